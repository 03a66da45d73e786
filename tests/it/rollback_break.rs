//! The rollback promise (docs/rollback-design.md) broken on purpose, on real processes: a
//! Redis crash-restart from a snapshot taken *before* something was first written, and a
//! Sentinel ping-pong failover.
//!
//! - Lock and pool: `node.lua`'s `node_gate` took a store with no node record and no sign of
//!   past activity for a new one and opened it at once; after such a rollback that is exactly
//!   what a lost first use looks like, so the same lock or pool id went out again, fence 1
//!   again, while the first holder ran on. Fixed: a missing record is closed as after a
//!   rollback and opened only once it is durable ("First use").
//! - Worker IDs: `guard open` (run on every deploy, as docs/worker.md allows) found no guard
//!   and no lease key and opened the guard, so a newcomer took an ID a holder still
//!   published. Fixed the same way: the hook's first run waits for a snapshot with its guard.
//! - `mint carry-over` read the old app's marks without vouching for them, and its floor was
//!   lost with a rollback after it; either way the new app minted IDs the old app minted
//!   (both fixed: it vouches for them, and waits for a snapshot and the replicas).
//! - Node stamps: a Sentinel failover back to the old primary before it was turned into a
//!   replica keeps its `run_id` and `master_replid`, so the rollback (the writes made on the
//!   other node) went unseen. Fixed: the stamp counts the `REPLICAOF NO ONE` Sentinel sends.
//!
//! Each test failed on the product before its fix, 3 of 3 runs.

use std::fs;
use std::path::Path;

use serde_json::json;
use snowlease::pool::PoolKeys;
use tempfile::TempDir;

use crate::first_record::lock_run;
use crate::harness::*;
use crate::pool_cli::{pool_cmd, pool_json};

/// Exit code of `lock` when the lock was not acquired within `--wait`.
const NOT_ACQUIRED: i32 = 69;

/// Exit code of `pool acquire` when no id is due (also: acquires closed after a rollback).
const NOTHING_DUE: i32 = 3;

/// The lock holder's command: records its fence and PID, then runs until `$DIR/$ME.go`.
const HOLDER_JOB: &str = r#"
echo "$SNOWLEASE_FENCE" > "$DIR/$ME.fence"
echo $$ > "$DIR/$ME.pid"
while [ ! -e "$DIR/$ME.go" ]; do sleep 0.02; done
"#;

/// `lock a` of `name` (`--ttl`, `--wait`), its command [`HOLDER_JOB`] (files under `dir`),
/// not spawned.
pub(crate) fn holder_lock(
    url: &str,
    name: &str,
    ttl: &str,
    wait: &str,
    dir: &Path,
) -> SidecarBuilder {
    SidecarBuilder::new("lock")
        .name("lock a")
        .without("--listen")
        .flag("--name", name)
        .flag("--redis-url", url)
        .flag("--ttl", ttl)
        .flag("--wait", wait)
        .env("DIR", dir)
        .env("ME", "a")
        .switch("--")
        .switch("sh")
        .switch("-c")
        .switch(HOLDER_JOB)
}

fn lock_key(name: &str) -> String {
    format!("snowlease:lock:{{{name}}}")
}

/// A value a job wrote, once it parses (10 s at most).
fn wait_value(path: &Path) -> Option<u64> {
    poll_some(secs(10), || {
        fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
    })
}

