//! A Redis that may evict keys (`maxmemory` with a `maxmemory-policy` other than `noeviction`):
//! no lease is held on it, at start or once `CONFIG SET` makes it so at run time, unless
//! `--allow-evicting-redis` accepts the risk. Worker mode (`/readyz` says why), `guard open`,
//! `pool init`/`add`/`acquire`/`extend`, `pool serve`, `lock`; `status` warns.

use crate::double_publish::both_published;
use crate::harness::*;

/// Every policy that can drop a lease key (all have TTLs, so `volatile-*` count too).
const EVICTING: [&str; 7] = [
    "volatile-ttl",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
];

/// A private `redis-server` started with these options, e.g. `--maxmemory 3mb`.
fn redis_with(args: &[&str]) -> RedisServer {
    RedisServer::start_with(RedisOptions {
        args: args.iter().map(|a| a.to_string()).collect(),
        ..RedisOptions::default()
    })
}

fn evicting_redis(policy: &str) -> RedisServer {
    redis_with(&["--maxmemory", "3mb", "--maxmemory-policy", policy])
}

fn config_set(redis: &RedisServer, name: &str, value: &str) {
    let _: () = redis.query(redis::cmd("CONFIG").arg("SET").arg(name).arg(value));
}

/// A lease lost to eviction: `volatile-ttl` with `maxmemory 3mb`, a holder of ID 0,
/// 3000 keys of 1 KB with `EX 3600`: Redis evicts the lease key (shortest TTL) and a newcomer
/// claims ID 0 while the holder still publishes it. Expected: nobody holds a lease on such a
/// Redis, the log names the setting and the fix, so ID 0 is never published twice.
#[test]
fn evicting_redis_never_publishes_one_id_twice() {
    let redis = evicting_redis("volatile-ttl");
    redis.open_claim_guard("orders");
    let worker = |name: &str| {
        Sidecar::worker(&redis, "orders")
            .name(name)
            .flag("--max-worker-id", "0")
            .flag("--ttl", "30s")
            .flag("--renew-interval", "15s")
            .flag("--claim-timeout", "60s")
            .spawn()
    };
    let holder = worker("holder");
    // Held (before the fix) or refused (after): either way the holder has decided.
    let decided = poll_until(secs(10), || {
        holder.id().is_some() || holder.count_log("redis may evict lease keys") > 0
    });
    assert!(decided, "holder neither held nor refused within 10 s");
    let value = "x".repeat(1024);
    for chunk in 0..30 {
        let mut pipe = redis::pipe();
        for i in 0..100 {
            pipe.cmd("SET")
                .arg(format!("cache:{}", chunk * 100 + i))
                .arg(&value)
                .arg("EX")
                .arg(3600)
                .ignore();
        }
        // Writes may be refused once nothing volatile is left to evict.
        let _: redis::RedisResult<()> = pipe.query(&mut redis.conn());
    }
    let newcomer = worker("newcomer");
    let dup = both_published(&holder, &newcomer, secs(5));
    assert_eq!(dup, None, "holder and newcomer both publish worker ID 0");
    let refused = holder
        .wait_for_event("not claiming: redis may evict lease keys", secs(1))
        .expect("the holder says why it does not claim");
    assert_eq!(level(&refused), "ERROR");
    let error = refused["error"].as_str().unwrap_or("");
    for part in [
        "maxmemory-policy is volatile-ttl",
        "noeviction",
        "--allow-evicting-redis",
    ] {
        assert!(error.contains(part), "{part:?} missing in {error}");
    }
    assert_eq!(holder.readyz(), 503);
    assert!(holder.read_output_file().is_none(), "ID file published");
}

/// Each evicting policy is refused at start (nothing claimed, unready, the policy named);
/// `noeviction` with `maxmemory`, and any policy without `maxmemory`, are fine.
#[test]
fn every_evicting_policy_is_refused_at_start() {
    let refused: Vec<(RedisServer, Sidecar, &str)> = EVICTING
        .iter()
        .map(|policy| {
            let redis = evicting_redis(policy);
            redis.open_claim_guard("orders");
            let sidecar = Sidecar::worker(&redis, "orders").name(*policy).spawn();
            (redis, sidecar, *policy)
        })
        .collect();
    for (redis, sidecar, policy) in &refused {
        let event = sidecar
            .wait_for_event("not claiming: redis may evict lease keys", secs(10))
            .unwrap_or_else(|| panic!("{policy}: not refused"));
        assert_eq!(event["policy"].as_str(), Some(*policy));
        assert_readyz_names_eviction(sidecar, policy);
        assert!(
            redis.keys(&format!("{PREFIX}orders:[0-9]*")).is_empty(),
            "{policy}: claimed"
        );
    }
    let safe = evicting_redis("noeviction");
    let unlimited = redis_with(&["--maxmemory-policy", "allkeys-lru"]);
    for redis in [&safe, &unlimited] {
        redis.open_claim_guard("orders");
        Sidecar::worker(redis, "orders")
            .spawn()
            .wait_for_lease(secs(10));
    }
}

