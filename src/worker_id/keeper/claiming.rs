//! The claim phase (docs/worker.md, "Claim"): re-adopt the recorded lease,
//! else a free ID (the lowest of its window), with capped, jittered backoff; every wait and
//! call ends by the claim timeout. A claimed lease is handed on only after
//! it passed the gate ([`Worker::publishable`]).

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, sleep, timeout_at};
use tracing::{error, info, warn};

use super::advice::log_paused;
use super::{Worker, WorkerError};
use crate::boot_clock::BootInstant;
use crate::connection::{Readable, classify};
use crate::eviction::EvictingRedis;
use crate::identity::Owner;
use crate::lease::{self, RenewOutcome};
use crate::timing::{bounded, ms, spread};
use crate::worker_id::claim::{ClaimOutcome, GuardFound};
use crate::worker_id::gate::{GateRefusal, Write};
use crate::worker_id::keeper::schedule::{self, ClaimBackoff};
use crate::worker_id::metrics::WorkerMetrics;
use crate::worker_id::state::{HeldLease, Mode, RecordedLease, WorkerState};

/// Longest pause behind a closed claim guard before the next claim round
/// reads it again (one cheap script call).
const GUARD_RECHECK: Duration = Duration::from_secs(5);

/// Least time between two warnings that all IDs are held, or that Redis
/// may evict.
const LOG_EVERY: Duration = Duration::from_secs(30);

/// What one claim pass found.
enum Round {
    Held(HeldLease),
    AllHeld(String),
    /// Wait, what the guards were, and (Cluster, a missing guard) whether
    /// other shards kept their data.
    Paused(Duration, GuardFound, bool),
    Evicting(EvictingRedis),
}

/// The state of one claim phase: its deadline, backoff and rate limits.
struct ClaimPhase {
    /// The claim timeout ends the phase here (exit 3).
    deadline: Instant,
    backoff: ClaimBackoff,
    /// Lease keys of the wrong type already warned about, by index.
    warned: HashSet<usize>,
    /// When "all held" or "paused" was last logged (one limit for both).
    last_log: Option<Instant>,
    /// When "redis may evict" was last logged.
    last_evicting_log: Option<Instant>,
    /// What the claim timeout's error says: the latest finding.
    detail: String,
}

impl ClaimPhase {
    fn new(claim_timeout: Duration, renew_interval: Duration) -> Self {
        Self {
            deadline: Instant::now() + claim_timeout,
            backoff: ClaimBackoff::new(renew_interval),
            warned: HashSet::new(),
            last_log: None,
            last_evicting_log: None,
            detail: String::from("no claim attempt finished in time"),
        }
    }

    /// Sleeps `pause`, never past the deadline. Errors: the claim timed
    /// out ([`WorkerError::ClaimTimeout`], with the latest finding).
    async fn wait(&mut self, pause: Duration, claim_timeout: Duration) -> Result<(), WorkerError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let Some(pause) = schedule::claim_pause(pause, left) else {
            return Err(WorkerError::ClaimTimeout {
                timeout: claim_timeout,
                detail: std::mem::take(&mut self.detail),
            });
        };
        sleep(pause).await;
        Ok(())
    }
}

/// Whether a rate-limited line last logged at `last` is due again.
fn due(last: Option<Instant>) -> bool {
    last.is_none_or(|t| t.elapsed() >= LOG_EVERY)
}

// === impl Worker ===

