//! Pool mode against a real redis-server: the Lua scripts through the Rust
//! API and called raw, lost leases, reclaim, bad input, concurrency,
//! idempotent acquire, and compatibility with workers that know only the
//! three keys of the pool layout (docs/pool.md, "Keys and compatibility").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use redis::Value;
use snowlease::connection::{Redis, RedisTarget};
use snowlease::pool::{
    AcquireRequest, Acquired, Extended, LostReason, Pool, PoolError, PoolKeys, PoolLease,
    PoolOptions, PoolScript, Released,
};
use tokio::time::Instant;

use crate::harness::{RedisServer, ms, secs};

/// Where a test reads a pool's keys directly, and the URL pool clients
/// connect through: a private standalone [`RedisServer`] here, or the
/// Cluster node that owns the pool's slot (`pool_cluster.rs`). The helpers
/// below take `&impl PoolRedis`, so one test body runs on both.
pub(crate) trait PoolRedis: Sync {
    /// A new synchronous connection to the node that holds the pool's keys
    /// (2 s timeouts).
    fn node_conn(&self) -> redis::Connection;

    /// The URL given to snowlease's own handle ([`manager`]).
    fn client_url(&self) -> String;

    /// The `KEYS` pattern [`dump`] compares: every key on a private server.
    fn dump_pattern(&self) -> String {
        "*".to_owned()
    }

    /// Runs one command on [`Self::node_conn`]; panics on an error.
    fn run<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        cmd.query(&mut self.node_conn())
            .unwrap_or_else(|e| panic!("redis command failed: {e}"))
    }
}

impl PoolRedis for RedisServer {
    fn node_conn(&self) -> redis::Connection {
        self.conn()
    }

    fn client_url(&self) -> String {
        self.url()
    }
}

/// Every key: type, whether it expires, full contents. Compared before and
/// after calls that must change nothing.
pub(crate) type Dump = BTreeMap<String, String>;