/// `CONFIG SET maxmemory-policy allkeys-lru` under a held lease: by the next renew the ID is
/// unpublished (`/id`, `/readyz`, file) and the key no longer renewed; back to `noeviction`,
/// the sidecar holds an ID again.
#[test]
fn policy_changed_at_run_time_unpublishes_then_holds_again() {
    let redis = redis_with(&["--maxmemory", "64mb"]);
    redis.open_claim_guard("orders");
    let sidecar = Sidecar::worker(&redis, "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    assert!(poll_until(secs(2), || sidecar.read_output_file().is_some()));
    config_set(&redis, "maxmemory-policy", "allkeys-lru");
    // One renew interval (500 ms) plus the call.
    let unpublished = poll_until(secs(1), || {
        sidecar.id().is_none() && sidecar.read_output_file().is_none()
    });
    assert!(unpublished, "still published 1 s after the policy changed");
    assert_readyz_names_eviction(&sidecar, "allkeys-lru");
    assert!(sidecar.wait_for_log("stopped publishing the worker ID: redis may evict", secs(1)));
    let key = worker_key("orders", lease.worker_id);
    // Not renewed: the key runs out within its 2 s TTL.
    assert!(
        poll_until(secs(3), || !redis.exists(&key)),
        "key still renewed"
    );
    config_set(&redis, "maxmemory-policy", "noeviction");
    sidecar.wait_for_lease(secs(10));
}

/// `/readyz` (and `/id`) of a worker on an evicting Redis: 503 with `"state": "evicting"`, the
/// policy and the reason (it said `claiming`).
fn assert_readyz_names_eviction(sidecar: &Sidecar, policy: &str) {
    for path in ["/readyz", "/id"] {
        let (status, body) = sidecar.http_get(path, None);
        assert_eq!(status, 503, "{policy}: {path}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["state"], "evicting", "{policy}: {path}: {body}");
        assert_eq!(body["maxmemory_policy"], policy, "{path}: {body}");
        let reason = body["reason"].as_str().unwrap_or("");
        assert!(reason.contains("noeviction"), "{path}: {body}");
    }
}

/// `--allow-evicting-redis` (and its env twin) accepts the risk: the lease is held, with a
/// warning at start.
#[test]
fn override_flag_holds_on_an_evicting_redis() {
    let redis = evicting_redis("volatile-lru");
    redis.open_claim_guard("orders");
    let flagged = Sidecar::worker(&redis, "orders")
        .name("flag")
        .flag("--max-worker-id", "3")
        .switch("--allow-evicting-redis")
        .spawn();
    let by_env = Sidecar::worker(&redis, "orders")
        .name("env")
        .flag("--max-worker-id", "3")
        .env("SNOWLEASE_ALLOW_EVICTING_REDIS", "true")
        .spawn();
    for sidecar in [&flagged, &by_env] {
        sidecar.wait_for_lease(secs(10));
        let warning = sidecar
            .wait_for_event("--allow-evicting-redis", secs(1))
            .expect("a warning at start");
        assert_eq!(level(&warning), "WARN");
    }
}

/// `pool init`, `pool add`, `pool acquire` and `pool extend` on an evicting Redis exit 1 naming
/// the setting, writing nothing (init and add succeeded silently);
/// `--allow-evicting-redis` lets them run; `release` is never refused;
/// `budget take` and `budget penalize` exit 1 naming what a budget risks.
#[test]
fn pool_cli_refuses_to_lease_on_an_evicting_redis() {
    let redis = evicting_redis("allkeys-lru");
    let url = redis.url();
    let env = [("REDIS_URL", url.as_str())];
    let pool = |args: &[&str]| {
        let mut argv = vec!["pool"];
        argv.extend_from_slice(args);
        run_snowlease(&argv, &env, secs(20))
    };
    for fill in [["init", "--ids", "a,b"], ["add", "--ids", "c,d"]] {
        let run = pool(&[&fill[..1], &["--pool", "proxies"], &fill[1..]].concat());
        assert_eq!(run.code, Some(1), "{fill:?}: {run:?}");
        assert!(
            run.stderr.contains("maxmemory-policy is allkeys-lru"),
            "{fill:?}: {}",
            run.stderr
        );
        assert_eq!(redis.dbsize(), 0, "{fill:?} wrote {:?}", redis.keys("*"));
    }
    let init = pool(&[
        "init",
        "--pool",
        "proxies",
        "--ids",
        "a,b",
        "--allow-evicting-redis",
    ]);
    assert_eq!(init.code, Some(0), "{init:?}");
    let refused = pool(&["acquire", "--pool", "proxies", "--ttl", "30s"]);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("maxmemory-policy is allkeys-lru"),
        "{}",
        refused.stderr
    );
    assert_eq!(
        redis.query::<i64>(redis::cmd("ZCARD").arg("{proxies}:leases")),
        0
    );
    let acquire = [
        "acquire",
        "--pool",
        "proxies",
        "--ttl",
        "30s",
        "--allow-evicting-redis",
    ];
    let leased = pool(&acquire);
    assert_eq!(leased.code, Some(0), "{leased:?}");
    let lease: serde_json::Value = serde_json::from_str(&leased.stdout).unwrap();
    let (id, token) = (
        lease["id"].as_str().unwrap(),
        lease["token"].as_str().unwrap(),
    );
    let token_env = [("REDIS_URL", url.as_str()), ("SNOWLEASE_POOL_TOKEN", token)];
    let extend = [
        "pool", "extend", "--pool", "proxies", "--id", id, "--ttl", "30s",
    ];
    let run = run_snowlease(&extend, &token_env, secs(20));
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("maxmemory-policy"), "{}", run.stderr);
    let release = ["pool", "release", "--pool", "proxies", "--id", id];
    let run = run_snowlease(&release, &token_env, secs(20));
    assert_eq!(run.code, Some(0), "{run:?}");
    let take = [
        "budget", "take", "--name", "crawl", "--key", "a", "--rate", "1/s", "--burst", "1",
    ];
    let run = run_snowlease(&take, &env, secs(20));
    assert_eq!(run.code, Some(1), "a budget take fails closed: {run:?}");
    assert!(run.stderr.contains("maxmemory-policy"), "{}", run.stderr);
    // What is at stake for a budget: a reset, not a lease.
    assert!(run.stderr.contains("budget keys"), "{}", run.stderr);
    assert!(
        run.stderr.contains("admits more requests"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("held lease"), "{}", run.stderr);
    // A penalty on a key Redis may evict would be lifted by the eviction:
    // penalize refuses too, and writes nothing.
    let penalize = [
        "budget",
        "penalize",
        "--name",
        "crawl",
        "--key",
        "a",
        "--rate",
        "1/s",
        "--burst",
        "1",
        "--penalty",
        "1s",
    ];
    let run = run_snowlease(&penalize, &env, secs(20));
    assert_eq!(run.code, Some(1), "a budget penalize fails closed: {run:?}");
    assert!(run.stderr.contains("budget keys"), "{}", run.stderr);
    assert_eq!(redis.keys("snowlease:budget:*"), Vec::<String>::new());
}

/// `pool serve`: unready and refusing acquire (and budget takes) with 503 while `CONFIG SET`
/// makes Redis evict, ready and leasing again once it is back to `noeviction`.
#[test]
fn pool_serve_is_unready_while_redis_may_evict() {
    let redis = redis_with(&["--maxmemory", "64mb"]);
    let init = run_snowlease(
        &["pool", "init", "--pool", "proxies", "--ids", "a,b"],
        &[("REDIS_URL", redis.url().as_str())],
        secs(20),
    );
    assert_eq!(init.code, Some(0), "{init:?}");
    let serve = SidecarBuilder::new("pool")
        .name("serve")
        .without("--listen")
        .without("--log-format")
        .switch("serve")
        .flag("--pool", "proxies")
        .flag("--listen", "127.0.0.1:0")
        .flag("--log-format", "json")
        .flag("--redis-url", redis.url())
        .spawn();
    assert!(poll_until(secs(5), || serve.readyz() == 200), "never ready");
    config_set(&redis, "maxmemory-policy", "volatile-lru");
    assert!(
        poll_until(secs(3), || serve.readyz() == 503),
        "still ready on an evicting Redis"
    );
    let (status, body) = post(&serve, "/pools/proxies/leases", r#"{"ttl_ms":30000}"#);
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("maxmemory-policy is volatile-lru"), "{body}");
    let take = r#"{"key":"example.com","rate":"1/s","burst":1}"#;
    let (status, body) = post(&serve, "/budgets/crawl/take", take);
    assert_eq!(status, 503, "a budget take fails closed: {body}");
    assert!(
        body.contains("budget keys"),
        "says what a budget risks: {body}"
    );
    assert!(!body.contains("held lease"), "{body}");
    config_set(&redis, "maxmemory-policy", "noeviction");
    assert!(
        poll_until(secs(3), || serve.readyz() == 200),
        "not ready again"
    );
    let (status, body) = post(&serve, "/pools/proxies/leases", r#"{"ttl_ms":30000}"#);
    assert_eq!(status, 201, "{body}");
    let (status, body) = post(&serve, "/budgets/crawl/take", take);
    assert_eq!(status, 200, "{body}");
}

fn post(serve: &Sidecar, path: &str, body: &str) -> (u16, String) {
    let url = format!("http://{}{path}", serve.http_addr());
    match ureq::post(&url).timeout(secs(2)).send_string(body) {
        Ok(resp) => (resp.status(), resp.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// `lock` on an evicting Redis refuses before the command starts (exit 1, nothing written, the
/// message names the policy); with `--allow-evicting-redis` it runs the command.
#[test]
fn lock_refuses_an_evicting_redis() {
    let redis = evicting_redis("allkeys-lru");
    let url = redis.url();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let mark = marker.to_str().unwrap();
    let cmd = ["--", "sh", "-c", "touch \"$MARK\""];
    let args = [
        &["lock", "--name", "report", "--redis-url", url.as_str()][..],
        &cmd,
    ]
    .concat();
    let run = run_snowlease(&args, &[("MARK", mark)], secs(10));
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stderr.contains("allkeys-lru"), "{run:?}");
    assert!(!marker.exists(), "the command must not run");
    assert_eq!(redis.dbsize(), 0, "nothing written: {:?}", redis.keys("*"));
    let allowed = [&args[..5], &["--allow-evicting-redis"], &cmd].concat();
    let run = run_snowlease(&allowed, &[("MARK", mark)], secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(marker.exists(), "runs with the override");
}

/// `guard open` on an evicting Redis exits 1 naming the policy and writes nothing (it opened the
/// guard silently); `--allow-evicting-redis` opens it.
#[test]
fn guard_open_refuses_an_evicting_redis() {
    let redis = evicting_redis("volatile-lru");
    let url = redis.url();
    let refused = guard_open(&url, "orders", &[]);
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("maxmemory-policy is volatile-lru"),
        "{refused:?}"
    );
    assert_eq!(redis.dbsize(), 0, "nothing written: {:?}", redis.keys("*"));
    let allowed = guard_open(&url, "orders", &["--allow-evicting-redis"]);
    assert_eq!(allowed.code, Some(0), "{allowed:?}");
    assert!(redis.exists(&format!("{PREFIX}orders:guard")));
}

/// `status` (read-only) on an evicting Redis still shows the leases (exit 0) but warns: the
/// table's first line names the policy and why no sidecar claims, `--json` has
/// `"eviction": {"state": "evicting", ...}`; on a safe Redis no warning and `"state": "safe"`.
#[test]
fn status_warns_on_an_evicting_redis() {
    let evicting = evicting_redis("allkeys-lfu");
    let safe = redis_with(&[]);
    let status = |redis: &RedisServer, json: bool| {
        let url = redis.url();
        let mut args = vec!["status", "--app", "orders", "--redis-url", url.as_str()];
        if json {
            args.push("--json");
        }
        let run = run_snowlease(&args, &[], secs(20));
        assert_eq!(run.code, Some(0), "{run:?}");
        run.stdout
    };
    let table = status(&evicting, false);
    let first = table.lines().next().unwrap_or("");
    assert!(
        first.starts_with("WARNING") && first.contains("maxmemory-policy is allkeys-lfu"),
        "{table}"
    );
    let json: serde_json::Value = serde_json::from_str(&status(&evicting, true)).unwrap();
    assert_eq!(json["eviction"]["state"], "evicting", "{json}");
    assert_eq!(
        json["eviction"]["maxmemory_policy"], "allkeys-lfu",
        "{json}"
    );
    assert_eq!(json["free"], json["ids"], "the leases are shown: {json}");
    assert!(!status(&safe, false).contains("WARNING"));
    let json: serde_json::Value = serde_json::from_str(&status(&safe, true)).unwrap();
    assert_eq!(json["eviction"]["state"], "safe", "{json}");
}
