//! Pool lease rules that a review broke (replay after extend, the cap), each
//! reproduced against a real redis-server.

use snowlease::pool::{AcquireRequest, Extended, PoolOptions, Released};

use crate::harness::{RedisServer, ms, secs};
use crate::pool::{
    check_invariants, empty, hash, leased, new_pool, pool_with, until_redis_after, zset,
};

/// A retry with the request id answers the same lease for as long as that
/// lease is valid, also after an extend took it past its first ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_answers_its_lease_after_extend() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "idem", &["a", "b"]).await;
    let req = AcquireRequest::new(secs(1)).request_id("r1");
    let mut first = leased(pool.acquire(&req).await.unwrap());
    let first_deadline = first.deadline_ms();
    assert!(matches!(
        first.extend(secs(10)).await.unwrap(),
        Extended::Extended { capped: false, .. }
    ));
    until_redis_after(&redis, first_deadline + 100).await;

    let again = leased(pool.acquire(&req).await.unwrap());
    assert!(again.replayed(), "a second lease for the same request id");
    assert_eq!(
        (again.id(), again.token(), again.fence()),
        (first.id(), first.token(), first.fence())
    );
    assert_eq!(
        again.deadline_ms(),
        first.deadline_ms(),
        "the extended deadline"
    );

    // Once the lease has ended, the request id leases anew.
    first.release(ms(0)).await.unwrap();
    let after = leased(pool.acquire(&req).await.unwrap());
    assert!(!after.replayed());
    assert_ne!(after.token(), first.token());
    check_invariants(&redis, pool.keys());
}

/// The total cap is fixed at acquire (its max lease) and stored with the
/// lease: an extend with a longer max lease cannot raise it, a shorter one
/// lowers it for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_cap_is_fixed_at_acquire() {
    let redis = RedisServer::start();
    let short = pool_with(&redis, "cap", PoolOptions { max_lease: secs(4) }).await;
    short.init(&["a", "b"]).await.unwrap();
    let long = pool_with(
        &redis,
        "cap",
        PoolOptions {
            max_lease: secs(86_400),
        },
    )
    .await;
    let default = pool_with(&redis, "cap", PoolOptions::default()).await;

    let lease = leased(short.acquire(&AcquireRequest::new(secs(3))).await.unwrap());
    let start = lease.deadline_ms() - 3000;
    for pool in [&long, &default] {
        match pool
            .extend_lease("a", lease.token(), secs(600))
            .await
            .unwrap()
        {
            Extended::Extended {
                deadline_ms,
                capped,
                ..
            } => {
                assert!(capped, "not capped");
                assert_eq!(deadline_ms, start + 4000, "cap moved");
            }
            other => panic!("{other:?}"),
        }
    }

    // A shorter max lease on an extend lowers the cap, and it stays low.
    let tight = pool_with(
        &redis,
        "cap",
        PoolOptions {
            max_lease: ms(3500),
        },
    )
    .await;
    let lease = leased(
        default
            .acquire(&AcquireRequest::new(secs(2)))
            .await
            .unwrap(),
    );
    let start = lease.deadline_ms() - 2000;
    let Extended::Extended { deadline_ms, .. } = tight
        .extend_lease("b", lease.token(), secs(5))
        .await
        .unwrap()
    else {
        panic!("extend failed");
    };
    assert_eq!(deadline_ms, start + 3500);
    let Extended::Extended {
        deadline_ms,
        capped,
        ..
    } = long
        .extend_lease("b", lease.token(), secs(5))
        .await
        .unwrap()
    else {
        panic!("extend failed");
    };
    assert!(capped);
    assert_eq!(
        deadline_ms,
        start + 3500,
        "the lowered cap was raised again"
    );
}

/// The next-due hint never counts a disabled id: with every id disabled
/// (leased or cooling) nothing will be due by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hint_never_counts_disabled_ids() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "hint", &["a", "b"]).await;
    let a = leased(pool.acquire(&AcquireRequest::new(secs(5))).await.unwrap());
    let b = leased(pool.acquire(&AcquireRequest::new(secs(5))).await.unwrap());
    b.release(secs(3)).await.unwrap();
    pool.disable(&["a", "b"]).await.unwrap();
    let (hint, _) = empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert_eq!(hint, None, "a disabled id counted as coming due");

    // Enabling the cooling one: the hint names its cooldown end again.
    pool.enable(&["b"]).await.unwrap();
    let (hint, at) = empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    let due = zset(&redis, &pool.keys().ready)["b"];
    assert_eq!(hint, Some(ms(due - at)));
    assert!(matches!(
        a.release(ms(0)).await.unwrap(),
        Released::Released { .. }
    ));
}

