//! The rollback promise broken on purpose (third round), on real `redis-server` processes:
//! a new store's first record said durable while nothing a restart loads holds it.
//! Each test failed on the product as it was (its doc comment says how often); those still
//! failing are ignored, each with the hole it shows (docs/rollback-design.md, "What is still
//! not covered"), so that `cargo test -- --ignored` shows them.

use std::fs;
use std::path::Path;
use std::thread;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use tempfile::TempDir;

use crate::first_record::lock_run;
use crate::harness::*;
use crate::rollback_break::holder_lock;

/// Waits (up to `within`) until holder `a` (`rollback_break::holder_lock`) runs its command or
/// exits: the fence it runs with, if it runs.
fn fence_once_running(a: &mut Sidecar, dir: &Path, within: Duration) -> Option<String> {
    let a_fence = dir.join("a.fence");
    poll_until(within, || a_fence.exists() || a.wait_exit(ms(1)).is_some());
    fs::read_to_string(&a_fence).ok()
}

/// `b` asks for the lock "job" (TTL 30 s, `--wait wait`) while `a` may still run, then `a` is
/// let go: `b`'s fence if its command ran, and `b`'s run.
fn second_holder(url: &str, wait: &str, dir: &Path, a: &mut Sidecar) -> (Option<String>, Run) {
    let b_fence = dir.join("b.fence");
    let run = lock_run(url, "job", "30s", wait, &b_fence);
    fs::write(dir.join("a.go"), "").unwrap();
    let fence_b = fs::read_to_string(&b_fence).ok();
    let _ = a.wait_exit(secs(10));
    (fence_b, run)
}

/// Waits (5 s) until `primary` lists no replica (`connected_slaves:0`).
fn assert_no_replica_listed(primary: &RedisServer) {
    assert!(
        primary.wait_info("replication", "connected_slaves", "0", secs(5)),
        "the primary still lists its replica"
    );
}

/// SIGKILLs `redis`' children (a snapshot or AOF rewrite in progress) and `redis` itself,
/// then starts it again with its options (a crash-restart: the node lost, an OOM kill).
fn crash_restart(redis: &mut RedisServer) {
    for child in child_pids(redis.pid()) {
        let _ = kill(child, Signal::SIGKILL);
    }
    redis.restart();
}

/// AOF switched on at run time (`CONFIG SET appendonly yes`, the documented way from RDB to
/// AOF without a restart) on a Redis with a data set whose rewrite takes 10 s (100 keys x
/// 100 ms). `INFO persistence` says `aof_enabled:1` at once, while the AOF is only being
/// written (`aof_rewrite_in_progress:1`: no manifest yet, a restart cannot load it). The
/// first-use wait takes the AOF for what a restart loads, sleeps 3 s for the `everysec`
/// fsync and opens the new lock: `a` runs with fence 1. A crash before the rewrite ends
/// restarts from the `dump.rdb` taken before the lock (with `appendonly yes` in the
/// config it comes back empty instead), so `b`'s first use opens at once and hands out
/// fence 1 again while `a` still runs. Failed 3 of 3 runs.
#[test]
fn aof_switched_on_at_run_time_does_not_make_a_first_use_durable() {
    let mut redis = RedisServer::start();
    redis.slow_snapshots(100, ms(0));
    // The last snapshot on disk: before the lock's first use.
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    redis.slow_snapshots(0, ms(100));
    let _: () = redis.query(redis::cmd("CONFIG").arg("SET").arg("appendonly").arg("yes"));
    let dir = TempDir::new().unwrap();
    let mut a = holder_lock(&redis.url(), "job", "30s", "0s", dir.path()).spawn();
    // a's command starts (the bug) or a gives up after its one attempt (5 s).
    let fence_a = fence_once_running(&mut a, dir.path(), secs(8));
    let rewriting = redis.info_field("persistence", "aof_rewrite_in_progress");
    crash_restart(&mut redis);
    let (fence_b, run) = second_holder(&redis.url(), "0s", dir.path(), &mut a);
    assert!(
        fence_a.is_none() || fence_b.is_none(),
        "b ran with fence {fence_b:?} while a (fence {fence_a:?}) still ran; the AOF rewrite \
         was still in progress ({rewriting:?}) when a opened the new lock; b: {run:?}"
    );
}

