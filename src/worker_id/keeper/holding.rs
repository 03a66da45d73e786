//! The hold phase: publish the lease, renew it every interval (at once
//! after a reconnect), retry a failed renew until the validity deadline,
//! and end on shutdown, loss, a lasting refusal, or an evicting Redis.

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use super::Worker;
use crate::boot_clock::{self, BootInstant};
use crate::connection::{Failure, Readable, classify};
use crate::eviction::EvictingRedis;
use crate::lease::{self, OnFailure, RenewOutcome, on_failure};
use crate::timing::bounded;
use crate::worker_id::gate::{GateRefusal, Write};
use crate::worker_id::keeper::schedule;
use crate::worker_id::metrics::WorkerMetrics;
use crate::worker_id::state::{HeldLease, WorkerState};

/// How a hold ended.
#[derive(Debug)]
pub(super) enum HoldEnd {
    /// Shutdown while this lease was held.
    Shutdown(HeldLease),
    /// The lease of this ID was lost.
    Lost(u16),
    /// The validity deadline passed while Redis refused this client
    /// (password, ACL, certificate): unpublished; the key may still be ours.
    Refused(redis::RedisError),
    /// Redis may evict keys: unpublished, the key left to expire.
    GaveUp,
}

/// What one renew round found.
#[derive(Debug)]
pub(super) enum RenewRound {
    /// Confirmed: sent at, and Redis' `expires_ms` of the key.
    Renewed(BootInstant, u64),
    Lost(&'static str),
    Evicting(EvictingRedis),
    /// Every attempt failed; the deadline has not passed.
    Failed,
}

/// How a hold ends after `round`, if it does: a loss names a refusal that
/// lasted to the deadline (taken from `refusal`), else it is a plain loss;
/// any other round keeps the hold (and the refusal).
fn hold_end(
    round: RenewRound,
    worker_id: u16,
    refusal: &mut Option<redis::RedisError>,
) -> Result<RenewRound, HoldEnd> {
    match round {
        RenewRound::Lost(_) => Err(match refusal.take() {
            Some(err) => HoldEnd::Refused(err),
            None => HoldEnd::Lost(worker_id),
        }),
        RenewRound::Evicting(_) => Err(HoldEnd::GaveUp),
        other => Ok(other),
    }
}

/// One hold: the lease, when to renew it, and the refusal that ends it if
/// it lasts until the validity deadline.
struct Hold {
    held: HeldLease,
    next_renew: BootInstant,
    /// Redis refused the last renewal or eviction check
    /// ([`Failure::Refused`]): if the validity deadline passes so, the
    /// sidecar exits 1 naming it instead of claiming again.
    refusal: Option<redis::RedisError>,
}

// === impl Worker ===

impl Worker {
    /// Publishes the lease and renews it until shutdown or loss.
    pub(super) async fn holding(
        &mut self,
        held: HeldLease,
        shutdown: &CancellationToken,
    ) -> HoldEnd {
        let interval = self.params.settings.renew_interval;
        // valid_until = sent + validity, so this is timed from the send.
        let sent = held.valid_until - lease::validity(self.params.settings.ttl);
        let mut hold = Hold {
            next_renew: schedule::renew_after_confirmed(sent, interval),
            held,
            refusal: None,
        };
        self.set_state(WorkerState::Held(hold.held.clone()));
        // A new connection (reconnect, new primary) may have lost the key or
        // met another owner: renew at once, not at the interval.
        let mut reconnects = self.conn.reconnects();
        reconnects.mark_unchanged();
        loop {
            let wake = schedule::wake_at(hold.next_renew, hold.held.valid_until);
            tokio::select! {
                _ = shutdown.cancelled() => return HoldEnd::Shutdown(hold.held),
                // A wake-up only: the renew round judges validity itself.
                _ = boot_clock::sleep_until(wake) => {}
                _ = reconnects.changed() => debug!("new redis connection; renewing at once"),
                () = self.renew_now.notified() => debug!("renewal asked for; renewing at once"),
            }
            let round = tokio::select! {
                _ = shutdown.cancelled() => return HoldEnd::Shutdown(hold.held),
                round = self.renew_round(&mut hold) => round,
            };
            // After a confirmed renew, so a slow INFO never delays one.
            let round = match round {
                RenewRound::Renewed(..) => self.eviction_round(&mut hold).await.unwrap_or(round),
                other => other,
            };
            // A reconnect inside the round already ran the renew on it.
            reconnects.mark_unchanged();
            self.report_round(&hold, &round);
            match hold_end(round, hold.held.worker_id, &mut hold.refusal) {
                Ok(RenewRound::Renewed(sent, expires_ms)) => {
                    hold.held = self.held(hold.held.worker_id, hold.held.claimed, sent, expires_ms);
                    hold.next_renew = schedule::renew_after_confirmed(sent, interval);
                    self.set_state(WorkerState::Held(hold.held.clone()));
                }
                // Keep trying until the deadline.
                Ok(_) => {
                    hold.next_renew = schedule::renew_after_failed(BootInstant::now(), interval)
                }
                Err(end) => return end,
            }
        }
    }