fn process_exists(pid: u64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// A lock first used after the last snapshot: holder `a` takes it (fence 1, `--ttl 10s`),
/// Redis is SIGKILLed and restarts from the snapshot, which has no lock key, no fence and no
/// node record. A second `lock` of the same name must be refused while `a`'s command may still
/// run (as `lock.rs`'s `a_restart_from_an_older_snapshot_closes_the_lock_for_one_ttl` shows for
/// a lock used once before the snapshot). It was not, before first records were made durable: `acquire.lua` saw "no record, no fence,
/// no key" as a new lock, takes it at once and hands out fence 1 a second time while `a`'s
/// command runs on with fence 1. The same happens after a failover to a replica that missed
/// the first acquire.
#[test]
fn lock_first_used_after_the_snapshot_is_not_handed_out_twice() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    let dir = TempDir::new().unwrap();
    // The last snapshot: taken before anyone ever used the lock "report".
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let _a = holder_lock(&url, "report", "10s", "0s", dir.path()).spawn();
    let fence_a = wait_value(&dir.path().join("a.fence")).expect("a runs");
    let pid_a = wait_value(&dir.path().join("a.pid")).expect("a runs");
    assert_eq!(fence_a, 1, "the lock's first use");
    redis.restart();
    assert!(
        !redis.exists(&lock_key("report")),
        "the restart loaded the snapshot without a's acquire"
    );

    let b_fence = dir.path().join("b.fence");
    let run = lock_run(&url, "report", "10s", "0s", &b_fence);
    let a_running = process_exists(pid_a) && !dir.path().join("a.go").exists();
    let fence_b = fs::read_to_string(&b_fence).ok();
    fs::write(dir.path().join("a.go"), "").unwrap();
    assert!(a_running, "a's command ran through b's attempt");
    assert_eq!(
        run.code,
        Some(NOT_ACQUIRED),
        "b took the lock while a's command (fence {fence_a}) still runs; b's fence: {fence_b:?}; \
         {run:?}"
    );
    assert!(fence_b.is_none(), "b's command ran with fence {fence_b:?}");
}

/// A pool written with plain commands (docs/pool.md's compatibility promise: `ZADD
/// '{p}:ready' 0 a`, no `pool init`) whose first acquire came after the last snapshot: the
/// restart loses that lease (id `a`, fence 1) and the next acquire must be closed for the max
/// lease. It was not, before first records were made durable: no node record, fence 0, no leases look like a pool that never leased, so
/// it leases `a` again at once, with fence 1 again, to a second token while the first holder's
/// 30 s lease runs.
#[test]
fn plain_pool_first_leased_after_the_snapshot_is_not_leased_twice() {
    let mut redis = RedisServer::start();
    let _: () = redis.query(redis::cmd("ZADD").arg("{p}:ready").arg(0).arg("a"));
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let acquire = [
        "acquire",
        "--pool",
        "p",
        "--ttl",
        "30s",
        "--max-lease",
        "30s",
    ];
    let first = pool_json(&redis, &acquire);
    assert_eq!((&first["id"], &first["fence"]), (&json!("a"), &json!(1)));
    redis.restart();
    assert!(
        !redis.exists(&PoolKeys::new("p").leases),
        "the restart lost the lease"
    );
    let run = pool_cmd(&redis, &acquire, &[]);
    assert_eq!(
        run.code,
        Some(NOTHING_DUE),
        "id a leased again (first lease {first}, deadline in 30 s): {run:?}"
    );
}

/// The same with a pool made by `pool init`, when the snapshot predates the init too: after
/// the restart the pool is gone, so the deploy step that runs `pool init` (refused only while
/// a pool key exists) creates it again, stamped by the node that runs now, and the next
/// acquire leases `a` with fence 1 at once while the holder from before the restart still
/// holds `a` with fence 1 for 30 s.
#[test]
fn pool_initialised_after_the_snapshot_is_not_leased_twice_after_init_again() {
    let mut redis = RedisServer::start();
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    pool_json(&redis, &["init", "--pool", "p", "--ids", "a"]);
    let acquire = [
        "acquire",
        "--pool",
        "p",
        "--ttl",
        "30s",
        "--max-lease",
        "30s",
    ];
    let first = pool_json(&redis, &acquire);
    assert_eq!((&first["id"], &first["fence"]), (&json!("a"), &json!(1)));
    redis.restart();
    // Before first records were made durable the restart lost the pool, and the deploy
    // step re-created it (exit 0); now init waited for a snapshot, which the restart loads.
    let init = pool_cmd(&redis, &["init", "--pool", "p", "--ids", "a"], &[]);
    eprintln!("init again: {init:?}");
    let run = pool_cmd(&redis, &acquire, &[]);
    assert_eq!(
        run.code,
        Some(NOTHING_DUE),
        "id a leased again (first lease {first}, deadline in 30 s): {run:?}"
    );
}

