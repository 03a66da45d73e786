//! The lease core shared by every mode that holds one key per lease:
//! renewing and releasing a lease key on behalf of an owner (owner-checked
//! scripts), the start-up probe of those scripts, and the local validity
//! math. Knows nothing of files, HTTP or which key it is given.
//!
//! Safety rests on two rules (docs/worker.md, "Validity"): a lease is only valid locally
//! until `sent + TTL - margin`, measured on the boot clock (which counts
//! suspended time, [`crate::boot_clock`]) from the moment the command was
//! *sent*; and only a confirmed reply extends it.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::boot_clock::BootInstant;
use redis::aio::ConnectionLike;
use redis::{RedisError, Script};
use tracing::warn;

use crate::connection::{Failure, Readable, Redis, is_auth_error, is_permission_error};
use crate::identity::Owner;
use crate::timing::{self, ttl_ms};

pub(crate) mod node;

static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lease/renew.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lease/release.lua")));

/// Safety margin subtracted from the TTL: 1% of the TTL (covers clock rates
/// that differ by up to 1%), at least 100 ms (scheduling jitter).
pub(crate) fn margin(ttl: Duration) -> Duration {
    (ttl / 100).max(Duration::from_millis(100))
}

/// How long after sending a claim or renew the lease may be treated as
/// held: TTL - margin.
pub(crate) fn validity(ttl: Duration) -> Duration {
    ttl.saturating_sub(margin(ttl))
}

/// The instant until which a lease whose claim or renew was sent at `sent`
/// may be treated as held. Redis starts its TTL later than `sent`, so this
/// always ends before Redis lets another owner in.
pub(crate) fn validity_deadline(sent: BootInstant, ttl: Duration) -> BootInstant {
    sent + validity(ttl)
}

/// Unix time of `t` in ms (the unit of the state file's `valid_until_ms`);
/// 0 before 1970, saturating.
pub(crate) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, timing::ms)
}

/// Time left until the Unix time `ms`; `None` once it has passed.
pub(crate) fn until_unix_ms(ms: u64) -> Option<Duration> {
    let left = ms.checked_sub(unix_ms(SystemTime::now()))?;
    (left > 0).then(|| Duration::from_millis(left))
}

/// What a renew round found in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The key held our owner string; its TTL was reset.
    Extended,
    /// The key was missing (Redis lost data) while it should still have
    /// existed by Redis' clock, and was set again to our owner.
    Recreated,
    /// Another owner or another type holds the key, or it is missing after
    /// it may have expired: the lease is gone.
    Lost,
}

/// What a failed renew call means for a held lease: the one decision the
/// worker's keeper and `lock`'s hold loop both follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// A permanent refusal: the lease is lost now.
    Ends,
    /// Refused before any write of ours ran (`NOPERM`, `WRONGPASS`,
    /// certificate): the key stays ours until Redis expires it, so only the
    /// deadline ends the lease; the refusal is kept to name it then.
    RetryRefused,
    /// No answer, or a transient error: retry until the validity deadline.
    Retry,
}

/// Judges a failed renew call by its [`Failure`] class
/// ([`Failure::retried_while_held`]).
pub(crate) fn on_failure(failure: Failure) -> OnFailure {
    match failure {
        _ if !failure.retried_while_held() => OnFailure::Ends,
        Failure::Refused => OnFailure::RetryRefused,
        _ => OnFailure::Retry,
    }
}

/// A renew's answer: what happened, and Redis' own deadline for the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewReply {
    /// What the script found and did.
    pub outcome: RenewOutcome,
    /// Redis time (ms) at which the key written by this call expires
    /// (TIME + TTL, read in the script); meaningful when it wrote the key.
    /// The next renew passes [`recreate_before`] of it.
    pub expires_ms: u64,
}

/// Until when (Redis time, ms) a renew may re-create a missing key whose
/// last confirmed write answered `expires_ms`: the margin before it, as for
/// the local validity (`margin`), so a stalled script or a rounding never
/// lets a re-create follow a real expiry.
pub fn recreate_before(expires_ms: u64, ttl: Duration) -> u64 {
    expires_ms.saturating_sub(ttl_ms(margin(ttl)))
}

