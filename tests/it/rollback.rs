//! Redis rolls back (docs/rollback-design.md): a crash-restart from an older snapshot (RDB, the
//! default persistence) or a failover to a replica that missed writes keeps the claim guard
//! and the mint marks of before but loses the newest leases and reservations. Each test
//! failed on main before node stamps: a newcomer claimed the holder's ID at once and both
//! published it (worker), both minted with it (mint), or a re-adopting sidecar minted below
//! what its predecessor had minted.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use crate::clock_skew::set_offset;
use crate::harness::*;
use crate::mint_worker::{APP as MINT_APP, faked_at, first_batch, minter_at, next, pull};

const APP: &str = "rolled";

/// A sidecar with a renew interval long enough that a newcomer starts between the restart
/// and the holder's next renew (the window the guard must cover).
fn slow_renewing(url: &str, app: &str, name: &str) -> SidecarBuilder {
    Sidecar::worker_at(url, app)
        .name(name)
        .flag("--max-worker-id", "0")
        .flag("--ttl", "8s")
        .flag("--renew-interval", "3s")
}

/// [`slow_renewing`] with TTL 20 s and a renew every 8 s: for failovers, where the holder's
/// next renew must come after the promotion and the newcomer's claim.
fn slower_renewing(url: &str, app: &str, name: &str) -> SidecarBuilder {
    slow_renewing(url, app, name)
        .flag("--ttl", "20s")
        .flag("--renew-interval", "8s")
}

/// Samples `/id` of both sidecars for `how_long`: every sample, both sidecars'.
fn sample_both(a: &Sidecar, b: &Sidecar, how_long: std::time::Duration) -> Vec<Sample> {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        let ta = scope.spawn(|| sample_ids(0, a, &stop));
        let tb = scope.spawn(|| sample_ids(1, b, &stop));
        let _stop = StopOnDrop(&stop);
        thread::sleep(how_long);
        stop.store(true, Ordering::Relaxed);
        let mut all = ta.join().unwrap();
        all.extend(tb.join().unwrap());
        all
    })
}

/// The first reproduction of the rollback, on one server: `guard open`, `SAVE`, sidecar A claims ID 0,
/// Redis is SIGKILLed and restarts from its `dump.rdb`, sidecar B starts at once. B finds the
/// guard written before the restart, closes claims for one TTL and never publishes ID 0 while
/// A does; A keeps its ID through the restart (its renew re-creates the lost key).
#[test]
fn worker_crash_restart_from_a_snapshot_never_publishes_one_id_twice() {
    let mut redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let a = slow_renewing(&redis.url(), APP, "a").spawn();
    a.wait_for_lease(secs(10));
    redis.restart();
    assert!(
        !redis.exists(&worker_key(APP, 0)) && redis.exists(&format!("{PREFIX}{APP}:guard")),
        "the restart loaded the snapshot: the guard without A's key"
    );
    let b = slow_renewing(&redis.url(), APP, "b").spawn();
    let samples = sample_both(&a, &b, secs(10));
    assert_never_published_together(&samples);
    assert!(
        b.wait_for_log("claim guard was written on another Redis node", secs(1)),
        "B says why it waits"
    );
    assert_eq!(a.id().map(|r| r.worker_id), Some(0), "A kept its ID");
    let a_ok = samples.iter().filter(|s| s.who == 0 && s.status == 200);
    assert!(a_ok.count() > 100, "A published throughout");
}