pub(crate) fn dump(redis: &impl PoolRedis) -> Dump {
    let mut conn = redis.node_conn();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(redis.dump_pattern())
        .query(&mut conn)
        .unwrap();
    let mut out = Dump::new();
    for key in keys {
        let ty: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        let mut q = |cmd: &mut redis::Cmd| -> Value { cmd.query(&mut conn).unwrap() };
        let contents = match ty.as_str() {
            "string" => q(redis::cmd("GET").arg(&key)),
            "zset" => q(redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")),
            "hash" => q(redis::cmd("HGETALL").arg(&key)),
            "set" => q(redis::cmd("SORT").arg(&key).arg("ALPHA")),
            "list" => q(redis::cmd("LRANGE").arg(&key).arg(0).arg(-1)),
            other => panic!("unexpected type {other} of {key}"),
        };
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        let expiry = if pttl >= 0 { "expiring" } else { "persistent" };
        out.insert(key, format!("{ty} {expiry} {contents:?}"));
    }
    out
}

/// Redis TIME in ms.
pub(crate) fn redis_ms(redis: &impl PoolRedis) -> u64 {
    let (s, us): (u64, u64) = redis.run(&mut redis::cmd("TIME"));
    s * 1000 + us / 1000
}

/// Waits (at most 10 s) until Redis time is past `t_ms`.
pub(crate) async fn until_redis_after(redis: &impl PoolRedis, t_ms: u64) {
    let give_up = Instant::now() + secs(10);
    while redis_ms(redis) <= t_ms {
        assert!(Instant::now() < give_up, "Redis time never passed {t_ms}");
        tokio::time::sleep(ms(2)).await;
    }
}

/// The connection handle every mode uses, with a 2 s call timeout.
pub(crate) async fn manager(redis: &impl PoolRedis) -> Redis {
    RedisTarget::parse(&redis.client_url())
        .unwrap()
        .connect(secs(2))
        .unwrap()
}

pub(crate) async fn pool_with(redis: &impl PoolRedis, name: &str, options: PoolOptions) -> Pool {
    Pool::new(manager(redis).await, name, options).unwrap()
}

pub(crate) async fn pool(redis: &impl PoolRedis, name: &str) -> Pool {
    pool_with(redis, name, PoolOptions::default()).await
}

pub(crate) async fn new_pool(redis: &impl PoolRedis, name: &str, ids: &[&str]) -> Pool {
    let pool = pool(redis, name).await;
    assert_eq!(pool.init(ids).await.unwrap(), ids.len() as u64);
    pool
}

pub(crate) fn leased(acquired: Acquired) -> PoolLease {
    match acquired {
        Acquired::Leased(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// (next_due_in, at_ms) of an empty answer.
pub(crate) fn empty(acquired: Acquired) -> (Option<Duration>, u64) {
    match acquired {
        Acquired::Empty {
            next_due_in, at_ms, ..
        } => (next_due_in, at_ms),
        other => panic!("expected no lease, got {other:?}"),
    }
}

pub(crate) fn zset(redis: &impl PoolRedis, key: &str) -> BTreeMap<String, u64> {
    let pairs: Vec<(String, u64)> = redis.run(
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    pairs.into_iter().collect()
}

pub(crate) fn hash(redis: &impl PoolRedis, key: &str) -> BTreeMap<String, String> {
    redis.run(redis::cmd("HGETALL").arg(key))
}

pub(crate) fn set(redis: &impl PoolRedis, key: &str) -> BTreeSet<String> {
    redis.run(redis::cmd("SMEMBERS").arg(key))
}

/// The invariants of the pool layout (docs/pool.md, "Keys and compatibility"): no id in both ready and leases; leases
/// and owners hold the same ids.
pub(crate) fn check_invariants(redis: &impl PoolRedis, keys: &PoolKeys) {
    let ready = zset(redis, &keys.ready);
    let leases = zset(redis, &keys.leases);
    let owners = hash(redis, &keys.owners);
    let both: Vec<_> = ready.keys().filter(|id| leases.contains_key(*id)).collect();
    assert!(both.is_empty(), "in ready and leases: {both:?}");
    let leased: BTreeSet<_> = leases.keys().collect();
    let owned: BTreeSet<_> = owners.keys().collect();
    assert_eq!(leased, owned, "leases and owners differ");
}

/// Calls a script directly, bypassing the Rust checks.
pub(crate) fn raw(
    redis: &impl PoolRedis,
    script: PoolScript,
    keys: &[String],
    args: &[&str],
) -> Result<Value, PoolError> {
    let mut inv = script.script().prepare_invoke();
    for key in keys {
        inv.key(key);
    }
    for arg in args {
        inv.arg(*arg);
    }
    inv.invoke::<Value>(&mut redis.node_conn())
        .map_err(PoolError::from)
}

#[track_caller]
pub(crate) fn assert_bad<T: std::fmt::Debug>(result: Result<T, PoolError>, field: &str) {
    match result {
        Err(PoolError::BadInput { field: f, expected }) => {
            assert_eq!(f, field, "expected: {expected}");
            assert!(!expected.is_empty());
        }
        other => panic!("expected bad {field}, got {other:?}"),
    }
}

/// Acquire one id; no second lease before it is due; a wrong-token release
/// changes nothing; the right token releases; the cooldown holds to the
/// Redis ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_and_cooldown() {
    acquire_release_and_cooldown_at(RedisServer::start()).await;
}

/// The body of [`acquire_release_and_cooldown`] on any [`PoolRedis`]; `pool_cluster.rs` runs it
/// on a Cluster too.
pub(crate) async fn acquire_release_and_cooldown_at(redis: impl PoolRedis) {
    let pool = new_pool(&redis, "basic", &["a"]).await;
    let keys = pool.keys().clone();
    let req = AcquireRequest::new(secs(5));

    let lease = leased(pool.acquire(&req).await.unwrap());
    assert_eq!(
        (lease.id(), lease.fence(), lease.token().len()),
        ("a", 1, 32)
    );
    assert!(!lease.replayed());
    assert_eq!(hash(&redis, &keys.owners)["a"], lease.token());
    assert_eq!(zset(&redis, &keys.leases)["a"], lease.deadline_ms());
    assert!(zset(&redis, &keys.ready).is_empty());

    // Before it is due: empty, and the hint is the deadline.
    let (hint, at) = empty(pool.acquire(&req).await.unwrap());
    assert_eq!(hint, Some(ms(lease.deadline_ms() - at)));

    let before = dump(&redis);
    let wrong = pool
        .release_lease("a", "not-the-token", ms(0))
        .await
        .unwrap();
    assert!(matches!(
        wrong,
        Released::NotOwner {
            reason: LostReason::OtherOwner,
            ..
        }
    ));
    let wrong = pool
        .extend_lease("a", "not-the-token", secs(9))
        .await
        .unwrap();
    assert!(matches!(wrong, Extended::NotOwner { .. }));
    assert_eq!(dump(&redis), before);
    check_invariants(&redis, &keys);

    let Released::Released { at_ms: released_at } = lease.release(ms(300)).await.unwrap() else {
        panic!("release with the right token failed");
    };
    let due = released_at + 300;
    assert_eq!(zset(&redis, &keys.ready)["a"], due);
    assert!(hash(&redis, &keys.owners).is_empty());
    assert!(matches!(
        lease.release(ms(0)).await.unwrap(),
        Released::NotOwner { .. }
    ));
    check_invariants(&redis, &keys);

    // Every empty answer comes before `due` and names it to the ms; the
    // next lease starts at or after it.
    let give_up = Instant::now() + secs(5);
    let mut empties = 0;
    let next = loop {
        match pool.acquire(&req).await.unwrap() {
            Acquired::Empty {
                next_due_in, at_ms, ..
            } => {
                assert!(at_ms < due, "empty at {at_ms}, due {due}");
                assert_eq!(next_due_in, Some(ms(due - at_ms)));
                empties += 1;
                assert!(Instant::now() < give_up, "never leased again");
                tokio::time::sleep(ms(1)).await;
            }
            Acquired::Leased(lease) => break lease,
        }
    };
    assert!(empties > 0);
    assert!(next.deadline_ms() - 5000 >= due);
    assert_eq!((next.id(), next.fence()), ("a", 2));
    check_invariants(&redis, &keys);
}

/// A leases, A's lease expires, B leases the same id: A's extend and
/// release both fail and leave B's lease exactly as B left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holder_cannot_touch_the_next_lease() {
    expired_holder_cannot_touch_the_next_lease_at(RedisServer::start()).await;
}

/// The body of [`expired_holder_cannot_touch_the_next_lease`] on any [`PoolRedis`]; `pool_cluster.rs` runs it
/// on a Cluster too.
pub(crate) async fn expired_holder_cannot_touch_the_next_lease_at(redis: impl PoolRedis) {
    let pool = new_pool(&redis, "ab", &["x"]).await;
    let keys = pool.keys().clone();

    let mut a = leased(pool.acquire(&AcquireRequest::new(ms(100))).await.unwrap());
    until_redis_after(&redis, a.deadline_ms()).await;
    // Expired, not yet reclaimed: A is told so, and nothing changes.
    let before = dump(&redis);
    assert!(matches!(
        a.extend(secs(1)).await.unwrap(),
        Extended::NotOwner {
            reason: LostReason::Expired,
            ..
        }
    ));
    assert!(matches!(
        a.release(ms(0)).await.unwrap(),
        Released::NotOwner {
            reason: LostReason::Expired,
            ..
        }
    ));
    assert_eq!(dump(&redis), before);

    let b = leased(pool.acquire(&AcquireRequest::new(secs(10))).await.unwrap());
    assert_eq!(b.id(), "x");
    assert!(b.fence() > a.fence());
    let before = dump(&redis);

    let a_deadline = a.deadline_ms();
    assert!(matches!(
        a.extend(secs(10)).await.unwrap(),
        Extended::NotOwner {
            reason: LostReason::OtherOwner,
            ..
        }
    ));
    assert_eq!(a.deadline_ms(), a_deadline);
    assert!(matches!(
        a.release(ms(0)).await.unwrap(),
        Released::NotOwner {
            reason: LostReason::OtherOwner,
            ..
        }
    ));

    assert_eq!(dump(&redis), before);
    assert_eq!(hash(&redis, &keys.owners)["x"], b.token());
    assert_eq!(zset(&redis, &keys.leases)["x"], b.deadline_ms());
    assert!(zset(&redis, &keys.ready).is_empty());
    check_invariants(&redis, &keys);
}

/// 250 expired leases come back over several reap and acquire calls of at
/// most 100 each; none lost or duplicated, invariants after every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_expired_leases_are_all_reclaimed() {
    many_expired_leases_are_all_reclaimed_at(RedisServer::start()).await;
}

/// The body of [`many_expired_leases_are_all_reclaimed`] on any [`PoolRedis`]; `pool_cluster.rs` runs it
/// on a Cluster too.
pub(crate) async fn many_expired_leases_are_all_reclaimed_at(redis: impl PoolRedis) {
    let ids: Vec<String> = (0..250).map(|i| format!("id-{i:03}")).collect();
    let pool = pool(&redis, "many").await;
    assert_eq!(pool.init(&ids).await.unwrap(), 250);
    let keys = pool.keys().clone();

    let req = AcquireRequest::new(secs(3));
    let mut leased_ids = BTreeSet::new();
    let mut last_deadline = 0;
    for _ in 0..250 {
        let lease = leased(pool.acquire(&req).await.unwrap());
        last_deadline = last_deadline.max(lease.deadline_ms());
        assert!(
            leased_ids.insert(lease.id().to_owned()),
            "{} twice",
            lease.id()
        );
    }
    let (hint, _) = empty(pool.acquire(&req).await.unwrap());
    assert!(hint.is_some());
    check_invariants(&redis, &keys);
    until_redis_after(&redis, last_deadline).await;

    // Cooldowns of a minute keep reclaimed ids from being leased again.
    let cooldown = secs(60);
    let mut back = BTreeSet::new();
    let absorb = |back: &mut BTreeSet<String>, ids: &[String]| {
        for id in ids {
            assert!(back.insert(id.clone()), "{id} reclaimed twice");
        }
    };
    let first = pool.reap(100, cooldown).await.unwrap();
    assert_eq!((first.ids.len(), first.still_expired), (100, 150));
    absorb(&mut back, &first.ids);
    check_invariants(&redis, &keys);

    let ready_before = zset(&redis, &keys.ready).len();
    let (hint, _) = empty(pool.acquire(&req.clone().cooldown(cooldown)).await.unwrap());
    assert!(hint.unwrap() <= cooldown, "{hint:?}");
    let ready_after = zset(&redis, &keys.ready);
    assert_eq!(
        ready_after.len(),
        ready_before + 100,
        "acquire reclaims 100"
    );
    let by_acquire: Vec<String> = ready_after
        .keys()
        .filter(|id| !back.contains(*id))
        .cloned()
        .collect();
    absorb(&mut back, &by_acquire);
    check_invariants(&redis, &keys);

    let last = pool.reap(100, cooldown).await.unwrap();
    assert_eq!((last.ids.len(), last.still_expired), (50, 0));
    absorb(&mut back, &last.ids);
    check_invariants(&redis, &keys);
    let again = pool.reap(100, cooldown).await.unwrap();
    assert!(again.ids.is_empty());

    assert_eq!(back, leased_ids);
    let ready: BTreeSet<String> = zset(&redis, &keys.ready).into_keys().collect();
    assert_eq!(ready, ids.iter().cloned().collect::<BTreeSet<_>>());
    assert!(zset(&redis, &keys.leases).is_empty());
    assert!(hash(&redis, &keys.owners).is_empty());
    let status = pool.status().await.unwrap();
    assert_eq!((status.ready_cooling, status.leases_valid), (250, 0));
}

/// Bad arguments, refused by the Rust checks and, called raw, by the
/// scripts themselves: each a clear error, the keyspace unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_writes_nothing() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "p", &["a", "b"]).await;
    let keys = pool.keys().clone();
    let lease = leased(pool.acquire(&AcquireRequest::new(secs(60))).await.unwrap());
    let token = lease.token().to_owned();
    let before = dump(&redis);
    let long_token = "t".repeat(129);

    // Through the Rust API.
    let acquire = |req: AcquireRequest| {
        let pool = pool.clone();
        async move { pool.acquire(&req).await }
    };
    assert_bad(acquire(AcquireRequest::new(ms(0))).await, "ttl");
    assert_bad(acquire(AcquireRequest::new(ms(600_001))).await, "ttl");
    assert_bad(
        acquire(AcquireRequest::new(Duration::from_micros(1500))).await,
        "ttl",
    );
    let fractional = AcquireRequest::new(secs(1)).cooldown(Duration::from_micros(2500));
    assert_bad(acquire(fractional).await, "cooldown");
    assert_bad(
        acquire(AcquireRequest::new(secs(1)).cooldown(ms(600_001))).await,
        "cooldown",
    );
    assert_bad(
        acquire(AcquireRequest::new(secs(1)).request_id("r 1")).await,
        "request_id",
    );
    let short = pool_with(&redis, "p", PoolOptions { max_lease: secs(1) }).await;
    assert_bad(short.acquire(&AcquireRequest::new(secs(2))).await, "ttl");
    assert_bad(pool.release_lease("a", "", ms(0)).await, "token");
    assert_bad(pool.release_lease("a", &long_token, ms(0)).await, "token");
    assert_bad(pool.extend_lease("a", &long_token, secs(1)).await, "token");
    assert_bad(pool.extend_lease("a b", &token, secs(1)).await, "id");
    assert_bad(pool.extend_lease("a", &token, ms(0)).await, "ttl");
    assert_bad(pool.reap(0, ms(0)).await, "limit");
    assert_bad(pool.reap(1001, ms(0)).await, "limit");
    let conn = manager(&redis).await;
    for name in ["", "a b", "{p}", "p:x", &"p".repeat(65)] {
        assert_bad(
            Pool::new(conn.clone(), name, PoolOptions::default()),
            "pool",
        );
    }
    let zero = PoolOptions { max_lease: ms(0) };
    assert_bad(Pool::new(conn.clone(), "q", zero), "max_lease");
    assert_bad(pool.add(&["c", "d e"]).await, "ids[1]");
    assert_bad(pool.add::<&str>(&[]).await, "ids");
    let fresh = Pool::new(conn.clone(), "fresh", PoolOptions::default()).unwrap();
    assert!(matches!(
        fresh.init(&["x", "y", "x"]).await,
        Err(PoolError::DuplicateId { id }) if id == "x"
    ));
    assert!(matches!(
        pool.init(&["c"]).await,
        Err(PoolError::AlreadyInitialized { pool }) if pool == "p"
    ));
    assert!(matches!(
        pool.add(&["c", "a"]).await,
        Err(PoolError::DuplicateId { id }) if id == "a"
    ));
    assert!(matches!(
        pool.disable(&["b", "nope"]).await,
        Err(PoolError::UnknownId { id }) if id == "nope"
    ));
    assert!(matches!(
        pool.enable(&["nope"]).await,
        Err(PoolError::UnknownId { id }) if id == "nope"
    ));
    assert_eq!(dump(&redis), before);

    // Raw: the scripts refuse the same on their own.
    let k = |s: PoolScript| s.keys(&keys);
    let acq = |args: &[&str]| raw(&redis, PoolScript::Acquire, &k(PoolScript::Acquire), args);
    let t = token.as_str();
    let m = "600000";
    for (args, field) in [
        (vec![t, "0", "0", m], "ttl_ms"),
        (vec![t, "600001", "0", m], "ttl_ms"),
        (vec![t, "-1", "0", m], "ttl_ms"),
        (vec![t, "1.5", "0", m], "ttl_ms"),
        (vec![t, "1e3", "0", m], "ttl_ms"),
        (vec![t, "", "0", m], "ttl_ms"),
        (vec![t, "1001", "0", "1000"], "ttl_ms"),
        (vec![t, "1000", "-5", m], "cooldown_ms"),
        (vec![t, "1000", "2.5", m], "cooldown_ms"),
        (vec![t, "1000", "600001", m], "cooldown_ms"),
        (vec![t, "1000", "0", "0"], "max_lease_ms"),
        (vec![t, "1000", "0", "86400001"], "max_lease_ms"),
        (vec!["", "1000", "0", m], "token"),
        (vec![long_token.as_str(), "1000", "0", m], "token"),
        (vec![t, "1000", "0", m, "r 1"], "request_id"),
        (vec![t, "1000", "0"], "ARGV"),
    ] {
        assert_bad(acq(&args), field);
    }
    let raw_acq = |keys: &[String], args: &[&str]| raw(&redis, PoolScript::Acquire, keys, args);
    let mut mixed = k(PoolScript::Acquire);
    mixed[1] = PoolKeys::new("other").leases;
    assert_bad(raw_acq(&mixed, &[t, "1000", "0", m]), "pool");
    assert_bad(raw_acq(&mixed[..5], &[t, "1000", "0", m]), "pool");
    let bad_pool: Vec<String> = k(PoolScript::Acquire)
        .iter()
        .map(|key| key.replace("{p}", "{p q}"))
        .collect();
    assert_bad(raw_acq(&bad_pool, &[t, "1000", "0", m]), "pool");
    let long_pool = PoolKeys::new(&"p".repeat(65));
    assert_bad(
        raw_acq(&PoolScript::Acquire.keys(&long_pool), &[t, "1000", "0", m]),
        "pool",
    );

    let rel = |args: &[&str]| raw(&redis, PoolScript::Release, &k(PoolScript::Release), args);
    assert_bad(rel(&["a b", t, "0"]), "id");
    assert_bad(rel(&["", t, "0"]), "id");
    assert_bad(rel(&["a", "", "0"]), "token");
    assert_bad(rel(&["a", t, "-1"]), "cooldown_ms");
    let ext = |args: &[&str]| raw(&redis, PoolScript::Extend, &k(PoolScript::Extend), args);
    assert_bad(ext(&["a", t, "0", "600000"]), "ttl_ms");
    assert_bad(ext(&["a", t, "1000", "0"]), "max_lease_ms");
    assert_bad(ext(&["a", t, "1000", "86400001"]), "max_lease_ms");
    assert_bad(ext(&["a", &long_token, "1000", "1000"]), "token");
    let reap = |args: &[&str]| raw(&redis, PoolScript::Reap, &k(PoolScript::Reap), args);
    assert_bad(reap(&["0", "0"]), "limit");
    assert_bad(reap(&["1001", "0"]), "limit");
    assert_bad(reap(&["10", "x"]), "cooldown_ms");
    assert_bad(
        raw(&redis, PoolScript::Status, &k(PoolScript::Status), &["x"]),
        "ARGV",
    );

    let fresh_keys = PoolScript::Init.keys(&PoolKeys::new("fresh"));
    let init = |args: &[&str]| {
        let mut full = vec!["off", "off", "600000"];
        full.extend_from_slice(args);
        raw(&redis, PoolScript::Init, &fresh_keys, &full)
    };
    assert_bad(init(&[]), "ids");
    assert_bad(init(&["x", "y z"]), "ids[1]");
    let too_many: Vec<String> = (0..1001).map(|i| format!("i{i}")).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    assert_bad(init(&too_many), "ids");
    assert!(matches!(init(&["x", "x"]), Err(PoolError::DuplicateId { id }) if id == "x"));
    assert!(matches!(
        raw(
            &redis,
            PoolScript::Init,
            &k(PoolScript::Init),
            &["off", "off", "600000", "z"]
        ),
        Err(PoolError::AlreadyInitialized { .. })
    ));
    let add = |args: &[&str]| raw(&redis, PoolScript::Add, &k(PoolScript::Add), args);
    assert!(matches!(add(&["c", "c"]), Err(PoolError::DuplicateId { id }) if id == "c"));
    assert!(matches!(add(&["c", "b"]), Err(PoolError::DuplicateId { id }) if id == "b"));
    assert_bad(add(&["c", &"x".repeat(65)]), "ids[1]");
    let disable = |args: &[&str]| raw(&redis, PoolScript::Disable, &k(PoolScript::Disable), args);
    assert!(matches!(disable(&["b", "zz"]), Err(PoolError::UnknownId { id }) if id == "zz"));
    assert!(matches!(
        disable(&["b", "b"]),
        Err(PoolError::DuplicateId { .. })
    ));
    let enable = |args: &[&str]| raw(&redis, PoolScript::Enable, &k(PoolScript::Enable), args);
    assert!(matches!(
        enable(&["0", "zz"]),
        Err(PoolError::UnknownId { .. })
    ));
    assert_bad(enable(&["yes", "b"]), "force");

    assert_eq!(dump(&redis), before);
    check_invariants(&redis, &keys);
}

/// Each pool key pre-set to a wrong type: every script that touches it
/// answers a wrong-type error naming the key, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_key_types_are_refused_and_write_nothing() {
    let redis = RedisServer::start();
    let pool = pool(&redis, "typed").await;
    let keys = pool.keys().clone();
    let cases: Vec<(String, &[&str], &str)> = vec![
        (keys.ready.clone(), &["RPUSH", "x"], "zset"),
        (keys.leases.clone(), &["RPUSH", "x"], "zset"),
        (keys.owners.clone(), &["SET", "x"], "hash"),
        (keys.fence.clone(), &["RPUSH", "x"], "string"),
        (keys.fence.clone(), &["SET", "abc"], "integer"),
        (keys.meta.clone(), &["SADD", "x"], "hash"),
        (keys.disabled.clone(), &["HSET", "x", "y"], "set"),
        (keys.requests.clone(), &["SET", "x"], "hash"),
        (keys.parked.clone(), &["SET", "x"], "hash"),
        (keys.quarantine.clone(), &["SET", "x"], "zset"),
        (keys.reasons.clone(), &["SET", "x"], "hash"),
        (keys.strikes.clone(), &["SET", "x"], "hash"),
        (keys.autodisabled.clone(), &["SET", "x"], "hash"),
        (keys.config.clone(), &["SET", "x"], "hash"),
    ];
    for (broken, wrong, expected) in cases {
        let _: () = redis.query(&mut redis::cmd("FLUSHALL"));
        pool.init(&["a", "b", "c"]).await.unwrap();
        let req = AcquireRequest::new(secs(60)).request_id("r1");
        let lease = leased(pool.acquire(&req).await.unwrap());
        pool.disable(&["c"]).await.unwrap();
        let _: () = redis.query(redis::cmd("DEL").arg(&broken));
        let _: () = redis.query(redis::cmd(wrong[0]).arg(&broken).arg(&wrong[1..]));
        let before = dump(&redis);

        let touches = |s: PoolScript| s.keys(&keys).contains(&broken);
        // The operations checked for this broken key: at least one must touch it.
        let mut checked: Vec<&str> = Vec::new();
        let mut check = |op: &'static str, result: Result<(), PoolError>| {
            checked.push(op);
            match result {
                Err(PoolError::WrongKeyType {
                    key, expected: e, ..
                }) => {
                    assert_eq!(
                        (key.as_str(), e.as_str()),
                        (broken.as_str(), expected),
                        "{op}"
                    );
                }
                other => panic!("{op} with {broken} as {wrong:?}: {other:?}"),
            }
        };
        let id = lease.id();
        let token = lease.token();
        if touches(PoolScript::Acquire) {
            check("acquire", pool.acquire(&req).await.map(drop));
        }
        if touches(PoolScript::Init) && expected != "integer" {
            check("init", pool.init(&["z"]).await.map(drop));
        }
        if touches(PoolScript::Add) {
            check("add", pool.add(&["z"]).await.map(drop));
        }
        if touches(PoolScript::Release) {
            check(
                "release",
                pool.release_lease(id, token, ms(0)).await.map(drop),
            );
        }
        if touches(PoolScript::Extend) {
            check(
                "extend",
                pool.extend_lease(id, token, secs(1)).await.map(drop),
            );
        }
        if touches(PoolScript::Reap) {
            check("reap", pool.reap(10, ms(0)).await.map(drop));
        }
        if touches(PoolScript::Status) {
            check("status", pool.status().await.map(drop));
        }
        if touches(PoolScript::Disable) {
            check("disable", pool.disable(&["b"]).await.map(drop));
        }
        if touches(PoolScript::Enable) {
            check("enable", pool.enable(&["c"]).await.map(drop));
        }
        if touches(PoolScript::Config) && expected != "integer" {
            check("config", pool.strikes().await.map(drop));
        }
        assert!(
            !checked.is_empty(),
            "no operation checked {broken} as {wrong:?}: no script touches it"
        );
        assert_eq!(dump(&redis), before, "{broken} as {wrong:?} ({checked:?})");
    }
}