impl Worker {
    /// The claim phase: rounds until a lease passes the gate. Errors: the
    /// claim timeout, or a Redis refusal ([`WorkerError`]).
    pub(super) async fn claiming(&mut self) -> Result<HeldLease, WorkerError> {
        let settings = &self.params.settings;
        let mut phase = ClaimPhase::new(self.params.claim_timeout, settings.renew_interval);
        loop {
            let mut pause = phase.backoff.pause();
            match timeout_at(phase.deadline, self.claim_pass(&mut phase.warned)).await {
                Ok(Ok(Round::Held(held))) => match self.publishable(&held, Write::Claim).await {
                    Ok(()) => {
                        info!(worker_id = held.worker_id, owner = %held.owner.redacted(), "lease acquired");
                        return Ok(held);
                    }
                    Err(refusal) => self.claim_refused(&mut phase, &held, refusal),
                },
                Ok(Ok(Round::AllHeld(holders))) => self.all_held(&mut phase, holders),
                Ok(Ok(Round::Paused(wait, guard, others_kept))) => {
                    pause = self.paused(&mut phase, wait, guard, others_kept).await;
                }
                Ok(Ok(Round::Evicting(evicting))) => self.claim_evicting(&mut phase, evicting),
                Ok(Err(err)) if classify(&err).retried_at_start() => {
                    warn!(error = %Readable(&err), retry_in_ms = ms(pause), "redis unavailable; retrying claim");
                    phase.detail = format!("redis unavailable: {}", Readable(&err));
                    phase.backoff.grow();
                }
                Ok(Err(err)) => return Err(WorkerError::Redis(err)),
                Err(_) => {}
            }
            phase.wait(pause, self.params.claim_timeout).await?;
        }
    }

    /// A claimed lease the gate refused. The key stays ours: the next
    /// round re-adopts it.
    fn claim_refused(&mut self, phase: &mut ClaimPhase, held: &HeldLease, refusal: GateRefusal) {
        let replicas = self.params.min_replicas_ack;
        match refusal {
            // Sentinel: a claim on a demoted primary that still takes
            // writes is lost at its conversion; never publish it.
            GateRefusal::NotPrimary => {
                warn!(
                    worker_id = held.worker_id,
                    "claim not confirmed on the primary the Sentinels name; claiming again"
                );
                phase.detail = "claim not confirmed on the primary the Sentinels name".into();
                self.set_state(WorkerState::Claiming);
            }
            GateRefusal::ClockSkewed(skew_ms) => {
                WorkerMetrics::count(&self.metrics.claim_attempts, "clock_skew");
                phase.detail =
                    format!("clock skew {skew_ms} ms to Redis' TIME is beyond --max-clock-skew");
                self.set_state(WorkerState::ClockSkewed(skew_ms));
            }
            GateRefusal::Handover(wait) => {
                WorkerMetrics::count(&self.metrics.claim_attempts, "handover");
                let (was, now) = match self.params.mode {
                    Mode::Mint => ("published to an app", "minting"),
                    Mode::Publish => ("minted with", "publishing"),
                };
                phase.detail = format!("worker ID {} was last {was}", held.worker_id);
                if !matches!(*self.state.borrow(), WorkerState::Handover(_)) {
                    info!(
                        worker_id = held.worker_id,
                        wait_ms = ms(wait),
                        "the worker ID was last {was} (the other mode); {now} waits until that use has ended"
                    );
                }
                self.set_state(WorkerState::Handover(BootInstant::now() + wait));
            }
            GateRefusal::Unacknowledged => {
                WorkerMetrics::count(&self.metrics.claim_attempts, "unacknowledged");
                warn!(
                    worker_id = held.worker_id,
                    replicas, "claim not acknowledged by enough replicas in time; claiming again"
                );
                phase.detail = format!("claim not acknowledged by {replicas} replica(s)");
                self.set_state(WorkerState::Unacknowledged(replicas));
            }
        }
        if refusal.claim_backs_off() {
            phase.backoff.grow();
        }
    }

    /// Every ID is held: wait for one to be freed, saying by whom.
    fn all_held(&mut self, phase: &mut ClaimPhase, holders: String) {
        let range = self.params.settings.worker_ids;
        let count = range.len();
        // A range of one region's share names its IDs: "all 512" alone reads as the whole space.
        let which = match range.low() {
            0 => String::new(),
            _ => format!(" ({range})"),
        };
        phase.detail = format!("all {count} worker IDs{which} are held ({holders})");
        if due(phase.last_log) {
            warn!(count, worker_ids = %range, holders = %holders, "all worker IDs are held; waiting for one to be freed");
            phase.last_log = Some(Instant::now());
        }
        // Not behind a guard (any more), and no key of ours: a recorded
        // lease is not ours either.
        self.set_state(WorkerState::Claiming);
        phase.backoff.grow();
    }