/// The other way round: a Redis whose configuration says `appendonly yes` (so a restart
/// loads the AOF, never `dump.rdb`), with the AOF switched off at run time (`CONFIG SET
/// appendonly no`, e.g. for a bulk load). The wait reads `aof_enabled:0`, takes a snapshot
/// (`dump.rdb`, which the restart ignores) and opens the new lock: `a` runs with fence 1.
/// A crash-restart loads the AOF, written up to the switch, without the lock; `b`'s first
/// use opens at once with fence 1 while `a` still runs. Failed 3 of 3 runs.
#[test]
#[ignore = "not covered: AOF switched off at run time while redis.conf says appendonly yes (rollback-design.md)"]
fn aof_switched_off_at_run_time_does_not_make_a_snapshot_what_a_restart_loads() {
    let mut redis = RedisServer::start_with(RedisOptions {
        args: ["--appendonly", "yes"].map(String::from).to_vec(),
        ..RedisOptions::default()
    });
    let _: () = redis.query(redis::cmd("SET").arg("before").arg(1));
    let _: () = redis.query(redis::cmd("CONFIG").arg("SET").arg("appendonly").arg("no"));
    let dir = TempDir::new().unwrap();
    let mut a = holder_lock(&redis.url(), "job", "30s", "0s", dir.path()).spawn();
    let fence_a = fence_once_running(&mut a, dir.path(), secs(8));
    crash_restart(&mut redis);
    let restored = redis.exists("before");
    let (fence_b, run) = second_holder(&redis.url(), "0s", dir.path(), &mut a);
    assert!(
        fence_a.is_none() || fence_b.is_none(),
        "b ran with fence {fence_b:?} while a (fence {fence_a:?}) still ran; the restart \
         loaded the AOF (key written before the switch there: {restored}); b: {run:?}"
    );
}

/// A replica's `master_link_status` is `up` (10 s at most).
fn wait_link_up(replica: &RedisServer) -> bool {
    replica.wait_info("replication", "master_link_status", "up", secs(10))
}

/// A primary without persistence (`save ""`) that syncs its replicas from disk and removes
/// that file afterwards (`repl-diskless-sync no`, `rdb-del-sync-files yes`: redis.conf's
/// setting for exactly this kind of instance). Lock `a`'s first use waits for its replica,
/// which is stalled and then restarts without its data (a pod rescheduled): its full sync
/// forks a snapshot on the primary, which `rdb_saves` counts, and whose file Redis removes
/// once the replica has it. The record's mark (`:new:<rdb_saves>` at its write) takes that
/// count for "a snapshot started after the record finished": the lock opens, fence 1, with
/// no `dump.rdb` on disk (the wait's own `BGSAVE`, whose file Redis keeps, is never sent).
/// The primary crash-restarts empty and `b`'s first use opens at once with fence 1 while
/// `a` still runs. Failed 3 of 3 runs.
#[test]
#[ignore = "not covered: rdb-del-sync-files on a primary without persistence (rollback-design.md)"]
fn a_replica_sync_whose_file_redis_removes_is_not_a_snapshot_of_the_first_use() {
    let mut primary = RedisServer::start_with(RedisOptions {
        args: ["--repl-diskless-sync", "no", "--rdb-del-sync-files", "yes"]
            .map(String::from)
            .to_vec(),
        name: "primary".into(),
        ..RedisOptions::default()
    });
    let mut replica = RedisServer::start_with(RedisOptions {
        args: vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            primary.port().to_string(),
        ],
        name: "replica".into(),
        ..RedisOptions::default()
    });
    assert!(wait_link_up(&replica), "the replica never synced");
    assert!(
        poll_until(secs(5), || !primary.dir().join("dump.rdb").exists()),
        "Redis kept the file of the replica's sync"
    );
    // The replica stalls (a long GC pause of its node, a full disk): the wait waits for it.
    replica.pause();
    let dir = TempDir::new().unwrap();
    let mut a = holder_lock(&primary.url(), "job", "30s", "20s", dir.path()).spawn();
    // a's first use has written its record; its wait (which lists the stalled replica)
    // begins right after, which cannot be seen from outside: a moment more.
    assert!(
        poll_until(secs(10), || primary.exists("snowlease:lock:{job}:node")),
        "a wrote no record"
    );
    thread::sleep(ms(300));
    // It comes back without its data (a pod rescheduled onto another node): a full sync.
    replica.stop();
    let _ = fs::remove_file(replica.dir().join("dump.rdb"));
    replica.restart();
    let fence_a = fence_once_running(&mut a, dir.path(), secs(25));
    let on_disk = primary.dir().join("dump.rdb").exists();
    let saves = primary.info_field("persistence", "rdb_saves");
    replica.stop();
    crash_restart(&mut primary);
    let (fence_b, run) = second_holder(&primary.url(), "5s", dir.path(), &mut a);
    assert!(
        fence_a.is_none() || fence_b.is_none(),
        "b ran with fence {fence_b:?} while a (fence {fence_a:?}) still ran; when a opened, \
         dump.rdb on disk: {on_disk}, rdb_saves {saves:?}; b: {run:?}"
    );
}

