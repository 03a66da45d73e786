//! The lease core: the names of an app's keys, claiming the lowest free ID,
//! renewing and releasing one lease key on behalf of an owner, and the local
//! validity math. Knows nothing of files or HTTP.
//!
//! Safety rests on two rules (README, "Validity"): a lease is only valid locally
//! until `sent + TTL - margin`, measured on the monotonic clock from the
//! moment the command was *sent*; and only a confirmed reply extends it.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;
use redis::{RedisError, Script};
use tokio::time::Instant;

use crate::identity::Owner;
use crate::store::{is_auth_error, is_permission_error};

static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lease/renew.lua")));
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lease/claim.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lease/release.lua")));

/// Safety margin subtracted from the TTL: 1% of the TTL (covers clock rates
/// that differ by up to 1%), at least 100 ms (scheduling jitter).
pub(crate) fn margin(ttl: Duration) -> Duration {
    (ttl / 100).max(Duration::from_millis(100))
}

/// How long after sending a claim or renew the lease may be treated as
/// held: TTL - margin.
pub fn validity(ttl: Duration) -> Duration {
    ttl.saturating_sub(margin(ttl))
}

/// The instant until which a lease whose claim or renew was sent at `sent`
/// may be treated as held. Redis starts its TTL later than `sent`, so this
/// always ends before Redis lets another owner in.
pub fn validity_deadline(sent: Instant, ttl: Duration) -> Instant {
    sent + validity(ttl)
}

/// Unix time of `t` in ms (the unit of the state file's `valid_until_ms`);
/// 0 before 1970, saturating.
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Time left until the Unix time `ms`; `None` once it has passed.
pub fn until_unix_ms(ms: u64) -> Option<Duration> {
    let left = ms.checked_sub(unix_ms(SystemTime::now()))?;
    (left > 0).then(|| Duration::from_millis(left))
}

/// Names of one app's keys, all under `<prefix><app>:` (snowlease never
/// touches other keys): lease keys `<id>`, the claim guard `guard`, and
/// start-up probe keys `probe:<nonce>`.
#[derive(Debug, Clone)]
pub struct LeaseKeys {
    base: String,
}

impl LeaseKeys {
    /// Keys of `app` under `prefix` (both validated by the caller).
    pub fn new(prefix: &str, app: &str) -> Self {
        Self {
            base: format!("{prefix}{app}:"),
        }
    }

    /// The lease key of one worker ID.
    pub fn id(&self, worker_id: u16) -> String {
        format!("{}{worker_id}", self.base)
    }

    /// The lease keys of IDs `0..=max_worker_id`, in ID order.
    pub fn ids(&self, max_worker_id: u16) -> Vec<String> {
        (0..=max_worker_id).map(|id| self.id(id)).collect()
    }

    /// The app's claim guard (see `claim.lua`).
    pub fn guard(&self) -> String {
        format!("{}guard", self.base)
    }

    /// The start-up probe key of one process.
    pub fn probe(&self, nonce: &str) -> String {
        format!("{}probe:{nonce}", self.base)
    }
}

/// What a renew round found in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The key held our owner string; its TTL was reset.
    Extended,
    /// The key was missing (Redis lost data) and was set again to our owner.
    Recreated,
    /// Another owner or another type holds the key: the lease is gone.
    Lost,
}

/// What [`claim_lowest`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClaimOutcome {
    /// The key at this index is ours now (`SET NX PX`).
    Claimed(usize),
    /// The key at this index already held our owner string (an earlier
    /// claim whose reply was lost had run); its TTL was reset.
    Adopted(usize),
    /// Every key is held (by others, or by keys of another type).
    AllHeld,
    /// The claim guard is closed for this long: Redis is fresh or lost its
    /// data, and holders from before may still publish their IDs.
    Paused(Duration),
}

/// Result of [`claim_lowest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimReply {
    /// What happened.
    pub outcome: ClaimOutcome,
    /// Indexes of keys of another type; they are never touched.
    pub wrong_type: Vec<usize>,
}

/// Runs `claim.lua`: in one round trip, adopts a key that already holds our
/// owner string, else, when the app's claim guard is open, takes the lowest
/// missing key with `SET NX PX`. A missing guard is set to Redis time + TTL
/// (see the script header for why).
///
/// All keys go to one script, so on Redis Cluster they would have to share
/// a slot; Cluster is not supported yet.
/// A transient error may hide a claim that ran; calling this again finds and
/// adopts that key instead of taking a second one (README, "Claim").
pub(crate) async fn claim_lowest<C: ConnectionLike>(
    conn: &mut C,
    keys: &[String],
    guard_key: &str,
    owner: &Owner,
    ttl: Duration,
) -> redis::RedisResult<ClaimReply> {
    let mut invocation = CLAIM.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    invocation.key(guard_key);
    let (index, how, wrong_type, wait_ms): (i64, i64, Vec<usize>, u64) = invocation
        .arg(owner.as_str())
        .arg(ttl_ms(ttl))
        .invoke_async(conn)
        .await?;
    let outcome = match (usize::try_from(index), how) {
        (Ok(index), 2) => ClaimOutcome::Adopted(index),
        (Ok(index), _) => ClaimOutcome::Claimed(index),
        _ if index == -2 => ClaimOutcome::Paused(Duration::from_millis(wait_ms)),
        _ => ClaimOutcome::AllHeld,
    };
    Ok(ClaimReply {
        outcome,
        wrong_type,
    })
}

