//! `snowlease pool ...` as a real process against a real redis-server: the
//! JSON it prints, exit codes 0/2/3/4, id files bigger than one script call,
//! and bad input that writes nothing.

use std::fmt::Write as _;
use std::time::Instant;

use serde_json::Value;
use snowlease::pool::PoolKeys;

use crate::harness::{RedisServer, Run, ms, poll_until, run_snowlease, secs};
use crate::pool::{check_invariants, dump, hash, redis_ms, zset};

/// Runs `snowlease pool <args>` with `REDIS_URL` (and `env`) set.
pub(crate) fn pool_cmd(redis: &RedisServer, args: &[&str], env: &[(&str, &str)]) -> Run {
    let url = redis.url();
    let mut full_env = vec![("REDIS_URL", url.as_str())];
    full_env.extend_from_slice(env);
    let mut argv = vec!["pool"];
    argv.extend_from_slice(args);
    run_snowlease(&argv, &full_env, secs(20))
}

/// Runs a command that must succeed and print one JSON object.
#[track_caller]
pub(crate) fn pool_json(redis: &RedisServer, args: &[&str]) -> Value {
    let run = pool_cmd(redis, args, &[]);
    assert_eq!(run.code, Some(0), "{args:?}: {run:?}");
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {run:?}"))
}

/// Scripts Redis has run (EVALSHA and EVAL calls that did not fail: an EVALSHA answered
/// NOSCRIPT, before the client loads the script and calls again, is not a run).
fn script_runs(redis: &RedisServer) -> u64 {
    ["evalsha", "eval"]
        .iter()
        .map(|c| redis.command_calls(c) - redis.command_stat(c, "failed_calls"))
        .sum()
}

