//! `--max-clock-skew` with a real clock difference: the sidecar
//! runs under libfaketime (Debian package `faketime`), its wall clock offset by the contents
//! of a timestamp file the test rewrites; Redis keeps the machine's clock. The boot clock,
//! which lease validity uses, is left alone (`FAKETIME_DONT_FAKE_MONOTONIC`).

use std::path::Path;

use crate::harness::*;

const APP: &str = "skew";

/// A worker whose wall clock is offset by what `stamp` says (e.g. `+2s`, `+0`).
fn skewed_worker(redis: &RedisServer, stamp: &Path) -> Sidecar {
    Sidecar::worker(redis, APP)
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", stamp)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .spawn()
}

pub(crate) fn set_offset(stamp: &Path, offset: &str) {
    std::fs::write(stamp, format!("{offset}\n")).expect("write the faketime file");
}

fn skew_gauge(sidecar: &Sidecar) -> Option<f64> {
    sidecar.metric("snowlease_clock_skew_seconds")
}

/// A sidecar 2 s ahead of Redis claims (the key is its own) but publishes nothing, says why on
/// /id and /readyz, and reports the skew; once its clock agrees with Redis it publishes. A
/// sidecar with the right clock beside it publishes at once.
#[test]
fn new_id_is_not_published_while_the_clock_is_skewed() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");
    set_offset(&stamp, "+2s");
    let skewed = skewed_worker(&redis, &stamp);
    let skew =
        poll_some(secs(10), || skew_gauge(&skewed).filter(|s| *s != 0.0)).expect("skew gauge set");
    assert!((1.7..2.3).contains(&skew), "skew gauge {skew}");
    let (status, body) = skewed.get_id();
    assert_eq!(status, 503, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["state"], "clock_skew", "{body}");
    let skew_ms = body["clock_skew_ms"].as_i64().unwrap();
    assert!((1700..2300).contains(&skew_ms), "{body}");
    assert_eq!(skewed.readyz(), 503);
    assert!(skewed.wait_for_log("beyond --max-clock-skew", secs(5)));

    let straight = Sidecar::worker(&redis, APP).name("straight").spawn();
    straight.wait_for_lease(secs(10));
    let skew = skew_gauge(&straight).unwrap();
    assert!(skew.abs() < 0.3, "right clock, skew {skew}");

    // Still skewed after more than a TTL: never published.
    std::thread::sleep(secs(2));
    assert_eq!(skewed.id(), None);
    assert_eq!(skewed.read_output_file(), None);
    set_offset(&stamp, "+0");
    skewed.wait_for_lease(secs(10));
}

/// A held ID stays published when the clock steps 2 s ahead (docs/worker.md, "Guarantees"): the skew
/// is logged and reported, the renewals go on.
#[test]
fn held_id_stays_published_when_the_clock_steps() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");
    set_offset(&stamp, "+0");
    let sidecar = skewed_worker(&redis, &stamp);
    let lease = sidecar.wait_for_lease(secs(10));
    set_offset(&stamp, "+2s");
    assert!(
        poll_until(secs(5), || skew_gauge(&sidecar).is_some_and(|s| s > 1.7)),
        "skew seen at a renew"
    );
    assert!(sidecar.wait_for_log("beyond --max-clock-skew", secs(5)));
    for _ in 0..30 {
        assert_eq!(sidecar.id().map(|l| l.worker_id), Some(lease.worker_id));
        std::thread::sleep(ms(100));
    }
}