/// Samples `/id` of both sidecars for `how_long` (every sample of both).
fn sample_both(a: &Sidecar, b: &Sidecar, how_long: std::time::Duration) -> Vec<Sample> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let ta = scope.spawn(|| sample_ids(0, a, &stop));
        let tb = scope.spawn(|| sample_ids(1, b, &stop));
        let _stop = StopOnDrop(&stop);
        std::thread::sleep(how_long);
        stop.store(true, Ordering::Relaxed);
        let mut all = ta.join().unwrap();
        all.extend(tb.join().unwrap());
        all
    })
}

/// Worker mode, the app's first use after the last snapshot, with `guard open` as the
/// deploy hook docs/worker.md suggests ("a hook that runs on every deploy (Argo CD `PreSync`)
/// does not fail"): the hook opens the guard, sidecar A claims ID 0, Redis crash-restarts from
/// the snapshot (no guard, no lease key), the next deploy runs the hook again and sidecar B
/// starts. B must not publish ID 0 while A does (without the hook B's claim finds the guard
/// missing and closes it for one TTL). It did, before first records were made durable: the hook found no guard and no lease key,
/// takes the Redis for a fresh one and opens the guard, and B claims ID 0 at once; both
/// publish it until A's next renew finds B's key. Now the hook finds the guard of the node
/// before the restart and closes it for one TTL (exit 0: a hook must not fail).
#[test]
fn guard_open_as_a_deploy_hook_after_a_rollback_never_publishes_one_id_twice() {
    const APP: &str = "hooked";
    let mut redis = RedisServer::start();
    let url = redis.url();
    // The last snapshot predates the app's first deploy.
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let hook = guard_open(&url, APP, &["--max-worker-id", "0"]);
    assert_eq!(hook.code, Some(0), "{hook:?}");
    let sidecar = |name: &str| {
        Sidecar::worker_at(&url, APP)
            .name(name)
            .flag("--max-worker-id", "0")
            .flag("--ttl", "20s")
            .flag("--renew-interval", "8s")
    };
    let a = sidecar("a").spawn();
    a.wait_for_lease(secs(10));
    redis.restart();
    // Before the guard was made durable the restart loaded the older snapshot (no guard, no
    // lease key) and the hook opened a new guard; now the hook's first run waited for a
    // snapshot with its guard, which the restart loads.
    // The next deploy: the hook, then a new pod.
    let hook = guard_open(&url, APP, &["--max-worker-id", "0"]);
    let b = sidecar("b").spawn();
    let samples = sample_both(&a, &b, secs(6));
    assert_never_published_together(&samples);
    // Not opened: closed for one TTL as a claim would (exit 0: a hook must not fail).
    assert_eq!(hook.code, Some(0), "{hook:?}");
    assert!(
        hook.stdout.contains("\"closed_after_rollback\":1"),
        "guard open must not open a guard a rollback may have lost: {hook:?}"
    );
}

/// When, in a format change (docs/kubernetes.md "Upgrading"), Redis crash-restarts from its
/// last snapshot.
#[derive(Clone, Copy, Debug)]
enum CarryRollback {
    /// After the old app's pods stopped, before `mint carry-over` reads their marks.
    BeforeCarry,
    /// After `mint carry-over` wrote the new app's floor, before the new app's pods start.
    AfterCarry,
}