/// One lease interval as Redis saw it: [start, end) in Redis ms.
#[derive(Debug, Clone)]
struct Interval {
    id: String,
    fence: u64,
    start: u64,
    end: u64,
}

/// 32 tasks x 500 cycles on 8 ids with short ttls, some stalling past their
/// deadline: no two valid leases of one id overlap in Redis time, and fences
/// grow with lease start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_share_an_id() {
    concurrent_clients_never_share_an_id_at(RedisServer::start()).await;
}

/// The body of [`concurrent_clients_never_share_an_id`] on any [`PoolRedis`]; `pool_cluster.rs` runs it
/// on a Cluster too.
pub(crate) async fn concurrent_clients_never_share_an_id_at(redis: impl PoolRedis) {
    const TASKS: usize = 32;
    const CYCLES: usize = 500;
    let ids: Vec<String> = (0..8).map(|i| format!("r{i}")).collect();
    let pool = pool(&redis, "busy").await;
    pool.init(&ids).await.unwrap();
    let started = Instant::now();

    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(CYCLES);
            let mut stalls = 0;
            for cycle in 0..CYCLES {
                let (ttl, roll) = {
                    let mut rng = rand::rng();
                    (
                        rand::Rng::random_range(&mut rng, 50..=200u64),
                        rand::Rng::random_range(&mut rng, 0..100u32),
                    )
                };
                let req = AcquireRequest::new(ms(ttl));
                let acquired = pool.acquire_wait(&req, secs(20)).await.unwrap();
                let Acquired::Leased(mut lease) = acquired else {
                    panic!("task {task} cycle {cycle}: nothing within 20 s: {acquired:?}");
                };
                let start = lease.deadline_ms() - ttl;
                let fence = lease.fence();
                if roll == 0 {
                    // Stall past the deadline; extend and release must fail.
                    stalls += 1;
                    tokio::time::sleep(ms(ttl + 5)).await;
                    assert!(matches!(
                        lease.extend(ms(100)).await.unwrap(),
                        Extended::NotOwner { .. }
                    ));
                } else if roll < 20 {
                    let _ = lease.extend(ms(ttl)).await.unwrap();
                }
                if roll % 3 == 0 {
                    tokio::task::yield_now().await;
                }
                let end = match lease.release(ms(0)).await.unwrap() {
                    Released::Released { at_ms } | Released::Quarantined { at_ms, .. } => at_ms,
                    Released::NotOwner { .. } => lease.deadline_ms(),
                };
                assert!(start <= end, "{start} > {end}");
                out.push(Interval {
                    id: lease.id().to_owned(),
                    fence,
                    start,
                    end,
                });
            }
            (out, stalls)
        }));
    }
    let mut all = Vec::new();
    let mut stalls = 0;
    for task in tasks {
        let (intervals, s) = task.await.unwrap();
        all.extend(intervals);
        stalls += s;
    }
    let elapsed = started.elapsed();
    assert_eq!(all.len(), TASKS * CYCLES);
    assert!(stalls > 0, "no task stalled");

    let mut by_id: HashMap<&str, Vec<&Interval>> = HashMap::new();
    for i in &all {
        by_id.entry(&i.id).or_default().push(i);
    }
    for (id, list) in &mut by_id {
        list.sort_by_key(|i| (i.start, i.fence));
        for pair in list.windows(2) {
            assert!(
                pair[0].end <= pair[1].start,
                "{id}: leases overlap: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
    all.sort_by_key(|i| i.fence);
    for pair in all.windows(2) {
        assert!(
            pair[0].fence < pair[1].fence,
            "fence {} twice",
            pair[0].fence
        );
        assert!(
            pair[0].start <= pair[1].start,
            "fence order != start order: {:?} {:?}",
            pair[0],
            pair[1]
        );
    }
    check_invariants(&redis, pool.keys());
    eprintln!("{} leases ({stalls} stalled) in {elapsed:?}", all.len());
}

/// The same request id twice gives the same lease; another request id, or
/// the same one after its lease ended, gives another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_with_a_request_id_is_idempotent() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "idem", &["a", "b"]).await;
    let req = AcquireRequest::new(secs(30)).request_id("req-1");

    let first = leased(pool.acquire(&req).await.unwrap());
    let again = leased(pool.acquire(&req).await.unwrap());
    assert!(!first.replayed() && again.replayed());
    assert_eq!(
        (
            again.id(),
            again.token(),
            again.fence(),
            again.deadline_ms()
        ),
        (
            first.id(),
            first.token(),
            first.fence(),
            first.deadline_ms()
        )
    );
    let other = leased(
        pool.acquire(&AcquireRequest::new(secs(30)).request_id("req-2"))
            .await
            .unwrap(),
    );
    assert_ne!(other.id(), first.id());
    // Even with every id leased, the retry still answers its lease.
    let again = leased(pool.acquire(&req).await.unwrap());
    assert_eq!(again.token(), first.token());
    assert_eq!(
        hash(&redis, &pool.keys().requests).len(),
        2,
        "req-1 and req-2"
    );

    assert!(matches!(
        first.release(ms(0)).await.unwrap(),
        Released::Released { .. }
    ));
    let after = leased(pool.acquire(&req).await.unwrap());
    assert!(!after.replayed());
    assert_ne!(after.token(), first.token());
    assert!(after.fence() > other.fence());

    // A lease past its deadline (here shortened by extend, so the request
    // key outlives it) is not answered again.
    after.release(ms(0)).await.unwrap();
    let req3 = AcquireRequest::new(secs(30)).request_id("req-3");
    let mut expiring = leased(pool.acquire(&req3).await.unwrap());
    expiring.extend(ms(30)).await.unwrap();
    until_redis_after(&redis, expiring.deadline_ms()).await;
    let renewed = leased(pool.acquire(&req3).await.unwrap());
    assert!(!renewed.replayed());
    assert_ne!(renewed.token(), expiring.token());
    check_invariants(&redis, pool.keys());
}

/// A worker that knows only the three keys of the pool layout (docs/pool.md, "Keys and compatibility"), with scripts
/// of its own.
struct LegacyWorker {
    keys: PoolKeys,
}

const LEGACY_ACQUIRE: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 100)) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
end
local id = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1)[1]
if not id then return false end
redis.call('ZREM', KEYS[1], id)
redis.call('HSET', KEYS[3], id, ARGV[1])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), id)
return id
";

