//! Rate budgets broken on purpose: a penalty's refill for takers with other limits than the
//! penalizer's, and the other findings of adversarial testing, on real redis-servers.

use snowlease::budget::BudgetKey;

use serde_json::json;

use crate::harness::{RedisServer, ms, poll_until, secs};
use crate::pool_http::Serve;

use crate::budget::{budget, rate};

/// `pool serve` of pool `none` with no reaper round for an hour (only requests and `/readyz`
/// ask Redis) and a 300 ms Redis timeout, once ready.
fn quiet_serve(redis: &RedisServer) -> Serve {
    let args = [
        "--pool",
        "none",
        "--reap-interval",
        "1h",
        "--redis-timeout",
        "300ms",
    ];
    let serve = Serve::start_at(&redis.url(), &args);
    assert!(poll_until(secs(10), || serve
        .call("GET", "/readyz", None)
        .0
        == 200));
    serve
}

/// Redis TIME in ms.
fn redis_ms(redis: &RedisServer) -> u64 {
    let t: Vec<u64> = redis.query(&mut redis::cmd("TIME"));
    t[0] * 1000 + t[1] / 1000
}

/// docs/pool.md, Penalize: after the penalty "the budget refills from empty at each taker's
/// own rate", whatever limits the penalizer passed. Penalized at 100/s burst 1 for 1 s, a
/// taker at 1/s burst 10 gets one unit at the penalty's end and then one per second, not
/// its whole burst: the key must outlive the penalty by the taker's window, which the
/// penalizer's limits do not tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_penalty_a_slower_taker_refills_from_empty() {
    let redis = RedisServer::start();
    let b = budget(&redis, "pen").await;
    let penalizer = [BudgetKey::new("example.com", rate("100/s"), 1)];
    let taker = [BudgetKey::new("example.com", rate("1/s"), 10)];
    let p = b.penalize(&penalizer, ms(1000)).await.unwrap();
    let denied = b.take(&taker, 1).await.unwrap();
    assert!(!denied.allowed, "{denied:?}");
    // Past the penalty's end on Redis' clock (and past the key's expiry for the
    // penalizer's limits, rounded up to the ms).
    let end = p.at_ms + 1000 + 20;
    assert!(poll_until(secs(5), || redis_ms(&redis) >= end));
    let first = b.take(&taker, 1).await.unwrap();
    assert!(first.allowed, "{first:?}");
    let second = b.take(&taker, 1).await.unwrap();
    assert!(
        first.remaining == 0 && !second.allowed,
        "from empty at 1/s the second take is due 1 s after the first: {first:?} {second:?}"
    );
}

/// docs/pool.md, `GET /readyz` of `pool serve`: 503 `redis_not_answering` while Redis does not
/// answer. With `--reap-interval 1h` nothing but the requests probes Redis; a budget take that
/// answers 503 `redis unavailable` on a paused Redis must make `/readyz` say so too (before:
/// only pool routes and reaper rounds were heard, so budget traffic left it 200 for up to an
/// hour), and a take answered again makes it ready again.
#[test]
fn a_budget_take_that_finds_redis_gone_makes_readyz_unready() {
    let redis = RedisServer::start();
    let serve = quiet_serve(&redis);
    let body = json!({"key": "example.com", "rate": "10/s", "burst": 10});
    redis.pause();
    let (status, answer, _) = serve.call("POST", "/budgets/crawl/take", Some(body.clone()));
    let (ready, state, _) = serve.call("GET", "/readyz", None);
    redis.resume();
    assert_eq!(status, 503, "{answer}");
    assert_eq!(
        (ready, &state["state"]),
        (503, &json!("redis_not_answering")),
        "a take just found Redis not answering: {state}"
    );
    let (status, answer, _) = serve.call("POST", "/budgets/crawl/take", Some(body));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(serve.call("GET", "/readyz", None).0, 200);
}

/// docs/pool.md, HTTP fields: `w` of `RateLimit-Policy` is burst / rate in seconds rounded up.
/// At 3 per 3001 ms with a burst of 1 a spent burst refills in 1000.33 ms: `w=2`, not 1 (the
/// refill time was floored to whole ms before rounding up to seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_window_rounds_up_the_exact_refill_time() {
    let redis = RedisServer::start();
    let (router, _shutdown) = crate::pool_http::serve_router(&redis, &["none"], &[]).await;
    let take = json!({"key": "example.com", "rate": "3/3001ms", "burst": 1});
    let (status, policy, _) =
        crate::budget_http::ratelimit_fields(&router, "/budgets/crawl/take", take).await;
    assert_eq!(status, axum::http::StatusCode::OK);
    assert_eq!(policy.as_deref(), Some("\"crawl\";q=1;w=2"));
}

