//! Quarantine and strikes against a real redis-server: the
//! quarantine holds to the Redis ms, strikes disable within their window,
//! each cell of the state table, stale tokens change nothing, bad input
//! through the API, the CLI and HTTP writes nothing.

use std::time::Duration;

use serde_json::{Value, json};
use snowlease::pool::{
    AcquireRequest, Acquired, LostReason, Pool, PoolError, PoolKeys, Quarantine, Released,
    StrikePolicy,
};
use tokio::time::Instant;

use crate::harness::{RedisServer, metric_value, ms, secs};
use crate::pool::{
    assert_bad, check_invariants, dump, empty, leased, new_pool, pool, redis_ms, set,
    until_redis_after, zset,
};
use crate::pool_cli::{pool_cmd, pool_json};
use crate::pool_http::{call, serve_router};

fn q(duration: Duration, reason: &str) -> Quarantine {
    Quarantine {
        duration,
        reason: reason.to_owned(),
    }
}

/// (until_ms, strikes, auto_disabled) of a release into quarantine.
#[track_caller]
fn quarantined(released: Released) -> (u64, u64, bool) {
    match released {
        Released::Quarantined {
            until_ms,
            strikes,
            auto_disabled,
            ..
        } => (until_ms, strikes, auto_disabled),
        other => panic!("expected a quarantine, got {other:?}"),
    }
}

/// Acquires (1 s ttl) and asserts which id came out.
async fn acquire_id(pool: &Pool) -> snowlease::pool::PoolLease {
    leased(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap())
}

/// Group 1: a quarantined id is not acquired until its end (to the Redis
/// ms: every empty answer comes before it and names it), then is; status
/// shows it with time left and reason; a worker that knows only the three
/// keys does not see it in ready meanwhile, and one it is put back by is
/// skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_holds_to_the_redis_ms_then_the_id_returns() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "qa", &["a"]).await;
    let keys = pool.keys().clone();
    let lease = acquire_id(&pool).await;
    let (until, strikes, auto) =
        quarantined(lease.quarantine(&q(ms(400), "captcha wall")).await.unwrap());
    assert_eq!((strikes, auto), (0, false), "strikes are off by default");
    assert!(zset(&redis, &keys.ready).is_empty(), "out of ready");
    assert!(zset(&redis, &keys.leases).is_empty());
    check_invariants(&redis, &keys);

    let status = pool.status().await.unwrap();
    assert_eq!((status.quarantined, status.ready_due), (1, 0));
    let entry = &status.quarantine[0];
    assert_eq!(
        (
            entry.id.as_str(),
            entry.until_ms,
            entry.reason.as_str(),
            entry.disabled
        ),
        ("a", until, "captcha wall", false)
    );
    assert_eq!(entry.left_ms, until - status.now_ms);

    // A worker that knows only the three keys puts it back into ready:
    // acquire still does not lease it, and drops the entry.
    let _: () = redis.query(redis::cmd("ZADD").arg(&keys.ready).arg(0).arg("a"));
    empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert!(zset(&redis, &keys.ready).is_empty());
    assert_eq!(zset(&redis, &keys.quarantine)["a"], until);

    let give_up = Instant::now() + secs(5);
    let mut empties = 0;
    let next = loop {
        match pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap() {
            Acquired::Empty {
                next_due_in, at_ms, ..
            } => {
                assert!(at_ms < until, "empty at {at_ms}, quarantined until {until}");
                assert_eq!(
                    next_due_in,
                    Some(ms(until - at_ms)),
                    "the hint names its end"
                );
                empties += 1;
                assert!(Instant::now() < give_up, "never came back");
                tokio::time::sleep(ms(5)).await;
            }
            Acquired::Leased(lease) => break lease,
        }
    };
    assert!(empties > 0);
    assert_eq!(next.id(), "a");
    assert!(next.deadline_ms() - 1000 >= until, "leased before the end");
    assert!(pool.status().await.unwrap().quarantine.is_empty());
    check_invariants(&redis, &keys);
}

