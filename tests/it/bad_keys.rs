//! A key of the wrong type (set by hand) in the pool's or a budget's keys is the caller's
//! answer naming the key, on every surface: the library, the charged acquire of `pool
//! serve` (HTTP 500 `{"error": "bad key in redis", "key"}`), the budget take route, and
//! `pool acquire --budget` (exit 1, the key named). Never "Redis down": `/readyz` stays 200.

use axum::Router;
use axum::http::StatusCode;
use serde_json::{Value, json};
use snowlease::budget::{BudgetKey, Charge, charge_key};
use snowlease::pool::{AcquireRequest, PoolError, PoolKeys, acquire_charged};

use crate::harness::{RedisServer, secs};
use crate::pool::{dump, pool};
use crate::pool_cli::pool_cmd;
use crate::pool_http::{call, serve_router};

const KEY: &str = "example.com";

fn charge() -> Charge {
    Charge {
        budget: "domains".into(),
        keys: vec![BudgetKey::new(KEY, "1/m".parse().unwrap(), 1)],
        cost: 1,
    }
}

fn charged_body(request_id: Option<&str>) -> Value {
    let mut body = json!({"ttl_ms": 30000, "budget": {
        "name": "domains", "key": KEY, "rate": "1/m", "burst": 1,
    }});
    if let Some(id) = request_id {
        body["request_id"] = id.into();
    }
    body
}

async fn readyz(router: &Router) -> StatusCode {
    call(router, "GET", "/readyz", Value::Null).await.0
}

/// A budget key that is a hash: the charged acquire answers the key (library, HTTP 500 with
/// the key, the budget take route alike), nothing is leased or written, and `/readyz` stays
/// 200. Before, the budget's KEYTYPE reply met the pool's parser: 503 "redis unavailable"
/// and unready until another call succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_key_of_another_type_is_named_and_redis_stays_up() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &["p1", "p2"]).await;
    let p = pool(&redis, "proxies").await;
    let budget_key = charge_key("proxies", "domains", KEY);
    redis.query::<()>(redis::cmd("HSET").arg(&budget_key).arg("f").arg("v"));
    assert_eq!(
        call(&router, "GET", "/pools/proxies", Value::Null).await.0,
        StatusCode::OK
    );
    assert_eq!(readyz(&router).await, StatusCode::OK);
    let before = dump(&redis);

    let (status, answer, _) =
        call(&router, "POST", "/pools/proxies/leases", charged_body(None)).await;
    assert_eq!(
        (status, answer, readyz(&router).await),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": "bad key in redis", "key": budget_key}),
            StatusCode::OK,
        ),
        "the key named; /readyz: redis answered"
    );

    let err = acquire_charged(&p, &AcquireRequest::new(secs(30)), &charge())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, PoolError::WrongKeyType { key, found, .. }
            if key == &budget_key && found == "hash"),
        "{err:?}"
    );

    let take = json!({"pool": "proxies", "key": KEY, "rate": "1/m", "burst": 1});
    let (status, answer, _) = call(&router, "POST", "/budgets/domains/take", take).await;
    assert_eq!(
        (status, answer),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": "bad key in redis", "key": budget_key})
        )
    );
    assert_eq!(readyz(&router).await, StatusCode::OK);
    assert_eq!(dump(&redis), before, "nothing written");
}

/// `{<pool>}:requests` holding a string, met by a retry (request id) that the budget denies:
/// the charge read the key before acquire.lua checked its type, and Redis' own WRONGTYPE
/// (no key named) answered 503 "redis unavailable". Now every acquire key's type is checked
/// first: the key is named (library, HTTP 500) and `/readyz` stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_key_of_another_type_is_named_and_redis_stays_up() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &["p1", "p2"]).await;
    let p = pool(&redis, "proxies").await;
    let requests = PoolKeys::new("proxies").requests;
    let (status, answer, _) =
        call(&router, "POST", "/pools/proxies/leases", charged_body(None)).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}: spends the budget");
    assert_eq!(readyz(&router).await, StatusCode::OK);
    redis.query::<()>(redis::cmd("SET").arg(&requests).arg("x"));
    let before = dump(&redis);

    let (status, answer, _) = call(
        &router,
        "POST",
        "/pools/proxies/leases",
        charged_body(Some("r1")),
    )
    .await;
    assert_eq!(
        (status, answer, readyz(&router).await),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": "bad key in redis", "key": requests}),
            StatusCode::OK,
        ),
        "the key named; /readyz: redis answered"
    );

    let req = AcquireRequest::new(secs(30)).request_id("r1");
    let err = acquire_charged(&p, &req, &charge()).await.unwrap_err();
    assert!(
        matches!(&err, PoolError::WrongKeyType { key, found, expected }
            if key == &requests && found == "string" && expected == "hash"),
        "{err:?}"
    );
    assert_eq!(dump(&redis), before, "nothing written");
}

/// `pool acquire --budget` with a budget key or the requests key of another type: exit 1,
/// the message names the key (not a bare WRONGTYPE), nothing leased.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_names_the_bad_key() {
    let redis = RedisServer::start();
    pool(&redis, "proxies")
        .await
        .init(&["p1", "p2"])
        .await
        .unwrap();
    let args = [
        "acquire",
        "--pool",
        "proxies",
        "--ttl",
        "30s",
        "--budget",
        "domains",
        "--budget-key",
        KEY,
        "--budget-rate",
        "1/m",
        "--budget-burst",
        "1",
    ];
    let budget_key = charge_key("proxies", "domains", KEY);
    redis.query::<()>(redis::cmd("HSET").arg(&budget_key).arg("f").arg("v"));
    let run = pool_cmd(&redis, &args, &[]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("bad key in redis") && run.stderr.contains(&budget_key),
        "{run:?}"
    );

    redis.query::<()>(redis::cmd("DEL").arg(&budget_key));
    assert_eq!(
        pool_cmd(&redis, &args, &[]).code,
        Some(0),
        "spends the budget"
    );
    let requests = PoolKeys::new("proxies").requests;
    redis.query::<()>(redis::cmd("SET").arg(&requests).arg("x"));
    let mut retry = args.to_vec();
    retry.extend(["--request-id", "r1"]);
    let run = pool_cmd(&redis, &retry, &[]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("bad key in redis") && run.stderr.contains(&requests),
        "{run:?}"
    );
}

/// Extend and release over HTTP with `{<pool>}:meta` of another type: 500 naming the key, in
/// the same words as an acquire's; nothing written; `/readyz` stays 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_and_release_name_the_bad_key_too() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &["p1", "p2"]).await;
    let (status, lease, _) = call(
        &router,
        "POST",
        "/pools/proxies/leases",
        json!({"ttl_ms": 30000}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{lease}");
    let meta = PoolKeys::new("proxies").meta;
    redis.query::<()>(redis::cmd("DEL").arg(&meta));
    redis.query::<()>(redis::cmd("SADD").arg(&meta).arg("x"));
    let before = dump(&redis);
    let id = lease["id"].as_str().unwrap();
    let token = lease["token"].clone();
    for (op, body) in [
        ("extend", json!({"token": token, "ttl_ms": 30000})),
        ("release", json!({"token": token})),
    ] {
        let path = format!("/pools/proxies/leases/{id}/{op}");
        let (status, answer, _) = call(&router, "POST", &path, body).await;
        assert_eq!(
            (status, answer, readyz(&router).await),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "bad key in redis", "key": meta}),
                StatusCode::OK,
            ),
            "{op}"
        );
    }
    assert_eq!(dump(&redis), before, "nothing written");
}