/// Runs `renew.lua`: extend when ours; re-create when missing and Redis'
/// clock is still before `recreate_before_ms` ([`recreate_before`] of the
/// last confirmed write; 0: never), because only then can nobody else have
/// claimed the key in between; otherwise report the loss. Never writes to a
/// key that holds another value.
pub async fn renew<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    owner: &Owner,
    ttl: Duration,
    recreate_before_ms: u64,
) -> redis::RedisResult<RenewReply> {
    let (code, expires_ms): (i64, u64) = RENEW
        .key(key)
        .arg(owner.as_str())
        .arg(ttl_ms(ttl))
        .arg(recreate_before_ms)
        .invoke_async(conn)
        .await?;
    let outcome = match code {
        1 => RenewOutcome::Extended,
        2 => RenewOutcome::Recreated,
        _ => RenewOutcome::Lost,
    };
    Ok(RenewReply {
        outcome,
        expires_ms,
    })
}

/// Runs `release.lua` (compare-and-delete) on one key: true when the key
/// was ours and is now gone, false when it held something else or nothing.
pub(crate) async fn release<C: ConnectionLike>(
    conn: &mut C,
    key: &str,
    owner: &Owner,
) -> redis::RedisResult<bool> {
    Ok(release_keys(conn, &[key.to_owned()], owner, Duration::ZERO).await? == 1)
}

/// How a released key's value starts (`release.lua` writes
/// `released:<owner>`): claims treat it as held until it expires.
pub(crate) const TOMBSTONE_PREFIX: &str = "released:";

/// Runs `release.lua` on `keys` in one call: each that still holds `owner`
/// is deleted (`handover` zero) or becomes the tombstone
/// `released:<owner>` expiring after `handover` (ms precision, docs/worker.md
/// "ID handover"); returns how many it released (0: none was ours, nothing
/// written).
pub(crate) async fn release_keys<C: ConnectionLike>(
    conn: &mut C,
    keys: &[String],
    owner: &Owner,
    handover: Duration,
) -> redis::RedisResult<u64> {
    let mut invocation = RELEASE.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    invocation
        .arg(owner.as_str())
        .arg(timing::ms(handover))
        .invoke_async(conn)
        .await
}

/// Loads the scripts into the script cache (`SCRIPT LOAD`), so a missing
/// ACL permission shows at start; `invoke_async` reloads them anyway after
/// a restart or `SCRIPT FLUSH` (NOSCRIPT).
async fn load_scripts<C: ConnectionLike>(conn: &mut C) -> redis::RedisResult<()> {
    RENEW.load_async(conn).await?;
    RELEASE.load_async(conn).await?;
    Ok(())
}

/// Loads both scripts, then runs `renew.lua` twice and `release.lua`
/// once on `probe_key`, a key of this process only (`GET`, `SET`,
/// `PEXPIRE`, `DEL` inside the scripts), and leaves nothing behind.
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
    // The probe key is ours alone: re-created whatever Redis' time.
    renew(conn, probe_key, owner, ttl, u64::MAX)
        .await
        .map_err(step(
            "renew.lua could not TIME, GET or SET (needs +time +get +set)",
        ))?;
    renew(conn, probe_key, owner, ttl, u64::MAX)
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
pub(crate) fn step(what: &'static str) -> impl FnOnce(RedisError) -> RedisError {
    move |err| {
        if is_auth_error(&err) {
            let hint = "wrong user name or password: the user of --redis-url, the password of --redis-url or --redis-password-file";
            match err.detail() {
                Some(detail) => (err.kind(), hint, detail.to_owned()).into(),
                None => (err.kind(), hint).into(),
            }
        } else if is_permission_error(&err) {
            (err.kind(), what, Readable(&err).to_string()).into()
        } else {
            err
        }
    }
}

/// How long Redis may wait for replicas: half the call timeout (the
/// client's own limit must not cut it off), never past the validity
/// deadline `remaining` away. `None` below 1 ms: a lease about to end is
/// not worth waiting for.
fn wait_limit(call_timeout: Duration, remaining: Duration) -> Option<Duration> {
    let limit = (call_timeout / 2).min(remaining);
    (limit >= Duration::from_millis(1)).then_some(limit)
}

