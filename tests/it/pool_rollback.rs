//! Pool acquires after Redis rolled back (a crash-restart from an older snapshot): the CLI,
//! `pool serve`'s router, the library's replay by request id and the charged acquire are
//! closed until the largest max lease has passed, so no id is leased to a second holder while
//! a holder the rollback lost still uses it, and the next fence is above every fence before.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use snowlease::budget::{BudgetKey, Charge};
use snowlease::connection::RedisTarget;
use snowlease::pool::serve::{ServeState, router};
use snowlease::pool::{
    AcquireRequest, Acquired, ChargedAcquire, Pool, PoolKeys, PoolOptions, acquire_charged,
};
use tokio_util::sync::CancellationToken;

use crate::harness::{RedisServer, ms, secs};
use crate::pool::{leased, pool_with, redis_ms};
use crate::pool_cli::{pool_cmd, pool_json};
use crate::pool_http::call;

/// The max lease of these tests: after a rollback, acquires are closed this long.
const MAX_LEASE: Duration = Duration::from_secs(2);

/// SAVE (the snapshot), then `after` (writes the restart loses), then [`crash_restart`].
fn roll_back(redis: &mut RedisServer, after: impl FnOnce(&RedisServer)) {
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    after(redis);
    crash_restart(redis);
}

/// SIGKILL and restart, loading the last SAVE's snapshot; asserts the node stamp changed.
fn crash_restart(redis: &mut RedisServer) {
    let stamp = redis.node_stamp();
    redis.restart();
    assert_ne!(
        redis.node_stamp(),
        stamp,
        "a restart changes the node stamp"
    );
}

/// `pool acquire` as a process: a lease taken after the snapshot is lost by the restart, and
/// the next acquire exits 3 naming the restart instead of leasing the same id again (before
/// the rollback gate it got id `a` with fence 1 a second time); with `--wait` it gets the id
/// only once the lost lease's max lease has run out, with a fence above Redis time in us.
#[test]
fn pool_cli_acquire_after_a_rollback_waits_out_the_max_lease() {
    let mut redis = RedisServer::start();
    pool_json(&redis, &["init", "--pool", "p", "--ids", "a"]);
    let acquire = ["acquire", "--pool", "p", "--ttl", "2s", "--max-lease", "2s"];
    let mut first = Value::Null;
    roll_back(&mut redis, |redis| first = pool_json(redis, &acquire));
    assert_eq!((&first["id"], &first["fence"]), (&json!("a"), &json!(1)));
    assert!(
        !redis.exists(&PoolKeys::new("p").leases),
        "the lease is lost"
    );

    let before_ms = redis_ms(&redis);
    let run = pool_cmd(&redis, &acquire, &[]);
    assert_eq!(
        run.code,
        Some(3),
        "id a must not be leased again while its lost holder may use it: {run:?}"
    );
    assert!(run.stderr.contains("acquires are closed"), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    // The acquire that found the rollback says so once in its log (pool serve logged
    // nothing of it, only 503s); later ones, closed as before, do not.
    const FOUND: &str = "acquires closed after a Redis restart or failover";
    assert_eq!(run.stderr.matches(FOUND).count(), 1, "{run:?}");
    let again = pool_cmd(&redis, &acquire, &[]);
    assert_eq!(again.code, Some(3), "{again:?}");
    assert!(!again.stderr.contains(FOUND), "{again:?}");

    let mut wait = acquire.to_vec();
    wait.extend(["--wait", "10s"]);
    let second = pool_json(&redis, &wait);
    assert_eq!(second["id"], "a");
    let start_ms = second["deadline_ms"].as_u64().unwrap() - 2_000;
    assert!(
        start_ms >= first["deadline_ms"].as_u64().unwrap(),
        "leased again only after the lost lease's deadline: {second} vs {first}"
    );
    let fence = second["fence"].as_u64().unwrap();
    assert!(
        fence > before_ms * 1000,
        "fence {fence} lifted above Redis time in us"
    );
}

/// `pool serve`'s router on the rolled-back Redis: 503 with Retry-After, `reason`
/// `redis_rollback` and the wait, then 201 once the max lease has passed, with a fence above
/// the lost one (before: 201 for the same id, fence 1 again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_after_a_rollback_answers_503_until_the_max_lease() {
    let mut redis = RedisServer::start();
    let options = PoolOptions {
        max_lease: MAX_LEASE,
    };
    let app = |redis: &RedisServer| {
        let conn = RedisTarget::parse(&redis.url())
            .unwrap()
            .connect(ms(500))
            .unwrap();
        let pool = Pool::new(conn, "p", options).unwrap();
        (
            router(ServeState::new(
                vec![pool.clone()],
                CancellationToken::new(),
            )),
            pool,
        )
    };
    let (r, pool) = app(&redis);
    pool.init(&["a"]).await.unwrap();
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let (status, lost, _) = call(&r, "POST", "/pools/p/leases", json!({"ttl_ms": 2000})).await;
    assert_eq!(
        (status.as_u16(), &lost["fence"]),
        (201, &json!(1)),
        "{lost}"
    );
    crash_restart(&mut redis);
    assert!(
        !redis.exists(&PoolKeys::new("p").leases),
        "the lease is lost"
    );

    let (r, _pool) = app(&redis);
    let (status, body, retry_after) =
        call(&r, "POST", "/pools/p/leases", json!({"ttl_ms": 2000})).await;
    assert_eq!(status.as_u16(), 503, "{body}");
    assert_eq!(body["reason"], "redis_rollback", "{body}");
    let wait = body["next_due_in_ms"].as_u64().unwrap();
    assert!(wait > 1_000 && wait <= 2_000, "{body}");
    assert_eq!(retry_after.as_deref(), Some("2"));

    let give_up = Instant::now() + secs(10);
    let lease = loop {
        let (status, body, _) = call(&r, "POST", "/pools/p/leases", json!({"ttl_ms": 2000})).await;
        if status.as_u16() == 201 {
            break body;
        }
        assert!(Instant::now() < give_up, "never opened: {body}");
        tokio::time::sleep(ms(100)).await;
    };
    assert_eq!(lease["id"], "a");
    assert!(lease["fence"].as_u64().unwrap() > 1_000_000, "{lease}");
    assert!(
        lease["deadline_ms"].as_u64().unwrap() - 2_000 >= lost["deadline_ms"].as_u64().unwrap(),
        "{lease} after {lost}"
    );
}

