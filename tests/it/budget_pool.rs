//! A pool acquire with a charge to a rate budget (one script, the pool's
//! hash tag): a lease only together with the charge, a denial says when to
//! come back and leases nothing, an empty pool charges nothing, a replay of
//! an idempotent acquire is not charged twice; `pool acquire --budget`
//! and the HTTP acquire with a `budget` field.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use snowlease::budget::{BudgetKey, Charge, charge_key};
use snowlease::pool::{AcquireRequest, Acquired, PoolKeys};
use snowlease::pool::{ChargedAcquire, acquire_charged};

use crate::budget::budget_cmd;
use crate::harness::{RedisServer, ms, secs};
use crate::pool::{dump, pool};
use crate::pool_cli::pool_cmd;
use crate::pool_http::{call, serve_router};

fn charge(burst: u64) -> Charge {
    Charge {
        budget: "domains".into(),
        keys: vec![
            BudgetKey::new("example.com", "2/s".parse().unwrap(), burst),
            BudgetKey::new("shop.example.com", "1/m".parse().unwrap(), 10),
        ],
        cost: 1,
    }
}

/// Leases come only with a charge: two leases spend a burst of 2, the
/// third acquire is denied with retry_after_ms and leases nothing; a
/// replay with the same request id answers its lease and charges nothing;
/// an empty pool charges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_leases_only_with_a_charge() {
    let redis = RedisServer::start();
    let p = pool(&redis, "proxies").await;
    p.init(&["p1", "p2", "p3"]).await.unwrap();
    let req = AcquireRequest::new(secs(30));
    let c = charge(2);
    let key = charge_key("proxies", "domains", "example.com");
    assert_eq!(key, "{proxies}:budget:domains:example.com");
    let first = acquire_charged(&p, &req.clone().request_id("r1"), &c)
        .await
        .unwrap();
    let ChargedAcquire::Acquired(Acquired::Leased(lease)) = first else {
        panic!("{first:?}")
    };
    assert!(redis.exists(&key), "charged");
    assert!(matches!(
        acquire_charged(&p, &req, &c).await.unwrap(),
        ChargedAcquire::Acquired(Acquired::Leased(_))
    ));
    let before = dump(&redis);
    let denied = acquire_charged(&p, &req, &c).await.unwrap();
    let ChargedAcquire::Denied(taken) = denied else {
        panic!("{denied:?}")
    };
    assert!((400..=500).contains(&taken.retry_after_ms), "{taken:?}");
    let after = dump(&redis);
    assert_eq!(before, after, "a denial leases and charges nothing");
    let replay = acquire_charged(&p, &req.clone().request_id("r1"), &c)
        .await
        .unwrap();
    let ChargedAcquire::Acquired(Acquired::Leased(again)) = replay else {
        panic!("{replay:?}")
    };
    assert!(again.replayed() && again.id() == lease.id());
    assert_eq!(dump(&redis), after, "a replay is not charged again");

    tokio::time::sleep(Duration::from_millis(taken.retry_after_ms)).await;
    let third = acquire_charged(&p, &req, &c).await.unwrap();
    assert!(
        matches!(third, ChargedAcquire::Acquired(Acquired::Leased(_))),
        "{third:?}"
    );
    tokio::time::sleep(ms(600)).await;
    let pttl = redis.pttl(&key);
    let empty = acquire_charged(&p, &req, &c).await.unwrap();
    assert!(
        matches!(empty, ChargedAcquire::Acquired(Acquired::Empty { .. })),
        "{empty:?}"
    );
    assert!(redis.pttl(&key) <= pttl, "an empty pool charges nothing");
    let keys = PoolKeys::new("proxies");
    assert_eq!(redis.query::<u64>(redis::cmd("ZCARD").arg(&keys.leases)), 3);
}