const LEGACY_RELEASE: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
local deadline = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not deadline or tonumber(deadline) <= now then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
return 1
";

impl LegacyWorker {
    fn new(pool: &str) -> Self {
        Self {
            keys: PoolKeys::new(pool),
        }
    }

    fn run(&self, redis: &RedisServer, source: &str, args: &[&str]) -> Value {
        let script = redis::Script::new(source);
        let mut inv = script.prepare_invoke();
        inv.key(&self.keys.ready)
            .key(&self.keys.leases)
            .key(&self.keys.owners);
        for arg in args {
            inv.arg(*arg);
        }
        inv.invoke(&mut redis.conn()).unwrap()
    }

    /// The leased id, if any was due.
    fn acquire(&self, redis: &RedisServer, token: &str, ttl_ms: u64) -> Option<String> {
        match self.run(redis, LEGACY_ACQUIRE, &[token, &ttl_ms.to_string(), "0"]) {
            Value::Nil => None,
            v => Some(redis::from_redis_value(v).unwrap()),
        }
    }

    fn release(&self, redis: &RedisServer, id: &str, token: &str) -> bool {
        self.run(redis, LEGACY_RELEASE, &[id, token, "0"]) == Value::Int(1)
    }
}

/// Stamps `pool`'s node record (`acquire.lua`) as this node's, as a snowlease acquire on this
/// node in this life of Redis leaves it: its acquires are open.
pub(crate) fn stamp_pool(redis: &RedisServer, pool: &str) {
    let script = format!(
        "{}\nredis.call('HSET', KEYS[1], '~node', '0:' .. stamped(0)) return 1",
        include_str!("../../src/lease/node.lua")
    );
    let meta = PoolKeys::new(pool).meta;
    let _: i64 = redis.query(redis::cmd("EVAL").arg(script).arg(1).arg(meta));
}

