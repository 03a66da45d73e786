//! The worker's start-up line on what its lease settings ride through
//! (docs/operations.md, "Sizing for Redis outages"; the computation's unit tests are in
//! src/worker_id/keeper/sizing.rs).

use crate::harness::*;

/// With the defaults (TTL 120 s, renew 60 s, 3 retries) the worker logs at start that it
/// rides through a 53 s Redis outage (113 s when it starts right after a renew) and that a
/// crashed pod's ID stays taken 60-120 s, with the settings beside the figures.
#[test]
fn worker_logs_the_outage_its_settings_ride_through() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "120s")
        .flag("--renew-interval", "60s")
        .flag("--retries", "3")
        .spawn();
    assert!(
        sidecar.wait_for_log("outage_ridden_ms", secs(10)),
        "{:?}",
        sidecar.log_lines()
    );
    // The harness's sidecars log JSON.
    let line: serde_json::Value = sidecar
        .log_lines()
        .iter()
        .find(|l| l.contains("outage_ridden_ms"))
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("a JSON log line");
    for (field, value) in [
        ("ttl_ms", 120_000),
        ("renew_interval_ms", 60_000),
        ("retries", 3),
        ("outage_ridden_ms", 53_000),
        ("outage_ridden_best_ms", 113_000),
        ("crashed_pod_id_taken_min_ms", 60_000),
        ("crashed_pod_id_taken_max_ms", 120_000),
    ] {
        assert_eq!(line[field], value, "{field}: {line}");
    }
    // The text says the values too (it named the fields: "an outage of outage_ridden_ms").
    let message = line["message"].as_str().unwrap();
    assert!(message.contains("outage of 53.0s (113.0s if"), "{message}");
}

/// In mint mode the same line adds what minting rides through: the last reservation's lead,
/// `--mint-window`.
#[test]
fn mint_worker_logs_the_outage_minting_rides_through() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .switch("--mint")
        .flag("--mint-window", "700ms")
        .spawn();
    assert!(sidecar.wait_for_log("mint_outage_ridden_ms", secs(10)));
    let line: serde_json::Value = sidecar
        .log_lines()
        .iter()
        .find(|l| l.contains("mint_outage_ridden_ms"))
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("a JSON log line");
    assert_eq!(line["mint_outage_ridden_ms"], 700, "{line}");
    let message = line["message"].as_str().unwrap();
    assert!(message.contains("503 reserving"), "{message}");
    assert!(message.contains("at most 0.7s of it"), "{message}");
}
