//! Redis ACL: the minimal rules of docs/operations.md ("Redis ACL") are enough, and a user
//! lacking a needed permission gets a clear error at start.

use crate::harness::*;

/// Worker mode, as documented: scripts by SHA (loaded at start), the commands the scripts
/// call, only the app's lease keys.
pub(crate) const WORKER_RULES: &str = "resetkeys ~snowflake:worker:* resetchannels -@all +evalsha +script|load +type +get +mget +set +pexpire +del +time +info +role +scan +wait";

/// `status`, as documented: read-only key access, three read commands.
pub(crate) const STATUS_RULES: &str =
    "resetkeys %R~snowflake:worker:* resetchannels -@all +type +pttl +get +time +info +role";

/// Pool mode for pool `proxies`, as documented: scripts by SHA, the commands the pool
/// scripts call, only that pool's keys (braces are literal in ACL key patterns).
/// The rule of `budget take` and `budget penalize` (docs/operations.md, "Redis ACL").
const BUDGET_RULES: &str = "resetkeys ~snowlease:budget:* resetchannels -@all +evalsha +script|load \
    +info +role +time +type +get +set";

pub(crate) const POOL_RULES: &str = "resetkeys ~{proxies}:* resetchannels -@all +evalsha +script|load \
    +info +role +time +type +exists +get +set +incr +hget +hset +hdel +hexists +hlen +hgetall +sadd +srem \
    +scard +sismember +smembers +zadd +zrem +zcard +zcount +zrange +zrangebyscore +zscore +bgsave";

/// Creates ACL user `user` (password `pw`) with `rules` and returns a URL that logs in as it.
pub(crate) fn acl_user(redis: &RedisServer, user: &str, rules: &str) -> String {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(user)
        .arg("reset")
        .arg("on")
        .arg(">pw");
    for rule in rules.split_whitespace() {
        cmd.arg(rule);
    }
    let _: () = redis.query(&mut cmd);
    format!("redis://{user}:pw@127.0.0.1:{}", redis.port())
}

/// Entries of `ACL LOG` (denied commands and keys), as text, but for `CONFIG GET`: the
/// persistence advice tries it and expects the refusal (the documented rules leave it out,
/// as `CONFIG GET` also reads secrets such as `requirepass`).
pub(crate) fn acl_log(redis: &RedisServer) -> Vec<String> {
    let entries: Vec<redis::Value> = redis.query(redis::cmd("ACL").arg("LOG"));
    entries
        .iter()
        .map(|e| format!("{e:?}"))
        .filter(|e| !e.contains("config|get"))
        .collect()
}

/// The minimal worker rules cover a whole lease life: claim, renew, re-create after key loss,
/// reload after SCRIPT FLUSH, release at SIGTERM; Redis denies nothing on the way.
#[test]
fn worker_runs_with_the_minimal_acl() {
    let redis = RedisServer::start();
    let url = acl_user(&redis, "snowlease", WORKER_RULES);
    let mut sidecar = Sidecar::worker_at(&url, "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    let key = worker_key("orders", lease.worker_id);
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));

    let _: () = redis.query(redis::cmd("DEL").arg(&key));
    assert!(
        poll_until(secs(3), || redis.get(&key).as_deref()
            == Some(lease.owner.as_str())),
        "key re-created by the renew script"
    );
    let _: () = redis.query(redis::cmd("SCRIPT").arg("FLUSH"));
    let renewed = sidecar
        .metric("snowlease_renewals_total{outcome=\"renewed\"}")
        .unwrap_or(0.0);
    assert!(poll_until(secs(3), || sidecar
        .metric("snowlease_renewals_total{outcome=\"renewed\"}")
        .unwrap_or(0.0)
        > renewed + 1.0));
    assert_eq!(sidecar.id().map(|l| l.worker_id), Some(lease.worker_id));

    sidecar.signal(Signal::SIGTERM);
    assert_eq!(sidecar.wait_exit(secs(5)).and_then(|s| s.code()), Some(0));
    // Released with the release script: a tombstone (its SET is allowed).
    crate::handover::assert_tombstone(&redis, &key);
    assert_eq!(acl_log(&redis), Vec::<String>::new(), "nothing denied");
}

