//! ID handover (issue 11, safety features 2 and 4): a released ID stays blocked for the
//! handover delay; a claim whose reply was lost on the wire is adopted, never orphaned.

use std::time::Instant;

use crate::harness::*;

/// Asserts `key` is a release tombstone (`released:<owner>`) expiring within the default
/// 1 s handover delay: released by its owner, not deleted, not left for a TTL.
pub fn assert_tombstone(redis: &RedisServer, key: &str) {
    let (value, pttl) = redis.get_with_pttl(key);
    assert!(
        value.as_deref().is_some_and(|v| v.starts_with("released:")),
        "{key} must be a tombstone, is {value:?}"
    );
    assert!((1..=1000).contains(&pttl), "{key}: tombstone PTTL {pttl}");
}

/// After a SIGTERM release another sidecar cannot claim the ID while the tombstone stands
/// (`--handover-delay 1500ms`), then can.
#[test]
fn released_id_is_blocked_for_the_handover_delay() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let mut first = Sidecar::worker(&redis, "orders")
        .flag("--max-worker-id", "0")
        .flag("--handover-delay", "1500ms")
        .spawn();
    let lease = first.wait_for_lease(secs(10));
    let key = worker_key("orders", 0);
    let second = Sidecar::worker(&redis, "orders")
        .flag("--max-worker-id", "0")
        .name("second")
        .spawn();
    assert!(
        second.wait_for_log("all worker IDs are held", secs(10)),
        "second sidecar must be waiting"
    );

    first.signal(Signal::SIGTERM);
    let status = first.wait_exit(secs(5)).expect("exit within 5 s");
    assert_eq!(status.code(), Some(0));
    let exited = Instant::now();
    let (value, pttl) = redis.get_with_pttl(&key);
    assert_eq!(value, Some(format!("released:{}", lease.owner)));
    assert!((1..=1500).contains(&pttl), "tombstone PTTL {pttl}");

    // Sample the second sidecar first, then the key: published while the tombstone still
    // stands afterwards means it claimed over the tombstone.
    let got = poll_some(secs(15), || {
        let id = second.id();
        let tombstone = redis.get(&key).is_some_and(|v| v.starts_with("released:"));
        assert!(
            !(id.is_some() && tombstone),
            "claimed over a tombstone: {id:?}"
        );
        id
    })
    .expect("the ID is claimable once the tombstone expired");
    assert_eq!(got.worker_id, 0);
    assert_eq!(redis.get(&key), Some(got.owner));
    assert!(
        exited.elapsed() >= ms(pttl as u64).saturating_sub(ms(50)),
        "published {:?} after the release, tombstone had {pttl} ms left",
        exited.elapsed()
    );
}
