//! The keeper's side of the gate (`worker_id::gate`, which holds the
//! checks and their order): runs a claim's or a renew's checks, answering
//! the two only the keeper can (the clock skew, the ID's last use in the
//! other mode), and says which refusals grow the claim backoff.

use std::time::Duration;

use super::Worker;
use crate::boot_clock::BootInstant;
use crate::lease;
use crate::timing::bounded;
use crate::worker_id::gate::{Check, GateRefusal, Write, WrittenKey, checks, refused};
use crate::worker_id::keys::MintKeys;
use crate::worker_id::state::{HeldLease, Mode};

impl GateRefusal {
    /// Whether a claim round refused so grows the claim backoff: a skew or
    /// slow replicas last a while; a Sentinel switch is over in a moment.
    pub(super) fn claim_backs_off(self) -> bool {
        !matches!(self, Self::NotPrimary)
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
        let key = self.keys().id(lease.worker_id);
        let written = WrittenKey {
            key: &key,
            replicas: self.params.min_replicas_ack,
            call_timeout: self.params.settings.call_timeout(),
            remaining: lease.remaining(),
        };
        for &check in checks(write) {
            let mut handover = Duration::ZERO;
            let passed = match check {
                Check::Skew => !self.skew.exceeded(),
                Check::Handover => {
                    handover = self.handover(lease).await;
                    handover.is_zero()
                }
                Check::Primary | Check::Replicas => {
                    written.passes(&mut self.conn, check).await == Some(true)
                }
            };
            if !passed {
                return Err(refused(check, self.skew.ms(), handover));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a Sentinel switch retries a claim at once.
    #[test]
    fn a_claim_refused_for_skew_or_replicas_backs_off() {
        assert!(!GateRefusal::NotPrimary.claim_backs_off());
        assert!(GateRefusal::ClockSkewed(900).claim_backs_off());
        assert!(GateRefusal::Unacknowledged.claim_backs_off());
        assert!(GateRefusal::Handover(Duration::from_secs(1)).claim_backs_off());
    }
}