/// Disable then enable of a cooling id keeps its cooldown: it is due at
/// the same Redis ms as before, not at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_keeps_a_cooling_ids_cooldown() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "cool", &["a"]).await;
    let lease = leased(pool.acquire(&AcquireRequest::new(secs(5))).await.unwrap());
    let Released::Released { at_ms } = lease.release(secs(30)).await.unwrap() else {
        panic!("release failed");
    };
    pool.disable(&["a"]).await.unwrap();
    assert!(zset(&redis, &pool.keys().ready).is_empty());
    pool.enable(&["a"]).await.unwrap();
    assert_eq!(zset(&redis, &pool.keys().ready)["a"], at_ms + 30_000);
    empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    check_invariants(&redis, pool.keys());
}

/// A due id that is still in `leases` (put back into ready by a client that
/// knows only the three keys and misbehaves) is never leased: its holder's
/// lease stays exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_never_leases_an_id_still_in_leases() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "held", &["a"]).await;
    let keys = pool.keys().clone();
    let lease = leased(pool.acquire(&AcquireRequest::new(secs(30))).await.unwrap());
    let _: () = redis.query(redis::cmd("ZADD").arg(&keys.ready).arg(0).arg("a"));

    let (hint, at) = empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert_eq!(hint, Some(ms(lease.deadline_ms() - at)));
    assert_eq!(hash(&redis, &keys.owners)["a"], lease.token());
    assert_eq!(zset(&redis, &keys.leases)["a"], lease.deadline_ms());
    check_invariants(&redis, &keys);
    assert!(matches!(
        lease.release(ms(0)).await.unwrap(),
        Released::Released { .. }
    ));
}

/// Values in snowlease's own keys that no snowlease wrote (a parked due
/// time, a request entry, lease meta that are not in their format) never
/// make a script fail halfway: each is treated as absent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_in_own_keys_are_treated_as_absent() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "odd", &["a", "b"]).await;
    let keys = pool.keys().clone();
    pool.disable(&["a"]).await.unwrap();
    let hset = |key: &str, field: &str, value: &str| {
        let _: () = redis.query(redis::cmd("HSET").arg(key).arg(field).arg(value));
    };
    hset(&keys.parked, "a", "soon");
    assert_eq!(pool.enable(&["a"]).await.unwrap(), 1);
    assert!(zset(&redis, &keys.ready)["a"] > 0, "due now, not failed");

    hset(&keys.requests, "r1", "not a lease");
    let req = AcquireRequest::new(secs(5)).request_id("r1");
    let mut lease = leased(pool.acquire(&req).await.unwrap());
    assert!(!lease.replayed());
    hset(&keys.meta, lease.id(), "garbage");
    assert!(matches!(
        lease.extend(secs(5)).await.unwrap(),
        Extended::Extended { .. }
    ));
    assert!(matches!(
        lease.release(ms(0)).await.unwrap(),
        Released::Released { .. }
    ));
    check_invariants(&redis, &keys);
}

/// A request entry lives as long as its lease: release, reclaim, and an
/// extend of the id's next lease taken by a plain worker all remove it, so
/// the requests hash does not grow with request ids that are used once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_entries_go_with_their_lease() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "reqs", &["a"]).await;
    let keys = pool.keys().clone();
    let requests = || hash(&redis, &keys.requests);

    let lease = leased(
        pool.acquire(&AcquireRequest::new(secs(5)).request_id("r1"))
            .await
            .unwrap(),
    );
    assert_eq!(requests().len(), 1);
    lease.release(ms(0)).await.unwrap();
    assert!(requests().is_empty(), "release");

    let lease = leased(
        pool.acquire(&AcquireRequest::new(ms(50)).request_id("r2"))
            .await
            .unwrap(),
    );
    until_redis_after(&redis, lease.deadline_ms()).await;
    pool.reap(10, ms(0)).await.unwrap();
    assert!(requests().is_empty(), "reclaim");

    // A plain worker reclaims the expired lease and leases the id itself;
    // snowlease's extend of that lease drops the old entry.
    let lease = leased(
        pool.acquire(&AcquireRequest::new(ms(50)).request_id("r3"))
            .await
            .unwrap(),
    );
    until_redis_after(&redis, lease.deadline_ms()).await;
    let deadline = lease.deadline_ms() + 60_000;
    let _: () = redis.query(redis::cmd("HSET").arg(&keys.owners).arg("a").arg("plain"));
    let _: () = redis.query(redis::cmd("ZADD").arg(&keys.leases).arg(deadline).arg("a"));
    assert!(matches!(
        pool.extend_lease("a", "plain", secs(5)).await.unwrap(),
        Extended::Extended { .. }
    ));
    assert!(requests().is_empty(), "extend of the next lease");
    check_invariants(&redis, &keys);
}
