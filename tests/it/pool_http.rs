//! `snowlease pool serve` against a real redis-server: the pure router via
//! `oneshot` (leases, 503 + Retry-After, 409, 404, 400, readiness,
//! metrics), and the real process (background reaper, SIGTERM).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use snowlease::connection::RedisTarget;
use snowlease::pool::serve::{ServeState, router};
use snowlease::pool::{Pool, PoolKeys, PoolOptions};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::harness::{
    BIN, RedisServer, Signal, message, metric_value, ms, poll_some, poll_until, secs,
};
use crate::pool::{check_invariants, dump, hash, zset};

/// A router serving `names` of `redis` (each initialised with `ids` when
/// given), and the shutdown token it watches.
pub(crate) async fn serve_router(
    redis: &RedisServer,
    names: &[&str],
    ids: &[&str],
) -> (Router, CancellationToken) {
    let conn = RedisTarget::parse(&redis.url())
        .unwrap()
        .connect(ms(500))
        .unwrap();
    let mut pools = Vec::new();
    for name in names {
        let pool = Pool::new(conn.clone(), name, PoolOptions::default()).unwrap();
        if !ids.is_empty() {
            pool.init(ids).await.unwrap();
        }
        pools.push(pool);
    }
    let shutdown = CancellationToken::new();
    (router(ServeState::new(pools, shutdown.clone())), shutdown)
}

/// One request through the router: (status, JSON or text body, Retry-After).
pub(crate) async fn call(
    router: &Router,
    method: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value, Option<String>) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    call_raw(router, method, path, &body).await
}

/// [`call`] with the body's bytes as given (a `Value` cannot hold a key twice).
pub(crate) async fn call_raw(
    router: &Router,
    method: &str,
    path: &str,
    body: &str,
) -> (StatusCode, Value, Option<String>) {
    let body = Body::from(body.to_owned());
    let request = Request::builder()
        .method(method)
        .uri(path)
        .body(body)
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = to_bytes(response.into_body(), 1 << 20).await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value, retry_after)
}