/// A user without SCRIPT LOAD / EVALSHA: the sidecar stops at start with exit 1 and an error
/// naming the refused command, having written nothing.
#[test]
fn worker_without_script_permissions_fails_at_start() {
    let redis = RedisServer::start();
    let rules = WORKER_RULES.replace(" +evalsha +script|load", "");
    let url = acl_user(&redis, "noscripts", &rules);
    let mut sidecar = Sidecar::worker_at(&url, "orders")
        .flag("--claim-timeout", "5m")
        .spawn();
    let status = sidecar
        .wait_exit(secs(5))
        .expect("exits at once, not at --claim-timeout");
    assert_eq!(status.code(), Some(1));
    let log = sidecar.log_lines().join("\n");
    assert!(log.contains("redis refused"), "{log}");
    assert!(log.to_lowercase().contains("noperm"), "{log}");
    assert!(log.contains("script|load"), "names the command: {log}");
    assert!(!log.contains(":pw@"), "password hidden: {log}");
    assert_no_kind_names(&log);
    assert_eq!(redis.dbsize(), 0);
    assert!(!sidecar.output_file().exists());
}

/// A user without PEXPIRE (called only inside the scripts, which SCRIPT LOAD does not check)
/// fails at start, exit 1, with PEXPIRE named by the start-up probe, before any ID is published.
#[test]
fn worker_without_pexpire_fails_at_start() {
    let redis = RedisServer::start();
    let rules = WORKER_RULES.replace(" +pexpire", "");
    let url = acl_user(&redis, "limited", &rules);
    let mut sidecar = Sidecar::worker_at(&url, "orders").spawn();
    let status = sidecar.wait_exit(secs(5)).expect("exits at start");
    assert_eq!(status.code(), Some(1));
    let log = sidecar.log_lines().join("\n");
    assert!(
        log.to_lowercase().contains("pexpire"),
        "names the command: {log}"
    );
    assert_eq!(
        sidecar.count_log("lease acquired"),
        0,
        "never published: {log}"
    );
}

/// A user without INFO: the eviction check at start is refused, exit 1 naming `+info`, before
/// any key is written.
#[test]
fn worker_without_info_fails_at_start() {
    let redis = RedisServer::start();
    let rules = WORKER_RULES.replace(" +info", "");
    let url = acl_user(&redis, "noinfo", &rules);
    let mut sidecar = Sidecar::worker_at(&url, "orders").spawn();
    let status = sidecar.wait_exit(secs(5)).expect("exits at start");
    assert_eq!(status.code(), Some(1));
    let log = sidecar.log_lines().join("\n");
    assert!(log.contains("needs +info"), "names the command: {log}");
    assert_eq!(redis.dbsize(), 0, "nothing written");
}

/// `--min-replicas-ack 1` on a primary with one replica: the documented rule (with `+wait`)
/// covers the WAIT after the claim and each renew; Redis denies nothing and the ID is published.
#[test]
fn worker_with_min_replicas_ack_runs_with_the_minimal_acl() {
    let redis = RedisServer::start();
    let _replica = RedisServer::start_with(RedisOptions {
        args: vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            redis.port().to_string(),
        ],
        name: "replica".into(),
        ..RedisOptions::default()
    });
    assert!(
        redis.wait_info("replication", "connected_slaves", "1", secs(10)),
        "replica linked"
    );
    let url = acl_user(&redis, "snowlease", WORKER_RULES);
    let sidecar = Sidecar::worker_at(&url, "orders")
        .flag("--min-replicas-ack", "1")
        .spawn();
    sidecar.wait_for_lease(secs(10));
    assert!(poll_until(secs(5), || sidecar
        .metric("snowlease_renewals_total{outcome=\"renewed\"}")
        .unwrap_or(0.0)
        >= 2.0));
    assert!(
        redis.command_calls("wait") >= 3,
        "WAIT after claim and renews"
    );
    assert_eq!(acl_log(&redis), Vec::<String>::new(), "nothing denied");
}

/// A user without `+wait` and `--min-replicas-ack 1`: the start-up probe's WAIT is refused,
/// exit 1 naming `+wait`, before any ID is claimed. Without the flag the same user runs.
#[test]
fn worker_without_wait_fails_at_start_with_min_replicas_ack() {
    let redis = RedisServer::start();
    let rules = WORKER_RULES.replace(" +wait", "");
    let url = acl_user(&redis, "nowait", &rules);
    let mut sidecar = Sidecar::worker_at(&url, "orders")
        .flag("--min-replicas-ack", "1")
        .spawn();
    let status = sidecar.wait_exit(secs(5)).expect("exits at start");
    assert_eq!(status.code(), Some(1));
    let log = sidecar.log_lines().join("\n");
    assert!(log.contains("needs +wait"), "names the command: {log}");
    assert_eq!(
        redis.keys("snowflake:worker:orders:[0-9]*"),
        Vec::<String>::new()
    );
    Sidecar::worker_at(&url, "orders")
        .spawn()
        .wait_for_lease(secs(10));
}

