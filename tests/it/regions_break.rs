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

/// A range that starts with a minus (`-1-3`, `-5`) is refused like any other bad range: exit
/// 2 naming `--worker-ids` and 0-1023 (clap took it for an unknown flag `-1` and named
/// neither), in `worker`, `status` and `guard open`, with nothing written to Redis.
#[test]
fn a_negative_range_names_the_flag_and_the_range() {
    let redis = RedisServer::start();
    let url = redis.url();
    for range in ["-1-3", "-5"] {
        for sub in [&["worker"][..], &["status"], &["guard", "open"]] {
            let mut args: Vec<&str> = sub.to_vec();
            args.extend(["--app", "neg", "--redis-url", &url, "--worker-ids", range]);
            let run = run_snowlease(&args, &[], secs(10));
            assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
            for word in ["--worker-ids", "0-1023"] {
                assert!(
                    run.stderr.contains(word),
                    "{args:?}: {word}: {}",
                    run.stderr
                );
            }
        }
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
}

/// Numbers past 65535 are named as given: `--worker-ids 65536-70000` exits 2 saying
/// `65536-70000 reaches past 1023` (it said `65535-65535`, a range nobody typed).
#[test]
fn a_range_past_u16_is_named_as_given() {
    let redis = RedisServer::start();
    let url = redis.url();
    for range in ["65536-70000", "5-99999999999999999999"] {
        let args = [
            "worker",
            "--app",
            "big",
            "--redis-url",
            &url,
            "--worker-ids",
            range,
        ];
        let run = run_snowlease(&args, &[], secs(10));
        assert_eq!(run.code, Some(2), "{range}: {run:?}");
        for word in ["--worker-ids", range, "0-1023"] {
            assert!(run.stderr.contains(word), "{range}: {word}: {}", run.stderr);
        }
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
}

/// An entry that expires later than any sidecar writes one (two TTLs of at most 1 h each; here
/// a hand-written `0-1023` for 100 years) is dropped, not kept as the latest entry for ever: a
/// sidecar of 3-5 reports no overlap and the record holds only its own entry.
#[test]
fn a_ranges_entry_past_two_longest_ttls_is_dropped() {
    let app = "farfuture";
    let redis = RedisServer::start();
    redis.open_claim_guard(app);
    let key = format!("{PREFIX}{app}:ranges");
    let century = unix_ms() + 100 * 365 * 24 * 3_600_000;
    let _: () = redis.query(redis::cmd("SET").arg(&key).arg(format!("0-1023:{century}")));

    let sidecar = Sidecar::worker(&redis, app)
        .flag("--worker-ids", "3-5")
        .spawn();
    sidecar.wait_for_lease(secs(10));
    let record = poll_some(secs(10), || {
        redis.get(&key).filter(|value| value.starts_with("3-5:"))
    })
    .expect("the record is rewritten");
    assert!(!record.contains("0-1023"), "{record}");
    assert!(redis.pttl(&key) <= 3_600_000, "{}", redis.pttl(&key));
    assert_eq!(
        sidecar.metric("snowlease_worker_id_range_overlaps"),
        Some(0.0)
    );
    assert_eq!(sidecar.count_log("another sidecar of this app"), 0);
}

/// `snowlease status` shows the leases whatever the ranges record holds (only a report): a
/// record of another type gives a warning naming the key, a record with bytes that are not
/// UTF-8 is read for its entries; exit 0 either way (it exited 1 and showed nothing).
#[test]
fn status_shows_the_leases_whatever_the_ranges_record_holds() {
    let redis = RedisServer::start();
    let url = redis.url();
    let hash = format!("{PREFIX}rtype:ranges");
    let _: () = redis.query(redis::cmd("HSET").arg(&hash).arg("a").arg("b"));
    let bytes = format!("{PREFIX}rbytes:ranges");
    let mut value = b"0-5:99999999999999,\xff\xfe,".to_vec();
    value.extend_from_slice(b"4-9:99999999999999");
    let _: () = redis.query(redis::cmd("SET").arg(&bytes).arg(value));

    let run = run_snowlease(
        &["status", "--app", "rtype", "--redis-url", &url],
        &[],
        secs(10),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("app rtype:"), "{run:?}");
    assert!(
        run.stdout.contains(&hash),
        "the warning names the key: {run:?}"
    );
    let run = run_snowlease(
        &["status", "--app", "rtype", "--redis-url", &url, "--json"],
        &[],
        secs(10),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let json: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(json["ranges"], serde_json::json!([]), "{json}");
    assert!(run.stderr.contains(&hash), "the warning on stderr: {run:?}");

    let run = run_snowlease(
        &["status", "--app", "rbytes", "--redis-url", &url],
        &[],
        secs(10),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("share IDs 4-5"), "{run:?}");
}
