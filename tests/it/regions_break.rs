//! Attempts to break `--worker-ids` and the ranges record (`<prefix><app>:ranges`) on real
//! Redis servers and sidecars.

use crate::harness::*;

/// A ranges record far longer than sidecars write (200,000 entries, 5.5 MB, put there by
/// hand or by a broken client) is only a report: the sidecar claims from its range and
/// overwrites the record unread, keeping none of its entries, instead of parsing and sorting
/// all of them inside a script (about 0.7 s with Redis blocked, which timed out the renewals
/// of every sidecar on that Redis).
#[test]
fn an_oversized_ranges_record_is_overwritten_unread() {
    let app = "bigrecord";
    let redis = RedisServer::start();
    redis.open_claim_guard(app);
    let key = format!("{PREFIX}{app}:ranges");
    let huge: Vec<String> = (0..200_000u32)
        .map(|i| format!("{}-{}:99999999999999", i % 1024, i % 1024))
        .collect();
    let _: () = redis.query(redis::cmd("SET").arg(&key).arg(huge.join(",")));

    let sidecar = Sidecar::worker(&redis, app)
        .flag("--worker-ids", "3-5")
        .spawn();
    let id = sidecar.wait_for_lease(secs(10)).worker_id;
    assert!((3..=5).contains(&id), "{id}");
    let record = poll_some(secs(10), || {
        redis.get(&key).filter(|value| value.len() < 100_000)
    })
    .expect("the record is rewritten");
    assert!(
        record.starts_with("3-5:") && !record.contains(','),
        "only our entry, none read from the oversized record: {record}"
    );
}