/// `mint carry-over` with the worker rule plus `+bgsave` (docs/operations.md)
/// on a Redis with snapshots: nothing denied, and it says a snapshot holds its writes. With
/// the worker rule alone it still exits 0, saying the durability is unchecked and what to do.
#[test]
fn carry_over_runs_with_the_documented_rule() {
    let redis = RedisServer::start_with(RedisOptions {
        args: ["--save", "3600 1"].map(String::from).to_vec(),
        ..RedisOptions::default()
    });
    let carry = |url: &str| crate::mint_edges::carry_over(url, &[]);
    let rule = format!("{WORKER_RULES} +bgsave");
    let run = carry(&acl_user(&redis, "carrier", &rule));
    assert_eq!(run.code, Some(0), "{run:?}");
    let line: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert!(
        line["durable"]
            .as_str()
            .unwrap()
            .contains("a snapshot started after them finished"),
        "{line}"
    );
    assert_eq!(acl_log(&redis), Vec::<String>::new(), "nothing denied");

    let run = carry(&acl_user(&redis, "plain", WORKER_RULES));
    assert_eq!(run.code, Some(0), "{run:?}");
    let line: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert!(line["durable"].is_null(), "{line}");
    assert!(run.stderr.contains("durability is unchecked"), "{run:?}");
}

/// `status` works with read-only key access (`%R~`), and that user cannot write a lease key.
#[test]
fn status_runs_with_a_read_only_acl() {
    let redis = RedisServer::start();
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(worker_key("orders", 2))
            .arg("10.0.0.1#00000000000000ab")
            .arg("PX")
            .arg(60_000),
    );
    let url = acl_user(&redis, "viewer", STATUS_RULES);
    let run = run_snowlease(
        &["status", "--app", "orders", "--redis-url", &url, "--json"],
        &[],
        secs(15),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(report["held"], 1);
    assert_eq!(report["leases"][0]["owner"], "10.0.0.1#00000000000000ab");
    assert_eq!(acl_log(&redis), Vec::<String>::new(), "nothing denied");

    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_connection_with_timeout(secs(2)).unwrap();
    let write: redis::RedisResult<()> = redis::cmd("SET")
        .arg(worker_key("orders", 3))
        .arg("x")
        .query(&mut conn);
    assert!(write.is_err(), "the status user cannot write");
}

/// `status` where `INFO` is refused cannot judge the guard's node stamp: it says so (text and
/// `claim_guard_stamps_checked: false`) instead of showing the guard as plainly open.
#[test]
fn status_without_info_says_the_guard_stamps_are_unchecked() {
    let redis = RedisServer::start();
    assert_eq!(guard_open(&redis.url(), "orders", &[]).code, Some(0));
    let url = acl_user(&redis, "blind", &STATUS_RULES.replace(" +info", ""));
    let run = |extra: &[&str]| {
        let mut args = vec!["status", "--app", "orders", "--redis-url", &url];
        args.extend_from_slice(extra);
        run_snowlease(&args, &[], secs(15))
    };
    let json = run(&["--json"]);
    assert_eq!(json.code, Some(0), "{json:?}");
    let report: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(report["claim_guard_stamps_checked"], false, "{json:?}");
    assert!(run(&[]).stdout.contains("claim guard stamps not checked"));
}

/// `status` with a user lacking PTTL: exit 1 with an error naming the command.
#[test]
fn status_without_permission_names_the_command() {
    let redis = RedisServer::start();
    let url = acl_user(&redis, "partial", &STATUS_RULES.replace(" +pttl", ""));
    let run = run_snowlease(
        &["status", "--app", "orders", "--redis-url", &url],
        &[],
        secs(15),
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("pttl"), "{run:?}");
    // Redis' own words, once, without redis-rs' kind names (it said
    // "NoPerm: this user has no permissions ...").
    assert!(
        run.stderr
            .contains("NOPERM this user has no permissions to run the 'pttl' command"),
        "{run:?}"
    );
    assert_no_kind_names(&run.stderr);
}

/// redis-rs' debug names of its error kinds never reach people: `Server(NoPerm)`,
/// `NoPerm:`, `- AuthenticationFailed`, `- InvalidClientConfig`.
pub(crate) fn assert_no_kind_names(text: &str) {
    for kind in [
        "Server(",
        "NoPerm",
        "AuthenticationFailed",
        "InvalidClientConfig",
        "MasterNameNotFoundBySentinel",
    ] {
        assert!(!text.contains(kind), "{kind} shown: {text}");
    }
}