/// docs/pool.md, `GET /readyz` of `pool serve`: 503 `redis_not_answering` only while Redis
/// does not answer. Once a request found Redis gone, nothing but another request or a reaper
/// round asked again: with `--reap-interval 1h` and no traffic, `/readyz` stayed 503 for up
/// to an hour after Redis answered again; now `/readyz` itself asks (a bounded `TIME`).
#[test]
fn readyz_turns_ready_again_when_redis_answers_without_traffic() {
    let redis = RedisServer::start();
    let serve = quiet_serve(&redis);
    redis.pause();
    let (status, answer, _) = serve.call("GET", "/pools/none", None);
    // While Redis is paused /readyz asks it and says so.
    assert_eq!(serve.call("GET", "/readyz", None).0, 503);
    redis.resume();
    assert_eq!(status, 503, "{answer}");
    assert!(
        poll_until(secs(5), || serve.call("GET", "/readyz", None).0 == 200),
        "Redis answers again, /readyz still {:?}",
        serve.call("GET", "/readyz", None)
    );
}

/// The house rule for bad input: the error names the field and its range. A value of the
/// wrong type in a budget body (`"wait_ms": 1.5`, `"cost": "2"`, `"penalty_ms": "30s"`, a
/// key that is not a string) and a missing `penalty_ms` answered serde's words ("invalid
/// type: floating point `1.5`, expected u64"), while the same field out of range named it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_in_budget_bodies_name_the_range() {
    let redis = RedisServer::start();
    let (router, _shutdown) = crate::pool_http::serve_router(&redis, &["proxies"], &[]).await;
    let take = "/budgets/crawl/take";
    let penalize = "/budgets/crawl/penalize";
    let leases = "/pools/proxies/leases";
    let cases = [
        (
            take,
            json!({"key": "a", "rate": "1/s", "burst": 1, "wait_ms": 1.5}),
            "wait_ms",
            "an integer 0-60000",
        ),
        (
            take,
            json!({"key": "a", "rate": "1/s", "burst": 1, "cost": "2"}),
            "cost",
            "an integer 1-1000000",
        ),
        (
            take,
            json!({"keys": ["a", 7], "rate": "1/s", "burst": 1}),
            "keys[1]",
            "1-128 chars of [A-Za-z0-9_.:-]",
        ),
        (
            take,
            json!({"key": "a", "rate": "1/s", "burst": 1, "pool": 3}),
            "pool",
            "1-64 chars of [A-Za-z0-9_-]",
        ),
        (
            penalize,
            json!({"key": "a", "rate": "1/s", "burst": 1, "penalty_ms": "30s"}),
            "penalty_ms",
            "an integer 1-86400000",
        ),
        (
            penalize,
            json!({"key": "a", "rate": "1/s", "burst": 1}),
            "penalty_ms",
            "an integer 1-86400000",
        ),
        (
            leases,
            json!({"ttl_ms": 1000, "budget": {"name": "d", "key": "a", "rate": "1/s", "burst": 1, "cost": -1}}),
            "budget.cost",
            "an integer 1-1000000",
        ),
    ];
    for (path, body, field, expected) in cases {
        let (status, answer, _) = crate::pool_http::call(&router, "POST", path, body.clone()).await;
        assert_eq!(
            status,
            axum::http::StatusCode::BAD_REQUEST,
            "{path} {body}: {answer}"
        );
        assert_eq!(
            (answer["field"].as_str(), answer["expected"].as_str()),
            (Some(field), Some(expected)),
            "{path} {body}"
        );
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
}

/// A penalty of the longest length (1 day) written by a Redis node whose clock ran 1 s
/// ahead of the node that serves the key now (a failover to a replica, or the node's clock
/// stepped back) holds an end more than a day after this node's now. The sanity bound on a
/// stored penalty end had no slack: every take and penalize of the key answered "bad key in
/// redis" (exit 1, HTTP 500) for up to a day. Now the end is bounded as the TAT is (a full
/// window plus the longest penalty after now) and the take is denied until it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_long_penalty_from_a_clock_ahead_stays_readable() {
    let redis = RedisServer::start();
    let b = budget(&redis, "clock").await;
    let keys = [BudgetKey::new("example.com", rate("1/s"), 1)];
    b.penalize(&keys, secs(86_400)).await.unwrap();
    let key = "snowlease:budget:{clock}:example.com";
    let (value, pttl) = redis.get_with_pttl(key);
    let value = value.unwrap();
    let (tat, until) = value.split_once(':').unwrap();
    // 1 s (us): the take below must come within it to see more than a day left (50 ms did
    // not always on a loaded machine).
    let ahead: u64 = until.parse::<u64>().unwrap() + 1_000_000;
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(key)
            .arg(format!("{tat}:{ahead}"))
            .arg("PX")
            .arg(pttl),
    );
    let taken = b.take(&keys, 1).await;
    let taken = taken.unwrap_or_else(|e| panic!("a take of a penalized key: {e}"));
    assert!(
        !taken.allowed && taken.retry_after_ms > 86_400_000,
        "{taken:?}"
    );
    let again = b.penalize(&keys, secs(1)).await.unwrap();
    assert!(
        again.retry_after_ms > 86_400_000,
        "the later end is kept: {again:?}"
    );
}