/// Acquire, extend and release through the router: 201 with the lease, 200
/// for the right token, 409 naming the reason for a wrong or spent one,
/// which changes nothing; status counts follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_acquire_extend_release_round_trip() {
    let redis = RedisServer::start();
    let keys = PoolKeys::new("proxies");
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &["vn-a01", "vn-a02"]).await;

    let (status, lease, _) = call(
        &router,
        "POST",
        "/pools/proxies/leases",
        json!({"ttl_ms": 30000}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{lease}");
    assert_eq!(lease.as_object().unwrap().len(), 4, "{lease}");
    let (id, token) = (
        lease["id"].as_str().unwrap(),
        lease["token"].as_str().unwrap(),
    );
    assert_eq!(hash(&redis, &keys.owners)[id], token);
    assert_eq!(lease["fence"], 1);

    let before = dump(&redis);
    let wrong = json!({"token": "not-the-token", "ttl_ms": 1000});
    let (status, body, _) = call(
        &router,
        "POST",
        &format!("/pools/proxies/leases/{id}/extend"),
        wrong,
    )
    .await;
    assert_eq!(
        (status, &body["reason"]),
        (StatusCode::CONFLICT, &json!("other_owner")),
        "{body}"
    );
    let wrong = json!({"token": "not-the-token"});
    let (status, body, _) = call(
        &router,
        "POST",
        &format!("/pools/proxies/leases/{id}/release"),
        wrong,
    )
    .await;
    assert_eq!(
        (status, &body["reason"]),
        (StatusCode::CONFLICT, &json!("other_owner")),
        "{body}"
    );
    assert_eq!(dump(&redis), before);

    let extend = json!({"token": token, "ttl_ms": 60000});
    let (status, body, _) = call(
        &router,
        "POST",
        &format!("/pools/proxies/leases/{id}/extend"),
        extend,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        zset(&redis, &keys.leases)[id],
        body["deadline_ms"].as_u64().unwrap()
    );
    assert_eq!(body["capped"], false);

    let (status, body, _) = call(&router, "GET", "/pools/proxies", Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["leases_valid"].as_u64(), body["ready_due"].as_u64()),
        (Some(1), Some(1)),
        "{body}"
    );

    let release = json!({"token": token, "cooldown_ms": 2000});
    let path = format!("/pools/proxies/leases/{id}/release");
    let (status, body, _) = call(&router, "POST", &path, release.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let at = body["released_at_ms"].as_u64().unwrap();
    assert_eq!(zset(&redis, &keys.ready)[id], at + 2000);
    let (status, _, _) = call(&router, "POST", &path, release).await;
    assert_eq!(status, StatusCode::CONFLICT, "a second release must fail");
    check_invariants(&redis, &keys);
}

/// Nothing due: 503 with the next-due hint in the body and Retry-After in
/// whole seconds rounded up; with wait_ms the answer comes after the wait,
/// or with the lease as soon as an id comes due within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_empty_pool_answers_503_with_hint_and_retry_after() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["p"], &["only"]).await;
    let (status, lease, _) =
        call(&router, "POST", "/pools/p/leases", json!({"ttl_ms": 4500})).await;
    assert_eq!(status, StatusCode::CREATED);

    let (status, body, retry_after) =
        call(&router, "POST", "/pools/p/leases", json!({"ttl_ms": 1000})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let hint = body["next_due_in_ms"].as_u64().unwrap();
    assert!(hint > 3000 && hint <= 4500, "{body}");
    assert_eq!(
        body["at_ms"].as_u64().unwrap() + hint,
        lease["deadline_ms"].as_u64().unwrap()
    );
    assert_eq!(retry_after.unwrap(), hint.div_ceil(1000).to_string());

    let started = Instant::now();
    let (status, _, _) = call(
        &router,
        "POST",
        "/pools/p/leases",
        json!({"ttl_ms": 1000, "wait_ms": 300}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() >= ms(300), "{:?}", started.elapsed());

    // Released with a 1.2 s cooldown: Retry-After 2; a waiting acquire gets it.
    let release = json!({"token": lease["token"], "cooldown_ms": 1200});
    let (status, _, _) = call(&router, "POST", "/pools/p/leases/only/release", release).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, retry_after) =
        call(&router, "POST", "/pools/p/leases", json!({"ttl_ms": 1000})).await;
    assert_eq!(
        (status, retry_after.as_deref()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("2"))
    );
    let started = Instant::now();
    let (status, body, _) = call(
        &router,
        "POST",
        "/pools/p/leases",
        json!({"ttl_ms": 1000, "wait_ms": 5000}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(started.elapsed() < secs(2), "{:?}", started.elapsed());
}

/// A pool not served answers 404; every bad body or path names its field
/// with 400; none of them writes to Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_refuses_unknown_pools_and_bad_input() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["p"], &["a", "b"]).await;
    let (_, lease, _) = call(&router, "POST", "/pools/p/leases", json!({"ttl_ms": 30000})).await;
    let token = lease["token"].as_str().unwrap().to_owned();
    let before = dump(&redis);

    for path in [
        "/pools/q/leases",
        "/pools/a:b/leases",
        "/pools/q/leases/a/release",
    ] {
        let (status, body, _) =
            call(&router, "POST", path, json!({"ttl_ms": 1000, "token": "t"})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    assert_eq!(
        call(&router, "GET", "/pools/q", Value::Null).await.0,
        StatusCode::NOT_FOUND
    );

    let long = "t".repeat(129);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/pools/p/leases", Value::Null, "ttl_ms"),
        ("/pools/p/leases", json!([1]), "body"),
        ("/pools/p/leases", json!({"ttl_ms": 0}), "ttl_ms"),
        ("/pools/p/leases", json!({"ttl_ms": 600001}), "ttl_ms"),
        ("/pools/p/leases", json!({"ttl_ms": 1.5}), "ttl_ms"),
        ("/pools/p/leases", json!({"ttl_ms": "5"}), "ttl_ms"),
        (
            "/pools/p/leases",
            json!({"ttl_ms": 5, "cooldown_ms": -1}),
            "cooldown_ms",
        ),
        (
            "/pools/p/leases",
            json!({"ttl_ms": 5, "wait_ms": 60001}),
            "wait_ms",
        ),
        (
            "/pools/p/leases",
            json!({"ttl_ms": 5, "request_id": "a b"}),
            "request_id",
        ),
        ("/pools/p/leases", json!({"ttl": 5}), "ttl_ms"),
        ("/pools/p/leases", json!({"ttl_ms": 5, "ttl": 5}), "ttl"),
        ("/pools/p/leases/a/release", json!({}), "token"),
        ("/pools/p/leases/a/release", json!({"token": ""}), "token"),
        ("/pools/p/leases/a/release", json!({"token": long}), "token"),
        (
            "/pools/p/leases/a/release",
            json!({"token": token, "cooldown_ms": 600001}),
            "cooldown_ms",
        ),
        (
            "/pools/p/leases/a%20b/release",
            json!({"token": token}),
            "id",
        ),
        (
            "/pools/p/leases/a/extend",
            json!({"token": token}),
            "ttl_ms",
        ),
    ];
    for (path, body, field) in cases {
        let (status, answer, _) = call(&router, "POST", path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {answer}");
        assert_eq!(answer["field"], field, "{path} {body}: {answer}");
        assert!(!answer.to_string().contains(&long));
    }
    assert_eq!(dump(&redis), before);
}

/// Readiness: ready once Redis answers (`/readyz` asks it while it is marked down), unready
/// while Redis is gone (calls answer 503), and from shutdown on; liveness stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_readyz_follows_redis_and_shutdown() {
    let mut redis = RedisServer::start();
    let (router, shutdown) = serve_router(&redis, &["p"], &["a"]).await;
    let readyz = async |router: &Router| call(router, "GET", "/readyz", Value::Null).await.0;
    assert_eq!(readyz(&router).await, StatusCode::OK);
    assert_eq!(
        call(&router, "GET", "/pools/p", Value::Null).await.0,
        StatusCode::OK
    );
    assert_eq!(readyz(&router).await, StatusCode::OK);

    redis.stop();
    let (status, body, _) = call(&router, "POST", "/pools/p/leases", json!({"ttl_ms": 1000})).await;
    assert_eq!(
        (status, &body["error"]),
        (StatusCode::SERVICE_UNAVAILABLE, &json!("redis unavailable"))
    );
    assert_eq!(readyz(&router).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        call(&router, "GET", "/livez", Value::Null).await.0,
        StatusCode::OK
    );

    redis.restart();
    let answered = async || call(&router, "GET", "/pools/p", Value::Null).await.0 == StatusCode::OK;
    let give_up = Instant::now() + secs(10);
    while !answered().await {
        assert!(Instant::now() < give_up, "never reconnected");
        tokio::time::sleep(ms(50)).await;
    }
    assert_eq!(readyz(&router).await, StatusCode::OK);
    shutdown.cancel();
    assert_eq!(readyz(&router).await, StatusCode::SERVICE_UNAVAILABLE);
}

/// /metrics carries the per-pool gauges, the acquire wait histogram and the
/// counters by outcome, labelled only by pool and outcome: no token, no id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_metrics_have_gauges_and_no_tokens() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["p"], &["vn-a01", "vn-a02", "vn-a03"]).await;
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let (_, lease, _) =
            call(&router, "POST", "/pools/p/leases", json!({"ttl_ms": 30000})).await;
        tokens.push((
            lease["id"].as_str().unwrap().to_owned(),
            lease["token"].as_str().unwrap().to_owned(),
        ));
    }
    let (id, token) = &tokens[0];
    let release = json!({"token": token, "cooldown_ms": 60000});
    call(
        &router,
        "POST",
        &format!("/pools/p/leases/{id}/release"),
        release,
    )
    .await;
    call(
        &router,
        "POST",
        &format!("/pools/p/leases/{id}/release"),
        json!({"token": "x"}),
    )
    .await;
    call(
        &router,
        "POST",
        "/pools/p/leases",
        json!({"ttl_ms": 1000, "wait_ms": 0}),
    )
    .await;
    call(&router, "GET", "/pools/p", Value::Null).await;

    let (status, Value::String(text), _) = call(&router, "GET", "/metrics", Value::Null).await
    else {
        panic!("/metrics is not text");
    };
    assert_eq!(status, StatusCode::OK);
    let value = |series: &str| {
        metric_value(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    // Three ids: two leased, one cooling down after its release.
    assert_eq!(value("snowlease_pool_ready_due{pool=\"p\"}"), 0.0);
    assert_eq!(value("snowlease_pool_ready_cooling{pool=\"p\"}"), 1.0);
    assert_eq!(value("snowlease_pool_leases_valid{pool=\"p\"}"), 2.0);
    assert_eq!(value("snowlease_pool_leases_expired{pool=\"p\"}"), 0.0);
    assert_eq!(value("snowlease_pool_disabled{pool=\"p\"}"), 0.0);
    // Redis time of those counts in Unix seconds (Prometheus' base unit); the local Redis
    // shares this machine's clock.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let at = value("snowlease_pool_status_timestamp_seconds{pool=\"p\"}");
    assert!((now - at).abs() < 60.0, "status time {at} s, now {now} s");
    assert_eq!(
        value("snowlease_pool_acquires_total{pool=\"p\",outcome=\"leased\"}"),
        3.0
    );
    assert_eq!(
        value("snowlease_pool_acquire_wait_seconds_count{pool=\"p\",outcome=\"leased\"}"),
        3.0
    );
    assert_eq!(
        value("snowlease_pool_releases_total{pool=\"p\",outcome=\"released\"}"),
        1.0
    );
    assert_eq!(
        value("snowlease_pool_releases_total{pool=\"p\",outcome=\"other_owner\"}"),
        1.0
    );
    for (id, token) in &tokens {
        assert!(!text.contains(token.as_str()), "token in metrics");
        assert!(!text.contains(id.as_str()), "id {id} in metrics");
    }
}

/// A running `snowlease pool serve`, its stderr captured; SIGKILLed on drop,
/// its log printed if the test panics.
pub(crate) struct Serve {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl Serve {
    /// Starts `snowlease pool serve --listen 127.0.0.1:0 --log-format json`
    /// with `args`, debug logs, and waits (10 s) for its HTTP address.
    fn start(redis: &RedisServer, args: &[&str]) -> Serve {
        Serve::start_at(&redis.url(), args)
    }

    /// As [`Serve::start`], with `REDIS_URL` set to `url` (e.g. one with an ACL user).
    pub(crate) fn start_at(url: &str, args: &[&str]) -> Serve {
        let mut child = Command::new(BIN)
            .args([
                "pool",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ])
            .args(args)
            .env_clear()
            .env("REDIS_URL", url)
            .env("SNOWLEASE_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let reader = {
            let (pipe, log) = (child.stderr.take().unwrap(), log.clone());
            thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    log.lock().unwrap().push(line);
                }
            })
        };
        let mut serve = Serve {
            child,
            log,
            reader: Some(reader),
            addr: "0.0.0.0:0".parse().unwrap(),
        };
        serve.addr = poll_some(secs(10), || {
            serve.events().into_iter().find_map(|e| {
                (message(&e) == "http listening").then(|| e["addr"].as_str()?.parse().ok())?
            })
        })
        .expect("no \"http listening\" event");
        serve
    }

    fn events(&self) -> Vec<Value> {
        let log = self.log.lock().unwrap();
        log.iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// `method path` with a JSON body: (status, JSON body, Retry-After).
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value, Option<String>) {
        self.call_within(method, path, body, secs(10))
    }

    /// [`Serve::call`] that waits up to `timeout` for the answer (a test that times a slow
    /// answer, rather than one that fails at 10 s).
    pub(crate) fn call_within(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        timeout: Duration,
    ) -> (u16, Value, Option<String>) {
        let url = format!("http://{}{path}", self.addr);
        let request = ureq::request(method, &url).timeout(timeout);
        let result = match body {
            Some(body) => request.send_json(body),
            None => request.call(),
        };
        let response = match result {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = response.status();
        let retry_after = response.header("retry-after").map(str::to_owned);
        let text = response.into_string().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
            retry_after,
        )
    }

    fn metrics(&self) -> String {
        match self.call("GET", "/metrics", None) {
            (200, Value::String(text), _) => text,
            other => panic!("/metrics: {other:?}"),
        }
    }

    fn signal(&self, sig: Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    /// Waits up to `timeout` for the exit; the log is complete afterwards.
    fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let status = poll_some(timeout, || self.child.try_wait().ok().flatten())?;
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        Some(status)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!("===== pool serve log =====\n{}", self.log_text());
        }
    }
}

