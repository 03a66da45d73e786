//! The Redis setting every lease relies on: Redis must never evict keys.
//! A lease key (or a pool key) that Redis drops under memory pressure looks
//! free to the next claimant while its holder still publishes it (seen:
//! `volatile-ttl` evicted the lease key with the shortest TTL, a second
//! sidecar took the ID at once). So snowlease holds no lease on a Redis
//! with `maxmemory` set and a `maxmemory-policy` other than `noeviction`
//! (docs/operations.md, "Redis requirements"), unless `--allow-evicting-redis` says
//! the operator accepts that risk.
//!
//! A worker that finds Redis evicting while it holds an ID unpublishes at
//! once and stops renewing, but leaves its key to expire rather than
//! deleting it: the safety property is about publishing, the key must not
//! go before the ID file does (a delete would race the file publisher), and
//! claim.lua re-adopts the key if Redis is fixed within its TTL. A key Redis
//! evicts meanwhile costs nothing, since nothing is published.
//!
//! The setting is read from `INFO memory` (works where `CONFIG` is renamed
//! or disabled, as on many managed services; needs `+info` in an ACL), at
//! start and again while leases are held, because `CONFIG SET` can change it
//! at run time.

use clap::Args;
use redis::aio::ConnectionLike;

use crate::lease::step;

/// The one policy under which Redis never drops a key to free memory.
pub(crate) const SAFE_POLICY: &str = "noeviction";

/// `--allow-evicting-redis`, shared by `worker` and `pool`.
#[derive(Debug, Clone, Copy, Default, Args)]
pub struct EvictionArgs {
    /// Hold leases even on a Redis that may evict keys (maxmemory set with a
    /// maxmemory-policy other than noeviction). Then one ID or pool id can be
    /// leased twice; only for those who accept that risk.
    #[arg(long, env = "SNOWLEASE_ALLOW_EVICTING_REDIS")]
    pub allow_evicting_redis: bool,
}

/// What `INFO memory` says about eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemorySettings {
    /// `maxmemory` in bytes; 0 means no limit (nothing is ever evicted).
    pub maxmemory: u64,
    /// `maxmemory-policy`, e.g. `noeviction`, `volatile-ttl`, `allkeys-lru`.
    pub policy: String,
}

impl MemorySettings {
    /// Parses the `maxmemory:` and `maxmemory_policy:` lines of `INFO memory`.
    /// `None` when either is missing (a server that does not report them).
    pub(crate) fn parse(info: &str) -> Option<Self> {
        let field = |name: &str| crate::connection::info_field(info, name);
        Some(Self {
            maxmemory: field("maxmemory")?.parse().ok()?,
            policy: field("maxmemory_policy")?.to_owned(),
        })
    }

    /// True when Redis may drop keys to free memory: a limit is set and the
    /// policy is not `noeviction`. `volatile-*` policies count too: every
    /// lease key has a TTL, so they are the first to go.
    pub(crate) fn may_evict(&self) -> bool {
        self.maxmemory > 0 && self.policy != SAFE_POLICY
    }
}

/// Redis may evict keys, and `--allow-evicting-redis` is not set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "redis may evict lease keys: maxmemory-policy is {policy} with maxmemory {maxmemory} bytes, \
     so a held lease can vanish and be taken by another holder; set maxmemory-policy to \
     noeviction (CONFIG SET maxmemory-policy noeviction, redis.conf, or your managed Redis' \
     parameters), or pass --allow-evicting-redis (SNOWLEASE_ALLOW_EVICTING_REDIS=true) to accept \
     that risk"
)]
pub(crate) struct EvictingRedis {
    /// The `maxmemory-policy` in effect.
    pub policy: String,
    /// The `maxmemory` in effect, bytes.
    pub maxmemory: u64,
}