/// Group 2: with max 2 strikes, the second quarantine within the window
/// disables the id (reason recorded, only enable brings it back, which
/// clears its strikes); after the window, strikes start again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strikes_disable_within_the_window_and_reset_after_it() {
    let redis = RedisServer::start();
    let pool = pool(&redis, "st").await;
    let policy = StrikePolicy {
        max_strikes: 2,
        window: secs(600),
    };
    pool.init_with(&["a"], Some(policy)).await.unwrap();
    assert_eq!(pool.strikes().await.unwrap(), Some(policy));

    let first = acquire_id(&pool).await;
    let (until, strikes, auto) = quarantined(first.quarantine(&q(ms(1), "timeout")).await.unwrap());
    assert_eq!((strikes, auto), (1, false));
    until_redis_after(&redis, until).await;
    let second = acquire_id(&pool).await;
    let (until, strikes, auto) = quarantined(second.quarantine(&q(ms(1), "banned")).await.unwrap());
    assert_eq!((strikes, auto), (2, true));
    until_redis_after(&redis, until + 10).await;
    let (hint, _) = empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert_eq!(hint, None, "the quarantine ended, the id stays disabled");
    let status = pool.status().await.unwrap();
    assert_eq!((status.disabled, status.auto_disabled), (1, 1));
    assert_eq!(status.auto_disabled_ids[0].id, "a");
    assert!(
        status.auto_disabled_ids[0].reason.contains("banned"),
        "{status:?}"
    );

    assert_eq!(pool.enable(&["a"]).await.unwrap(), 1);
    assert_eq!(pool.status().await.unwrap().auto_disabled, 0);
    // The shortest window, for the part about strikes expiring.
    let short = StrikePolicy {
        max_strikes: 2,
        window: secs(1),
    };
    assert_eq!(pool.set_strikes(Some(short)).await.unwrap(), Some(short));
    let third = acquire_id(&pool).await;
    let (until, strikes, _) = quarantined(third.quarantine(&q(ms(1), "x")).await.unwrap());
    assert_eq!(strikes, 1, "enable cleared the strikes");

    // Past the window the earlier strike no longer counts.
    until_redis_after(&redis, until + 1000).await;
    let fourth = acquire_id(&pool).await;
    let (_, strikes, auto) = quarantined(fourth.quarantine(&q(ms(1), "y")).await.unwrap());
    assert_eq!((strikes, auto), (1, false));
    assert!(set(&redis, &pool.keys().disabled).is_empty());

    // Strikes off: quarantines count nothing.
    assert_eq!(pool.set_strikes(None).await.unwrap(), None);
    until_redis_after(&redis, redis_ms(&redis) + 2).await;
    let fifth = acquire_id(&pool).await;
    assert_eq!(
        quarantined(fifth.quarantine(&q(ms(1), "z")).await.unwrap()).1,
        0
    );
}

/// Group 3: each cell of the state table (disabled > quarantined >
/// cooling > ready): enable on a quarantined id keeps the quarantine
/// unless forced; a disable during quarantine outlives its end; enable of
/// a disabled and quarantined id leaves the quarantine running; a
/// quarantined leased-and-disabled id stays out; enable of a cooling id
/// keeps its cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precedence_of_admin_states_cell_by_cell() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "prec", &["a", "b", "c", "d", "e"]).await;
    let keys = pool.keys().clone();
    let long = q(secs(120), "long");
    let mut leases = Vec::new();
    for _ in 0..5 {
        leases.push(acquire_id(&pool).await);
    }
    let by_id = |id: &str| leases.iter().find(|l| l.id() == id).unwrap();

    // a: quarantined; enable (not forced) changes nothing, --force ends it.
    let (until_a, ..) = quarantined(by_id("a").quarantine(&long).await.unwrap());
    assert_eq!(pool.enable(&["a"]).await.unwrap(), 0);
    assert_eq!(zset(&redis, &keys.quarantine)["a"], until_a);
    // b: quarantined, then disabled; the short quarantine ends, b stays out.
    let (until_b, ..) = quarantined(by_id("b").quarantine(&q(ms(50), "")).await.unwrap());
    assert_eq!(pool.disable(&["b"]).await.unwrap(), 1);
    // c: disabled and quarantined; enable (not forced) leaves the quarantine.
    quarantined(by_id("c").quarantine(&long).await.unwrap());
    pool.disable(&["c"]).await.unwrap();
    assert_eq!(pool.enable(&["c"]).await.unwrap(), 1);
    // d: leased and disabled, then quarantined: disabled and quarantined.
    pool.disable(&["d"]).await.unwrap();
    quarantined(by_id("d").quarantine(&q(ms(50), "")).await.unwrap());
    // e: cooling, disabled, enabled: the cooldown still applies.
    let Released::Released { at_ms } = by_id("e").release(secs(60)).await.unwrap() else {
        panic!("release of e failed");
    };
    pool.disable(&["e"]).await.unwrap();
    pool.enable(&["e"]).await.unwrap();
    assert_eq!(zset(&redis, &keys.ready)["e"], at_ms + 60_000);

    until_redis_after(&redis, until_b + 60).await;
    // The reap ends b's and d's quarantines: they stay out of ready, where
    // a worker that knows only the three keys would take them.
    assert_eq!(pool.reap(100, ms(0)).await.unwrap().quarantines_ended, 2);
    assert!(
        zset(&redis, &keys.ready).keys().eq(["e"].iter()),
        "only e, cooling"
    );
    let (hint, at) = empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert!(
        zset(&redis, &keys.ready).keys().eq(["e"].iter()),
        "only e, cooling"
    );
    assert!(
        !zset(&redis, &keys.quarantine).contains_key("b"),
        "b's quarantine ended"
    );
    assert_eq!(
        hint,
        Some(ms(at_ms + 60_000 - at)),
        "e's cooldown, never b or d"
    );
    let status = pool.status().await.unwrap();
    assert_eq!(
        (status.disabled, status.quarantined, status.ready_cooling),
        (2, 2, 1),
        "b, d disabled; a, c quarantined; e cooling: {status:?}"
    );

    // Forced enable: a and c due now; b and d (their quarantines over) too.
    assert_eq!(pool.enable_force(&["a", "c"]).await.unwrap(), 2);
    assert_eq!(pool.enable(&["b", "d"]).await.unwrap(), 2);
    let mut got: Vec<String> = Vec::new();
    for _ in 0..4 {
        got.push(acquire_id(&pool).await.id().to_owned());
    }
    got.sort();
    assert_eq!(got, ["a", "b", "c", "d"]);
    assert!(zset(&redis, &keys.quarantine).is_empty());
    check_invariants(&redis, &keys);
}

