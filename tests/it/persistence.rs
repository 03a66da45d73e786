//! A Redis whose persistence can bring it back older (AOF off: a restart loads any
//! `dump.rdb`; AOF without `appendfsync always`) is named by `status` (a note,
//! `"persistence"` in `--json`) and by one WARN in the sidecar's start log; one that cannot
//! is not; where `CONFIG` is refused nothing is said and nothing fails.

use serde_json::Value;

use crate::acl::{STATUS_RULES, WORKER_RULES, acl_user};
use crate::harness::*;

/// What the sidecar's start-up warning and `status`'s note both say.
const NAMED: &str = "redis persistence can roll back";

fn redis_with(args: &[&str]) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        args: args.iter().map(|a| a.to_string()).collect(),
        ..RedisOptions::default()
    })
}

fn status(url: &str, json: bool) -> Run {
    let mut args = vec!["status", "--app", "orders", "--redis-url", url];
    if json {
        args.push("--json");
    }
    let run = run_snowlease(&args, &[], secs(15));
    assert_eq!(run.code, Some(0), "{run:?}");
    run
}

fn persistence_json(url: &str) -> Value {
    let run = status(url, true);
    let report: Value = serde_json::from_str(&run.stdout).unwrap();
    report["persistence"].clone()
}

/// What a sidecar logged up to "lease acquired" (the advice comes before the first claim, and
/// log lines reach stderr through a queue, so the lease's own line is waited for).
fn sidecar_log(url: &str, env: &[(&str, &str)]) -> Vec<String> {
    let mut builder = Sidecar::worker_at(url, "orders");
    for (k, v) in env {
        builder = builder.env(k, v);
    }
    let sidecar = builder.spawn();
    sidecar.wait_for_lease(secs(10));
    assert!(
        sidecar.wait_for_log("lease acquired", secs(5)),
        "{:#?}",
        sidecar.log_lines()
    );
    sidecar.log_lines()
}

/// Snapshots on (`--save "3600 1"`, AOF off: a crash-restart loads a snapshot up to an hour
/// old): `status` names it in text and JSON, and the sidecar warns once at start, naming the
/// setting and what snowlease does about it.
#[test]
fn snapshots_are_named_by_status_and_the_sidecar() {
    let redis = redis_with(&["--save", "3600 1"]);
    redis.open_claim_guard("orders");
    let p = persistence_json(&redis.url());
    assert_eq!(p["rolls_back"], true, "{p}");
    assert_eq!(p["save"], "3600 1", "{p}");
    assert_eq!(p["appendonly"], "no", "{p}");
    assert_eq!(p["appendfsync"], "everysec", "{p}");
    let text = status(&redis.url(), false).stdout;
    assert!(
        text.contains(NAMED) && text.contains("save \"3600 1\""),
        "{text}"
    );

    let log = sidecar_log(&redis.url(), &[]);
    let warnings: Vec<&String> = log.iter().filter(|l| l.contains(NAMED)).collect();
    assert_eq!(warnings.len(), 1, "{log:#?}");
    let warning: Value = serde_json::from_str(warnings[0]).unwrap();
    assert_eq!(level(&warning), "WARN", "{warning}");
    let message = message(&warning);
    assert!(
        message.contains("one TTL") && message.contains("docs/rollback-design.md"),
        "{warning}"
    );
    assert!(warnings[0].contains("3600 1"), "{warning}");
}