/// [`EvictingRedis`] said for rate budgets (`budget take`): what is at stake
/// there is a budget reset, not a lease.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "redis may evict budget keys: maxmemory-policy is {} with maxmemory {} bytes, so a \
     budget's key can vanish, which resets that budget to full and admits more requests than \
     its rate allows; set maxmemory-policy to noeviction (CONFIG SET maxmemory-policy \
     noeviction, redis.conf, or your managed Redis' parameters), or pass --allow-evicting-redis \
     (SNOWLEASE_ALLOW_EVICTING_REDIS=true) to accept that risk",
    .0.policy,
    .0.maxmemory
)]
pub(crate) struct EvictingBudgets(pub(crate) EvictingRedis);

/// What is known of Redis' eviction setting: the one model for every
/// holder of a check's answer (no `Option<Option<_>>`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// No check has answered yet.
    #[default]
    Unchecked,
    /// The last check found Redis never evicts.
    Safe,
    /// The last check found Redis may evict keys.
    Evicting(EvictingRedis),
}

impl Eviction {
    /// The evicting setting, when the last check found one.
    pub(crate) fn evicting(&self) -> Option<&EvictingRedis> {
        match self {
            Self::Evicting(evicting) => Some(evicting),
            Self::Unchecked | Self::Safe => None,
        }
    }
}

/// The answer of [`check`].
impl From<Option<EvictingRedis>> for Eviction {
    fn from(answer: Option<EvictingRedis>) -> Self {
        answer.map_or(Self::Safe, Self::Evicting)
    }
}

/// Reads `INFO memory` and judges it: `Ok(None)` when Redis never evicts
/// (or reports no such fields: nothing to judge), `Ok(Some(_))` when it may.
///
/// Errors: the Redis error of `INFO`; a permission error says it needs
/// `+info`.
pub(crate) async fn check<C: ConnectionLike>(
    conn: &mut C,
) -> redis::RedisResult<Option<EvictingRedis>> {
    let reply: redis::Value = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .map_err(step("INFO memory failed (needs +info)"))?;
    // A Cluster answers node by node (a map): every node must be safe.
    let infos: Vec<String> = match reply {
        redis::Value::Map(nodes) => nodes
            .into_iter()
            .map(|(_, info)| redis::from_redis_value(info))
            .collect::<Result<_, _>>()?,
        info => vec![redis::from_redis_value(info)?],
    };
    Ok(infos
        .iter()
        .filter_map(|info| MemorySettings::parse(info))
        .find(MemorySettings::may_evict)
        .map(|s| EvictingRedis {
            policy: s.policy,
            maxmemory: s.maxmemory,
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(maxmemory: u64, policy: &str) -> String {
        format!(
            "# Memory\r\nused_memory:1\r\nmaxmemory:{maxmemory}\r\nmaxmemory_human:x\r\nmaxmemory_policy:{policy}\r\n"
        )
    }

    #[test]
    fn only_noeviction_or_no_limit_is_safe() {
        for policy in [
            "volatile-ttl",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
        ] {
            let s = MemorySettings::parse(&info(3 << 20, policy)).unwrap();
            assert!(s.may_evict(), "{policy}");
            let unlimited = MemorySettings::parse(&info(0, policy)).unwrap();
            assert!(!unlimited.may_evict(), "{policy} without maxmemory");
        }
        let s = MemorySettings::parse(&info(3 << 20, "noeviction")).unwrap();
        assert!(!s.may_evict());
    }

    #[test]
    fn missing_fields_parse_to_none() {
        assert_eq!(MemorySettings::parse("# Memory\r\nused_memory:1\r\n"), None);
    }

    #[test]
    fn error_names_the_setting_and_both_fixes() {
        let text = EvictingRedis {
            policy: "volatile-ttl".into(),
            maxmemory: 3 << 20,
        }
        .to_string();
        for part in [
            "maxmemory-policy is volatile-ttl",
            "noeviction",
            "--allow-evicting-redis",
        ] {
            assert!(text.contains(part), "{text}");
        }
    }
}