/// Group 4: a wrong token, an expired lease's token, and the token of a
/// lease since given to someone else cannot quarantine: not_owner or
/// expired, and the keyspace is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_tokens_cannot_quarantine() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "stale", &["a"]).await;
    let quarantine = q(secs(60), "burned");
    let lease = leased(pool.acquire(&AcquireRequest::new(ms(100))).await.unwrap());

    let before = dump(&redis);
    let wrong = pool
        .quarantine_lease("a", "not-the-token", &quarantine)
        .await;
    assert!(
        matches!(
            wrong,
            Ok(Released::NotOwner {
                reason: LostReason::OtherOwner,
                ..
            })
        ),
        "{wrong:?}"
    );
    assert_eq!(dump(&redis), before);

    until_redis_after(&redis, lease.deadline_ms()).await;
    let before = dump(&redis);
    let late = lease.quarantine(&quarantine).await;
    assert!(
        matches!(
            late,
            Ok(Released::NotOwner {
                reason: LostReason::Expired,
                ..
            })
        ),
        "{late:?}"
    );
    assert_eq!(dump(&redis), before);

    let next = acquire_id(&pool).await;
    assert_eq!(next.id(), "a");
    let before = dump(&redis);
    let old = lease.quarantine(&quarantine).await;
    assert!(matches!(old, Ok(Released::NotOwner { .. })), "{old:?}");
    assert_eq!(dump(&redis), before);
    assert!(zset(&redis, &pool.keys().quarantine).is_empty());
}

/// Group 5, API: quarantines of 0 or past 30 days, reasons too long or
/// with control characters, strikes of 0 or past 100, windows under 1 s or
/// past 30 days: each refused naming the field, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_quarantine_and_strike_input_is_refused_by_the_api() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "bad", &["a"]).await;
    let lease = acquire_id(&pool).await;
    let before = dump(&redis);
    let long_reason = "r".repeat(201);
    for (quarantine, field) in [
        (q(ms(0), ""), "quarantine"),
        (q(secs(30 * 86_400) + ms(1), ""), "quarantine"),
        (q(Duration::from_micros(1500), ""), "quarantine"),
        (q(secs(1), &long_reason), "reason"),
        (q(secs(1), "two\nlines"), "reason"),
    ] {
        assert_bad(lease.quarantine(&quarantine).await, field);
    }
    let policy = |max_strikes, window| {
        Some(StrikePolicy {
            max_strikes,
            window,
        })
    };
    for (strikes, field) in [
        (policy(0, secs(60)), "max_strikes"),
        (policy(101, secs(60)), "max_strikes"),
        (policy(2, ms(999)), "strike_window"),
        (policy(2, secs(30 * 86_400 + 1)), "strike_window"),
    ] {
        assert_bad(pool.set_strikes(strikes).await, field);
        let fresh = crate::pool::pool(&redis, "fresh").await;
        assert_bad(fresh.init_with(&["x"], strikes).await, field);
    }
    assert_eq!(dump(&redis), before);
    let missing = crate::pool::pool(&redis, "missing").await;
    assert!(matches!(
        missing.set_strikes(None).await,
        Err(PoolError::NoPool { .. })
    ));
    assert_eq!(dump(&redis), before);
}