/// The format change of `mint_edges.rs`'s `a_format_change_as_the_docs_give_it_never_mints_an_old_id`
/// (old app, epoch E; new app, epoch E + 10 s; carry-over; guard open), with one Redis
/// crash-restart from a snapshot taken after the old app's first batch. Returns how many IDs of
/// the new app the old app had minted.
fn format_change_with_a_rollback(when: CarryRollback) -> (usize, usize) {
    // Debian's redis.conf snapshots (`save 3600 1 300 100 60 10000`): a crash-restart loads the
    // last snapshot, the one `SAVE` below takes (nothing changes often enough for another).
    let mut redis = RedisServer::start_with(RedisOptions {
        args: ["--save", "3600 1 300 100 60 10000"]
            .map(String::from)
            .to_vec(),
        ..RedisOptions::default()
    });
    let url = redis.url();
    let (old_app, new_app) = ("carry-old", "carry-new");
    let minter = |app: &str, epoch: &str| {
        Sidecar::worker_at(&url, app)
            .name(app)
            .switch("--mint")
            .flag("--mint-window", "500ms")
            .flag("--max-worker-id", "0")
            .flag("--epoch", epoch)
    };
    let old_epoch = "1288834974657";
    let new_epoch = "1288834984657";
    redis.open_claim_guard(old_app);
    let mut old = minter(old_app, old_epoch).spawn();
    let mut old_ids = crate::mint_worker::first_batch(&old, 256);
    // The last snapshot: the old app's format and a mark from its first batch.
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let end = std::time::Instant::now() + secs(6);
    while std::time::Instant::now() < end {
        old_ids.extend(crate::mint_worker::next(&old, 256).unwrap_or_default());
    }
    old.signal(Signal::SIGTERM);
    assert!(old.wait_exit(secs(10)).is_some());
    // Its key (a tombstone for the handover delay after a clean stop) is gone: `carry-over`
    // would refuse before.
    assert!(
        poll_until(secs(10), || redis
            .keys(&format!("{PREFIX}{old_app}:[0-9]*"))
            .is_empty()),
        "the old app's key is gone"
    );
    if let CarryRollback::BeforeCarry = when {
        redis.restart();
    }
    let carry = run_snowlease(
        &[
            "mint",
            "carry-over",
            "--from-app",
            old_app,
            "--app",
            new_app,
            "--max-worker-id",
            "0",
            "--epoch",
            new_epoch,
            "--redis-url",
            &url,
        ],
        &[],
        secs(10),
    );
    assert_eq!(carry.code, Some(0), "{carry:?}");
    if let CarryRollback::AfterCarry = when {
        redis.restart();
    }
    let open = guard_open(&url, new_app, &["--max-worker-id", "0"]);
    assert_eq!(open.code, Some(0), "{open:?}");
    let new = minter(new_app, new_epoch).spawn();
    let mut new_ids = crate::mint_worker::first_batch(&new, 256);
    let end = std::time::Instant::now() + secs(8);
    while std::time::Instant::now() < end {
        new_ids.extend(crate::mint_worker::next(&new, 256).unwrap_or_default());
    }
    let old_set: std::collections::BTreeSet<u64> = old_ids.iter().copied().collect();
    let twice = new_ids.iter().filter(|id| old_set.contains(id)).count();
    eprintln!(
        "{when:?}: carry-over said {}; {twice} of {} new IDs minted by the old app",
        carry.stdout.trim(),
        new_ids.len()
    );
    (twice, new_ids.len())
}

/// `mint carry-over` run after Redis rolled back (a crash-restart between the old app's last
/// reservations and the carry-over): it reads the old app's marks as they are, also those
/// another node or life wrote, which may be below reservations the rollback lost (the
/// sidecars' `vouch.lua` raises such a mark; `carry.rs` takes its integer part), computes the
/// floor from the snapshot's mark and stamps the new app's marks as written here, so nothing
/// raises them later. The new app (epoch 10 s later) then minted IDs the old app minted in
/// its last seconds (33,280-934,400 in 3 runs); now it reads them as `vouch.lua` would.
#[test]
fn carry_over_after_a_rollback_never_mints_an_old_id() {
    let (twice, of) = format_change_with_a_rollback(CarryRollback::BeforeCarry);
    assert_eq!(
        twice, 0,
        "{twice} of {of} IDs of the new app were minted by the old one"
    );
}