/// A pool written with plain ZADD/HSET as the layout describes is leased,
/// extended, reaped and released through snowlease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_a_pool_written_with_plain_commands() {
    let redis = RedisServer::start();
    let keys = PoolKeys::new("plain");
    let now = redis_ms(&redis);
    let _: () = redis.query(
        redis::cmd("ZADD")
            .arg(&keys.ready)
            .arg(0)
            .arg("a")
            .arg(0)
            .arg("b"),
    );
    let _: () = redis.query(
        redis::cmd("ZADD")
            .arg(&keys.ready)
            .arg(now + 60_000)
            .arg("cool"),
    );
    let _: () = redis.query(
        redis::cmd("ZADD")
            .arg(&keys.leases)
            .arg(now + 60_000)
            .arg("held"),
    );
    let _: () = redis.query(
        redis::cmd("HSET")
            .arg(&keys.owners)
            .arg("held")
            .arg("tok-held"),
    );
    let _: () = redis.query(
        redis::cmd("ZADD")
            .arg(&keys.leases)
            .arg(now - 1)
            .arg("gone"),
    );
    let _: () = redis.query(
        redis::cmd("HSET")
            .arg(&keys.owners)
            .arg("gone")
            .arg("tok-gone"),
    );
    // Seen by snowlease on this node before (see pool_rollback.rs for a pool that was not).
    stamp_pool(&redis, "plain");
    let pool = pool(&redis, "plain").await;

    let status = pool.status().await.unwrap();
    assert_eq!(
        (
            status.ready_due,
            status.ready_cooling,
            status.leases_valid,
            status.leases_expired
        ),
        (2, 1, 1, 1)
    );
    assert!(matches!(
        pool.init(&["x"]).await,
        Err(PoolError::AlreadyInitialized { .. })
    ));

    // The lease of a plain worker: snowlease extends it (its cap starts
    // now, as it has no meta) and releases it.
    let ext = pool
        .extend_lease("held", "tok-held", secs(30))
        .await
        .unwrap();
    assert!(
        matches!(ext, Extended::Extended { capped: false, .. }),
        "{ext:?}"
    );
    assert!(matches!(
        pool.release_lease("held", "tok-held", ms(0)).await.unwrap(),
        Released::Released { .. }
    ));

    let mut got = BTreeSet::new();
    let mut fences = Vec::new();
    let mut leases = Vec::new();
    while let Acquired::Leased(lease) = pool.acquire(&AcquireRequest::new(secs(30))).await.unwrap()
    {
        got.insert(lease.id().to_owned());
        fences.push(lease.fence());
        leases.push(lease);
    }
    // "gone" expired and was reclaimed by the first acquire; "cool" is not due.
    let expect: BTreeSet<String> = ["a", "b", "gone", "held"].map(String::from).into();
    assert_eq!(got, expect);
    assert_eq!(
        fences,
        [1, 2, 3, 4],
        "the fence counter starts on the first acquire"
    );
    check_invariants(&redis, &keys);
    for mut lease in leases {
        assert!(matches!(
            lease.extend(secs(10)).await.unwrap(),
            Extended::Extended { .. }
        ));
        assert!(matches!(
            lease.release(ms(0)).await.unwrap(),
            Released::Released { .. }
        ));
    }
    check_invariants(&redis, &keys);
    assert_eq!(zset(&redis, &keys.ready).len(), 5);
}

