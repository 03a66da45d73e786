//! The one gate a confirmed write passes before it may be published (a
//! claim) or keep the ID published (a renew): the primary the Sentinels
//! name took it, the clock agrees with Redis (claims only), and enough
//! replicas acknowledged it. Claim and renew report a refusal their own
//! way; the checks and their order live only here.

use std::time::Duration;

use tracing::warn;

use super::Worker;
use crate::connection::{Readable, Redis};
use crate::timing::bounded;
use crate::worker_id::state::HeldLease;

/// Which write the gate judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Write {
    /// A claim or re-adoption: not published yet.
    Claim,
    /// A renewal of a published ID.
    Renew,
}

/// Why the gate refused a write. The key stays ours in each case: the next
/// claim round re-adopts it, the next renew attempt extends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Sentinel: the write ran on a node that is not the primary the
    /// Sentinels name (a demoted primary still taking writes loses them
    /// at its conversion).
    NotPrimary,
    /// The wall clock differs from Redis' TIME beyond `--max-clock-skew`
    /// by this many ms (local - Redis).
    ClockSkewed(i64),
    /// Fewer than `--min-replicas-ack` replicas acknowledged it in time:
    /// a failover may lose the write.
    Unacknowledged,
}

impl Refusal {
    /// Whether a claim round refused so grows the claim backoff: a skew or
    /// slow replicas last a while; a Sentinel switch is over in a moment.
    pub(super) fn claim_backs_off(self) -> bool {
        !matches!(self, Self::NotPrimary)
    }
}

/// One check of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Primary,
    Skew,
    Replicas,
}

/// The checks a write passes, in order: the primary first (a write on a
/// demoted node is worth nothing else), `WAIT` last (the slowest). The
/// skew bound holds only for a new ID: a held ID stays published.
fn checks(write: Write) -> &'static [Check] {
    match write {
        Write::Claim => &[Check::Primary, Check::Skew, Check::Replicas],
        Write::Renew => &[Check::Primary, Check::Replicas],
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

// === impl Worker ===

impl Worker {
    /// The gate: whether a `write` confirmed by Redis on the key of `lease`
    /// may be published. For a renew, `lease` is the one held before it
    /// (its deadline bounds the `WAIT`).
    pub(super) async fn publishable(
        &mut self,
        lease: &HeldLease,
        write: Write,
    ) -> Result<(), Refusal> {
        for check in checks(write) {
            let passed = match check {
                Check::Primary => self.conn.confirm_primary().await,
                Check::Skew => !self.skew.exceeded(),
                Check::Replicas => self.acknowledged(lease).await,
            };
            if !passed {
                return Err(match check {
                    Check::Primary => Refusal::NotPrimary,
                    Check::Skew => Refusal::ClockSkewed(self.skew.ms()),
                    Check::Replicas => Refusal::Unacknowledged,
                });
            }
        }
        Ok(())
    }

    /// Whether `--min-replicas-ack` replicas acknowledged the last write
    /// on the key of `lease` ([`acknowledged`]).
    async fn acknowledged(&mut self, lease: &HeldLease) -> bool {
        let key = self.keys().id(lease.worker_id);
        let call_timeout = self.params.settings.call_timeout();
        let replicas = self.params.min_replicas_ack;
        acknowledged(
            &mut self.conn,
            &key,
            replicas,
            call_timeout,
            lease.remaining(),
        )
        .await
    }
}

/// Whether `replicas` replicas acknowledged the last write `conn` made on `key` (`WAIT`,
/// README "Guarantees"); true when none are asked for. Redis waits at most [`wait_limit`]
/// of `call_timeout` and `remaining` (the lease's validity). Shared by the keeper's gate and
/// mint mode's reservations, which must count only once they would survive a failover.
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
    match bounded(call_timeout, conn.wait_replicas(key, replicas, limit)).await {
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

    const MS: Duration = Duration::from_millis(1);

    /// A renewal is never refused for clock skew (a held ID stays
    /// published); a claim is, after the primary and before `WAIT`.
    #[test]
    fn only_a_claim_is_held_to_the_skew_bound() {
        assert_eq!(
            checks(Write::Claim),
            [Check::Primary, Check::Skew, Check::Replicas]
        );
        assert_eq!(checks(Write::Renew), [Check::Primary, Check::Replicas]);
    }

    /// The primary is asked first on every path: nothing else counts on a
    /// demoted node.
    #[test]
    fn every_write_checks_the_primary_first() {
        for write in [Write::Claim, Write::Renew] {
            assert_eq!(checks(write).first(), Some(&Check::Primary));
        }
    }

    /// `WAIT` gets half the call timeout, cut by the validity deadline;
    /// under 1 ms left, the gate refuses without asking.
    #[test]
    fn wait_is_bounded_by_half_the_call_timeout_and_the_deadline() {
        assert_eq!(wait_limit(1000 * MS, 60_000 * MS), Some(500 * MS));
        assert_eq!(wait_limit(1000 * MS, 200 * MS), Some(200 * MS));
        assert_eq!(wait_limit(1000 * MS, 1 * MS), Some(MS));
        assert_eq!(wait_limit(1000 * MS, Duration::from_micros(999)), None);
        assert_eq!(wait_limit(1000 * MS, Duration::ZERO), None);
    }

    /// Only a Sentinel switch retries a claim at once.
    #[test]
    fn a_claim_refused_for_skew_or_replicas_backs_off() {
        assert!(!Refusal::NotPrimary.claim_backs_off());
        assert!(Refusal::ClockSkewed(900).claim_backs_off());
        assert!(Refusal::Unacknowledged.claim_backs_off());
    }
}
