//! `snowlease status`: the leases of an app as Redis holds them, read-only.

use serde_json::Value;

use crate::harness::*;
use crate::pool::dump;

fn status(redis_url: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "status",
        "--app",
        "orders",
        "--redis-url",
        redis_url,
        "--max-worker-id",
        "7",
    ];
    args.extend_from_slice(extra);
    run_snowlease(&args, &[], secs(15))
}

/// `status` against a Redis with a held lease, an expiring-soon key, a key without expiry and a
/// wrong-type key: owner strings, TTLs, the wrong type marked, the free count; nothing written,
/// no TTL extended.
#[test]
fn status_reports_held_expiring_and_wrong_type_keys() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "30s")
        .flag("--renew-interval", "10s")
        .spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    assert_eq!(lease.worker_id, 0);
    let set = |key: String, value: &str, px: Option<u64>| {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value);
        if let Some(px) = px {
            cmd.arg("PX").arg(px);
        }
        let _: () = redis.query(&mut cmd);
    };
    set(
        worker_key("orders", 3),
        "10.0.0.9#00000000000000aa",
        Some(2_000),
    );
    set(worker_key("orders", 6), "legacy-owner", None);
    let _: () = redis.query(
        redis::cmd("HSET")
            .arg(worker_key("orders", 5))
            .arg("f")
            .arg("v"),
    );
    set(worker_key("orders", 8), "outside-the-range", None);
    set(worker_key("billing", 1), "another-app", None);
    // The sidecar's one write beside the lease keys (its range, rewritten every 15 s) is done
    // before the snapshot, so the snapshot shows what status writes: nothing.
    assert!(poll_until(secs(5), || redis.exists(&format!("{PREFIX}orders:ranges"))));
    let before = dump(&redis);
    let pttl_before = redis.pttl(&worker_key("orders", 3));

    let run = status(&redis.url(), &["--json"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).expect("JSON report");
    assert_eq!(report["ids"], 8);
    assert_eq!(report["held"], 3);
    assert_eq!(report["wrong_type"], 1);
    assert_eq!(report["free"], 4);
    let leases = report["leases"].as_array().unwrap();
    let ids: Vec<u64> = leases
        .iter()
        .map(|l| l["worker_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [0, 3, 5, 6]);
    assert_eq!(leases[0]["owner"], lease.owner.as_str());
    let ttl0 = leases[0]["ttl_ms"].as_u64().unwrap();
    assert!(ttl0 > 0 && ttl0 <= 30_000, "{ttl0}");
    let ttl3 = leases[1]["ttl_ms"].as_u64().unwrap();
    assert!(ttl3 > 0 && ttl3 <= 2_000, "{ttl3}");
    assert_eq!(leases[2]["type"], "hash");
    assert!(leases[2]["owner"].is_null());
    assert!(leases[3]["ttl_ms"].is_null(), "no expiry");
    assert_eq!(report["claim_guard"]["state"], "open");
    // ID 8 is above --max-worker-id 7: not in the table, but named.
    assert_eq!(report["above_range"], serde_json::json!([8]));

    let run = status(&redis.url(), &[]);
    assert_eq!(run.code, Some(0), "{run:?}");
    // The harness's Redis has no AOF: its persistence note (tests/it/persistence.rs) aside.
    let mut lines = run.stdout.lines().filter(|l| !l.starts_with("note: "));
    assert_eq!(
        lines.next(),
        Some(
            "warning: 1 key above --max-worker-id 7 / --worker-ids 0-7 (ID 8) not shown: sidecars of the app with a larger --max-worker-id or another range hold them; pass theirs to see them"
        ),
        "{}",
        run.stdout
    );
    assert!(
        lines
            .next()
            .unwrap_or_default()
            .starts_with("app orders: 4 of 8 worker IDs free, 3 held, 1 wrong type"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains(&lease.owner), "{}", run.stdout);
    assert!(run.stdout.contains("wrong-type") && run.stdout.contains("hash"));
    assert!(
        run.stdout.contains("no expiry  legacy-owner"),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("outside-the-range") && !run.stdout.contains("another-app"));

    assert_eq!(dump(&redis), before, "status wrote nothing");
    assert!(
        redis.pttl(&worker_key("orders", 3)) <= pttl_before,
        "no TTL extended"
    );

    // The expiring key frees its ID.
    assert!(poll_until(secs(5), || !redis.exists(&worker_key("orders", 3))));
    let run = status(&redis.url(), &["--json"]);
    let report: Value = serde_json::from_str(&run.stdout).expect("JSON report");
    assert_eq!(
        (report["held"].as_u64(), report["free"].as_u64()),
        (Some(2), Some(5))
    );
}

/// The claim guard shows as missing on a fresh Redis, then closed (with the time left) once a
/// sidecar's first claim has set it.
#[test]
fn status_shows_the_claim_guard() {
    let redis = RedisServer::start();
    let run = status(&redis.url(), &["--json"]);
    let report: Value = serde_json::from_str(&run.stdout).expect("JSON report");
    assert_eq!(report["claim_guard"]["state"], "missing", "{run:?}");
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "30s")
        .flag("--renew-interval", "10s")
        .spawn();
    assert!(poll_until(secs(5), || redis.exists(&format!("{PREFIX}orders:guard"))));
    let run = status(&redis.url(), &[]);
    assert!(
        run.stdout
            .contains("claim guard closed: new claims wait another"),
        "{run:?}"
    );
    let run = status(&redis.url(), &["--json"]);
    let report: Value = serde_json::from_str(&run.stdout).expect("JSON report");
    assert_eq!(report["claim_guard"]["state"], "closed");
    let left = report["claim_guard"]["opens_in_ms"].as_u64().unwrap();
    assert!(left > 20_000 && left <= 30_000, "{left}");
    drop(sidecar);
}

/// An open guard shows as open while Redis runs the life that wrote it (status computes
/// node.lua's stamp in Rust, `REPLICAOF` count included: the two agree), and as written elsewhere after a restart from the
/// snapshot that holds it; the next claim closes it for one TTL, as status said.
#[test]
fn status_names_a_guard_written_before_a_restart() {
    let mut redis = RedisServer::start();
    // A REPLICAOF ran (as Sentinel sends one at a promotion): the stamp counts it, in both.
    let _: () = redis.query(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
    assert_eq!(guard_open(&redis.url(), "orders", &[]).code, Some(0));
    let state = |redis: &RedisServer| {
        let run = status(&redis.url(), &["--json"]);
        let report: Value = serde_json::from_str(&run.stdout).expect("JSON report");
        report["claim_guard"]["state"].as_str().unwrap().to_owned()
    };
    assert_eq!(state(&redis), "open");
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    redis.restart();
    assert_eq!(state(&redis), "written_elsewhere");
    let run = status(&redis.url(), &[]);
    assert!(
        run.stdout
            .contains("claim guard written before a Redis restart or failover"),
        "{run:?}"
    );
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "30s")
        .spawn();
    assert!(poll_until(secs(10), || state(&redis) == "closed"));
    drop(sidecar);
}

/// On a Cluster each per-ID guard is judged by the stamp of the primary that serves its slot
/// now: after the slot of ID 5's guard moved to another primary, status names that guard
/// written elsewhere (a claim of ID 5 closes it) and the other 7 open. It compared with any
/// primary's stamp and said all 8 open.
#[test]
fn status_judges_each_cluster_guard_by_its_slot_owner() {
    let topo = ClusterTopology::start();
    let url = topo.url();
    assert_eq!(
        guard_open(&url, "orders", &["--max-worker-id", "7"]).code,
        Some(0)
    );
    let guard = format!("{PREFIX}orders:guard:{{{}}}", worker_key("orders", 5));
    let slot = topo.keyslot(&guard);
    topo.migrate_slot(slot, topo.other_primary_than_owner(slot));
    let run = status(&url, &["--json"]);
    let report: Value = serde_json::from_str(&run.stdout).expect("JSON report");
    let guards = &report["claim_guard"];
    assert_eq!(guards["written_elsewhere"], 1, "{run:?}");
    assert_eq!(guards["open"], 7, "{run:?}");
}

/// Bad flags exit 2 naming the flag; an unreachable Redis exits 1 with the URL, password hidden.
#[test]
fn status_bad_input_and_unreachable_redis() {
    for (args, flag) in [
        (&["status", "--app", "a b"][..], "--app"),
        (
            &["status", "--app", "a", "--max-worker-id", "1024"][..],
            "--max-worker-id",
        ),
        (
            &["status", "--app", "a", "--redis-url", "http://h:1"][..],
            "--redis-url",
        ),
    ] {
        let run = run_snowlease(args, &[], secs(10));
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
        assert!(run.stderr.contains(flag), "{args:?}: {run:?}");
    }
    let url = format!("redis://user:s3cret@127.0.0.1:{}", free_port());
    let run = status(&url, &[]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("127.0.0.1"), "{run:?}");
    assert!(!run.stderr.contains("s3cret"), "{run:?}");
}

/// A sidecar stopped with SIGTERM leaves a tombstone for `--handover-delay`: `status` counts
/// and shows that ID as released, not held and not free.
#[test]
fn status_shows_a_released_id_apart_from_held_ones() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let mut sidecar = Sidecar::worker(&redis, "orders")
        .flag("--handover-delay", "30s")
        .spawn();
    let id = sidecar.wait_for_lease(secs(10)).worker_id;
    sidecar.signal(Signal::SIGTERM);
    assert_eq!(sidecar.wait_exit(secs(5)).and_then(|s| s.code()), Some(0));
    let run = status(&redis.url(), &["--json"]);
    let report: Value = serde_json::from_str(&run.stdout).expect("JSON report");
    assert_eq!(
        (
            report["held"].as_u64(),
            report["released"].as_u64(),
            report["free"].as_u64()
        ),
        (Some(0), Some(1), Some(7)),
        "{report}"
    );
    let text = status(&redis.url(), &[]).stdout;
    assert!(
        text.contains("0 held, 1 released (handover delay running)"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with(&format!("{id}  released"))),
        "{text}"
    );
}
