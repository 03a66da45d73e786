//! The one gate a confirmed write passes before it may be published (a
//! claim) or keep the ID published (a renew): the primary the Sentinels
//! name took it, the clock agrees with Redis (claims only), the ID's last
//! use in the other mode has ended (claims only), and enough replicas
//! acknowledged it. Claim and renew report a refusal their own way; the
//! checks and their order live only here.

use std::time::Duration;

use super::Worker;
use crate::boot_clock::BootInstant;
use crate::lease;
use crate::timing::bounded;
use crate::worker_id::keys::MintKeys;
use crate::worker_id::state::{HeldLease, Mode};

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
pub(super) enum GateRefusal {
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

impl GateRefusal {
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
    Handover,
    Replicas,
}

/// The checks a write passes, in order: the primary first (a write on a
/// demoted node is worth nothing else), `WAIT` last (the slowest). The
/// skew bound holds only for a new ID: a held ID stays published.
fn checks(write: Write) -> &'static [Check] {
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

// === impl Worker ===

impl Worker {
    /// The gate: whether a `write` confirmed by Redis on the key of `lease`
    /// may be published. For a renew, `lease` is the one held before it
    /// (its deadline bounds the `WAIT`).
    pub(super) async fn publishable(
        &mut self,
        lease: &HeldLease,
        write: Write,
    ) -> Result<(), GateRefusal> {
        for check in checks(write) {
            let mut handover = Duration::ZERO;
            let passed = match check {
                Check::Primary => self.conn.confirm_primary().await,
                Check::Skew => !self.skew.exceeded(),
                Check::Handover => {
                    handover = self.handover(lease).await;
                    handover.is_zero()
                }
                Check::Replicas => self.acknowledged(lease).await,
            };
            if !passed {
                return Err(match check {
                    Check::Primary => GateRefusal::NotPrimary,
                    Check::Skew => GateRefusal::ClockSkewed(self.skew.ms()),
                    Check::Handover => GateRefusal::Handover(handover),
                    Check::Replicas => GateRefusal::Unacknowledged,
                });
            }
        }
        Ok(())
    }

    /// How long the ID's last use in the other mode may still go on
    /// (zero: ended, or none). Mint mode: until the deadline of the app a
    /// re-adopted record says it was published to. Publishing: until Redis'
    /// TIME is `--max-clock-skew` past the ID's high-water mark, read now
    /// (one `GET`; an app that never minted has none); a mark that cannot
    /// be read counts as one whole mint window (`--mint-window`'s largest
    /// value is not known here: the read is retried with the claim).
    async fn handover(&mut self, lease: &HeldLease) -> Duration {
        match self.params.mode {
            Mode::Mint => lease.app_until.map_or(Duration::ZERO, |until| {
                until.saturating_duration_since(BootInstant::now())
            }),
            Mode::Publish => {
                let keys = MintKeys::new(&self.params.settings.key_prefix, &self.params.app);
                let mark_key = keys.mark(&self.keys().id(lease.worker_id));
                let call_timeout = self.params.settings.call_timeout();
                let mut get = redis::cmd("GET");
                get.arg(&mark_key);
                let read = get.query_async::<Option<String>>(&mut self.conn);
                let mark = match bounded(call_timeout, read).await {
                    Ok(mark) => mark
                        .and_then(|m| lease::node::integer_part(&m))
                        .unwrap_or(0),
                    // Unknown: not published this round (a claim retries).
                    Err(_) => return Duration::from_secs(1),
                };
                let redis_now = lease
                    .redis_expires_ms
                    .saturating_sub(crate::timing::ms(self.params.settings.ttl));
                let skew = crate::timing::ms(self.params.max_clock_skew);
                Duration::from_millis((mark + skew).saturating_sub(redis_now))
            }
        }
    }

    /// Whether `--min-replicas-ack` replicas acknowledged the last write
    /// on the key of `lease` ([`lease::acknowledged`]).
    async fn acknowledged(&mut self, lease: &HeldLease) -> bool {
        let key = self.keys().id(lease.worker_id);
        let call_timeout = self.params.settings.call_timeout();
        let replicas = self.params.min_replicas_ack;
        lease::acknowledged(
            &mut self.conn,
            &key,
            replicas,
            call_timeout,
            lease.remaining(),
        )
        .await
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

    /// Only a Sentinel switch retries a claim at once.
    #[test]
    fn a_claim_refused_for_skew_or_replicas_backs_off() {
        assert!(!GateRefusal::NotPrimary.claim_backs_off());
        assert!(GateRefusal::ClockSkewed(900).claim_backs_off());
        assert!(GateRefusal::Unacknowledged.claim_backs_off());
        assert!(GateRefusal::Handover(Duration::from_secs(1)).claim_backs_off());
    }
}
