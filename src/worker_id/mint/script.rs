//! The high-water mark of each worker ID in Redis and its three owner-checked scripts:
//! `mark.lua` (the floor after a claim), `reserve.lua` (raise the mark before minting past
//! it), `settle.lua` (the last minted timestamp, at release); and the app's ID format
//! (`format.lua`), checked before minting. docs/mint-design.md.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::identity::Owner;
use crate::worker_id::keys::MintKeys;

use crate::timing::ms;

static MARK: LazyLock<Script> = LazyLock::new(|| vouched(include_str!("mark.lua")));
static RESERVE: LazyLock<Script> = LazyLock::new(|| vouched(include_str!("reserve.lua")));
static SETTLE: LazyLock<Script> = LazyLock::new(|| vouched(include_str!("settle.lua")));
static FORMAT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("format.lua")));

/// A mark script with `node.lua` and `vouch.lua` in front: every script that reads the
/// mark first checks that this node can vouch for it (docs/rollback-design.md).
fn vouched(body: &str) -> Script {
    crate::lease::node::script(&format!("{}{body}", include_str!("vouch.lua")))
}

/// What `mark.lua` read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkRead {
    /// The lease key held our owner string; else the rest is 0 but `redis_ms`.
    pub ours: bool,
    /// Unix ms every ID of this lease must be above: the settled record, else the mark.
    pub floor_unix_ms: u64,
    /// The mark (Unix ms), 0 when missing.
    pub mark_unix_ms: u64,
    /// Redis' TIME (ms).
    pub redis_ms: u64,
    /// The mark was raised to Redis' TIME + the rollback lead: this node could not vouch
    /// for it (Redis restarted or failed over since it was written, so it may have rolled
    /// back; or the worker ID never minted).
    pub raised: bool,
}

/// What `reserve.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserved {
    /// The lease key held our owner string, so the mark was raised (a false one wrote
    /// nothing: the lease is lost).
    pub ours: bool,
    /// The mark after the call (Unix ms): with `ours`, the new ceiling.
    pub mark_unix_ms: u64,
    /// Redis' TIME (ms).
    pub redis_ms: u64,
}

/// What `settle.lua` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The lease key held our owner string, so the record was written.
    pub ours: bool,
    /// The settled record after the call (Unix ms), 0 when not ours.
    pub settled_unix_ms: u64,
    /// The mark after the call (Unix ms).
    pub mark_unix_ms: u64,
}

/// Runs `mark.lua` after a claim of `lease_key`: the floor to mint above. Run it only once
/// the claim is confirmed; before, a holder's reservation could still follow.
/// `rollback_lead` (--mint-window + --max-clock-skew, ms precision): a mark this node
/// cannot vouch for is raised to Redis' TIME + this first (`vouch.lua`).
pub async fn read_mark<C: ConnectionLike>(
    conn: &mut C,
    keys: &MintKeys,
    lease_key: &str,
    owner: &Owner,
    rollback_lead: Duration,
) -> redis::RedisResult<MarkRead> {
    let (ours, floor_unix_ms, mark_unix_ms, redis_ms, raised): (u8, u64, u64, u64, u8) = MARK
        .key(lease_key)
        .key(keys.mark(lease_key))
        .key(keys.settled(lease_key))
        .arg(owner.as_str())
        .arg(ms(rollback_lead))
        .invoke_async(conn)
        .await?;
    Ok(MarkRead {
        ours: ours == 1,
        floor_unix_ms,
        mark_unix_ms,
        redis_ms,
        raised: raised == 1,
    })
}

/// Runs `reserve.lua`: raises the mark of `lease_key` to `target_unix_ms`, capped at Redis'
/// TIME + `max_lead` (ms precision), if the lease key holds `owner`; a mark this node
/// cannot vouch for is first raised to TIME + `rollback_lead` (see [`read_mark`]).
pub async fn reserve<C: ConnectionLike>(
    conn: &mut C,
    keys: &MintKeys,
    lease_key: &str,
    owner: &Owner,
    target_unix_ms: u64,
    max_lead: Duration,
    rollback_lead: Duration,
) -> redis::RedisResult<Reserved> {
    let (ours, mark_unix_ms, redis_ms): (u8, u64, u64) = RESERVE
        .key(lease_key)
        .key(keys.mark(lease_key))
        .key(keys.settled(lease_key))
        .arg(owner.as_str())
        .arg(target_unix_ms)
        .arg(ms(max_lead))
        .arg(ms(rollback_lead))
        .invoke_async(conn)
        .await?;
    Ok(Reserved {
        ours: ours == 1,
        mark_unix_ms,
        redis_ms,
    })
}

/// Runs `settle.lua`: records `last_unix_ms` (the last minted timestamp, or the floor when
/// none was minted) for `lease_key` if it holds `owner`. Only once minting stopped for
/// good, and before `release.lua`. A mark this node cannot vouch for is raised to Redis'
/// TIME + `rollback_lead` instead, and no record written (see [`read_mark`]).
pub async fn settle<C: ConnectionLike>(
    conn: &mut C,
    keys: &MintKeys,
    lease_key: &str,
    owner: &Owner,
    last_unix_ms: u64,
    rollback_lead: Duration,
) -> redis::RedisResult<Settled> {
    let (ours, settled_unix_ms, mark_unix_ms): (u8, u64, u64) = SETTLE
        .key(lease_key)
        .key(keys.mark(lease_key))
        .key(keys.settled(lease_key))
        .arg(owner.as_str())
        .arg(last_unix_ms)
        .arg(ms(rollback_lead))
        .invoke_async(conn)
        .await?;
    Ok(Settled {
        ours: ours == 1,
        settled_unix_ms,
        mark_unix_ms,
    })
}

/// Runs `format.lua`: records `format` (`"<layout>@<epoch Unix ms>"`) as the app's ID
/// format when none is recorded; returns the recorded one (compare it with `format`).
pub async fn record_format<C: ConnectionLike>(
    conn: &mut C,
    keys: &MintKeys,
    format: &str,
) -> redis::RedisResult<String> {
    FORMAT
        .key(keys.format())
        .arg(format)
        .invoke_async(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mint_keys_share_the_lease_keys_hash_tag() {
        let keys = MintKeys::new("snowflake:worker:", "orders");
        let lease = "snowflake:worker:orders:7";
        assert_eq!(
            keys.mark(lease),
            "snowflake:worker:orders:mark:{snowflake:worker:orders:7}"
        );
        assert_eq!(
            keys.settled(lease),
            "snowflake:worker:orders:settled:{snowflake:worker:orders:7}"
        );
        let lease_keys = crate::worker_id::keys::LeaseKeys::new("snowflake:worker:", "orders");
        assert_eq!(
            lease_keys.worker_id_of(&keys.mark(lease)),
            None,
            "no lease key"
        );
    }

    /// Every script opens with its contract.
    #[test]
    fn scripts_open_with_their_contract() {
        for script in [
            include_str!("mark.lua"),
            include_str!("reserve.lua"),
            include_str!("settle.lua"),
        ] {
            for part in ["-- KEYS[1]", "-- KEYS[3]", "-- ARGV[1]", "-- Returns"] {
                assert!(script.contains(part), "{part}");
            }
        }
    }
}
