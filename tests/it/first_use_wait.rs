//! The first-use wait (docs/rollback-design.md, "First use"): it asks only the primary that
//! holds the new store's record (a Cluster's other shards have nothing of it), and a
//! snapshot longer than one attempt's wait still ends it: the record carries the snapshot
//! count of its primary at its write (`:new:<rdb_saves>`), so a later attempt takes a
//! snapshot an earlier one started as started after the record.

use std::fs;

use tempfile::TempDir;

use crate::first_record::lock_run;
use crate::harness::*;

/// Redis' count of snapshots since its start (`rdb_saves`, Redis 7+).
fn snapshots(redis: &RedisServer) -> u64 {
    redis
        .info_field("persistence", "rdb_saves")
        .and_then(|n| n.parse().ok())
        .expect("INFO persistence has rdb_saves (Redis 7+)")
}

/// A snapshot of 7 s (70 keys x 100 ms, as a large data set) already running when a new
/// lock is first asked for, and each attempt's wait only 5 s (`--wait 0s`: the first-use
/// minimum). Each attempt used to need a snapshot that started after it looked: it waited
/// for the running one to end, started its own, and gave up before that one ended; the
/// next attempt found that one running, waited, started another: the lock never opened
/// (exit 69 eight times of eight, about 45 s). Now an attempt takes the snapshot an earlier
/// one started and opens the lock, at fence 1 (the third, on an idle machine).
#[test]
fn a_snapshot_longer_than_each_attempt_still_opens_a_new_lock() {
    let redis = RedisServer::start();
    redis.slow_snapshots(70, ms(100));
    let _: () = redis.query(&mut redis::cmd("BGSAVE"));
    let dir = TempDir::new().unwrap();
    let out = dir.path().join("fence");
    let mut runs = Vec::new();
    for attempt in 1..=8 {
        let run = lock_run(&redis.url(), "job", "10s", "0s", &out);
        let code = run.code;
        runs.push(run);
        if code != Some(69) {
            break;
        }
        assert!(attempt < 8, "the lock never opened: {runs:#?}");
    }
    let last = runs.last().unwrap();
    assert_eq!(last.code, Some(0), "{runs:#?}");
    assert_eq!(fs::read_to_string(&out).unwrap().trim(), "1");
}

/// A Cluster whose other shards cannot snapshot (one's `dump.rdb` is a folder, as a full or
/// read-only disk) or cannot promise (the other's AOF with `appendfsync no`): the new
/// lock's record is on a shard that can (AOF with `appendfsync always`), so it opens at
/// once, at fence 1, and no other shard is asked to snapshot. The wait used to cover every
/// shard: the failing one kept every new store closed (exit 69), and each first use forked
/// a snapshot on every shard; then the AOF settings of every shard were still read, and the
/// other's `appendfsync no` made the wait unchecked (the lock opened only one TTL after its
/// first use: exit 69 with `--wait 0s`).
#[test]
fn a_new_lock_on_a_cluster_waits_only_for_its_own_shard() {
    let cluster = ClusterTopology::start_primaries_only();
    let owner = cluster.owner_of_key("snowlease:lock:{job}").port;
    let others: Vec<u16> = cluster
        .primaries()
        .iter()
        .map(|n| n.port)
        .filter(|&p| p != owner)
        .collect();
    let broken = cluster.server(others[0]);
    fs::create_dir_all(broken.dir().join("dump.rdb").join("x")).unwrap();
    // The lock's shard runs AOF with fsync at every write; another shard AOF with none.
    for (port, fsync) in [(owner, "always"), (others[1], "no")] {
        let node = cluster.server(port);
        for (name, value) in [("appendonly", "yes"), ("appendfsync", fsync)] {
            let _: () = node.query(redis::cmd("CONFIG").arg("SET").arg(name).arg(value));
        }
        assert!(
            node.wait_info("persistence", "aof_rewrite_in_progress", "0", secs(10)),
            "the AOF's first rewrite did not end"
        );
    }
    let before: Vec<u64> = others
        .iter()
        .map(|&p| snapshots(cluster.server(p)))
        .collect();
    let dir = TempDir::new().unwrap();
    let out = dir.path().join("fence");
    let run = lock_run(&cluster.url(), "job", "10s", "0s", &out);
    let after: Vec<u64> = others
        .iter()
        .map(|&p| snapshots(cluster.server(p)))
        .collect();
    let _ = fs::remove_dir_all(broken.dir().join("dump.rdb"));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(fs::read_to_string(&out).unwrap().trim(), "1");
    assert_eq!(before, after, "snapshots on shards without the lock");
}
