//! A new pool's first use (docs/pool.md, "First use"): the first acquire writes the pool's
//! record closed and marked new, then waits for it to be durable (a snapshot, the replicas)
//! before it opens the pool. That wait is bounded by what is left of the caller's wait
//! (`--wait`, `wait_ms`), at least 5 s for one snapshot, at most 60 s: it was always 60 s, so
//! `pool acquire --wait 1s` and `pool serve`'s `wait_ms: 0` blocked a minute on a Redis whose
//! snapshots are slow. And `pool status` says whether acquires are open (it counted the ids of
//! a closed pool as ready, and said nothing of acquires being refused).

use std::fs;

use nix::sys::signal::{Signal, kill};
use serde_json::{Value, json};

use crate::harness::*;
use crate::pool_cli::{pool_cmd, pool_json};
use crate::pool_http::Serve;

/// Where a first use waits past the caller's wait, it waits this long (the old 60 s limit); a
/// bounded one answers well before it.
const WELL_BEFORE_60S: std::time::Duration = std::time::Duration::from_secs(30);

/// A pool written with plain commands (no `pool init`, so no record): id `a` in pool `p`.
fn plain_pool(redis: &RedisServer) {
    let _: () = redis.query(redis::cmd("ZADD").arg("{p}:ready").arg(0).arg("a"));
}

/// Runs `call` (a first acquire) while a 40 s snapshot runs (started before it, ended after
/// it): what it answered and how long it took, which must be well before the old 60 s.
fn during_slow_snapshot<T: std::fmt::Debug>(
    redis: &RedisServer,
    call: impl FnOnce() -> T,
) -> (T, std::time::Duration) {
    slow_snapshot_running(redis);
    let (answer, took) = timed(call);
    end_slow_snapshot(redis);
    assert!(
        took < WELL_BEFORE_60S,
        "answered after {took:?}: {answer:?}"
    );
    (answer, took)
}

/// Makes every snapshot slow (400 keys x 100 ms: 40 s, as a large data set) and starts one,
/// which runs when the first use begins: its wait must see that one end, then one of its own.
fn slow_snapshot_running(redis: &RedisServer) {
    redis.slow_snapshots(400, ms(100));
    let _: String = redis.query(&mut redis::cmd("BGSAVE"));
    assert!(
        redis.wait_info("persistence", "rdb_bgsave_in_progress", "1", secs(5)),
        "no snapshot running"
    );
}

/// Makes snapshots quick again and ends the slow one (its child killed, as a crash would).
fn end_slow_snapshot(redis: &RedisServer) {
    redis.slow_snapshots(0, ms(0));
    for child in child_pids(redis.pid()) {
        let _ = kill(child, Signal::SIGKILL);
    }
    assert!(
        redis.wait_info("persistence", "rdb_bgsave_in_progress", "0", secs(5)),
        "the slow snapshot still runs"
    );
}

/// `pool acquire --wait 1s` on a new pool while a 40 s snapshot runs: its first record cannot
/// be durable soon, so it exits 3 (closed, docs/pool.md) after about 5 s, the least a first
/// use waits for a snapshot. It took 60 s (the first-use wait ignored `--wait`). Once
/// snapshots are quick again, the next acquire sees the record durable and leases fence 1.
#[test]
fn a_new_pools_first_acquire_waits_about_its_wait_not_60s() {
    let redis = RedisServer::start();
    plain_pool(&redis);
    let url = redis.url();
    let (run, took) = during_slow_snapshot(&redis, || {
        run_snowlease(
            &[
                "pool", "acquire", "--pool", "p", "--ttl", "30s", "--wait", "1s",
            ],
            &[("REDIS_URL", url.as_str())],
            secs(90),
        )
    });
    assert_eq!(run.code, Some(3), "closed while not durable: {run:?}");
    assert!(
        run.stderr.contains("closed") && run.stderr.contains("new"),
        "{run:?}"
    );
    assert!(took >= secs(4), "gave the snapshot only {took:?}: {run:?}");
    let lease = pool_json(
        &redis,
        &["acquire", "--pool", "p", "--ttl", "30s", "--wait", "10s"],
    );
    assert_eq!((&lease["id"], &lease["fence"]), (&json!("a"), &json!(1)));
}

/// `pool serve`'s acquire with `wait_ms: 0` on a new pool while a 40 s snapshot runs answers
/// 503 `redis_rollback` (closed, docs/pool.md) after about 5 s, not after 60 s: a worker's
/// HTTP client gives up long before that, and its connection was held meanwhile.
#[test]
fn a_new_pools_first_acquire_over_http_with_wait_ms_0_answers_in_seconds() {
    let redis = RedisServer::start();
    plain_pool(&redis);
    let serve = Serve::start_at(&redis.url(), &["--pool", "p"]);
    assert!(poll_until(secs(10), || serve
        .call("GET", "/readyz", None)
        .0
        == 200));
    let ((status, body, retry_after), _) = during_slow_snapshot(&redis, || {
        serve.call_within(
            "POST",
            "/pools/p/leases",
            Some(json!({"ttl_ms": 30000, "wait_ms": 0})),
            secs(90),
        )
    });
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["reason"], "redis_rollback", "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
    let (status, lease, _) = serve.call(
        "POST",
        "/pools/p/leases",
        Some(json!({"ttl_ms": 30000, "wait_ms": 10000})),
    );
    assert_eq!(status, 201, "{lease}");
    assert_eq!(lease["fence"], 1, "{lease}");
}