    /// The claim guard is closed for `wait`: says why once per phase, and
    /// returns the pause before the next look.
    async fn paused(
        &mut self,
        phase: &mut ClaimPhase,
        wait: Duration,
        guard: GuardFound,
        others_kept: bool,
    ) -> Duration {
        // A time of day, not a duration: the line is read when the claim
        // timeout ends, later than this round.
        phase.detail = format!(
            "claims paused: the claim guard is closed until {}",
            humantime::format_rfc3339_seconds(SystemTime::now() + wait)
        );
        if phase.last_log.is_none() {
            let found = match guard {
                GuardFound::Missing => Some(self.missing_guard(others_kept).await),
                _ => None,
            };
            let open_cmd = self.guard_open_command();
            log_paused(&self.params.app, &open_cmd, wait, guard, found);
            phase.last_log = Some(Instant::now());
        }
        let opens = SystemTime::now() + wait;
        let opens_s = lease::unix_ms(opens).div_ceil(1000);
        self.metrics
            .claim_guard_opens
            .set(i64::try_from(opens_s).unwrap_or(i64::MAX));
        self.set_state(WorkerState::GuardClosed(BootInstant::now() + wait));
        // Look again at least every GUARD_RECHECK: `guard open --force`
        // may open it early.
        wait.min(GUARD_RECHECK) + spread(Duration::from_millis(50))
    }

    /// Redis may evict lease keys: no claim until it is safe.
    fn claim_evicting(&mut self, phase: &mut ClaimPhase, evicting: EvictingRedis) {
        WorkerMetrics::count(&self.metrics.claim_attempts, "evicting");
        phase.detail = evicting.to_string();
        if due(phase.last_evicting_log) {
            error!(policy = %evicting.policy, maxmemory = evicting.maxmemory, error = %evicting, "not claiming: redis may evict lease keys");
            phase.last_evicting_log = Some(Instant::now());
        }
        // A record kept for re-adoption is no proof on such a Redis.
        self.set_state(WorkerState::Evicting(evicting));
        phase.backoff.grow();
    }

    /// One pass: the eviction check, the ACL probe (once), then a claim
    /// round.
    async fn claim_pass(&mut self, warned: &mut HashSet<usize>) -> redis::RedisResult<Round> {
        if let Some(evicting) = self.evicting().await? {
            return Ok(Round::Evicting(evicting));
        }
        if matches!(*self.state.borrow(), WorkerState::Evicting(_)) {
            self.set_state(WorkerState::Claiming);
        }
        if !self.setup.probed {
            self.probe().await?;
            self.advise_replica_count().await;
            self.advise_persistence().await;
            self.setup.probed = true;
        }
        self.claim_round(warned).await
    }

    /// One round: re-adopt the recorded lease, else claim
    /// ([`Claimer`](crate::worker_id::claim::Claimer); the connection's keyspace picks the guard
    /// layout).
    async fn claim_round(&mut self, warned: &mut HashSet<usize>) -> redis::RedisResult<Round> {
        self.ours.claim_started = true;
        if let Some(rec) = self.recorded.clone() {
            if let Some(held) = self.adopt(&rec).await? {
                self.claimer.resume_at(held.worker_id);
                return Ok(Round::Held(held));
            }
            self.recorded = None;
            self.set_state(WorkerState::Claiming);
        }
        let keys = self.keys();
        let settings = &self.params.settings;
        let sent = BootInstant::now();
        let claim = self
            .claimer
            .claim(&mut self.conn, &self.ours.owner, settings.ttl);
        let reply = bounded(settings.call_timeout(), claim)
            .await
            .inspect_err(|_| WorkerMetrics::count(&self.metrics.claim_attempts, "error"))?;
        self.observe_skew(sent, reply.expires_ms);
        for index in reply.wrong_type {
            if warned.insert(index) {
                let key = keys.id(u16::try_from(index).expect("at most 1024 keys"));
                warn!(key = %key, "lease key has the wrong type; skipping it, not deleting it");
            }
        }
        let (index, outcome) = match reply.outcome {
            ClaimOutcome::Claimed(index) => (index, "claimed"),
            ClaimOutcome::Adopted(index) => (index, "adopted"),
            ClaimOutcome::AllHeld => {
                WorkerMetrics::count(&self.metrics.claim_attempts, "full");
                return Ok(Round::AllHeld(self.holders().await));
            }
            ClaimOutcome::Paused { wait, guard } => {
                WorkerMetrics::count(&self.metrics.claim_attempts, "paused");
                let others_kept = reply.other_shards_kept_data;
                return Ok(Round::Paused(wait, guard, others_kept));
            }
        };
        WorkerMetrics::count(&self.metrics.claim_attempts, outcome);
        let worker_id = u16::try_from(index).expect("at most 1024 keys");
        Ok(Round::Held(self.held(
            worker_id,
            sent,
            sent,
            reply.expires_ms,
        )))
    }