/// Group 5, CLI: bad quarantine, reason and strike flags exit 2 naming the
/// flag (never echoing the reason text) and write nothing; the good path
/// prints the quarantine and status --json lists it.
#[test]
fn cli_quarantine_strikes_and_bad_input() {
    let redis = RedisServer::start();
    let keys = PoolKeys::new("cq");
    let init = pool_json(
        &redis,
        &[
            "init",
            "--pool",
            "cq",
            "--ids",
            "a,b",
            "--max-strikes",
            "3",
            "--strike-window",
            "1h",
        ],
    );
    assert_eq!(init["added"], 2);
    let config = pool_json(&redis, &["config", "--pool", "cq"]);
    assert_eq!(
        (
            config["max_strikes"].as_u64(),
            config["strike_window_ms"].as_u64()
        ),
        (Some(3), Some(3_600_000))
    );
    let lease = pool_json(&redis, &["acquire", "--pool", "cq", "--ttl", "30s"]);
    let (id, token) = (
        lease["id"].as_str().unwrap(),
        lease["token"].as_str().unwrap(),
    );
    let secret_reason = "x".repeat(201);
    let before = dump(&redis);
    let release = |extra: &[&str]| {
        let mut argv = vec!["release", "--pool", "cq", "--id", id, "--token", token];
        argv.extend_from_slice(extra);
        pool_cmd(&redis, &argv, &[])
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--quarantine", "0s"], "--quarantine"),
        (vec!["--quarantine", "31d"], "--quarantine"),
        (vec!["--quarantine", "1500us"], "--quarantine"),
        (
            vec!["--quarantine", "1m", "--reason", &secret_reason],
            "--reason",
        ),
        (vec!["--quarantine", "1m", "--reason", "a\tb"], "--reason"),
        (vec!["--reason", "no quarantine"], "--quarantine"),
        (vec!["--quarantine=-5s"], "--quarantine"),
    ];
    for (extra, flag) in cases {
        let run = release(&extra);
        assert_eq!(run.code, Some(2), "{extra:?}: {run:?}");
        assert!(run.stderr.contains(flag), "{extra:?} names {flag}: {run:?}");
        assert!(!run.stderr.contains(&secret_reason));
        assert!(!run.stderr.contains(token));
    }
    for argv in [
        vec![
            "config",
            "--pool",
            "cq",
            "--max-strikes",
            "0",
            "--strike-window",
            "1h",
        ],
        vec![
            "config",
            "--pool",
            "cq",
            "--max-strikes",
            "101",
            "--strike-window",
            "1h",
        ],
        vec![
            "config",
            "--pool",
            "cq",
            "--max-strikes",
            "2",
            "--strike-window",
            "999ms",
        ],
        vec![
            "config",
            "--pool",
            "cq",
            "--max-strikes",
            "2",
            "--strike-window",
            "31d",
        ],
        vec!["config", "--pool", "cq", "--max-strikes", "2"],
        vec![
            "config",
            "--pool",
            "cq",
            "--strikes-off",
            "--max-strikes",
            "2",
            "--strike-window",
            "1h",
        ],
        vec![
            "init",
            "--pool",
            "fresh",
            "--ids",
            "x",
            "--max-strikes",
            "0",
            "--strike-window",
            "1h",
        ],
        vec!["config", "--pool", "nosuchpool"],
    ] {
        let run = pool_cmd(&redis, &argv, &[]);
        assert_eq!(run.code, Some(2), "{argv:?}: {run:?}");
    }
    assert_eq!(dump(&redis), before);

    let out = pool_json(
        &redis,
        &[
            "release",
            "--pool",
            "cq",
            "--id",
            id,
            "--token",
            token,
            "--quarantine",
            "10m",
            "--reason",
            "captcha wall",
        ],
    );
    assert_eq!(
        (out["strikes"].as_u64(), out["auto_disabled"].as_bool()),
        (Some(1), Some(false))
    );
    let until = out["quarantined_until_ms"].as_u64().unwrap();
    assert_eq!(zset(&redis, &keys.quarantine)[id], until);
    let status = pool_json(&redis, &["status", "--pool", "cq", "--json"]);
    assert_eq!(status["quarantined"], 1);
    assert_eq!(status["quarantine"][0]["reason"], "captcha wall");
    assert_eq!(status["quarantine"][0]["id"], id);
    assert!(status["quarantine"][0]["left_ms"].as_u64().unwrap() <= 600_000);
    let table = pool_cmd(&redis, &["status", "--pool", "cq"], &[]);
    assert!(table.stdout.contains("captcha wall"), "{table:?}");
    let off = pool_json(&redis, &["config", "--pool", "cq", "--strikes-off"]);
    assert_eq!(off["max_strikes"], Value::Null);
    let forced = pool_json(&redis, &["enable", "--pool", "cq", "--ids", id, "--force"]);
    assert_eq!(forced["enabled"], 1);
    assert!(zset(&redis, &keys.ready).contains_key(id));
}