fn ids_file(dir: &tempfile::TempDir, name: &str, ids: impl Iterator<Item = String>) -> String {
    let mut text = String::from("# one id per line\n");
    for id in ids {
        let _ = writeln!(text, "{id}");
    }
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// Round trip: init from a 2500-id file (three script calls: one init, two
/// adds; a script takes at most 1000), add 1500 more (two adds), acquire prints the
/// lease as JSON, a wrong token exits 4 and changes nothing, the right one
/// releases with its cooldown; the token never reaches stderr.
#[test]
fn cli_round_trip_from_an_ids_file() {
    let redis = RedisServer::start();
    let keys = PoolKeys::new("proxies");
    let dir = tempfile::tempdir().unwrap();
    let first = ids_file(&dir, "first", (0..2500).map(|i| format!("vn-{i:04}")));
    let runs_before = script_runs(&redis);
    let init = pool_json(&redis, &["init", "--pool", "proxies", "--ids-file", &first]);
    assert_eq!(
        script_runs(&redis) - runs_before,
        4,
        "init from 2500 ids: one init, two adds of at most 1000 ids each, and the open of the \
         new pool once its record is durable (lease/node_open.lua)"
    );
    assert_eq!(init["added"], 2500);
    let ready = zset(&redis, &keys.ready);
    assert_eq!(ready.len(), 2500);
    assert!(ready.values().all(|score| *score == 0));
    let more = ids_file(&dir, "more", (2500..4000).map(|i| format!("vn-{i:04}")));
    let runs_before = script_runs(&redis);
    assert_eq!(
        pool_json(&redis, &["add", "--pool", "proxies", "--ids-file", &more])["added"],
        1500
    );
    assert_eq!(
        script_runs(&redis) - runs_before,
        2,
        "add of 1500 ids: two adds"
    );

    let run = pool_cmd(
        &redis,
        &["acquire", "--pool", "proxies", "--ttl", "30s"],
        &[],
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let lease: Value = serde_json::from_str(&run.stdout).unwrap();
    let fields: Vec<&str> = lease
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(fields.len(), 4, "{lease}");
    let (id, token) = (
        lease["id"].as_str().unwrap(),
        lease["token"].as_str().unwrap(),
    );
    assert_eq!(lease["fence"], 1);
    assert_eq!(hash(&redis, &keys.owners)[id], token);
    assert_eq!(
        zset(&redis, &keys.leases)[id],
        lease["deadline_ms"].as_u64().unwrap()
    );
    assert!(!run.stderr.contains(token));
    check_invariants(&redis, &keys);

    let before = dump(&redis);
    let wrong = pool_cmd(
        &redis,
        &[
            "release",
            "--pool",
            "proxies",
            "--id",
            id,
            "--token",
            "0123456789abcdef",
        ],
        &[],
    );
    assert_eq!(wrong.code, Some(4), "{wrong:?}");
    assert!(wrong.stderr.contains("other_owner"), "{wrong:?}");
    assert_eq!(dump(&redis), before);

    // The right token, through its env twin (keeps it out of argv).
    let released = pool_cmd(
        &redis,
        &[
            "release",
            "--pool",
            "proxies",
            "--id",
            id,
            "--cooldown",
            "500ms",
        ],
        &[("SNOWLEASE_POOL_TOKEN", token)],
    );
    assert_eq!(released.code, Some(0), "{released:?}");
    assert!(!released.stderr.contains(token));
    let at = serde_json::from_str::<Value>(&released.stdout).unwrap()["released_at_ms"]
        .as_u64()
        .unwrap();
    assert_eq!(zset(&redis, &keys.ready)[id], at + 500);
    check_invariants(&redis, &keys);

    let status = pool_json(&redis, &["status", "--pool", "proxies", "--json"]);
    // The released id is due again once its cooldown has passed by the
    // status's own Redis time (a loaded machine may get there).
    let cooling = u64::from(status["now_ms"].as_u64().unwrap() < at + 500);
    assert_eq!(status["ready_due"], 4000 - cooling);
    assert_eq!(status["ready_cooling"], cooling);
    assert_eq!(status["leases_valid"], 0);
    assert_eq!(status["pool"], "proxies");
    let table = pool_cmd(&redis, &["status", "--pool", "proxies"], &[]);
    assert_eq!(table.code, Some(0));
    assert!(table.stdout.contains("ready, due"), "{table:?}");
    assert!(table.stdout.contains("ready, cooling down"), "{table:?}");
}

/// `acquire --wait` on a pool with nothing due exits 3 after about the
/// wait, having backed off (a bounded number of attempts, no hot loop).
#[test]
fn cli_acquire_wait_on_an_empty_pool_exits_3() {
    let redis = RedisServer::start();
    pool_json(&redis, &["init", "--pool", "p", "--ids", "only"]);
    pool_json(&redis, &["acquire", "--pool", "p", "--ttl", "30s"]);

    let before = redis.command_calls("evalsha");
    let started = Instant::now();
    let run = pool_cmd(
        &redis,
        &["acquire", "--pool", "p", "--ttl", "5s", "--wait", "800ms"],
        &[],
    );
    let took = started.elapsed();
    let attempts = redis.command_calls("evalsha") - before;
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(run.stderr.contains("--wait 800ms"), "{run:?}");
    assert!(run.stderr.contains("next id is due in"), "{run:?}");
    assert!(took >= ms(800) && took < ms(2500), "{took:?}");
    // Backoff from 10 ms doubling to 500 ms: about 7 attempts in 800 ms.
    assert!((3..=20).contains(&attempts), "{attempts} attempts");

    // Without --wait: one attempt, exit 3 at once.
    let run = pool_cmd(&redis, &["acquire", "--pool", "p", "--ttl", "5s"], &[]);
    assert_eq!(run.code, Some(3), "{run:?}");
}

/// `pool status` lists disabled and leased ids, as it lists quarantined ones, in the table and
/// in `--json` (it gave counts only); leases soonest deadline first, never a token.
#[test]
fn status_lists_disabled_and_leased_ids() {
    let redis = RedisServer::start();
    pool_json(&redis, &["init", "--pool", "p", "--ids", "a,b,c,d"]);
    pool_json(&redis, &["disable", "--pool", "p", "--ids", "d,c"]);
    let long = pool_json(&redis, &["acquire", "--pool", "p", "--ttl", "60s"]);
    let short = pool_json(&redis, &["acquire", "--pool", "p", "--ttl", "30s"]);
    let (long_id, short_id) = (long["id"].as_str().unwrap(), short["id"].as_str().unwrap());
    let status = pool_json(&redis, &["status", "--pool", "p", "--json"]);
    assert_eq!(
        status["disabled_ids"],
        serde_json::json!(["c", "d"]),
        "{status}"
    );
    let leases = status["leases"].as_array().expect("leases listed");
    let ids: Vec<&str> = leases.iter().map(|l| l["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [short_id, long_id], "soonest deadline first: {status}");
    assert_eq!(leases[0]["deadline_ms"], short["deadline_ms"], "{status}");
    assert!(leases[1]["left_ms"].as_u64().unwrap() > 30_000, "{status}");
    let table = pool_cmd(&redis, &["status", "--pool", "p"], &[]);
    assert_eq!(table.code, Some(0), "{table:?}");
    let out = &table.stdout;
    for token in [&long["token"], &short["token"]] {
        assert!(!out.contains(token.as_str().unwrap()), "token shown: {out}");
    }
    let section = |head: &str| -> Vec<String> {
        out.split("\n\n")
            .find(|s| s.starts_with(head))
            .unwrap_or_else(|| panic!("no {head:?} section: {out}"))
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap_or("").to_owned())
            .collect()
    };
    assert_eq!(section("disabled id"), ["c", "d"], "{out}");
    assert_eq!(section("leased id"), [short_id, long_id], "{out}");
}

/// `pool status` of a pool with no keys (a typo in --pool) exits 2 saying it does not exist
/// (it printed a table of zeros and exited 0); a pool whose ids are all leased still counts;
/// no start-up log line on stderr (every one-shot pool command printed the topology).
#[test]
fn status_of_a_pool_that_does_not_exist_exits_2() {
    let redis = RedisServer::start();
    let run = pool_cmd(&redis, &["status", "--pool", "nopool"], &[]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("nopool does not exist"), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    pool_json(&redis, &["init", "--pool", "p", "--ids", "only"]);
    pool_json(&redis, &["acquire", "--pool", "p", "--ttl", "30s"]);
    let status = pool_json(&redis, &["status", "--pool", "p", "--json"]);
    assert_eq!(status["leases_valid"], 1, "{status}");
    // A one-shot command keeps its start-up facts (the detected topology) to itself unless
    // SNOWLEASE_LOG asks for them.
    let quiet = pool_cmd(&redis, &["status", "--pool", "p"], &[]);
    assert_eq!(quiet.code, Some(0), "{quiet:?}");
    assert!(!quiet.stderr.contains("topology detected"), "{quiet:?}");
    let asked = [("SNOWLEASE_LOG", "info,snowlease::start=info")];
    let told = pool_cmd(&redis, &["status", "--pool", "p"], &asked);
    assert!(told.stderr.contains("topology detected"), "{told:?}");
}

/// Bad flags, ids and tokens exit 2 with a message naming the flag (and
/// never echoing a token); Redis refusals of the input (init on an existing
/// pool, an id already present, an unknown id) exit 2 too; the keyspace is
/// unchanged after each.
#[test]
fn cli_bad_input_exits_2_and_writes_nothing() {
    let redis = RedisServer::start();
    pool_json(&redis, &["init", "--pool", "p", "--ids", "a,b,c"]);
    let lease = pool_json(&redis, &["acquire", "--pool", "p", "--ttl", "60s"]);
    let id = lease["id"].as_str().unwrap().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let bad_line = ids_file(
        &dir,
        "bad",
        (0..2000).map(|i| {
            if i == 1499 {
                "bad id".into()
            } else {
                format!("n{i}")
            }
        }),
    );
    let dup_line = ids_file(&dir, "dup", ["x", "y", "x"].into_iter().map(String::from));
    let secret = "s".repeat(129);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["init", "--pool", "p", "--ids", "d"],
            "already initialized",
        ),
        (vec!["acquire", "--pool", "p", "--ttl", "0s"], "--ttl"),
        (vec!["acquire", "--pool", "p", "--ttl", "600001ms"], "--ttl"),
        (vec!["acquire", "--pool", "p", "--ttl", "1500us"], "--ttl"),
        (vec!["acquire", "--pool", "p"], "--ttl"),
        // --cooldown: the old name of --reclaim-cooldown, still read.
        (
            vec!["acquire", "--pool", "p", "--ttl", "1s", "--cooldown=-1s"],
            "--reclaim-cooldown",
        ),
        (
            vec!["acquire", "--pool", "p", "--ttl", "1s", "--cooldown", "11m"],
            "--reclaim-cooldown",
        ),
        (
            vec![
                "acquire",
                "--pool",
                "p",
                "--ttl",
                "1s",
                "--reclaim-cooldown",
                "11m",
            ],
            "--reclaim-cooldown",
        ),
        (vec!["acquire", "--pool", "a:b", "--ttl", "1s"], "--pool"),
        (
            vec![
                "acquire",
                "--pool",
                "p",
                "--ttl",
                "1s",
                "--request-id",
                "r/1",
            ],
            "--request-id",
        ),
        (
            vec!["release", "--pool", "p", "--id", &id, "--token", ""],
            "--token",
        ),
        (
            vec!["release", "--pool", "p", "--id", &id, "--token", &secret],
            "--token",
        ),
        (
            vec!["release", "--pool", "p", "--id", "a b", "--token", "t"],
            "--id",
        ),
        (
            vec![
                "extend", "--pool", "p", "--id", &id, "--token", "t", "--ttl", "0s",
            ],
            "--ttl",
        ),
        (vec!["add", "--pool", "p", "--ids", "d,e,d"], "--ids"),
        (
            vec!["add", "--pool", "p", "--ids-file", &bad_line],
            "line 1501",
        ),
        (
            vec!["add", "--pool", "p", "--ids-file", &dup_line],
            "--ids-file",
        ),
        (vec!["add", "--pool", "p", "--ids", "d,a"], "duplicate id a"),
        (
            vec!["disable", "--pool", "p", "--ids", "nope"],
            "unknown id nope",
        ),
        (
            vec!["add", "--pool", "p", "--ids", "d", "--ids-file", &dup_line],
            "--ids",
        ),
        (
            vec!["status", "--pool", "p", "--redis-url", "http://x"],
            "--redis-url",
        ),
        (vec!["reap", "--pool", "p", "--limit", "1001"], "--limit"),
        (
            vec!["serve", "--pool", "p", "--reap-interval", "0s"],
            "--reap-interval",
        ),
    ];
    let before = dump(&redis);
    for (args, names) in cases {
        let run = pool_cmd(&redis, &args, &[]);
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
        assert!(
            run.stderr.contains(names),
            "{args:?} should name {names}: {run:?}"
        );
        assert!(!run.stderr.contains(&secret), "{args:?} echoed the token");
        assert_eq!(dump(&redis), before, "{args:?} wrote to Redis");
    }
}

/// Extend moves the deadline and stops at --max-lease (capped); reap
/// returns an expired lease; a late release of it exits 4 ("expired");
/// disable keeps an id out until enable.
#[test]
fn cli_extend_reap_disable_enable() {
    let redis = RedisServer::start();
    let keys = PoolKeys::new("p");
    pool_json(&redis, &["init", "--pool", "p", "--ids", "a"]);
    let lease = pool_json(
        &redis,
        &["acquire", "--pool", "p", "--ttl", "1s", "--max-lease", "3s"],
    );
    let token = lease["token"].as_str().unwrap();
    let extend = |ttl: &str| {
        pool_json(
            &redis,
            &[
                "extend",
                "--pool",
                "p",
                "--id",
                "a",
                "--token",
                token,
                "--ttl",
                ttl,
                "--max-lease",
                "3s",
            ],
        )
    };
    let first = lease["deadline_ms"].as_u64().unwrap();
    let extended = extend("2s");
    assert_eq!(extended["capped"], false);
    assert!(extended["deadline_ms"].as_u64().unwrap() > first);
    let capped = extend("10s");
    assert_eq!(capped["capped"], true);
    assert_eq!(capped["deadline_ms"].as_u64().unwrap(), first - 1000 + 3000);

    // A short lease, expired in Redis time, then reaped.
    let run = pool_cmd(
        &redis,
        &["release", "--pool", "p", "--id", "a", "--token", token],
        &[],
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let short = pool_json(&redis, &["acquire", "--pool", "p", "--ttl", "50ms"]);
    let deadline = short["deadline_ms"].as_u64().unwrap();
    assert!(poll_until(secs(5), || redis_ms(&redis) > deadline));
    let late = pool_cmd(
        &redis,
        &[
            "release",
            "--pool",
            "p",
            "--id",
            "a",
            "--token",
            short["token"].as_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(late.code, Some(4), "{late:?}");
    assert!(late.stderr.contains("expired"), "{late:?}");
    let reaped = pool_json(&redis, &["reap", "--pool", "p", "--cooldown", "0s"]);
    assert_eq!(reaped["reclaimed"], 1);
    assert_eq!(reaped["ids"][0], "a");
    assert_eq!(reaped["still_expired"], 0);
    check_invariants(&redis, &keys);

    assert_eq!(
        pool_json(&redis, &["disable", "--pool", "p", "--ids", "a"])["disabled"],
        1
    );
    let run = pool_cmd(&redis, &["acquire", "--pool", "p", "--ttl", "1s"], &[]);
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(
        run.stderr.contains("no id will become due by itself"),
        "{run:?}"
    );
    assert_eq!(
        pool_json(&redis, &["status", "--pool", "p", "--json"])["disabled"],
        1
    );
    assert_eq!(
        pool_json(&redis, &["enable", "--pool", "p", "--ids", "a"])["enabled"],
        1
    );
    let again = pool_json(&redis, &["acquire", "--pool", "p", "--ttl", "1s"]);
    assert_eq!(again["id"], "a");
    assert_eq!(again["fence"], 3);
}

/// `pool acquire | (exit)`: stdout closed before the lease JSON could be written. Nobody got the
/// token, so the id is released at once (not left leased until its deadline), and the command
/// exits 1 without a panic.
#[test]
fn acquire_with_closed_stdout_leaves_no_lease_behind() {
    use std::process::{Command, Stdio};
    let redis = RedisServer::start();
    pool_json(&redis, &["init", "--pool", "p", "--ids", "a"]);
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    drop(read_end);
    let out = Command::new(crate::harness::BIN)
        .args(["pool", "acquire", "--pool", "p", "--ttl", "10m"])
        .env("REDIS_URL", redis.url())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let status = pool_json(&redis, &["status", "--pool", "p", "--json"]);
    assert_eq!(status["leases_valid"], 0, "{status}");
    assert_eq!(status["ready_due"], 1, "{status}");
}