/// `snowlease pool <command> --pool <pool> --redis-url <url> <args>`; panics unless it exits 0.
fn pool_cli(url: &str, command: &str, pool: &str, args: &[&str]) -> serde_json::Value {
    let mut argv = vec!["pool", command, "--pool", pool, "--redis-url", url];
    argv.extend_from_slice(args);
    let run = run_snowlease(&argv, &[], secs(15));
    assert_eq!(run.code, Some(0), "{argv:?}: {run:?}");
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{argv:?}: {e}: {run:?}"))
}

/// The documented pool rules cover every pool command (init, add, acquire with a request id,
/// extend, release, reap, disable, enable, status) with nothing denied; the user cannot reach
/// another pool, and without SCRIPT LOAD the first command names the refused command.
#[test]
fn pool_cli_runs_with_the_minimal_acl() {
    let redis = RedisServer::start();
    let url = acl_user(&redis, "pool", POOL_RULES);
    let strikes = ["--max-strikes", "3", "--strike-window", "1h"];
    pool_cli(
        &url,
        "init",
        "proxies",
        &[&["--ids", "a,b,c"][..], &strikes].concat(),
    );
    pool_cli(&url, "config", "proxies", &strikes);
    pool_cli(&url, "add", "proxies", &["--ids", "d"]);
    let lease = pool_cli(
        &url,
        "acquire",
        "proxies",
        &["--ttl", "10s", "--request-id", "r1"],
    );
    let (id, token) = (
        lease["id"].as_str().unwrap(),
        lease["token"].as_str().unwrap(),
    );
    pool_cli(
        &url,
        "extend",
        "proxies",
        &["--id", id, "--token", token, "--ttl", "20s"],
    );
    pool_cli(&url, "release", "proxies", &["--id", id, "--token", token]);
    let lease = pool_cli(&url, "acquire", "proxies", &["--ttl", "10s"]);
    let (id, token) = (
        lease["id"].as_str().unwrap(),
        lease["token"].as_str().unwrap(),
    );
    let quarantine = ["--quarantine", "1h", "--reason", "banned"];
    pool_cli(
        &url,
        "release",
        "proxies",
        &[&["--id", id, "--token", token][..], &quarantine].concat(),
    );
    pool_cli(&url, "reap", "proxies", &[]);
    pool_cli(&url, "disable", "proxies", &["--ids", "b"]);
    pool_cli(&url, "enable", "proxies", &["--ids", "b"]);
    let status = pool_cli(&url, "status", "proxies", &["--json"]);
    assert_eq!(
        (status["ready_due"].as_u64(), status["quarantined"].as_u64()),
        (Some(3), Some(1)),
        "{status}"
    );
    pool_cli(&url, "enable", "proxies", &["--ids", id, "--force"]);
    assert_eq!(acl_log(&redis), Vec::<String>::new(), "nothing denied");

    let run = run_snowlease(
        &["pool", "status", "--pool", "other", "--redis-url", &url],
        &[],
        secs(15),
    );
    assert_ne!(
        run.code,
        Some(0),
        "another pool's keys are out of reach: {run:?}"
    );
    assert!(run.stderr.to_lowercase().contains("noperm"), "{run:?}");
    assert_no_kind_names(&run.stderr);

    let noload = acl_user(&redis, "noload", &POOL_RULES.replace(" +script|load", ""));
    let _: () = redis.query(redis::cmd("SCRIPT").arg("FLUSH"));
    let run = run_snowlease(
        &[
            "pool",
            "status",
            "--pool",
            "proxies",
            "--redis-url",
            &noload,
        ],
        &[],
        secs(15),
    );
    assert_ne!(run.code, Some(0), "{run:?}");
    assert!(
        run.stderr.contains("script|load"),
        "names the command: {run:?}"
    );
    assert!(!run.stderr.contains(":pw@"), "password hidden: {run:?}");
}

/// The rule docs/operations.md's ACL table gives in the row that starts with `| <row> |`:
/// its first backticked `resetkeys ...`, with the table's `\|` unescaped.
fn documented_rule(row: &str) -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let line = doc
        .lines()
        .find(|l| l.starts_with(&format!("| {row} |")))
        .unwrap_or_else(|| panic!("no ACL row {row:?} in docs/operations.md"));
    let rule = line
        .split("`resetkeys")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap_or_else(|| panic!("no rule in {line}"));
    format!("resetkeys{}", rule.replace("\\|", "|"))
}