/// The real process: 201, 503 + Retry-After + hint, 409, 404 over a real
/// socket; a waiting acquire ends at SIGTERM and the process exits 0 within
/// 2 s; no token in any log line, even at debug level.
#[test]
fn serve_process_end_to_end_and_sigterm() {
    let redis = RedisServer::start();
    let keys = PoolKeys::new("proxies");
    let init = crate::harness::run_snowlease(
        &["pool", "init", "--pool", "proxies", "--ids", "vn-a01"],
        &[("REDIS_URL", &redis.url())],
        secs(10),
    );
    assert_eq!(init.code, Some(0), "{init:?}");
    // A reaper round at start only (the interval's first tick), so that the EVALSHA calls
    // counted later are the requests' own.
    let mut serve = Serve::start(
        &redis,
        &["--pool", "proxies,accounts", "--reap-interval", "1h"],
    );
    assert!(poll_until(secs(10), || serve
        .call("GET", "/readyz", None)
        .0
        == 200));

    let (status, lease, _) = serve.call(
        "POST",
        "/pools/proxies/leases",
        Some(json!({"ttl_ms": 30000})),
    );
    assert_eq!(status, 201, "{lease}");
    let token = lease["token"].as_str().unwrap().to_owned();
    assert_eq!(hash(&redis, &keys.owners)["vn-a01"], token);

    let (status, body, retry_after) = serve.call(
        "POST",
        "/pools/proxies/leases",
        Some(json!({"ttl_ms": 1000})),
    );
    assert_eq!(status, 503, "{body}");
    let hint = body["next_due_in_ms"].as_u64().unwrap();
    assert_eq!(retry_after.unwrap(), hint.div_ceil(1000).to_string());
    let (status, body, _) = serve.call(
        "POST",
        "/pools/proxies/leases/vn-a01/release",
        Some(json!({"token": "nope"})),
    );
    assert_eq!((status, &body["reason"]), (409, &json!("other_owner")));
    assert_eq!(
        serve
            .call("POST", "/pools/nope/leases", Some(json!({"ttl_ms": 1})))
            .0,
        404
    );
    let (status, body, _) = serve.call("GET", "/pools/accounts", None);
    assert_eq!((status, &body["ready_due"]), (200, &json!(0)));
    // `accounts` was never created: served, and a warning names it (a typo in --pool shows).
    let missing: Vec<Value> = serve
        .events()
        .into_iter()
        .filter(|e| message(e).starts_with("pool does not exist"))
        .collect();
    assert!(
        missing.len() == 1 && missing[0]["pool"] == "accounts",
        "{missing:?}"
    );
    let metrics = serve.metrics();
    assert!(
        metric_value(&metrics, "snowlease_pool_leases_valid{pool=\"proxies\"}").is_some(),
        "{metrics}"
    );

    // An acquire waiting for a minute is answered at SIGTERM, and the process stops.
    let evalsha_before = redis.command_calls("evalsha");
    let waiter = {
        let addr = serve.addr;
        thread::spawn(move || {
            let url = format!("http://{addr}/pools/proxies/leases");
            match ureq::post(&url)
                .timeout(secs(10))
                .send_json(json!({"ttl_ms": 1000, "wait_ms": 60000}))
            {
                Ok(r) | Err(ureq::Error::Status(_, r)) => r.status(),
                Err(e) => panic!("waiting acquire: {e}"),
            }
        })
    };
    let debug_lines = || {
        serve
            .events()
            .iter()
            .filter(|e| e["message"] == "leased")
            .count()
    };
    // The log reader thread may lag on a loaded machine: wait for the line.
    assert!(
        poll_until(secs(5), || debug_lines() >= 1),
        "debug logs are on"
    );
    // Let the waiting acquire reach its backoff: a first attempt and at least one retry.
    assert!(
        poll_until(secs(5), || redis.command_calls("evalsha")
            >= evalsha_before + 2),
        "the waiting acquire never retried: {} EVALSHA calls since it started",
        redis.command_calls("evalsha") - evalsha_before
    );
    let signalled = Instant::now();
    serve.signal(Signal::SIGTERM);
    let status = serve.wait_exit(secs(5)).expect("serve did not exit");
    assert!(
        signalled.elapsed() < secs(2),
        "took {:?}",
        signalled.elapsed()
    );
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert_eq!(waiter.join().unwrap(), 503);
    let log = serve.log_text();
    assert!(!log.contains(&token), "token in the log");
    assert!(
        log.contains("shutdown requested") && log.contains("stopped"),
        "{log}"
    );
    check_invariants(&redis, &keys);
}