/// A pool that snowlease created and serves is leased and released by a
/// worker that knows only the three keys, side by side with snowlease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_workers_keep_working_on_a_snowlease_pool() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "mixed", &["a", "b", "c", "d"]).await;
    let keys = pool.keys().clone();
    let legacy = LegacyWorker::new("mixed");
    pool.disable(&["d"]).await.unwrap();

    let mine = leased(pool.acquire(&AcquireRequest::new(secs(30))).await.unwrap());
    let mut theirs = Vec::new();
    while let Some(id) = legacy.acquire(&redis, "legacy-token", 30_000) {
        theirs.push(id);
    }
    theirs.sort();
    let mut expect: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    expect.retain(|id| id != mine.id());
    assert_eq!(
        theirs, expect,
        "the legacy worker leases every free id, not the disabled one"
    );
    empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    check_invariants(&redis, &keys);

    // Each side extends and releases the other's view consistently.
    let legacy_id = theirs[0].clone();
    let ext = pool
        .extend_lease(&legacy_id, "legacy-token", secs(20))
        .await
        .unwrap();
    assert!(matches!(ext, Extended::Extended { .. }));
    assert!(!legacy.release(&redis, mine.id(), "legacy-token"));
    for id in &theirs {
        assert!(legacy.release(&redis, id, "legacy-token"), "{id}");
    }
    assert!(matches!(
        mine.release(ms(0)).await.unwrap(),
        Released::Released { .. }
    ));
    check_invariants(&redis, &keys);

    // A snowlease lease that expires is reclaimed by the legacy worker;
    // the old holder is then told it lost the lease.
    let mut short = leased(pool.acquire(&AcquireRequest::new(ms(50))).await.unwrap());
    until_redis_after(&redis, short.deadline_ms()).await;
    let mut reclaimed = false;
    while let Some(id) = legacy.acquire(&redis, "legacy-2", 30_000) {
        reclaimed |= id == short.id();
    }
    assert!(reclaimed, "legacy worker did not get {}", short.id());
    assert!(matches!(
        short.extend(secs(1)).await.unwrap(),
        Extended::NotOwner { .. }
    ));
    assert!(matches!(
        short.release(ms(0)).await.unwrap(),
        Released::NotOwner { .. }
    ));

    // A legacy lease that expires is reclaimed by snowlease's reap.
    let held: Vec<String> = zset(&redis, &keys.leases).into_keys().collect();
    for id in &held {
        assert!(legacy.release(&redis, id, "legacy-2"));
    }
    let id = legacy.acquire(&redis, "legacy-3", 50).unwrap();
    until_redis_after(&redis, zset(&redis, &keys.leases)[&id]).await;
    assert_eq!(pool.reap(100, ms(0)).await.unwrap().ids, [id.as_str()]);
    assert!(zset(&redis, &keys.ready).contains_key(&id));
    assert!(set(&redis, &keys.disabled).contains("d"));
    check_invariants(&redis, &keys);
}

