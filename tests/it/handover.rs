//! ID handover: a claim whose reply was lost on the wire
//! is adopted, never orphaned. That a released ID stays blocked for the handover delay is
//! shown on every topology by `scenarios::*::thirty_three_sidecars_share_thirty_two_ids`.

use crate::harness::*;

/// Asserts `key` is a release tombstone (`released:<owner>`) expiring within the default
/// 1 s handover delay: released by its owner, not deleted, not left for a TTL.
pub fn assert_tombstone(redis: &impl Keyspace, key: &str) {
    let (value, pttl) = redis.get_with_pttl(key);
    assert!(
        value.as_deref().is_some_and(|v| v.starts_with("released:")),
        "{key} must be a tombstone, is {value:?}"
    );
    assert!((1..=1000).contains(&pttl), "{key}: tombstone PTTL {pttl}");
}

/// A claim that ran in Redis but whose reply was dropped on the wire (then the connection
/// reset) is adopted by the next claim round (same ID, counted as "adopted"); no key of ours is left orphaned until its TTL.
#[test]
fn claim_with_lost_reply_is_adopted_not_orphaned() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::for_redis(&redis);
    // Claim guard closed: the first round is paused one TTL, which leaves time to arm the
    // fault before the claim that will write a key.
    // No INFO (eviction check) before the claim: its timeout would replace the connection.
    let sidecar = Sidecar::worker_at(&proxy.url(), "orders")
        .flag("--max-worker-id", "3")
        .switch("--allow-evicting-redis")
        .spawn();
    assert!(sidecar.wait_for_log("no claim guard", secs(10)));
    proxy.set_mode(Mode::DropReplies);
    // Under load the client may give up on the claim before it reaches Redis: wait for the key.
    let written = poll_some(secs(15), || {
        let keys = redis.keys(&format!("{PREFIX}orders:[0-9]*"));
        (!keys.is_empty()).then_some(keys)
    })
    .expect("the lost claim ran in Redis");
    assert_eq!(written.len(), 1, "one claim ran: {written:?}");
    assert!(
        sidecar.wait_for_log("retrying claim", secs(15)),
        "the claim's reply must be lost"
    );
    assert_eq!(sidecar.id(), None, "the sidecar cannot know it claimed");
    // A lost reply ends a real TCP connection; on a kept one the multiplexed client matches
    // every later reply to the abandoned call and never recovers (seen: timeouts for good).
    proxy.set_mode(Mode::Reset);
    proxy.set_mode(Mode::Pass);

    let lease = sidecar.wait_for_lease(secs(10));
    assert_eq!(
        vec![worker_key("orders", lease.worker_id)],
        written,
        "the key the lost claim wrote is the one adopted"
    );
    let ours: Vec<String> = redis
        .keys(&format!("{PREFIX}orders:[0-9]*"))
        .into_iter()
        .filter(|k| redis.get(k).as_deref() == Some(lease.owner.as_str()))
        .collect();
    assert_eq!(ours, written, "no other key of ours");
    assert_eq!(
        sidecar.metric(r#"snowlease_claim_attempts_total{outcome="adopted"}"#),
        Some(1.0)
    );
}