/// A crash-restart right after `mint carry-over`: its floor and the new app's format record
/// were lost with the snapshot (taken before it), and the new app's first reservation found
/// no mark and raised it to TIME + window + skew, not to the carried floor, so with an epoch
/// 10 s later it minted IDs the old app minted in its last seconds (43,264-871,680). Now
/// carry-over returns only once a snapshot taken after its writes finished (`BGSAVE
/// SCHEDULE`; and every replica has them), so the restart loads the floor.
#[test]
fn carry_over_lost_in_a_rollback_never_mints_an_old_id() {
    let (twice, of) = format_change_with_a_rollback(CarryRollback::AfterCarry);
    assert_eq!(
        twice, 0,
        "{twice} of {of} IDs of the new app were minted by the old one"
    );
}

/// Sentinel ping-pong: a planned failover (`SENTINEL FAILOVER`) to node 1, sidecar A claims
/// ID 0 there, and a second failover comes back to node 0 before the Sentinel has turned it
/// into a replica (it keeps role master, and takes no part in replication, for up to about
/// 8 s after the switch: see `SentinelTopology::wait_replicas_in_sync`). Node 0 never saw A's
/// claim: a rollback. (The guard on node 1 is opened with `guard open --force` before A starts,
/// as docs/worker.md allows while no sidecar of the app ran.) But its `REPLICAOF NO ONE` was a no-op on a primary, so neither its
/// `run_id` nor its `master_replid` changed and its node stamp is the one it had before the
/// first failover: the guard `guard open` wrote there vouched for itself, claims stayed open,
/// and newcomer B claimed ID 0 at once while A published it. Now the stamp also counts the
/// `REPLICAOF` commands the node ran, which that no-op still counts.
#[test]
fn sentinel_failover_back_before_the_old_primary_turned_replica_never_publishes_one_id_twice() {
    const APP: &str = "pingpong";
    let topo = SentinelTopology::start_small();
    let url = topo.url();
    let open = guard_open(&url, APP, &["--max-worker-id", "0"]);
    assert_eq!(open.code, Some(0), "{open:?}");
    topo.wait_replicas_in_sync();
    let first = topo.primary_index();
    let stamp_before = topo.nodes()[first].node_stamp();
    let second = topo.failover();
    assert_ne!(first, second);
    // No sidecar of the app has run yet, so `--force` is the documented way to skip the one
    // TTL the new primary's first claim would wait (docs/worker.md, "Claim guard").
    let open = guard_open(&url, APP, &["--max-worker-id", "0", "--force"]);
    assert_eq!(open.code, Some(0), "{open:?}");
    let sidecar = |name: &str| {
        Sidecar::worker_at(&url, APP)
            .name(name)
            .flag("--max-worker-id", "0")
            .flag("--ttl", "20s")
            .flag("--renew-interval", "8s")
    };
    let a = sidecar("a").spawn();
    a.wait_for_lease(secs(10));
    assert!(
        topo.nodes()[second].exists(&worker_key(APP, 0)),
        "A claimed on node {second}"
    );
    let back = topo.failover();
    assert_eq!(back, first, "the failover came back to node {first}");
    let missed = !topo.nodes()[first].exists(&worker_key(APP, 0));
    let stamp_after = topo.nodes()[first].node_stamp();
    eprintln!(
        "node {first}: A's key missed: {missed}; stamp before {stamp_before}, after {stamp_after}"
    );
    let b = sidecar("b").spawn();
    let samples = sample_both(&a, &b, secs(6));
    assert_never_published_together(&samples);
}