/// Whether `replicas` replicas acknowledged the last write `conn` made on `key` (`WAIT`,
/// README "Guarantees"); true when none are asked for. Redis waits at most [`wait_limit`]
/// of `call_timeout` and `remaining` (the lease's validity). Shared by the worker keeper's gate
/// and mint mode's reservations, which must count only once they would survive a failover.
pub(crate) async fn acknowledged(
    conn: &mut Redis,
    key: &str,
    replicas: u32,
    call_timeout: Duration,
    remaining: Duration,
) -> bool {
    if replicas == 0 {
        return true;
    }
    let Some(limit) = wait_limit(call_timeout, remaining) else {
        return false;
    };
    match timing::bounded(call_timeout, conn.wait_replicas(key, replicas, limit)).await {
        Ok(acked) => acked >= replicas,
        Err(err) => {
            warn!(error = %Readable(&err), "WAIT for replica acknowledgement failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A permanent error ends the lease now; a refusal is retried and
    /// kept; anything else is retried.
    #[test]
    fn a_failed_renew_is_judged_by_its_class() {
        assert_eq!(on_failure(Failure::Permanent), OnFailure::Ends);
        assert_eq!(on_failure(Failure::Refused), OnFailure::RetryRefused);
        assert_eq!(on_failure(Failure::Transient), OnFailure::Retry);
    }

    /// `WAIT` gets half the call timeout, cut by the validity deadline;
    /// under 1 ms left, the gate refuses without asking.
    #[test]
    fn wait_is_bounded_by_half_the_call_timeout_and_the_deadline() {
        const MS: Duration = Duration::from_millis(1);
        assert_eq!(wait_limit(1000 * MS, 60_000 * MS), Some(500 * MS));
        assert_eq!(wait_limit(1000 * MS, 200 * MS), Some(200 * MS));
        assert_eq!(wait_limit(1000 * MS, 1 * MS), Some(MS));
        assert_eq!(wait_limit(1000 * MS, Duration::from_micros(999)), None);
        assert_eq!(wait_limit(1000 * MS, Duration::ZERO), None);
    }

    #[test]
    fn margin_is_one_percent_but_at_least_100ms() {
        assert_eq!(
            margin(Duration::from_secs(120)),
            Duration::from_millis(1200)
        );
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(100));
    }

    #[test]
    fn recreate_bound_keeps_the_margin() {
        let ttl = Duration::from_secs(120);
        assert_eq!(recreate_before(1_000_000, ttl), 1_000_000 - 1_200);
        // Saturates at 0, which means "never re-create".
        assert_eq!(recreate_before(50, ttl), 0);
    }

    #[test]
    fn deadline_ends_before_redis_expiry() {
        let sent = BootInstant::now();
        let ttl = Duration::from_secs(120);
        let deadline = validity_deadline(sent, ttl);
        assert_eq!(
            deadline.saturating_duration_since(sent),
            Duration::from_millis(118_800)
        );
        assert!(deadline < sent + ttl);
    }

    #[test]
    fn unix_ms_counts_from_the_epoch_and_is_0_before_it() {
        assert_eq!(unix_ms(UNIX_EPOCH + Duration::from_millis(1234)), 1234);
        assert_eq!(unix_ms(UNIX_EPOCH - Duration::from_millis(5)), 0);
    }

    /// A wall-clock deadline counts down and is gone once reached (the
    /// state file's `valid_until_ms`, read at re-adoption without a boot-clock one).
    #[test]
    fn time_left_until_a_unix_ms_deadline() {
        let now = unix_ms(SystemTime::now());
        assert_eq!(until_unix_ms(now - 1), None, "passed");
        assert_eq!(until_unix_ms(0), None);
        let left = until_unix_ms(now + 10_000).expect("10 s ahead");
        assert!(left <= Duration::from_secs(10), "{left:?}");
        assert!(left > Duration::from_secs(9), "{left:?}");
        // A deadline in this very ms (or one just passed) has nothing left.
        assert_eq!(until_unix_ms(unix_ms(SystemTime::now())), None);
    }
}