    /// Re-adopts a recorded lease when the key still holds exactly the
    /// recorded owner string; never re-creates a missing key.
    async fn adopt(&mut self, rec: &RecordedLease) -> redis::RedisResult<Option<HeldLease>> {
        let range = self.params.settings.worker_ids;
        if !range.contains(rec.worker_id) {
            // Another range now (a region moved to its share of the IDs): the recorded ID
            // may be another region's to hand out. Its key expires with its TTL.
            warn!(
                worker_id = rec.worker_id,
                worker_ids = %range,
                "not re-adopting the lease recorded in the state file: its worker ID {} is outside --worker-ids {range}; claiming a new ID",
                rec.worker_id
            );
            return Ok(None);
        }
        let key = self.keys().id(rec.worker_id);
        let owner = Owner::from_recorded(rec.owner.clone());
        let ttl = self.params.settings.ttl;
        let sent = BootInstant::now();
        let renew = lease::renew(&mut self.conn, &key, &owner, ttl, 0);
        let reply = bounded(self.params.settings.call_timeout(), renew).await?;
        self.observe_skew(sent, reply.expires_ms);
        if reply.outcome == RenewOutcome::Extended {
            WorkerMetrics::count(&self.metrics.claim_attempts, "adopted");
            info!(
                worker_id = rec.worker_id,
                "re-adopted the lease recorded in the state file"
            );
            self.ours.owner = owner;
            self.ours.readopted = Some(rec.worker_id);
            let held = self.held(rec.worker_id, sent, sent, reply.expires_ms);
            return Ok(Some(HeldLease {
                app_until: rec.app_deadline(ttl),
                ..held
            }));
        }
        info!(
            worker_id = rec.worker_id,
            "recorded lease is gone; claiming a new ID"
        );
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// The phase sleeps up to its deadline, then fails with the latest
    /// finding; it never sleeps past the claim timeout.
    #[tokio::test(start_paused = true)]
    async fn the_claim_phase_times_out_with_its_latest_finding() {
        let start = Instant::now();
        let mut phase = ClaimPhase::new(10 * S, 60 * S);
        phase.wait(4 * S, 10 * S).await.unwrap();
        assert_eq!(Instant::now() - start, 4 * S);
        phase.detail = "all 32 worker IDs are held (pod-a: 32)".into();
        phase.wait(30 * S, 10 * S).await.unwrap();
        assert_eq!(Instant::now() - start, 10 * S, "cut at the deadline");
        match phase.wait(S, 10 * S).await {
            Err(WorkerError::ClaimTimeout { timeout, detail }) => {
                assert_eq!(timeout, 10 * S);
                assert_eq!(detail, "all 32 worker IDs are held (pod-a: 32)");
            }
            other => panic!("{other:?}"),
        }
    }

    /// "All held" and "evicting" are repeated at most every 30 s.
    #[tokio::test(start_paused = true)]
    async fn rate_limited_lines_are_due_every_30_s() {
        assert!(due(None));
        let logged = Some(Instant::now());
        tokio::time::advance(29 * S).await;
        assert!(!due(logged));
        tokio::time::advance(S).await;
        assert!(due(logged));
    }
}
