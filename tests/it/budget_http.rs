//! The budget routes of `pool serve` through the router (`oneshot`) on a
//! real redis-server: 200 and 429 with `Retry-After`, penalize, 400 naming
//! the field (nothing written), 503 when Redis is gone (fail closed), and
//! the metrics (takes by outcome, denials by budget, no key labels).

use axum::http::StatusCode;
use serde_json::json;

use crate::harness::RedisServer;
use crate::pool_http::{call, serve_router};

/// Take until denied: 200 `allowed`, then 429 with `Retry-After` and
/// `retry_after_ms`; two keys with their own limits charged together;
/// penalize pushes them back; the metrics count by outcome and name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_answers_200_then_429_with_retry_after() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &[]).await;
    let body = json!({
        "keys": ["example.com", "p1:example.com"],
        "rate": ["10/s", "2/m"],
        "burst": [10, 2],
    });
    for remaining in [1, 0] {
        let (status, answer, _) = call(&router, "POST", "/budgets/crawl/take", body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["allowed"], true);
        assert_eq!(answer["remaining"], remaining, "{answer}");
    }
    let (status, answer, retry_after) =
        call(&router, "POST", "/budgets/crawl/take", body.clone()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert_eq!(answer["allowed"], false);
    let retry_ms = answer["retry_after_ms"].as_u64().unwrap();
    assert!((29_000..=30_000).contains(&retry_ms), "{answer}");
    assert_eq!(retry_after.as_deref(), Some("30"));
    // The domain alone was not charged by the denial: 8 of 10 left.
    let domain = json!({"key": "example.com", "rate": "10/s", "burst": 10, "cost": 8});
    let (status, answer, _) = call(&router, "POST", "/budgets/crawl/take", domain).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    let penalty = json!({"key": "other.org", "rate": "5/s", "burst": 5, "penalty_ms": 2000});
    let (status, answer, _) = call(&router, "POST", "/budgets/crawl/penalize", penalty).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["retry_after_ms"], 2000);
    let other = json!({"key": "other.org", "rate": "5/s", "burst": 5});
    let (status, _, retry_after) = call(&router, "POST", "/budgets/crawl/take", other).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after.as_deref(), Some("2"));

    let (_, metrics, _) = call(&router, "GET", "/metrics", json!(null)).await;
    let text = metrics.as_str().unwrap();
    assert!(
        text.contains("snowlease_budget_takes_total{outcome=\"allowed\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("snowlease_budget_takes_total{outcome=\"denied\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("snowlease_budget_denials_total{budget=\"crawl\"} 2"),
        "{text}"
    );
    assert!(!text.contains("example.com"), "no key labels: {text}");
}

/// Bad bodies answer 400 naming the field and its range; nothing is
/// written. A Redis that is gone answers 503 (fail closed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_400_and_redis_down_503() {
    let mut redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &[]).await;
    let cases = [
        (
            "crawl",
            json!({"key": "a", "rate": "0/s", "burst": 1}),
            "keys[0].rate",
            "an integer 1-1000000",
        ),
        (
            "crawl",
            json!({"key": "a", "rate": "1/s", "burst": 0}),
            "keys[0].burst",
            "an integer 1-1000000",
        ),
        (
            "crawl",
            json!({"key": "a", "rate": "1/s", "burst": 2, "cost": 3}),
            "cost",
            "at most the burst (2)",
        ),
        (
            "crawl",
            json!({"key": "a", "rate": "1/s", "burst": 2, "wait_ms": 70000}),
            "wait_ms",
            "an integer 0-60000",
        ),
        (
            "crawl",
            json!({"key": "a b", "rate": "1/s", "burst": 2}),
            "keys[0]",
            "1-128 chars of [A-Za-z0-9_.:-]",
        ),
        (
            "crawl",
            json!({"key": "a", "rate": "fast", "burst": 2}),
            "rate",
            "\"fast\" is not a rate",
        ),
        (
            "cr!wl",
            json!({"key": "a", "rate": "1/s", "burst": 2}),
            "name",
            "1-64 chars",
        ),
        // JSON of the wrong type names the field and what it takes, not
        // serde's "did not match any variant of untagged enum".
        (
            "crawl",
            json!({"key": "a", "rate": "1/s", "burst": -1}),
            "burst",
            "an integer 1-1000000, or a list with one per key",
        ),
        (
            "crawl",
            json!({"key": "a", "rate": 10, "burst": 1}),
            "rate",
            "a rate like \"10/s\"",
        ),
        (
            "crawl",
            json!({"key": "a", "burst": 1}),
            "rate",
            "the field is required",
        ),
        (
            "crawl",
            json!({"keys": (0..17).map(|i| i.to_string()).collect::<Vec<_>>(), "rate": "1/s", "burst": 1}),
            "keys",
            "1-16 keys",
        ),
    ];
    for (name, body, field, expected) in cases {
        let path = format!("/budgets/{name}/take");
        let (status, answer, _) = call(&router, "POST", &path, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["field"], field, "{body}: {answer}");
        let got = answer["expected"].as_str().unwrap();
        assert!(got.contains(expected), "{body}: {answer}");
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
    redis.stop();
    let body = json!({"key": "a", "rate": "1/s", "burst": 2});
    let (status, answer, _) = call(&router, "POST", "/budgets/crawl/take", body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["error"], "redis unavailable");
}