/// A lock in use on a Cluster (`a` holds it, fence 1: its first record was made durable on
/// its shard), its slot then moved to another primary (a resharding: `MIGRATE` of its keys,
/// `SETSLOT NODE`), which crash-restarts from its last snapshot, taken before the move. It
/// keeps the slot (`nodes.conf`) but not the keys: record, fence counter and `a`'s lease
/// are gone. Nothing on the new owner said the record was on its disk: the move carries
/// the record (stamped by the old owner) but no wait makes it durable where it lands. So
/// `b` finds a missing record, its first use is durable at once and it runs with fence 1
/// while `a` (fence 1) still runs. Failed 3 of 3 runs.
#[test]
#[ignore = "not covered: a slot move, then a crash of the new owner before its snapshot (rollback-design.md)"]
fn a_lock_moved_to_another_shard_that_then_rolls_back_does_not_hand_out_its_fence_again() {
    let mut cluster = ClusterTopology::start_primaries_only();
    let key = "snowlease:lock:{job}";
    let slot = cluster.keyslot(key);
    let target = cluster.other_primary_than_owner(slot);
    // The target's last snapshot: before the move.
    let _: () = cluster.server(target).query(&mut redis::cmd("SAVE"));
    let dir = TempDir::new().unwrap();
    let mut a = holder_lock(&cluster.url(), "job", "30s", "10s", dir.path()).spawn();
    let fence_a = fence_once_running(&mut a, dir.path(), secs(15));
    assert_eq!(fence_a.as_deref().map(str::trim), Some("1"), "a never ran");
    cluster.migrate_slot(slot, target);
    let moved: Vec<String> = cluster
        .server(target)
        .keys("snowlease:lock:*")
        .into_iter()
        .collect();
    cluster.restart_shard_from_snapshot(target);
    let (fence_b, run) = second_holder(&cluster.url(), "5s", dir.path(), &mut a);
    assert!(
        fence_b.is_none(),
        "b ran with fence {fence_b:?} while a (fence {fence_a:?}) still ran; keys moved to \
         :{target}: {moved:?}; b: {run:?}"
    );
}

/// The same without a resharding, on Sentinel: a lock in use (`a`, fence 1: its first record
/// on the replica and in the primary's snapshot), then a planned failover (`SENTINEL
/// FAILOVER`: no write lost), then the new primary crash-restarts at once from its own
/// `dump.rdb`, the one its full sync wrote before the lock existed (the record was on it
/// only in memory). Lock, fence counter and record are gone; the old primary turns replica
/// and resyncs from it. `b`'s first use is durable at once and runs with fence 1 while `a`
/// (fence 1) still runs. Two faults (a failover, then a crash of the promoted node), each
/// one a rollback the promise covers. Failed 3 of 3 runs.
#[test]
#[ignore = "not covered: a failover, then a crash of the new primary before its snapshot (rollback-design.md)"]
fn a_lock_after_a_failover_then_a_crash_of_the_new_primary_does_not_hand_out_its_fence_again() {
    let mut topo = SentinelTopology::start_small();
    let dir = TempDir::new().unwrap();
    let mut a = holder_lock(&topo.url(), "job", "30s", "10s", dir.path()).spawn();
    let fence_a = fence_once_running(&mut a, dir.path(), secs(15));
    assert_eq!(fence_a.as_deref().map(str::trim), Some("1"), "a never ran");
    let new = topo.failover();
    let had_record = topo.nodes()[new].exists("snowlease:lock:{job}:node");
    // SIGKILL and restart as the primary it now is (Sentinel rewrote its config so).
    topo.nodes_mut()[new].restart_with(
        ["--repl-diskless-sync-delay", "0"]
            .map(String::from)
            .to_vec(),
    );
    let (fence_b, run) = second_holder(&topo.url(), "10s", dir.path(), &mut a);
    assert!(
        fence_b.is_none(),
        "b ran with fence {fence_b:?} while a (fence {fence_a:?}) still ran; the new \
         primary had the record before its crash: {had_record}; b: {run:?}"
    );
}