/// `pool acquire --budget`: exit 0 with the lease, exit 6 with
/// retry_after_ms when the budget is spent (nothing leased); bad budget
/// flags exit 2 naming the flag. The HTTP acquire answers 429 with
/// Retry-After for a denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_and_http_acquire_with_a_budget() {
    let redis = RedisServer::start();
    let p = pool(&redis, "proxies").await;
    p.init(&["p1", "p2", "p3"]).await.unwrap();
    let args = [
        "acquire",
        "--pool",
        "proxies",
        "--ttl",
        "30s",
        "--budget",
        "domains",
        "--budget-key",
        "example.com",
        "--budget-rate",
        "1/m",
        "--budget-burst",
        "1",
    ];
    let ok = pool_cmd(&redis, &args, &[]);
    assert_eq!(ok.code, Some(0), "{ok:?}");
    assert!(ok.stdout.contains("\"token\""), "{ok:?}");
    let denied = pool_cmd(&redis, &args, &[]);
    assert_eq!(denied.code, Some(6), "{denied:?}");
    // A denial, not a Redis error: no Redis URL in front.
    assert!(
        denied.stderr.contains("denied by budget domains"),
        "{denied:?}"
    );
    assert!(!denied.stderr.contains("redis"), "{denied:?}");
    let answer: serde_json::Value = serde_json::from_str(&denied.stdout).unwrap();
    assert!(
        answer["retry_after_ms"].as_u64().unwrap() > 59_000,
        "{answer}"
    );
    let mut bad = args.to_vec();
    let last = bad.len() - 1;
    bad[last] = "0";
    let run = pool_cmd(&redis, &bad, &[]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--budget-burst"), "{run:?}");

    let (router, _shutdown) = serve_router(&redis, &["proxies"], &[]).await;
    let body = json!({"ttl_ms": 30000, "budget": {
        "name": "domains", "key": "example.com", "rate": "1/m", "burst": 1,
    }});
    let (status, answer, retry_after) = call(&router, "POST", "/pools/proxies/leases", body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert!(
        answer["retry_after_ms"].as_u64().unwrap() > 59_000,
        "{answer}"
    );
    assert!(retry_after.is_some());
    let body = json!({"ttl_ms": 30000, "budget": {
        "name": "domains", "key": "other.org", "rate": "1/m", "burst": 1,
    }});
    let (status, answer, _) = call(&router, "POST", "/pools/proxies/leases", body).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let body = json!({"ttl_ms": 30000, "budget": {"name": "domains", "key": "x", "rate": "1/m"}});
    let (status, answer, _) = call(&router, "POST", "/pools/proxies/leases", body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["field"].as_str().unwrap().starts_with("budget"),
        "{answer}"
    );
}

/// A wait shorter than the denial's retry_after_ms answers the denial at
/// once (under GCRA nobody can make it sooner): `budget take --wait`,
/// `pool acquire --budget --wait`, and `wait_ms` of both HTTP routes, each
/// with 3 s to wait against a retry of about a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_shorter_than_the_retry_answers_at_once() {
    let redis = RedisServer::start();
    let p = pool(&redis, "proxies").await;
    p.init(&["p1", "p2", "p3"]).await.unwrap();
    let quick = |what: &str, start: std::time::Instant| {
        let took = start.elapsed();
        assert!(took < ms(1500), "{what} took {took:?}");
    };
    let take = [
        "take", "--name", "w", "--key", "a", "--rate", "1/m", "--burst", "1", "--wait", "3s",
    ];
    assert_eq!(budget_cmd(&redis.url(), &take).code, Some(0));
    let start = std::time::Instant::now();
    let run = budget_cmd(&redis.url(), &take);
    assert_eq!(run.code, Some(6), "{run:?}");
    quick("budget take --wait", start);

    let acquire = [
        "acquire",
        "--pool",
        "proxies",
        "--ttl",
        "30s",
        "--wait",
        "3s",
        "--budget",
        "domains",
        "--budget-key",
        "example.com",
        "--budget-rate",
        "1/m",
        "--budget-burst",
        "1",
    ];
    assert_eq!(pool_cmd(&redis, &acquire, &[]).code, Some(0));
    let start = std::time::Instant::now();
    let run = pool_cmd(&redis, &acquire, &[]);
    assert_eq!(run.code, Some(6), "{run:?}");
    quick("pool acquire --budget --wait", start);

    let (router, _shutdown) = serve_router(&redis, &["proxies"], &[]).await;
    let body = json!({"key": "a", "rate": "1/m", "burst": 1, "wait_ms": 3000});
    let start = std::time::Instant::now();
    let (status, answer, _) = call(&router, "POST", "/budgets/w/take", body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    quick("HTTP take wait_ms", start);
    let body = json!({"ttl_ms": 30000, "wait_ms": 3000, "budget": {
        "name": "domains", "key": "example.com", "rate": "1/m", "burst": 1,
    }});
    let start = std::time::Instant::now();
    let (status, answer, _) = call(&router, "POST", "/pools/proxies/leases", body).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    quick("HTTP acquire wait_ms", start);
}

/// The crawler's 429: `budget penalize --pool P` pushes back the keys
/// `pool acquire --budget` charges; acquires are denied until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalize_in_the_pool_holds_acquires_back() {
    let redis = RedisServer::start();
    let p = pool(&redis, "proxies").await;
    p.init(&["p1", "p2"]).await.unwrap();
    let run = crate::budget::budget_cmd(
        &redis.url(),
        &[
            "penalize",
            "--pool",
            "proxies",
            "--name",
            "domains",
            "--key",
            "example.com",
            "--rate",
            "2/s",
            "--burst",
            "2",
            "--penalty",
            "700ms",
        ],
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(redis.exists(&charge_key("proxies", "domains", "example.com")));
    let one = Charge {
        budget: "domains".into(),
        keys: vec![BudgetKey::new("example.com", "2/s".parse().unwrap(), 2)],
        cost: 1,
    };
    let req = AcquireRequest::new(secs(30));
    let denied = acquire_charged(&p, &req, &one).await.unwrap();
    let ChargedAcquire::Denied(taken) = denied else {
        panic!("{denied:?}")
    };
    assert!((600..=700).contains(&taken.retry_after_ms), "{taken:?}");
    tokio::time::sleep(ms(taken.retry_after_ms)).await;
    let leased = acquire_charged(&p, &req, &one).await.unwrap();
    assert!(
        matches!(leased, ChargedAcquire::Acquired(Acquired::Leased(_))),
        "{leased:?}"
    );
}

/// Retries of a charged acquire (one request id) sent back to back while its 2 ms lease
/// expires: each is answered the lease (a replay, charged when first granted) or denied by
/// the spent budget (burst 1, 1/h), never a fresh lease. Before, the charge judged the
/// replay on one read of Redis' TIME and the acquire on a later one: a lease that expired
/// in between was replaced by a fresh one, uncharged (65 of 320 pipelined cycles).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_expires_during_the_call_never_leases_uncharged() {
    let redis = RedisServer::start();
    let p = pool(&redis, "px").await;
    let ids: Vec<String> = (0..64).map(|i| format!("p{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    p.init(&ids).await.unwrap();
    let mut uncharged = 0;
    for cycle in 0..100 {
        let c = Charge {
            budget: "domains".into(),
            keys: vec![BudgetKey::new(
                format!("d{cycle}.example"),
                "1/h".parse().unwrap(),
                1,
            )],
            cost: 1,
        };
        let req = AcquireRequest::new(ms(2)).request_id(format!("r{cycle}"));
        let first = acquire_charged(&p, &req, &c).await.unwrap();
        assert!(
            matches!(first, ChargedAcquire::Acquired(Acquired::Leased(_))),
            "{first:?}"
        );
        // Queued back to back on one connection: they run across the lease's expiry.
        let retries = (0..150).map(|_| acquire_charged(&p, &req, &c));
        for answer in futures_util::future::join_all(retries).await {
            if let ChargedAcquire::Acquired(Acquired::Leased(lease)) = answer.unwrap()
                && !lease.replayed()
            {
                uncharged += 1;
            }
        }
    }
    assert_eq!(uncharged, 0, "fresh leases without a charge");
}

/// A body that gives a field twice is refused naming it (400), at any depth, and nothing is
/// leased or charged. Before, `pool serve` read the body into a map where the last duplicate
/// won: `{"ttl_ms": 30000, "budget": {...}, "budget": null}` leased without a charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_given_twice_is_refused_never_leased_uncharged() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["proxies"], &["p1", "p2"]).await;
    let charge = r#"{"name": "domains", "key": "example.com", "rate": "1/m", "burst": 1}"#;
    for (body, field) in [
        (format!(r#"{{"ttl_ms": 30000, "budget": {charge}, "budget": null}}"#), "budget"),
        (format!(r#"{{"budget": null, "ttl_ms": 30000, "budget": {charge}}}"#), "budget"),
        (r#"{"ttl_ms": 30000, "ttl_ms": 1000}"#.to_owned(), "ttl_ms"),
        (
            r#"{"ttl_ms": 30000, "budget": {"name": "domains", "key": "a.com", "key": "b.com", "rate": "1/m"}}"#
                .to_owned(),
            "key",
        ),
    ] {
        let (status, answer, _) =
            crate::pool_http::call_raw(&router, "POST", "/pools/proxies/leases", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["field"], field, "{body}: {answer}");
    }
    let keys = PoolKeys::new("proxies");
    assert_eq!(
        redis.query::<u64>(redis::cmd("ZCARD").arg(&keys.leases)),
        0,
        "nothing leased"
    );
    assert!(
        redis.keys("{proxies}:budget:*").is_empty(),
        "nothing charged"
    );
}