/// Disabled ids never come back by cooldown or expiry, even when a plain
/// worker puts one back into ready; only enable returns them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_ids_return_only_through_enable() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "dis", &["a", "b", "c"]).await;
    let keys = pool.keys().clone();

    // A cooling id, a leased id that is released, a leased id that expires.
    let a = leased(pool.acquire(&AcquireRequest::new(secs(30))).await.unwrap());
    assert!(matches!(
        a.release(ms(100)).await.unwrap(),
        Released::Released { .. }
    ));
    let b = leased(pool.acquire(&AcquireRequest::new(secs(30))).await.unwrap());
    let c = leased(pool.acquire(&AcquireRequest::new(ms(100))).await.unwrap());
    assert_eq!((a.id(), b.id(), c.id()), ("a", "b", "c"));
    assert_eq!(pool.disable(&["a", "b", "c"]).await.unwrap(), 3);
    assert_eq!(pool.disable(&["a"]).await.unwrap(), 0, "already disabled");
    assert!(!zset(&redis, &keys.ready).contains_key("a"));
    assert!(
        zset(&redis, &keys.leases).contains_key("b"),
        "disable keeps a lease"
    );

    assert!(matches!(
        b.release(ms(0)).await.unwrap(),
        Released::Released { .. }
    ));
    until_redis_after(&redis, c.deadline_ms() + 100).await;
    let (hint, _) = empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert_eq!(hint, None, "nothing becomes due by itself");
    assert!(zset(&redis, &keys.ready).is_empty());
    assert!(zset(&redis, &keys.leases).is_empty());
    let status = pool.status().await.unwrap();
    assert_eq!((status.ready_due, status.disabled), (0, 3));

    // A plain worker's release put "b" back: acquire skips and drops it.
    let _: () = redis.query(redis::cmd("ZADD").arg(&keys.ready).arg(0).arg("b"));
    empty(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert!(zset(&redis, &keys.ready).is_empty());
    check_invariants(&redis, &keys);

    assert_eq!(pool.enable(&["b"]).await.unwrap(), 1);
    assert_eq!(pool.enable(&["b"]).await.unwrap(), 0, "already enabled");
    let lease = leased(pool.acquire(&AcquireRequest::new(secs(1))).await.unwrap());
    assert_eq!(lease.id(), "b");
    assert_eq!(
        set(&redis, &keys.disabled),
        ["a", "c"].map(String::from).into()
    );
}

