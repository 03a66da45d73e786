//! The one gate a confirmed write passes before it may be published (a
//! claim) or keep the ID published (a renew), or, in mint mode, raise the
//! minter's ceiling (a reservation, judged as a renew): the primary the
//! Sentinels name took it, the clock agrees with Redis (claims only), the
//! ID's last use in the other mode has ended (claims only), and enough
//! replicas acknowledged it. The checks and their order, the ones the
//! connection answers and the refusals live here; the keeper judges claims
//! and renewals with them (`keeper/gate.rs`, which also answers the skew
//! and the handover), mint mode's reserver its reservations. Each reports
//! a refusal its own way.

use std::time::Duration;

use crate::connection::Redis;
use crate::lease;

/// Which write the gate judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// A claim or re-adoption: not published yet.
    Claim,
    /// A renewal of a published ID.
    Renew,
}

/// Why the gate refused a write. The key stays ours in each case: the next
/// claim round re-adopts it, the next renew attempt extends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateRefusal {
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
    /// The ID was last used in the other mode and that use may go on for
    /// this long: an app an earlier process in this pod published it to
    /// (mint mode waits for its recorded deadline), or IDs minted up to
    /// its high-water mark (publishing waits until Redis' TIME is past the
    /// mark by `--max-clock-skew`, so the app's clock is past it too).
    Handover(Duration),
}

/// One check of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    Primary,
    Skew,
    Handover,
    Replicas,
}

/// The key a confirmed write went to, as the checks the connection answers
/// see it.
pub(crate) struct WrittenKey<'a> {
    /// The lease key of the worker ID.
    pub key: &'a str,
    /// Replicas that must acknowledge the write (`--min-replicas-ack`, 0-16).
    pub replicas: u32,
    /// Bound of one Redis call.
    pub call_timeout: Duration,
    /// Time left of the lease held before the write: `WAIT` never outlasts it.
    pub remaining: Duration,
}

impl WrittenKey<'_> {
    /// Whether `check` passes on `conn`, when the connection alone answers
    /// it: the primary the Sentinels name took the write, or enough replicas
    /// acknowledged it ([`lease::acknowledged`]). `None` for the skew and
    /// the handover, the keeper's to judge.
    pub(crate) async fn passes(&self, conn: &mut Redis, check: Check) -> Option<bool> {
        match check {
            Check::Primary => Some(conn.confirm_primary().await),
            Check::Replicas => {
                let (replicas, timeout) = (self.replicas, self.call_timeout);
                Some(lease::acknowledged(conn, self.key, replicas, timeout, self.remaining).await)
            }
            Check::Skew | Check::Handover => None,
        }
    }

    /// The gate of mint mode's reservation on a held worker ID: a write that
    /// keeps the ID in use, judged as a renewal is (the primary, then `WAIT`),
    /// on the reserver's connection. The minter's ceiling rises only past it.
    pub(crate) async fn reservation(&self, conn: &mut Redis) -> Result<(), GateRefusal> {
        for &check in checks(Write::Renew) {
            // A check only the keeper answers refuses: nothing here judges it.
            if self.passes(conn, check).await != Some(true) {
                return Err(refused(check, 0, Duration::ZERO));
            }
        }
        Ok(())
    }
}

/// The refusal of a failed `check`: `skew_ms` and `handover` are what the
/// keeper's own checks measured.
pub(crate) fn refused(check: Check, skew_ms: i64, handover: Duration) -> GateRefusal {
    match check {
        Check::Primary => GateRefusal::NotPrimary,
        Check::Skew => GateRefusal::ClockSkewed(skew_ms),
        Check::Handover => GateRefusal::Handover(handover),
        Check::Replicas => GateRefusal::Unacknowledged,
    }
}

/// The checks a write passes, in order: the primary first (a write on a
/// demoted node is worth nothing else), `WAIT` last (the slowest). The
/// skew bound holds only for a new ID: a held ID stays published.
pub(crate) fn checks(write: Write) -> &'static [Check] {
    match write {
        Write::Claim => &[
            Check::Primary,
            Check::Skew,
            Check::Handover,
            Check::Replicas,
        ],
        Write::Renew => &[Check::Primary, Check::Replicas],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A renewal is never refused for clock skew (a held ID stays
    /// published); a claim is, after the primary and before `WAIT`.
    #[test]
    fn only_a_claim_is_held_to_the_skew_bound() {
        assert_eq!(
            checks(Write::Claim),
            [
                Check::Primary,
                Check::Skew,
                Check::Handover,
                Check::Replicas
            ]
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
}
