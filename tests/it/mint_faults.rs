//! Mint mode through Redis' own faults: a Redis restarted empty and a
//! Cluster shard restarted empty lose the high-water mark with the lease key; the claim
//! guard's wait of one TTL covers it (docs/worker.md, "Mint mode"), so the next holder,
//! even with its clock behind within `--max-clock-skew`, mints above every earlier ID. A
//! holder alive through the loss keeps minting in order. With `--min-replicas-ack` a
//! reservation counts only once the replica has it, so a failover never hands the next
//! holder a mark below minted IDs. Through an outage minting stops at the last reservation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::signal::Signal;

use crate::clock_skew::set_offset;
use crate::harness::*;
use crate::mint_worker::{APP, assert_increasing, faked_at, first_batch, minter_at, next, pull};

/// The first holder mints, is SIGKILLed, and `lose` wipes its Redis data (mark, guard and
/// lease key); a newcomer whose clock is 1 s behind (within `--max-clock-skew` 1.5 s) first
/// waits for the guard, then mints above every ID of the first.
fn lost_mark_is_covered_by_the_guard(url: &str, lose: impl FnOnce()) {
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");
    set_offset(&stamp, "-1s");
    let ttl = |b: SidecarBuilder| {
        b.flag("--max-worker-id", "0")
            .flag("--ttl", "3s")
            .flag("--max-clock-skew", "1500ms")
    };
    let mut first = ttl(minter_at(url)).spawn();
    let mut old = first_batch(&first, 4096);
    old.extend(next(&first, 4096).unwrap());
    first.signal(Signal::SIGKILL);
    assert!(first.wait_exit(secs(5)).is_some());
    lose();

    let newcomer = ttl(faked_at(url, &stamp)).spawn();
    assert!(
        poll_until(secs(10), || next(&newcomer, 1)
            .is_err_and(|(s, body)| s == 503 && body.contains("guard_closed"))),
        "the guard holds claims back: {:?}",
        next(&newcomer, 1)
    );
    let new = first_batch(&newcomer, 4096);
    assert!(new[0] > *old.iter().max().unwrap(), "above every old ID");
}

/// Standalone Redis restarted empty.
#[test]
fn redis_restarted_empty_the_guard_covers_the_lost_mark() {
    let mut redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let url = redis.url();
    lost_mark_is_covered_by_the_guard(&url, || redis.restart());
}

/// The Cluster shard holding the lease key restarted empty (its replicas resynced to it).
#[test]
fn cluster_shard_restarted_empty_the_guard_covers_the_lost_mark() {
    let mut topo = ClusterTopology::start_primaries_only();
    let url = topo.url();
    assert_eq!(guard_open(&url, APP, &[]).code, Some(0));
    let shard = topo.owner_of_key(&worker_key(APP, 0)).port;
    lost_mark_is_covered_by_the_guard(&url, || topo.restart_shard_empty(shard));
}

/// A holder alive while Redis restarts empty keeps its worker ID and mints on in order; its
/// renewal re-creates the lease key and its next reservation the mark.
#[test]
fn a_holder_mints_on_in_order_through_redis_restarted_empty() {
    let mut redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let sidecar = Arc::new(minter_at(&redis.url()).flag("--max-worker-id", "0").spawn());
    first_batch(&sidecar, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let client = pull(sidecar.clone(), stop.clone());
    std::thread::sleep(ms(500));
    redis.restart();
    let mark = format!("snowflake:worker:{APP}:mark:{{{}}}", worker_key(APP, 0));
    assert!(
        poll_until(secs(5), || redis.exists(&mark)),
        "the mark is re-created"
    );
    std::thread::sleep(ms(500));
    stop.store(true, Ordering::Relaxed);
    let (ids, refused) = client.join().unwrap();
    assert_increasing(&ids);
    assert!(ids.len() > 4096, "{} IDs", ids.len());
    assert!(
        refused.iter().all(|b| b.contains("reserving")),
        "only a wait for the mark: {refused:?}"
    );
    let state = sidecar.read_state().unwrap();
    assert_eq!(state["worker_id"], 0);
    assert!(redis.get(&worker_key(APP, 0)).is_some());
}

/// `--min-replicas-ack 1` on Sentinel: with the replica paused, no reservation counts, so
/// minting stops at the last acknowledged mark (503 `reserving`, before the lease itself
/// expires); after the replica resumes and the primary is killed (failover), the next holder
/// mints above every ID the first one answered.
#[test]
fn sentinel_failover_with_min_replicas_ack_never_lowers_the_mark() {
    let mut topo = SentinelTopology::start_small();
    topo.primary().open_claim_guard(APP);
    let acked = |b: SidecarBuilder| {
        b.flag("--max-worker-id", "0")
            .flag("--min-replicas-ack", "1")
    };
    let first = Arc::new(acked(minter_at(&topo.url())).spawn());
    first_batch(&first, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let client = pull(first.clone(), stop.clone());
    std::thread::sleep(ms(300));

    let replica = 1 - topo.primary_index();
    topo.nodes()[replica].pause();
    std::thread::sleep(ms(1_500));
    topo.nodes()[replica].resume();
    std::thread::sleep(ms(300));
    stop.store(true, Ordering::Relaxed);
    let (mut old, refused) = client.join().unwrap();
    let states: Vec<&str> = refused
        .iter()
        .map(|b| {
            if b.contains("reserving") {
                "reserving"
            } else {
                "other"
            }
        })
        .collect();
    assert_eq!(
        states.first(),
        Some(&"reserving"),
        "minting stopped at the acknowledged mark first: {refused:?}"
    );

    let (killed, _) = topo.kill_primary();
    topo.restart_as_replica(killed);
    old.extend(first_batch(&first, 4096));
    first.signal(Signal::SIGKILL);

    let second = acked(minter_at(&topo.url())).spawn();
    let new = first_batch(&second, 4096);
    assert!(new[0] > *old.iter().max().unwrap(), "above every old ID");
}

/// Through a Redis outage minting goes on only up to the last reservation (at most
/// `--mint-window`, 500 ms here, ahead), then answers `503 reserving` while the lease itself
/// is still valid; every ID answered is at or below the mark Redis holds.
#[test]
fn a_redis_outage_stops_minting_at_the_last_reservation() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let sidecar = Arc::new(minter_at(&redis.url()).flag("--max-worker-id", "0").spawn());
    first_batch(&sidecar, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let client = pull(sidecar.clone(), stop.clone());
    std::thread::sleep(ms(300));
    redis.pause();
    assert!(
        poll_until(secs(5), || sidecar
            .metric("snowlease_mint_unavailable_total{state=\"reserving\"}")
            .is_some_and(|n| n > 0.0)),
        "reserving"
    );
    redis.resume();
    stop.store(true, Ordering::Relaxed);
    let (ids, refused) = client.join().unwrap();
    let first_refusal = refused.first().map(String::as_str).unwrap_or_default();
    assert!(first_refusal.contains("reserving"), "{refused:?}");
    let mark_key = format!("snowflake:worker:{APP}:mark:{{{}}}", worker_key(APP, 0));
    let mark = stamped_int(&redis.get(&mark_key).unwrap());
    let newest = crate::mint_worker::unix_ms_of(*ids.iter().max().unwrap());
    assert!(newest <= mark, "newest ID at {newest}, mark {mark}");
}