/// The second reproduction: the same with `--mint`, a client pulling `/next` from each
/// sidecar. No ID is answered twice (before the fix: 18-21 thousand in 8 s). Then A is
/// SIGKILLed and B takes ID 0 over once A's key expires: still no ID twice.
#[test]
fn mint_crash_restart_from_a_snapshot_never_mints_one_id_twice() {
    let mut redis = RedisServer::start();
    redis.open_claim_guard(MINT_APP);
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let url = redis.url();
    let minter = |name: &str| {
        // A window of 5 s: a reservation every few seconds, so A's next one (which would
        // find its key gone and renew at once) comes after B's claim.
        minter_at(&url)
            .name(name)
            .flag("--max-worker-id", "0")
            .flag("--ttl", "8s")
            .flag("--renew-interval", "3s")
            .flag("--mint-window", "5s")
    };
    let a = Arc::new(minter("a").spawn());
    let mut ids = first_batch(&a, 64);
    redis.restart();
    let b = Arc::new(minter("b").spawn());
    let stop = Arc::new(AtomicBool::new(false));
    let pulls = [pull(a.clone(), stop.clone()), pull(b.clone(), stop.clone())];
    thread::sleep(secs(6));
    stop.store(true, Ordering::Relaxed);
    let [(from_a, _), (from_b, _)] = pulls.map(|p| p.join().unwrap());
    assert!(!from_a.is_empty(), "A minted on through the restart");
    ids.extend(from_a);
    ids.extend(from_b);

    // A crashes; B takes over ID 0 once A's key has expired.
    let mut a = Arc::into_inner(a).expect("the pulls are done");
    a.signal(Signal::SIGKILL);
    let _ = a.wait_exit(secs(5));
    let after = poll_some(secs(20), || next(&b, 256).ok()).expect("B mints after A's key expired");
    ids.extend(after);
    let unique: BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "an ID was minted twice");
}

/// A mint-mode sidecar whose clock runs 400 ms ahead (within `--max-clock-skew`) mints near
/// its reservation; Redis and the sidecar crash together (a node lost), Redis restarts from a
/// snapshot taken before most of those reservations, and the sidecar's successor in the same
/// pod re-adopts the lease from the state file with a right clock. Its floor must be above
/// every timestamp the lost reservations covered; before the fix it was the snapshot's mark
/// and the successor minted IDs the crashed one had answered.
#[test]
fn a_readopting_minter_after_a_rollback_mints_above_the_lost_reservations() {
    let mut redis = RedisServer::start();
    redis.open_claim_guard(MINT_APP);
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");
    set_offset(&stamp, "+0.4");
    let pod = PodDir::new();
    let ahead = Arc::new(
        faked_at(&redis.url(), &stamp)
            .pod(&pod)
            .flag("--ttl", "8s")
            .flag("--renew-interval", "3s")
            .flag("--max-clock-skew", "1s")
            .spawn(),
    );
    let mut ids = first_batch(&ahead, 64);
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let stop = Arc::new(AtomicBool::new(false));
    let puller = pull(ahead.clone(), stop.clone());
    thread::sleep(secs(2));
    // The node is lost: the sidecar and Redis die together.
    ahead.signal(Signal::SIGKILL);
    stop.store(true, Ordering::Relaxed);
    ids.extend(puller.join().unwrap().0);
    let mut ahead = Arc::into_inner(ahead).expect("the puller is done");
    let _ = ahead.wait_exit(secs(5));
    redis.restart();

    let successor = minter_at(&redis.url())
        .pod(&pod)
        .flag("--max-worker-id", "0")
        .flag("--ttl", "8s")
        .flag("--renew-interval", "3s")
        .flag("--max-clock-skew", "1s")
        .spawn();
    let end = std::time::Instant::now() + secs(4);
    while std::time::Instant::now() < end {
        if let Ok(batch) = next(&successor, 256) {
            ids.extend(batch);
        }
    }
    assert!(
        successor.wait_for_log("re-adopt", secs(1)),
        "the successor re-adopted the lease"
    );
    let unique: BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(
        unique.len(),
        ids.len(),
        "{} IDs minted twice",
        ids.len() - unique.len()
    );
}