/// Extend never sets a deadline past first-acquired + max_lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_stops_at_the_total_lease_cap() {
    let redis = RedisServer::start();
    // A ttl long enough that a loaded machine still extends in time.
    let (ttl, max_lease) = (600, 1500);
    let options = PoolOptions {
        max_lease: ms(max_lease),
    };
    let pool = pool_with(&redis, "capped", options).await;
    pool.init(&["a"]).await.unwrap();
    let mut lease = leased(pool.acquire(&AcquireRequest::new(ms(ttl))).await.unwrap());
    let cap = lease.deadline_ms() - ttl + max_lease;

    let mut capped_seen = false;
    let give_up = Instant::now() + secs(5);
    loop {
        match lease.extend(ms(ttl)).await.unwrap() {
            Extended::Extended {
                deadline_ms,
                capped,
                at_ms,
            } => {
                assert_eq!(deadline_ms, (at_ms + ttl).min(cap));
                assert_eq!(capped, at_ms + ttl > cap);
                assert_eq!(lease.deadline_ms(), deadline_ms);
                assert_eq!(zset(&redis, &pool.keys().leases)["a"], deadline_ms);
                capped_seen |= capped;
            }
            Extended::NotOwner { reason, at_ms } => {
                assert_eq!(reason, LostReason::Expired);
                assert!(at_ms >= cap);
                break;
            }
        }
        assert!(Instant::now() < give_up);
        tokio::time::sleep(ms(50)).await;
    }
    assert!(capped_seen);
}

/// An empty pool: acquire_wait backs off (bounded number of attempts),
/// gives up after its wait, and wakes for an id that comes due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_wait_backs_off_and_wakes_when_due() {
    let redis = RedisServer::start();
    let pool = new_pool(&redis, "wait", &["a"]).await;
    let lease = leased(pool.acquire(&AcquireRequest::new(secs(30))).await.unwrap());
    let evalsha_calls = || redis.command_calls("evalsha");

    let before = evalsha_calls();
    let started = Instant::now();
    let req = AcquireRequest::new(secs(1));
    let (hint, _) = empty(pool.acquire_wait(&req, ms(600)).await.unwrap());
    let waited = started.elapsed();
    let attempts = evalsha_calls() - before;
    assert!(hint.is_some());
    assert!(waited >= ms(600) && waited < ms(1500), "{waited:?}");
    // 10 ms doubling to 500 ms: about 7 attempts; never one per ms.
    assert!((3..=20).contains(&attempts), "{attempts} attempts");

    // Released with a cooldown during the wait: leased soon after it is due.
    let releaser = {
        let pool = pool.clone();
        let (id, token) = (lease.id().to_owned(), lease.token().to_owned());
        tokio::spawn(async move {
            tokio::time::sleep(ms(100)).await;
            pool.release_lease(&id, &token, ms(200)).await.unwrap()
        })
    };
    let got = leased(pool.acquire_wait(&req, secs(5)).await.unwrap());
    let Released::Released { at_ms } = releaser.await.unwrap() else {
        panic!("release failed");
    };
    let start = got.deadline_ms() - 1000;
    assert!(start >= at_ms + 200, "leased before due");
    assert!(
        start <= at_ms + 200 + 520,
        "woke {} ms late",
        start - at_ms - 200
    );
}