/// AOF fsynced on every write (also with snapshots on: Redis loads the AOF) is not named; AOF
/// with `everysec` is, and so is no snapshot point with AOF off (`--save "" --appendonly no`):
/// `guard open`'s durability wait leaves a `dump.rdb`, which a restart loads (it was not named
/// before: the tour's own Redis read as one that could not roll back, and after `guard
/// open`, a claim, a SIGKILL and a restart the lease was gone while the guard was back).
#[test]
fn aof_always_is_not_named_and_no_save_point_is() {
    for args in [
        &["--appendonly", "yes", "--appendfsync", "always"][..],
        &[
            "--save",
            "3600 1",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ],
    ] {
        let redis = redis_with(args);
        redis.open_claim_guard("orders");
        let p = persistence_json(&redis.url());
        assert_eq!(p["rolls_back"], false, "{args:?}: {p}");
        let text = status(&redis.url(), false).stdout;
        assert!(!text.contains(NAMED), "{args:?}: {text}");
        let log = sidecar_log(&redis.url(), &[]);
        assert!(!log.iter().any(|l| l.contains(NAMED)), "{args:?}: {log:#?}");
    }
    let everysec = redis_with(&["--appendonly", "yes", "--appendfsync", "everysec"]);
    let p = persistence_json(&everysec.url());
    assert_eq!(p["rolls_back"], true, "{p}");
    let text = status(&everysec.url(), false).stdout;
    assert!(text.contains("appendfsync everysec"), "{text}");

    let unsaved = redis_with(&["--save", "", "--appendonly", "no"]);
    let run = run_snowlease(
        &[
            "guard",
            "open",
            "--app",
            "orders",
            "--redis-url",
            &unsaved.url(),
        ],
        &[],
        secs(30),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        unsaved.dir().join("dump.rdb").exists(),
        "guard open's snapshot"
    );
    let p = persistence_json(&unsaved.url());
    assert_eq!(p["rolls_back"], true, "{p}");
    let text = status(&unsaved.url(), false).stdout;
    assert!(
        text.contains(NAMED) && text.contains("loads the last dump.rdb on disk"),
        "{text}"
    );
}

/// An ACL user without `+config` (the documented rules) and a server whose `CONFIG` is renamed
/// away, both with snapshots on: no warning, no failure, `"persistence": null`; the sidecar
/// says why in a debug line only.
#[test]
fn config_refused_is_no_warning_and_no_failure() {
    let redis = redis_with(&["--save", "3600 1"]);
    redis.open_claim_guard("orders");
    let viewer = acl_user(&redis, "viewer", STATUS_RULES);
    assert_eq!(persistence_json(&viewer), Value::Null);
    assert!(!status(&viewer, false).stdout.contains(NAMED));
    let worker = acl_user(&redis, "snowlease", WORKER_RULES);
    let log = sidecar_log(&worker, &[("SNOWLEASE_LOG", "debug")]);
    assert!(!log.iter().any(|l| l.contains(NAMED)), "{log:#?}");
    assert!(
        log.iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .any(|e| level(&e) == "DEBUG" && message(&e).contains("persistence not judged")),
        "the refusal is a debug line: {log:#?}"
    );

    let renamed = redis_with(&["--save", "3600 1", "--rename-command", "CONFIG", ""]);
    renamed.open_claim_guard("orders");
    assert_eq!(persistence_json(&renamed.url()), Value::Null);
    let log = sidecar_log(&renamed.url(), &[]);
    assert!(!log.iter().any(|l| l.contains(NAMED)), "{log:#?}");
}

/// Cluster: every primary is read; one primary whose AOF is switched to `appendfsync
/// everysec` at run time is named, with its address, though the others fsync every write.
#[test]
fn cluster_names_the_primary_that_rolls_back() {
    let cluster = ClusterTopology::start_primaries_only();
    let primaries = cluster.primaries();
    for node in &primaries {
        let server = cluster.server(node.port);
        for (name, value) in [("appendonly", "yes"), ("appendfsync", "always")] {
            let _: () = server.query(redis::cmd("CONFIG").arg("SET").arg(name).arg(value));
        }
    }
    assert_eq!(persistence_json(&cluster.url())["rolls_back"], false);
    let last = primaries.last().expect("primaries");
    let _: () = cluster.server(last.port).query(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendfsync")
            .arg("everysec"),
    );
    let p = persistence_json(&cluster.url());
    assert_eq!(p["rolls_back"], true, "{p}");
    assert_eq!(p["appendfsync"], "everysec", "{p}");
    let node = p["node"].as_str().unwrap_or_default();
    assert!(node.ends_with(&format!(":{}", last.port)), "{p}");
}