    /// Unpublishes and logs a round that ends the hold.
    fn report_round(&self, hold: &Hold, round: &RenewRound) {
        let worker_id = hold.held.worker_id;
        match round {
            RenewRound::Lost(reason) => {
                self.metrics.leases_lost.inc();
                self.set_state(WorkerState::Lost);
                error!(
                    worker_id,
                    reason, "lease lost; stopped publishing the worker ID"
                );
                if let Some(err) = &hold.refusal {
                    error!(worker_id, error = %Readable(err), "no renewal confirmed before the validity deadline: redis refused this client (password, ACL or certificate); the key stays recorded in the state file for the next start");
                }
            }
            RenewRound::Evicting(evicting) => {
                // Unpublished at once; the key is not renewed and expires,
                // or claim.lua re-adopts it once Redis is safe.
                error!(worker_id, policy = %evicting.policy, error = %evicting, "stopped publishing the worker ID: redis may evict lease keys");
                self.set_state(WorkerState::Evicting(evicting.clone()));
            }
            RenewRound::Renewed(..) | RenewRound::Failed => {}
        }
    }

    /// The eviction check of a renew round: `None` while Redis never
    /// evicts, or did not answer (the next renew meets the same trouble and
    /// handles it; the last answer stands meanwhile).
    async fn eviction_round(&mut self, hold: &mut Hold) -> Option<RenewRound> {
        match self.evicting().await {
            Ok(Some(evicting)) => Some(RenewRound::Evicting(evicting)),
            Ok(None) => None,
            Err(err) => match classify(&err).failure {
                Failure::Permanent => {
                    error!(error = %Readable(&err), "eviction check refused by redis");
                    Some(RenewRound::Lost("redis refused INFO memory"))
                }
                // Unchecked, the renewal does not count; retried until the deadline.
                Failure::Refused => {
                    error!(error = %Readable(&err), "eviction check refused by redis; retrying until the validity deadline");
                    hold.refusal = Some(err);
                    Some(RenewRound::Failed)
                }
                Failure::Transient => None,
            },
        }
    }

    /// One renew round: the script, retried `retries` times with doubling
    /// backoff, never sent after the validity deadline.
    async fn renew_round(&mut self, hold: &mut Hold) -> RenewRound {
        let settings = &self.params.settings;
        let mut pauses = schedule::renew_retries(settings.renew_interval, settings.retries);
        for attempt in 0u32.. {
            if !hold.held.is_valid() {
                return RenewRound::Lost("validity deadline passed without a confirmed renewal");
            }
            if let Some(round) = self.renew_attempt(hold, attempt).await {
                return round;
            }
            let Some(pause) = pauses.next() else { break };
            sleep(schedule::retry_pause(pause, hold.held.remaining())).await;
        }
        RenewRound::Failed
    }

    /// One renew attempt: the script, then the gate. `None`: retry.
    async fn renew_attempt(&mut self, hold: &mut Hold, attempt: u32) -> Option<RenewRound> {
        let worker_id = hold.held.worker_id;
        let settings = &self.params.settings;
        let key = self.keys().id(worker_id);
        let recreate = lease::recreate_before(hold.held.redis_expires_ms, settings.ttl);
        let sent = BootInstant::now();
        let renew = lease::renew(
            &mut self.conn,
            &key,
            &self.ours.owner,
            settings.ttl,
            recreate,
        );
        let reply = match bounded(settings.call_timeout(), renew).await {
            Ok(reply) => reply,
            Err(err) => return self.renew_failed(hold, attempt, err),
        };
        self.observe_skew(sent, reply.expires_ms);
        hold.refusal = None;
        if reply.outcome == RenewOutcome::Lost {
            WorkerMetrics::count(&self.metrics.renewals, "lost");
            return Some(RenewRound::Lost(
                "the key holds another owner, or is gone after it may have expired",
            ));
        }
        match self.publishable(&hold.held, Write::Renew).await {
            Ok(()) => Some(self.renewed(worker_id, reply.outcome, sent, reply.expires_ms)),
            Err(refusal) => {
                self.renew_refused(worker_id, attempt, refusal);
                None
            }
        }
    }