/// Group 5, HTTP: bad quarantine_ms and reason answer 400 naming the field
/// and write nothing; a good one answers the quarantine, GET /pools/{pool}
/// lists it, the gauges and the quarantine counter follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_quarantine_and_bad_input() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["hq"], &["vn-a01", "vn-a02"]).await;
    let (_, lease, _) = call(
        &router,
        "POST",
        "/pools/hq/leases",
        json!({"ttl_ms": 30000}),
    )
    .await;
    let id = lease["id"].as_str().unwrap().to_owned();
    let token = lease["token"].as_str().unwrap().to_owned();
    let path = format!("/pools/hq/leases/{id}/release");
    let before = dump(&redis);
    let long = "r".repeat(201);
    for (body, field) in [
        (
            json!({"token": token, "quarantine_ms": -1}),
            "quarantine_ms",
        ),
        (json!({"token": token, "quarantine_ms": 0}), "quarantine_ms"),
        (
            json!({"token": token, "quarantine_ms": 2_592_000_001_u64}),
            "quarantine_ms",
        ),
        (
            json!({"token": token, "quarantine_ms": "60000"}),
            "quarantine_ms",
        ),
        (
            json!({"token": token, "quarantine_ms": 60000, "reason": long}),
            "reason",
        ),
        (
            json!({"token": token, "quarantine_ms": 60000, "reason": "a\u{1}b"}),
            "reason",
        ),
        (
            json!({"token": token, "quarantine_ms": 60000, "reason": 5}),
            "reason",
        ),
        (json!({"token": token, "reason": "no quarantine"}), "reason"),
    ] {
        let (status, answer, _) = call(&router, "POST", &path, body.clone()).await;
        assert_eq!(status.as_u16(), 400, "{body}: {answer}");
        assert_eq!(answer["field"], field, "{body}: {answer}");
        assert!(!answer.to_string().contains(&long));
    }
    assert_eq!(dump(&redis), before);

    let body = json!({"token": token, "quarantine_ms": 60000, "reason": "banned"});
    let (status, answer, _) = call(&router, "POST", &path, body).await;
    assert_eq!(status.as_u16(), 200, "{answer}");
    assert_eq!(answer["auto_disabled"], false);
    let until = answer["quarantined_until_ms"].as_u64().unwrap();
    let (_, pool_status, _) = call(&router, "GET", "/pools/hq", Value::Null).await;
    assert_eq!(pool_status["quarantined"], 1, "{pool_status}");
    assert_eq!(pool_status["quarantine"][0]["until_ms"], until);
    assert_eq!(pool_status["quarantine"][0]["reason"], "banned");
    let (_, metrics, _) = call(&router, "GET", "/metrics", Value::Null).await;
    let text = metrics.as_str().unwrap();
    let value = |series: &str| metric_value(text, series);
    assert_eq!(
        value("snowlease_pool_quarantined{pool=\"hq\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value("snowlease_pool_auto_disabled{pool=\"hq\"}"),
        Some(0.0)
    );
    assert_eq!(
        value("snowlease_pool_quarantines_total{pool=\"hq\"}"),
        Some(1.0)
    );
    assert!(
        !text.contains("banned") && !text.contains(&id),
        "no reason or id in metrics"
    );
    // The other id is still leased normally; the quarantined one is not.
    let (_, next, _) = call(&router, "POST", "/pools/hq/leases", json!({"ttl_ms": 1000})).await;
    assert_ne!(next["id"].as_str(), Some(id.as_str()));
}