/// The take metrics of acquires with a charge: a replayed request id
/// counts `replayed`, not `allowed` again; a bad charge counts
/// `bad_input`; a budget may be named `_other`, and names beyond the cap
/// count as `(other)`, which no name can be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charged_acquires_count_replays_and_bad_input() {
    let redis = RedisServer::start();
    let p = crate::pool::pool(&redis, "proxies").await;
    p.init(&["p1", "p2"]).await.unwrap();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &[]).await;
    let body = json!({"ttl_ms": 30000, "request_id": "r1", "budget": {
        "name": "_other", "key": "example.com", "rate": "1/m", "burst": 5,
    }});
    for _ in 0..2 {
        let (status, answer, _) =
            call(&router, "POST", "/pools/proxies/leases", body.clone()).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
    }
    let bad = json!({"ttl_ms": 30000, "budget": {
        "name": "domains", "key": "example.com", "rate": "1/m", "burst": 0,
    }});
    let (status, answer, _) = call(&router, "POST", "/pools/proxies/leases", bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let bad = json!({"ttl_ms": 30000, "budget": {"name": "domains", "key": "a b", "rate": "1/m", "burst": 1}});
    let (status, answer, _) = call(&router, "POST", "/pools/proxies/leases", bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (_, metrics, _) = call(&router, "GET", "/metrics", json!(null)).await;
    let text = metrics.as_str().unwrap();
    for line in [
        "snowlease_budget_takes_total{outcome=\"allowed\"} 1",
        "snowlease_budget_takes_total{outcome=\"replayed\"} 1",
        "snowlease_budget_takes_total{outcome=\"bad_input\"} 2",
        "snowlease_budget_takes_total{outcome=\"error\"} 0",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
}

/// A body is one JSON object: text after it (`{...}xyz`, `{...}{}`) is
/// refused with 400 naming `body`, and nothing is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_after_the_json_body_is_refused() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &[]).await;
    let body = r#"{"key":"a","rate":"1/s","burst":1,"penalty_ms":1000}"#;
    for path in ["/budgets/crawl/take", "/budgets/crawl/penalize"] {
        for tail in ["xyz", "{}", " ]]]"] {
            let take = body.replace(r#","penalty_ms":1000"#, "");
            let sent = if path.ends_with("take") {
                take
            } else {
                body.to_owned()
            };
            let request = axum::http::Request::builder()
                .method("POST")
                .uri(path)
                .body(axum::body::Body::from(format!("{sent}{tail}")))
                .unwrap();
            let response = tower::ServiceExt::oneshot(router.clone(), request)
                .await
                .unwrap();
            let status = response.status();
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
            let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {tail}: {answer}");
            assert_eq!(answer["field"], "body", "{answer}");
        }
    }
    assert_eq!(redis.dbsize(), 0, "nothing charged");
}

/// The budget routes read bodies by the rules of `pool serve`'s (one reader): a null is an
/// absent field (`cost: null` takes the default), an empty body names the first missing
/// field, an unknown field is "no such field"; an acquire's `budget` that is no object is
/// named itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_bodies_follow_the_rules_of_every_route() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &["p1"]).await;
    let take = json!({"key": "a", "rate": "1/s", "burst": 2, "cost": null, "wait_ms": null});
    let (status, answer, _) = call(&router, "POST", "/budgets/crawl/take", take).await;
    assert_eq!(status, StatusCode::OK, "null is absent: {answer}");
    let cases = [
        (
            "/budgets/crawl/take",
            String::new(),
            "rate",
            "the field is required",
        ),
        (
            "/budgets/crawl/take",
            r#"{"key": "a", "rate": "1/s", "burst": 2, "costs": 1}"#.to_owned(),
            "costs",
            "no such field",
        ),
        (
            "/pools/proxies/leases",
            r#"{"ttl_ms": 1000, "budget": 7}"#.to_owned(),
            "budget",
            "a JSON object",
        ),
    ];
    for (path, body, field, expected) in cases {
        let (status, answer, _) = crate::pool_http::call_raw(&router, "POST", path, &body).await;
        assert_eq!(
            (status, answer["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some(field)),
            "{path} {body}: {answer}"
        );
        let got = answer["expected"].as_str().unwrap();
        assert!(got.contains(expected), "{path} {body}: {answer}");
    }
}

/// `POST` `body` to `path`; the status and the `RateLimit-Policy` and `RateLimit` fields.
pub(crate) async fn ratelimit_fields(
    router: &axum::Router,
    path: &str,
    body: serde_json::Value,
) -> (StatusCode, Option<String>, Option<String>) {
    use tower::ServiceExt;
    let request = axum::http::Request::builder()
        .method("POST")
        .uri(path)
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let field = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    (
        response.status(),
        field("ratelimit-policy"),
        field("ratelimit"),
    )
}

/// Takes and a charged acquire carry the IETF RateLimit fields (structured-field form of
/// draft-ietf-httpapi-ratelimit-headers) beside `Retry-After`: the policy is the burst as
/// quota over the time a spent burst refills, the state the units left and the seconds until
/// full; on 200 and 429 alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_carry_the_ratelimit_fields() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &["a", "b", "c"]).await;
    let take = json!({"key": "example.com", "rate": "2/s", "burst": 3});
    // 0.5 s charged per take: full again in 0.5, 1.0, 1.5 s (whole seconds rounded up).
    let expected = [
        (StatusCode::OK, 2, 1),
        (StatusCode::OK, 1, 1),
        (StatusCode::OK, 0, 2),
    ];
    for (status, left, full) in expected {
        let (got, policy, state) =
            ratelimit_fields(&router, "/budgets/crawl/take", take.clone()).await;
        assert_eq!(got, status);
        assert_eq!(policy.as_deref(), Some("\"crawl\";q=3;w=2"));
        assert_eq!(
            state.as_deref(),
            Some(format!("\"crawl\";r={left};t={full}").as_str())
        );
    }
    let (got, policy, state) = ratelimit_fields(&router, "/budgets/crawl/take", take).await;
    assert_eq!(got, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policy.as_deref(), Some("\"crawl\";q=3;w=2"));
    assert_eq!(state.as_deref(), Some("\"crawl\";r=0;t=2"));

    let budget = json!({"name": "domains", "key": "shop.example.com", "rate": "1/m", "burst": 1});
    let acquire = json!({"ttl_ms": 10000, "budget": budget});
    let (got, _, _) = ratelimit_fields(&router, "/pools/proxies/leases", acquire.clone()).await;
    assert_eq!(got, StatusCode::CREATED);
    let (got, policy, state) = ratelimit_fields(&router, "/pools/proxies/leases", acquire).await;
    assert_eq!(got, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policy.as_deref(), Some("\"domains\";q=1;w=60"));
    assert_eq!(state.as_deref(), Some("\"domains\";r=0;t=60"));
}