/// A failover to a replica that missed the holder's claim (Sentinel, asynchronous
/// replication): the replica is SIGSTOPped while A claims ID 0, the primary is SIGKILLed, the
/// replica resumed and promoted without A's key. B, started at once, must not publish ID 0
/// while A does; A keeps it (its renew re-creates the key on the new primary).
#[test]
fn worker_failover_to_a_lagging_replica_never_publishes_one_id_twice() {
    let mut topo = SentinelTopology::start_small();
    let url = topo.url();
    let open = guard_open(&url, APP, &["--max-worker-id", "0"]);
    assert_eq!(open.code, Some(0), "{open:?}");
    topo.wait_replicas_in_sync();
    let (primary, replica) = (topo.primary_index(), 1 - topo.primary_index());
    topo.nodes()[replica].pause();
    // Cut the link too: a paused replica would read what the primary already sent once resumed.
    let _: i64 = topo
        .primary()
        .query(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"));
    // Renewing every 8 s: A's next renew comes after B's claim (the window of the fault).
    let a = slower_renewing(&url, APP, "a").spawn();
    a.wait_for_lease(secs(10));
    topo.nodes_mut()[primary].stop();
    topo.nodes()[replica].resume();
    assert!(
        !topo.nodes()[replica].exists(&worker_key(APP, 0)),
        "the replica missed A's claim"
    );
    assert_eq!(topo.wait_new_primary(primary), replica);
    let b = slower_renewing(&url, APP, "b").spawn();
    let samples = sample_both(&a, &b, secs(10));
    assert_never_published_together(&samples);
    assert_eq!(a.id().map(|r| r.worker_id), Some(0), "A kept its ID");
}

/// The same on a Cluster shard: the replica of the shard holding ID 0 misses A's claim and is
/// promoted when its primary dies. B must not publish ID 0 while A does.
#[test]
fn worker_cluster_failover_to_a_lagging_replica_never_publishes_one_id_twice() {
    let mut topo = ClusterTopology::start();
    let url = topo.url();
    let open = guard_open(&url, APP, &["--max-worker-id", "0"]);
    assert_eq!(open.code, Some(0), "{open:?}");
    let key = worker_key(APP, 0);
    let port = topo.owner_of_key(&key).port;
    let (a, new) = topo.fail_over_to_lagging_replica(port, || {
        let a = slower_renewing(&url, APP, "a").spawn();
        a.wait_for_lease(secs(10));
        a
    });
    // A renews 8 s after its claim, after the promotion: the key is still missing.
    assert!(
        !topo.server(new.port).exists(&key),
        "the promoted replica missed A's claim"
    );
    let b = slower_renewing(&url, APP, "b").spawn();
    let samples = sample_both(&a, &b, secs(10));
    assert_never_published_together(&samples);
    assert_eq!(a.id().map(|r| r.worker_id), Some(0), "A kept its ID");
}

/// `guard open` after a restart from a snapshot: the open guard in the snapshot was written
/// before the restart, so it is not taken as open (a rollback may have lost leases that
/// holders still publish): refused, exit 5, nothing written; `--force` opens it, stamped by
/// the node that runs now.
#[test]
fn guard_open_closes_a_guard_from_before_a_restart_for_one_ttl() {
    let mut redis = RedisServer::start();
    let guard = format!("{PREFIX}{APP}:guard");
    let first = guard_open(&redis.url(), APP, &[]);
    assert_eq!(first.code, Some(0), "{first:?}");
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    redis.restart();
    let before = redis.get(&guard).expect("the snapshot's guard");
    // A deploy hook run after the restart: not an error (it failed with exit 5 until a
    // sidecar claimed, so a PreSync hook blocked every deploy), and the guard is closed
    // for one TTL as a claim would close it, never opened.
    let closed = guard_open(&redis.url(), APP, &["--ttl", "30s"]);
    assert_eq!(closed.code, Some(0), "{closed:?}");
    assert!(
        closed.stderr.contains("restarted or failed over"),
        "{closed:?}"
    );
    let line: serde_json::Value = serde_json::from_str(closed.stdout.trim()).unwrap();
    assert_eq!(line["closed_after_rollback"], 1, "{line}");
    assert_eq!(line["already_open"], false, "{line}");
    let now = redis.get(&guard).unwrap();
    assert_ne!(now, before);
    assert!(now.ends_with(&format!(".{}", redis.node_stamp())), "{now}");
    assert!(
        stamped_int(&now) > unix_ms() + 20_000,
        "closed for the TTL: {now}"
    );
    // Run again within that TTL: the guard is closed (exit 5, as for a claim's closure).
    let again = guard_open(&redis.url(), APP, &[]);
    assert_eq!(again.code, Some(5), "{again:?}");
    let forced = guard_open(&redis.url(), APP, &["--force"]);
    assert_eq!(forced.code, Some(0), "{forced:?}");
    let after = redis.get(&guard).unwrap();
    assert!(
        after.ends_with(&format!(".{}", redis.node_stamp())),
        "{after}"
    );
}