/// The background reaper returns an expired lease to ready with no acquire
/// traffic at all, and counts it; the gauges follow without a scrape
/// touching Redis.
#[test]
fn serve_reaper_reclaims_expired_leases_without_acquires() {
    let redis = RedisServer::start();
    let keys = PoolKeys::new("p");
    let url = redis.url();
    let env = [("REDIS_URL", url.as_str())];
    let run = |args: &[&str]| {
        let mut argv = vec!["pool"];
        argv.extend_from_slice(args);
        let run = crate::harness::run_snowlease(&argv, &env, secs(10));
        assert_eq!(run.code, Some(0), "{run:?}");
        serde_json::from_str::<Value>(&run.stdout).unwrap()
    };
    run(&["init", "--pool", "p", "--ids", "a,b"]);
    let lease = run(&["acquire", "--pool", "p", "--ttl", "300ms"]);
    let id = lease["id"].as_str().unwrap().to_owned();
    let deadline = lease["deadline_ms"].as_u64().unwrap();

    let serve = Serve::start(
        &redis,
        &[
            "--pool",
            "p",
            "--reap-interval",
            "100ms",
            "--reap-cooldown",
            "0s",
        ],
    );
    let before_acquires = serve.metrics();
    assert!(
        poll_until(secs(5), || zset(&redis, &keys.ready).contains_key(&id)),
        "the expired lease was never reclaimed"
    );
    assert!(zset(&redis, &keys.ready)[&id] >= deadline);
    assert!(zset(&redis, &keys.leases).is_empty());
    check_invariants(&redis, &keys);
    let reaped = "snowlease_pool_reaped_total{pool=\"p\"}";
    assert!(poll_until(secs(2), || metric_value(
        &serve.metrics(),
        reaped
    ) == Some(1.0)));
    assert!(poll_until(secs(2), || {
        metric_value(&serve.metrics(), "snowlease_pool_ready_due{pool=\"p\"}") == Some(2.0)
    }));
    // Nobody acquired: the acquire counters never moved.
    let acquires = "snowlease_pool_acquires_total{pool=\"p\",outcome=\"leased\"}";
    assert_eq!(metric_value(&before_acquires, acquires), Some(0.0));
    assert_eq!(metric_value(&serve.metrics(), acquires), Some(0.0));
    assert!(serve.log_text().contains("reclaimed expired leases"));
}