/// Runs `renew.lua`: extend when ours, re-create when missing and
/// `recreate` is set, otherwise report the loss. Never writes to a key that
/// holds another value.
pub async fn renew<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    owner: &Owner,
    ttl: Duration,
    recreate: bool,
) -> redis::RedisResult<RenewOutcome> {
    let code: i64 = RENEW
        .key(key)
        .arg(owner.as_str())
        .arg(ttl_ms(ttl))
        .arg(if recreate { "1" } else { "0" })
        .invoke_async(conn)
        .await?;
    Ok(match code {
        1 => RenewOutcome::Extended,
        2 => RenewOutcome::Recreated,
        _ => RenewOutcome::Lost,
    })
}

/// Runs `release.lua` (compare-and-delete): true when the key was ours and
/// is now gone, false when it held something else or nothing.
pub async fn release<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    owner: &Owner,
) -> redis::RedisResult<bool> {
    let code: i64 = RELEASE
        .key(key)
        .arg(owner.as_str())
        .invoke_async(conn)
        .await?;
    Ok(code == 1)
}

/// Loads the scripts into the script cache (`SCRIPT LOAD`), so a missing
/// ACL permission shows at start; `invoke_async` reloads them anyway after
/// a restart or `SCRIPT FLUSH` (NOSCRIPT).
async fn load_scripts<C: ConnectionLike>(conn: &mut C) -> redis::RedisResult<()> {
    CLAIM.load_async(conn).await?;
    RENEW.load_async(conn).await?;
    RELEASE.load_async(conn).await?;
    Ok(())
}

/// Loads all three scripts, then runs `renew.lua` twice and `release.lua`
/// once on `probe_key`, a key of this process only (`GET`, `SET`,
/// `PEXPIRE`, `DEL` inside the scripts), and leaves nothing behind.
/// (`claim.lua`'s `TYPE` and `TIME` are checked by the first claim.)
///
/// `SCRIPT LOAD` alone checks no command inside a script, so without this a
/// user missing e.g. `+pexpire` would claim and publish an ID, then fail at
/// the first renew. Errors: the first Redis error; a permission error names
/// the command the step needs.
pub(crate) async fn probe<C: ConnectionLike>(
    conn: &mut C,
    probe_key: &str,
    owner: &Owner,
) -> redis::RedisResult<()> {
    let ttl = Duration::from_secs(5);
    load_scripts(conn)
        .await
        .map_err(step("SCRIPT LOAD failed (needs +script|load +evalsha)"))?;
    renew(conn, probe_key, owner, ttl, true)
        .await
        .map_err(step("renew.lua could not GET or SET (needs +get +set)"))?;
    renew(conn, probe_key, owner, ttl, true)
        .await
        .map_err(step("renew.lua could not PEXPIRE (needs +pexpire)"))?;
    release(conn, probe_key, owner)
        .await
        .map_err(step("release.lua could not DEL (needs +del)"))?;
    Ok(())
}

/// Names the probe step in a permission error (a script ACL error from
/// Redis names the script, not the command it was refused), and says so
/// plainly when the login failed. Other errors pass unchanged: transient
/// ones (OOM, loading, timeouts) are retried by the caller.
fn step(what: &'static str) -> impl FnOnce(RedisError) -> RedisError {
    move |err| {
        if is_auth_error(&err) {
            let hint = "wrong user name or password in --redis-url";
            match err.detail() {
                Some(detail) => (err.kind(), hint, detail.to_owned()).into(),
                None => (err.kind(), hint).into(),
            }
        } else if is_permission_error(&err) {
            (err.kind(), what, err.to_string()).into()
        } else {
            err
        }
    }
}

fn ttl_ms(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margin_is_one_percent_but_at_least_100ms() {
        assert_eq!(
            margin(Duration::from_secs(120)),
            Duration::from_millis(1200)
        );
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(100));
    }

    #[test]
    fn deadline_ends_before_redis_expiry() {
        let sent = Instant::now();
        let ttl = Duration::from_secs(120);
        let deadline = validity_deadline(sent, ttl);
        assert_eq!(deadline - sent, Duration::from_millis(118_800));
        assert!(deadline < sent + ttl);
    }
}