/// A replica whose link to the primary is down for a moment (a network blip, a replica
/// process paused) when a new lock is first used: the primary lists no replica, so the wait
/// covers none ("every replica connected when the wait began"), takes the primary's
/// snapshot and opens the lock: `a` runs with fence 1. The primary dies; Sentinel promotes
/// the replica, whose link was down only a few seconds (it skips only replicas down for
/// more than 10 x `down-after-milliseconds` + the primary's downtime). The promoted replica
/// never had the record, so `b`'s first use is durable at once and runs with fence 1
/// while `a` still runs. Failed 3 of 3 runs.
#[test]
#[ignore = "not covered: a replica disconnected during a first use (rollback-design.md)"]
fn a_replica_briefly_disconnected_during_a_first_use_is_not_promoted_without_the_record() {
    let mut topo = SentinelTopology::start_small();
    let old = topo.primary_index();
    let replica = 1 - old;
    let primary_port = topo.nodes()[old].port();
    topo.nodes()[replica].pause();
    let _: i64 =
        topo.nodes()[old].query(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"));
    assert_no_replica_listed(&topo.nodes()[old]);
    let dir = TempDir::new().unwrap();
    let mut a = holder_lock(&topo.url(), "job", "30s", "5s", dir.path()).spawn();
    let fence_a = fence_once_running(&mut a, dir.path(), secs(8));
    topo.nodes_mut()[old].stop();
    topo.nodes()[replica].resume();
    let new = topo.wait_new_primary(old);
    assert_eq!(
        new, replica,
        "the replica of :{primary_port} was not promoted"
    );
    let (fence_b, run) = second_holder(&topo.url(), "10s", dir.path(), &mut a);
    assert!(
        fence_a.is_none() || fence_b.is_none(),
        "b ran with fence {fence_b:?} while a (fence {fence_a:?}) still ran; b: {run:?}"
    );
}

/// Attempts add up for snapshots (the mark's count) but not for replicas: each attempt
/// waits only for the replicas connected when *it* began. The replica's link stalls when
/// the new lock is first used (a network fault: the proxy in front of the primary holds
/// the stream): `a`'s attempt waits for the replica and gives up (exit 69, the record stays
/// closed and marked new). The link then breaks (reset; the replica process is paused
/// meanwhile, as a node under a long GC pause, so it cannot resync) and the primary drops
/// the replica. `b`'s attempt finds no replica, takes a snapshot and opens the lock: `b`
/// runs with fence 1. The primary dies; Sentinel promotes the replica (its link was down
/// for seconds, not 10 x `down-after-milliseconds`), which never had the record: `c`'s
/// first use is durable at once and runs with fence 1 while `b` still runs. Failed 3 of 3
/// runs.
#[test]
#[ignore = "not covered: a replica dropped between two first-use attempts (rollback-design.md)"]
fn a_replica_dropped_between_two_attempts_still_holds_the_first_use_closed() {
    let mut topo = SentinelTopology::start_with(SentinelOptions {
        replicas: 1,
        sentinels: 1,
        quorum: 1,
        proxied: true,
        ..SentinelOptions::default()
    });
    let old = topo.primary_index();
    let replica = 1 - old;
    // The replica's link: the proxy connection whose client port is the replica's side.
    let clients: String =
        topo.nodes()[replica].query(redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("master"));
    let laddr = clients
        .split_whitespace()
        .find_map(|f| f.strip_prefix("laddr="))
        .expect("the replica's link to its primary")
        .to_owned();
    let link = topo
        .proxy(old)
        .open_connections()
        .into_iter()
        .find(|c| c.peer.to_string() == laddr)
        .unwrap_or_else(|| panic!("no proxy connection from {laddr}"));
    topo.proxy(old).set_conn_mode(link.id, Mode::Blackhole);
    let dir = TempDir::new().unwrap();
    let a = lock_run(&topo.url(), "job", "30s", "0s", &dir.path().join("a.fence"));
    topo.nodes()[replica].pause();
    topo.proxy(old).set_conn_mode(link.id, Mode::Reset);
    assert_no_replica_listed(&topo.nodes()[old]);
    let mut b = holder_lock(&topo.url(), "job", "30s", "5s", dir.path())
        .env("ME", "b")
        .spawn();
    let b_fence = dir.path().join("b.fence");
    poll_until(secs(8), || b_fence.exists() || b.wait_exit(ms(1)).is_some());
    let fence_b = fs::read_to_string(&b_fence).ok();
    topo.nodes_mut()[old].stop();
    topo.nodes()[replica].resume();
    let new = topo.wait_new_primary(old);
    assert_eq!(new, replica, "the replica was not promoted");
    let c_fence = dir.path().join("c.fence");
    let run = lock_run(&topo.url(), "job", "30s", "10s", &c_fence);
    fs::write(dir.path().join("b.go"), "").unwrap();
    let fence_c = fs::read_to_string(&c_fence).ok();
    let _ = b.wait_exit(secs(10));
    assert!(
        fence_b.is_none() || fence_c.is_none(),
        "c ran with fence {fence_c:?} while b (fence {fence_b:?}) still ran; a's attempt: \
         {a:?}; c: {run:?}"
    );
}