/// A retry by request id of a lease that is in the snapshot is not answered as valid after
/// the rollback (it may have been released and leased to another since, in writes the restart
/// lost); nor does a charged acquire lease. Before the gate the replay answered the old lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_charged_acquire_after_a_rollback_are_closed() {
    let mut redis = RedisServer::start();
    let options = PoolOptions {
        max_lease: MAX_LEASE,
    };
    let pool = pool_with(&redis, "p", options).await;
    pool.init(&["a", "b"]).await.unwrap();
    let req = AcquireRequest::new(MAX_LEASE).request_id("r1");
    let held = leased(pool.acquire(&req).await.unwrap());
    let (id, fence) = (held.id().to_owned(), held.fence());
    roll_back(&mut redis, |_| {});
    // In the lost writes the holder released the id and another took it: not replayed.
    let pool = pool_with(&redis, "p", options).await;
    let replay = pool.acquire(&req).await.unwrap();
    let Acquired::Empty {
        next_due_in: Some(wait),
        after_rollback: true,
        ..
    } = replay
    else {
        panic!("the lease of {id} (fence {fence}) must not be answered again: {replay:?}")
    };
    assert!(wait <= MAX_LEASE && wait > ms(1_000), "{wait:?}");

    let charge = Charge {
        budget: "domains".into(),
        keys: vec![BudgetKey::new("example.com", "10/s".parse().unwrap(), 10)],
        cost: 1,
    };
    let charged = acquire_charged(&pool, &AcquireRequest::new(secs(1)), &charge)
        .await
        .unwrap();
    assert!(
        matches!(
            charged,
            ChargedAcquire::Acquired(Acquired::Empty {
                after_rollback: true,
                ..
            })
        ),
        "{charged:?}"
    );
    assert!(
        !redis.exists("{p}:budget:domains:example.com"),
        "nothing charged while closed"
    );
}

/// A pool that shows leases but no node record (written by a version before the record, or
/// by plain workers) may have rolled back unseen: its first acquire closes for the max lease
/// and lifts the fence. A pool that never leased is stamped and leases at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_with_leases_but_no_record_closes_once() {
    let redis = RedisServer::start();
    let options = PoolOptions {
        max_lease: MAX_LEASE,
    };
    let keys = PoolKeys::new("old");
    let now = redis_ms(&redis);
    let _: () = redis.query(redis::cmd("ZADD").arg(&keys.ready).arg(0).arg("a"));
    let _: () = redis.query(
        redis::cmd("ZADD")
            .arg(&keys.leases)
            .arg(now + 60_000)
            .arg("b"),
    );
    let _: () = redis.query(redis::cmd("HSET").arg(&keys.owners).arg("b").arg("tok"));
    let _: () = redis.query(redis::cmd("SET").arg(&keys.fence).arg(7));
    let old = pool_with(&redis, "old", options).await;
    let answer = old.acquire(&AcquireRequest::new(secs(1))).await.unwrap();
    assert!(
        matches!(
            answer,
            Acquired::Empty {
                after_rollback: true,
                ..
            }
        ),
        "{answer:?}"
    );
    let fence: u64 = redis.get(&keys.fence).unwrap().parse().unwrap();
    assert!(fence >= now * 1000, "lifted: {fence}");

    let _: () = redis.query(redis::cmd("ZADD").arg("{new}:ready").arg(0).arg("a"));
    let new = pool_with(&redis, "new", options).await;
    let lease = leased(new.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert_eq!(lease.fence(), 1, "a pool that never leased starts at 1");
}