    /// A renew call that failed with `err`: the lease is lost on a
    /// permanent refusal, else the attempt is retried. `None`: retry.
    fn renew_failed(
        &self,
        hold: &mut Hold,
        attempt: u32,
        err: redis::RedisError,
    ) -> Option<RenewRound> {
        let worker_id = hold.held.worker_id;
        WorkerMetrics::count(&self.metrics.renewals, "failed");
        match on_failure(classify(&err).failure) {
            OnFailure::Ends => {
                error!(worker_id, error = %Readable(&err), "renew refused by redis");
                hold.refusal = None;
                return Some(RenewRound::Lost("redis refused the renew script"));
            }
            OnFailure::RetryRefused => {
                error!(worker_id, attempt, error = %Readable(&err), "renew refused by redis; retrying until the validity deadline");
                hold.refusal = Some(err);
            }
            OnFailure::Retry => {
                warn!(worker_id, attempt, error = %Readable(&err), "renew failed");
                hold.refusal = None;
            }
        }
        None
    }

    /// Counts and logs a renewal that passed the gate.
    fn renewed(
        &self,
        worker_id: u16,
        outcome: RenewOutcome,
        sent: BootInstant,
        expires_ms: u64,
    ) -> RenewRound {
        if outcome == RenewOutcome::Recreated {
            WorkerMetrics::count(&self.metrics.renewals, "recreated");
            self.metrics.reacquisitions.inc();
            warn!(
                worker_id,
                "lease re-created after key loss (Redis, or on Cluster the key's shard, lost its data?)"
            );
        } else {
            WorkerMetrics::count(&self.metrics.renewals, "renewed");
            debug!(worker_id, "lease renewed");
        }
        RenewRound::Renewed(sent, expires_ms)
    }

    /// A renewal the gate refused: it does not count; retried.
    fn renew_refused(&self, worker_id: u16, attempt: u32, refusal: GateRefusal) {
        match refusal {
            // Sentinel: only a renewal on the primary they name counts.
            GateRefusal::NotPrimary => {
                WorkerMetrics::count(&self.metrics.renewals, "unconfirmed");
                warn!(
                    worker_id,
                    attempt, "renewal not confirmed on the primary the Sentinels name; retrying"
                );
            }
            // Never extend validity from a write a failover may lose.
            // (The gate does not hold a renewal to the skew bound.)
            GateRefusal::Unacknowledged
            | GateRefusal::ClockSkewed(_)
            | GateRefusal::Handover(_) => {
                WorkerMetrics::count(&self.metrics.renewals, "unacknowledged");
                warn!(
                    worker_id,
                    attempt,
                    replicas = self.params.min_replicas_ack,
                    "renewal not acknowledged by enough replicas in time; retrying"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> redis::RedisError {
        redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "WRONGPASS"))
    }

    /// A loss is named a refusal only when Redis refused until the
    /// deadline; the refusal is taken then, and kept across failed rounds.
    #[test]
    fn a_loss_after_a_lasting_refusal_ends_in_refused() {
        let mut refusal = None;
        let end = hold_end(RenewRound::Lost("gone"), 4, &mut refusal);
        assert!(matches!(end, Err(HoldEnd::Lost(4))), "{end:?}");

        let mut refusal = Some(refused());
        let end = hold_end(RenewRound::Failed, 4, &mut refusal);
        assert!(matches!(end, Ok(RenewRound::Failed)), "{end:?}");
        assert!(refusal.is_some(), "a failed round keeps the refusal");
        let end = hold_end(RenewRound::Lost("deadline"), 4, &mut refusal);
        assert!(matches!(end, Err(HoldEnd::Refused(_))), "{end:?}");
        assert!(refusal.is_none());
    }

    /// A confirmed renewal keeps the hold; an evicting Redis ends it.
    #[test]
    fn renewed_keeps_the_hold_and_evicting_gives_up() {
        let mut refusal = None;
        let sent = BootInstant::now();
        let end = hold_end(RenewRound::Renewed(sent, 9), 4, &mut refusal);
        assert!(matches!(end, Ok(RenewRound::Renewed(_, 9))), "{end:?}");
        let evicting = EvictingRedis {
            policy: "allkeys-lru".into(),
            maxmemory: 1 << 20,
        };
        let end = hold_end(RenewRound::Evicting(evicting), 4, &mut refusal);
        assert!(matches!(end, Err(HoldEnd::GaveUp)), "{end:?}");
    }
}