/// A reaper round that fails on a key of the wrong type (`{p}:leases` a string) says so at
/// warn, once while the error stays the same (it was said only at debug, every round), and
/// readiness stays: Redis answered.
#[test]
fn serve_warns_once_when_reaping_meets_a_bad_key() {
    let redis = RedisServer::start();
    let keys = PoolKeys::new("p");
    let init = crate::harness::run_snowlease(
        &["pool", "init", "--pool", "p", "--ids", "a"],
        &[("REDIS_URL", &redis.url())],
        secs(10),
    );
    assert_eq!(init.code, Some(0), "{init:?}");
    let _: () = redis.query(redis::cmd("SET").arg(&keys.leases).arg("garbage"));
    let serve = Serve::start(&redis, &["--pool", "p", "--reap-interval", "50ms"]);
    let warned = || {
        serve
            .events()
            .iter()
            .filter(|e| e["level"] == "WARN" && message(e).starts_with("reap failed"))
            .count()
    };
    assert!(
        poll_until(secs(5), || warned() == 1),
        "{}",
        serve.log_text()
    );
    std::thread::sleep(ms(500));
    assert_eq!(
        warned(),
        1,
        "one warning for ~10 failed rounds: {}",
        serve.log_text()
    );
    assert_eq!(serve.call("GET", "/readyz", None).0, 200);
}