/// The documented rules of pool, budgets and lock are the ones these tests run with.
#[test]
fn documented_rules_are_the_tested_ones() {
    assert_eq!(documented_rule("pool `proxies`"), POOL_RULES);
    assert_eq!(
        documented_rule("`budget take`, `budget penalize`"),
        BUDGET_RULES
    );
}

/// The budget rule of docs/operations.md covers `budget take` and `budget penalize`; with the
/// pool rule and the budget keys, `pool serve` answers a charged acquire and the `/budgets`
/// routes: nothing denied (the rules had no row for budgets).
#[test]
fn budgets_and_pool_serve_run_with_the_documented_rules() {
    let redis = RedisServer::start();
    let url = acl_user(&redis, "budget", BUDGET_RULES);
    let limit = ["--rate", "10/s", "--burst", "5"];
    for command in ["take", "penalize"] {
        let mut args = vec![command, "--name", "crawl", "--key", "example.com"];
        args.extend_from_slice(&limit);
        if command == "penalize" {
            args.extend_from_slice(&["--penalty", "2s"]);
        }
        let run = crate::budget::budget_cmd(&url, &args);
        assert_eq!(run.code, Some(0), "{command}: {run:?}");
    }
    assert_eq!(
        acl_log(&redis),
        Vec::<String>::new(),
        "budget: nothing denied"
    );

    let serve_rules = format!("{POOL_RULES} ~snowlease:budget:*");
    let url = acl_user(&redis, "serve", &serve_rules);
    pool_cli(&url, "init", "proxies", &["--ids", "a,b"]);
    let serve = crate::pool_http::Serve::start_at(&url, &["--pool", "proxies"]);
    assert!(poll_until(secs(10), || serve
        .call("GET", "/readyz", None)
        .0
        == 200));
    let budget =
        serde_json::json!({"name": "crawl", "key": "example.com", "rate": "10/s", "burst": 5});
    let (status, body, _) = serve.call(
        "POST",
        "/pools/proxies/leases",
        Some(serde_json::json!({"ttl_ms": 10000, "budget": budget})),
    );
    assert_eq!(status, 201, "{body}");
    let (status, body, _) = serve.call(
        "POST",
        "/budgets/crawl/take",
        // Not example.com: the penalty above still holds it back.
        Some(serde_json::json!({"key": "example.org", "rate": "10/s", "burst": 5})),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        acl_log(&redis),
        Vec::<String>::new(),
        "pool serve: nothing denied"
    );
}

/// The rule of the deploy steps (docs/kubernetes.md, "Deploy, step by step", step 2), read
/// from the `ACL SETUSER snowlease on >PASSWORD ...` line of README.md or of a file under docs/.
pub(crate) fn deploy_steps_rule() -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    if let Ok(docs) = std::fs::read_dir(root.join("docs")) {
        files.extend(docs.flatten().map(|e| e.path()));
    }
    let prefix = "ACL SETUSER snowlease on >PASSWORD ";
    let rules: Vec<String> = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|l| l.trim().strip_prefix(prefix).map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(rules.len(), 1, "one deploy-steps ACL line: {rules:?}");
    rules[0].clone()
}

/// The exact ACL rule of the deploy steps covers every command those steps run:
/// `guard open` on a fresh Redis, the sidecar's whole lease life, `snowlease id` and
/// `snowlease status` with the sidecar's URL; Redis denies nothing.
#[test]
fn deploy_steps_rule_covers_every_step() {
    let redis = RedisServer::start();
    let url = acl_user(&redis, "snowlease", &deploy_steps_rule());
    let guard = run_snowlease(
        &["guard", "open", "--app", "orders", "--redis-url", &url],
        &[],
        secs(15),
    );
    assert_eq!(guard.code, Some(0), "{guard:?}");
    let mut sidecar = Sidecar::worker_at(&url, "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(10));

    let file = sidecar.output_file().to_string_lossy().into_owned();
    let id = run_snowlease(&["id", "--file", &file, "--wait", "5s"], &[], secs(10));
    assert_eq!(id.stdout.trim(), lease.worker_id.to_string(), "{id:?}");
    let status = run_snowlease(
        &["status", "--app", "orders", "--json"],
        &[("REDIS_URL", &url)],
        secs(15),
    );
    assert_eq!(status.code, Some(0), "{status:?}");
    let report: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(report["held"], 1, "{report}");

    sidecar.signal(Signal::SIGTERM);
    assert_eq!(sidecar.wait_exit(secs(5)).and_then(|s| s.code()), Some(0));
    assert_eq!(acl_log(&redis), Vec::<String>::new(), "nothing denied");
}
