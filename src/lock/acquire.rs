//! One acquire attempt: `acquire.lua` (SET NX PX, then INCR of the fence).
//! The wait that repeats it is `wait.rs`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use super::LockKeys;
use crate::identity::Owner;
use crate::lease::node::FirstRecord;
use crate::timing::ttl_ms;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| crate::lease::node::script(include_str!("acquire.lua")));

/// What one run of `acquire.lua` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LockAcquired {
    /// The lock is ours with this fencing token (counted up now, or, when
    /// an earlier attempt's reply was lost, by that attempt).
    Ours {
        /// The fencing token, >= 1.
        fence: u64,
    },
    /// Another owner holds it; its key expires in this long (`None`: the
    /// key has no expiry, set by hand).
    Held(Option<Duration>),
    /// Closed for this long: Redis restarted or failed over since the lock
    /// was last acquired there, and may have lost the key of a holder that
    /// still runs (docs/lock.md, "After a Redis rollback").
    Closed(Duration),
    /// A new lock (no record, fence or key; or its first use was lost with a
    /// rollback): written closed for `wait`, as after a rollback; it opens
    /// at once when `record` is durable (`lease::node::open_first_use`).
    New {
        /// How long it stays closed unless opened.
        wait: Duration,
        /// The record as written.
        record: FirstRecord,
    },
}

/// Runs `acquire.lua` once (see its header for the contract).
pub(crate) async fn acquire<C: ConnectionLike>(
    conn: &mut C,
    keys: &LockKeys,
    owner: &Owner,
    ttl: Duration,
) -> redis::RedisResult<LockAcquired> {
    let reply: Vec<redis::Value> = ACQUIRE
        .key(keys.lock())
        .key(keys.fence())
        .key(keys.node())
        .arg(owner.as_str())
        .arg(ttl_ms(ttl))
        .invoke_async(conn)
        .await?;
    // {status, value} or, for a new lock, {4, wait, record}.
    let item = |at: usize| reply.get(at).cloned().unwrap_or(redis::Value::Nil);
    let status: i64 = redis::from_redis_value(item(0))?;
    let value: i64 = redis::from_redis_value(item(1))?;
    let written: Option<String> = redis::from_redis_value(item(2))?;
    Ok(match status {
        4 => LockAcquired::New {
            wait: Duration::from_millis(value.unsigned_abs()),
            record: FirstRecord {
                key: keys.node().to_owned(),
                field: None,
                fence: Some(keys.fence().to_owned()),
                fence_reset: "",
                written: written.unwrap_or_default(),
            },
        },
        1 | 2 => LockAcquired::Ours {
            fence: value.unsigned_abs(),
        },
        3 => LockAcquired::Closed(Duration::from_millis(value.unsigned_abs())),
        _ => LockAcquired::Held(u64::try_from(value).ok().map(Duration::from_millis)),
    })
}