/// `pool status` (JSON and table) and `GET /pools/p`: the gate and when it opens by time.
fn gate_of(redis: &RedisServer, serve: &Serve) -> (Value, Value, String) {
    let status = pool_json(redis, &["status", "--pool", "p", "--json"]);
    let (code, http, _) = serve.call("GET", "/pools/p", None);
    assert_eq!(code, 200, "{http}");
    assert_eq!(
        (&http["gate"], &http["closed_until_ms"]),
        (&status["gate"], &status["closed_until_ms"]),
        "HTTP {http} and CLI {status} differ"
    );
    let table = pool_cmd(redis, &["status", "--pool", "p"], &[]);
    assert_eq!(table.code, Some(0), "{table:?}");
    let line = table
        .stdout
        .lines()
        .find(|l| l.starts_with("acquires"))
        .unwrap_or_else(|| panic!("no acquires line: {}", table.stdout))
        .to_owned();
    (
        status["gate"].clone(),
        status["closed_until_ms"].clone(),
        line,
    )
}

/// `pool status` of a pool whose acquires are closed says so (it counted its ids ready and
/// nothing more): a new pool whose first record is not durable (a snapshot that fails:
/// `dump.rdb` is a folder, as a full disk) is `new` until an acquire sees the record durable,
/// then `open`; after a restart (the record of an earlier life) `rolled_back`, which status
/// only reports (it writes nothing); after the next acquire `closed` until one max lease from
/// it. `GET /pools/p` says the same.
#[test]
fn status_shows_whether_acquires_are_open() {
    let mut redis = RedisServer::start();
    let blocker = redis.dir().join("dump.rdb");
    fs::create_dir_all(blocker.join("x")).unwrap();
    plain_pool(&redis);
    let serve = Serve::start_at(&redis.url(), &["--pool", "p"]);
    let acquire = [
        "acquire",
        "--pool",
        "p",
        "--ttl",
        "30s",
        "--max-lease",
        "10m",
    ];
    let closed = pool_cmd(&redis, &acquire, &[]);
    assert_eq!(closed.code, Some(3), "closed while not durable: {closed:?}");
    let status = pool_json(&redis, &["status", "--pool", "p", "--json"]);
    assert_eq!(status["ready_due"], 1, "{status}");
    let (gate, until, line) = gate_of(&redis, &serve);
    assert_eq!((gate, until), (json!("new"), Value::Null), "{line}");
    assert!(line.contains("durable"), "{line}");

    fs::remove_dir_all(&blocker).unwrap();
    let lease = pool_json(&redis, &acquire);
    assert_eq!(lease["fence"], 1, "{lease}");
    let (gate, until, line) = gate_of(&redis, &serve);
    assert_eq!((gate, until), (json!("open"), Value::Null), "{line}");

    // The snapshot the acquire took holds the record; a restart loads it, stamped by the
    // server's earlier life.
    drop(serve);
    redis.restart();
    let serve = Serve::start_at(&redis.url(), &["--pool", "p"]);
    let record = || redis.query::<Option<String>>(redis::cmd("HGET").arg("{p}:meta").arg("~node"));
    let before = record();
    let (gate, until, line) = gate_of(&redis, &serve);
    assert_eq!((gate, until), (json!("rolled_back"), Value::Null), "{line}");
    assert!(line.contains("next acquire"), "{line}");
    assert_eq!(record(), before, "status wrote the record");

    let closed = pool_cmd(&redis, &acquire, &[]);
    assert_eq!(closed.code, Some(3), "closed after the restart: {closed:?}");
    let now = crate::pool::redis_ms(&redis);
    let (gate, until, line) = gate_of(&redis, &serve);
    assert_eq!(gate, "closed", "{line}");
    let until = until.as_u64().unwrap_or_else(|| panic!("{line}"));
    assert!(
        until > now + 590_000 && until <= now + 600_000,
        "closed until {until}, one max lease (10m) from {now}: {line}"
    );
    assert!(line.contains("9m"), "{line}");
}

/// An acquire on a pool that does not exist yet writes its node record (an empty pool: exit
/// 3), after which `pool init` is refused (exit 2) with only "already initialized" and a
/// status of 0 ids (new-user trial): the message now names `pool add`, which works.
#[test]
fn init_after_an_acquire_on_a_missing_pool_points_to_pool_add() {
    let redis = RedisServer::start();
    let early = pool_cmd(&redis, &["acquire", "--pool", "rp", "--ttl", "30s"], &[]);
    assert_eq!(early.code, Some(3), "{early:?}");
    let init = pool_cmd(&redis, &["init", "--pool", "rp", "--ids", "a,b"], &[]);
    assert_eq!(init.code, Some(2), "{init:?}");
    assert!(init.stderr.contains("pool add"), "{init:?}");
    let add = pool_cmd(&redis, &["add", "--pool", "rp", "--ids", "a,b"], &[]);
    assert_eq!(add.code, Some(0), "{add:?}");
    let lease = pool_json(&redis, &["acquire", "--pool", "rp", "--ttl", "30s"]);
    assert_eq!(lease["fence"], json!(1), "{lease}");
}
