//! The keeper: claims the lowest free worker ID, renews it, reports loss,
//! and hands the lease back to the caller at shutdown.
//!
//! The loop here is the only writer of [`WorkerState`]; the file publisher,
//! HTTP and metrics read it through a `watch` channel (kubert's pattern).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout, timeout_at};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::args::{DEFAULT_KEY_PREFIX, DEFAULT_MAX_WORKER_ID, LeaseSettings, OnLoss};
use super::claim::{self, ClaimOutcome, GuardFound, LeaseKeys, glob_escape};
use super::metrics::WorkerMetrics;
use super::state::{HeldLease, RecordedLease, WorkerState};
use super::status;
use super::timing::{self, ClaimBackoff};
use crate::boot_clock::{self, BootInstant};
use crate::connection::{Failure, Keyspace, Readable, Redis, classify};
use crate::eviction::{self, EvictingRedis};
use crate::identity::{Owner, identity_of};
use crate::lease::{self, RenewOutcome};

/// Longest pause behind a closed claim guard before the next claim round
/// reads it again (one cheap script call).
const GUARD_RECHECK: Duration = Duration::from_secs(5);

/// Why the worker loop stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// No ID could be claimed before `--claim-timeout` (exit 3).
    #[error("no worker ID claimed within {timeout:?}: {detail}")]
    ClaimTimeout {
        /// The claim timeout.
        timeout: Duration,
        /// How many IDs exist and who holds them, or why Redis failed.
        detail: String,
    },
    /// The lease was lost and `--on-loss exit` is set (exit 4).
    #[error("lease on worker ID {worker_id} lost (--on-loss exit)")]
    LeaseLost {
        /// The ID that was lost.
        worker_id: u16,
    },
    /// Redis refused in a way retries cannot fix (exit 1): at start any
    /// error not [`Failure::Transient`]; while holding, a permanent error
    /// that ends the reclaim, or a refusal (`NOPERM`, `WRONGPASS`,
    /// certificate) that lasted until the validity deadline.
    #[error("redis refused: {}", Readable(.0))]
    Redis(redis::RedisError),
}

/// What the keeper needs besides its connection and owner; nothing about
/// files or HTTP. `Default` gives the CLI's defaults (app `default`).
#[derive(Debug, Clone)]
pub struct WorkerParams {
    /// Application name (validated by the caller).
    pub app: String,
    /// Lease timing and ID range.
    pub settings: LeaseSettings,
    /// Behaviour after a loss.
    pub on_loss: OnLoss,
    /// Give up claiming after this long (exit 3).
    pub claim_timeout: Duration,
    /// Hold leases even on a Redis that may evict keys (`--allow-evicting-redis`).
    pub allow_evicting_redis: bool,
    /// Replicas that must acknowledge a claim or renew (`WAIT`) before it
    /// counts, 0-16 (`--min-replicas-ack`); 0: none.
    pub min_replicas_ack: u32,
    /// Largest |wall clock - Redis TIME| at which a newly claimed ID is
    /// published (`--max-clock-skew`).
    pub max_clock_skew: Duration,
}

impl Default for WorkerParams {
    fn default() -> Self {
        Self {
            app: "default".into(),
            settings: LeaseSettings::default(),
            on_loss: OnLoss::Reclaim,
            claim_timeout: Duration::from_secs(300),
            allow_evicting_redis: false,
            min_replicas_ack: 0,
            max_clock_skew: Duration::from_millis(500),
        }
    }
}

/// How a keeper ended, for the cleanup after it.
#[derive(Debug)]
pub struct Stopped {
    /// The owner string used last (a re-adopted one replaces the process's
    /// own); every key holding it is ours.
    pub owner: Owner,
    /// The worker ID held at shutdown, if any.
    pub held: Option<u16>,
    /// Every lease key of the app: a claim that ran while its reply was
    /// lost (SIGTERM or the claim timeout arrived) may hold any of them.
    /// Empty when no claim round started (Redis never answered, or the URL
    /// named the wrong topology): then no key can hold our owner string.
    pub keys: Vec<String>,
    /// `Err` for claim timeout, loss with `--on-loss exit`, or a Redis
    /// refusal ([`WorkerError::Redis`]).
    pub result: Result<(), WorkerError>,
}

/// The keeper of one worker-ID lease: claims, renews, reclaims; the only
/// writer of [`WorkerState`].
pub struct Worker {
    conn: Redis,
    params: WorkerParams,
    /// Owner string of this process (replaced by a re-adopted one).
    owner: Owner,
    recorded: Option<RecordedLease>,
    metrics: Arc<WorkerMetrics>,
    state: watch::Sender<WorkerState>,
    /// The last eviction check found Redis safe.
    found_safe: bool,
    /// Clock skew (ms, local - Redis) seen at the last claim or renew reply.
    skew_ms: i64,
    /// When a skew beyond the bound was last logged (rate limit).
    skew_logged: Option<Instant>,
    /// A claim round started (a claim, or a re-adopted lease's renewals,
    /// may have written keys holding our owner string).
    claim_started: bool,
    /// Redis refused the last renewal or eviction check
    /// ([`Failure::Refused`]): if the validity deadline passes so, the
    /// sidecar exits 1 naming it instead of claiming again.
    refusal: Option<redis::RedisError>,
}

enum HoldEnd {
    Shutdown(HeldLease),
    Lost(u16),
    /// The validity deadline passed while Redis refused this client
    /// (password, ACL, certificate): unpublished; the key may still be ours.
    Refused(redis::RedisError),
    /// Redis may evict keys: unpublished, the key left to expire.
    GaveUp,
}

enum RenewRound {
    /// Confirmed: sent at, and Redis' `expires_ms` of the key.
    Renewed(BootInstant, u64),
    Lost(&'static str),
    Evicting(EvictingRedis),
    Failed,
}

/// What one claim pass found.
enum Round {
    Held(HeldLease),
    AllHeld(String),
    /// Wait, what the guards were, and (Cluster, a missing guard) whether
    /// other shards kept their data.
    Paused(Duration, GuardFound, bool),
    Evicting(EvictingRedis),
}

impl Worker {
    /// A keeper that will first try to re-adopt `recorded` (the state file
    /// of an earlier process in this pod), and the receiver of its state:
    /// `Readopting` while that record is valid, else `Claiming`.
    pub fn new(
        conn: Redis,
        owner: Owner,
        params: WorkerParams,
        recorded: Option<RecordedLease>,
        metrics: Arc<WorkerMetrics>,
    ) -> (Self, watch::Receiver<WorkerState>) {
        let initial = match recorded
            .as_ref()
            .and_then(|r| r.deadline(params.settings.ttl))
        {
            Some(until) => WorkerState::Readopting(until),
            None => WorkerState::Claiming,
        };
        let (state, receiver) = watch::channel(initial);
        let worker = Self {
            conn,
            params,
            owner,
            recorded,
            metrics,
            state,
            found_safe: false,
            skew_ms: 0,
            skew_logged: None,
            claim_started: false,
            refusal: None,
        };
        (worker, receiver)
    }

    /// Claims, holds and reclaims until shutdown or an error. Returns what
    /// the caller needs to clean up: it unpublishes (awaits the publisher),
    /// then removes every key of ours with `release`.
    pub async fn run(mut self, shutdown: CancellationToken) -> Stopped {
        let result = self.run_until_stop(&shutdown).await;
        self.set_state(WorkerState::Stopping);
        let max = self.params.settings.max_worker_id;
        Stopped {
            owner: self.owner.clone(),
            held: result.as_ref().ok().copied().flatten(),
            keys: match self.claim_started {
                true => self.keys().ids(max),
                false => Vec::new(),
            },
            result: result.map(drop),
        }
    }

    /// The ID held when `shutdown` fired, if any. Errors: [`WorkerError`].
    async fn run_until_stop(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<Option<u16>, WorkerError> {
        let mut recorded = self.recorded.take();
        // Once per process: the ACL check does not change on a reclaim.
        let mut probed = false;
        loop {
            let held = tokio::select! {
                _ = shutdown.cancelled() => return Ok(None),
                claimed = self.claim(&mut recorded, &mut probed) => claimed?,
            };
            match self.hold(held, shutdown).await {
                HoldEnd::Shutdown(held) => return Ok(Some(held.worker_id)),
                HoldEnd::Lost(worker_id) if self.params.on_loss == OnLoss::Exit => {
                    return Err(WorkerError::LeaseLost { worker_id });
                }
                HoldEnd::Lost(_) => info!("on-loss reclaim: claiming a worker ID again"),
                HoldEnd::Refused(err) => return Err(WorkerError::Redis(err)),
                HoldEnd::GaveUp => {}
            }
        }
    }

    fn keys(&self) -> LeaseKeys {
        LeaseKeys::new(&self.params.settings.key_prefix, &self.params.app)
    }

    /// The `guard open` command for this sidecar's keys, flags that differ
    /// from their defaults included (else it would open another app's guard
    /// or check too few IDs).
    fn guard_open_command(&self) -> String {
        let settings = &self.params.settings;
        let mut cmd = format!("snowlease guard open --app {}", self.params.app);
        if settings.key_prefix != DEFAULT_KEY_PREFIX {
            cmd += &format!(" --key-prefix {}", settings.key_prefix);
        }
        if settings.max_worker_id != DEFAULT_MAX_WORKER_ID {
            cmd += &format!(" --max-worker-id {}", settings.max_worker_id);
        }
        cmd
    }

    fn set_state(&self, state: WorkerState) {
        if !matches!(state, WorkerState::GuardClosed(_)) {
            self.metrics.claim_guard_opens.set(0);
        }
        match &state {
            WorkerState::Held(held) => {
                self.metrics.lease_held.set(1);
                self.metrics.worker_id.set(i64::from(held.worker_id));
            }
            _ => {
                self.metrics.lease_held.set(0);
                self.metrics.worker_id.set(-1);
            }
        }
        self.state.send_replace(state);
    }

    /// The lease confirmed by a claim or renew sent at `sent`, after which
    /// Redis says the key lives until at least `redis_expires_ms`.
    fn held(&self, worker_id: u16, sent: BootInstant, redis_expires_ms: u64) -> HeldLease {
        let valid_for = lease::validity(self.params.settings.ttl);
        let sent_wall = SystemTime::now() - sent.elapsed();
        HeldLease {
            worker_id,
            owner: self.owner.clone(),
            valid_until: sent + valid_for,
            valid_until_unix_ms: lease::unix_ms(sent_wall + valid_for),
            redis_expires_ms,
        }
    }

    /// Claim step (docs/worker.md, "Claim"): re-adopt, else lowest free ID, with
    /// capped, jittered backoff; every wait and call ends by the claim
    /// timeout.
    async fn claim(
        &mut self,
        recorded: &mut Option<RecordedLease>,
        probed: &mut bool,
    ) -> Result<HeldLease, WorkerError> {
        let deadline = Instant::now() + self.params.claim_timeout;
        let mut backoff = ClaimBackoff::new(self.params.settings.renew_interval);
        let mut warned = HashSet::new();
        let mut last_log: Option<Instant> = None;
        let mut last_evicting_log: Option<Instant> = None;
        let mut detail = String::from("no claim attempt finished in time");
        loop {
            let round = async {
                if let Some(evicting) = self.evicting().await? {
                    return Ok(Round::Evicting(evicting));
                }
                if matches!(*self.state.borrow(), WorkerState::Evicting(_)) {
                    self.set_state(WorkerState::Claiming);
                }
                if !*probed {
                    self.probe().await?;
                    self.advise_replica_count().await;
                    *probed = true;
                }
                self.claim_round(recorded, &mut warned).await
            };
            let mut pause = backoff.pause();
            match timeout_at(deadline, round).await {
                // Sentinel: a claim on a demoted primary that still takes
                // writes is lost at its conversion; never publish it.
                Ok(Ok(Round::Held(held))) if !self.conn.confirm_primary().await => {
                    warn!(
                        worker_id = held.worker_id,
                        "claim not confirmed on the primary the Sentinels name; claiming again"
                    );
                    detail = "claim not confirmed on the primary the Sentinels name".into();
                }
                // The key stays ours: the next round re-adopts it.
                Ok(Ok(Round::Held(_))) if self.skew_exceeded() => {
                    WorkerMetrics::count(&self.metrics.claim_attempts, "clock_skew");
                    detail = format!(
                        "clock skew {} ms to Redis' TIME is beyond --max-clock-skew",
                        self.skew_ms
                    );
                    self.set_state(WorkerState::ClockSkewed(self.skew_ms));
                    backoff.grow();
                }
                Ok(Ok(Round::Held(held))) if !self.acknowledged(&held).await => {
                    WorkerMetrics::count(&self.metrics.claim_attempts, "unacknowledged");
                    warn!(
                        worker_id = held.worker_id,
                        replicas = self.params.min_replicas_ack,
                        "claim not acknowledged by enough replicas in time; claiming again"
                    );
                    detail = format!(
                        "claim not acknowledged by {} replica(s)",
                        self.params.min_replicas_ack
                    );
                    backoff.grow();
                }
                Ok(Ok(Round::Held(held))) => {
                    info!(worker_id = held.worker_id, owner = %held.owner.redacted(), "lease acquired");
                    return Ok(held);
                }
                Ok(Ok(Round::AllHeld(holders))) => {
                    let count = u32::from(self.params.settings.max_worker_id) + 1;
                    detail = format!("all {count} worker IDs are held ({holders})");
                    if last_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                        warn!(count, holders = %holders, "all worker IDs are held; waiting for one to be freed");
                        last_log = Some(Instant::now());
                    }
                    // Not behind a guard (any more), and no key of ours: a
                    // recorded lease is not ours either.
                    self.set_state(WorkerState::Claiming);
                    backoff.grow();
                }
                Ok(Ok(Round::Paused(wait, guard, others_kept))) => {
                    // A time of day, not a duration: the line is read when
                    // the claim timeout ends, later than this round.
                    detail = format!(
                        "claims paused: the claim guard is closed until {}",
                        humantime::format_rfc3339_seconds(SystemTime::now() + wait)
                    );
                    if last_log.is_none() {
                        let found = match guard {
                            GuardFound::Missing => Some(self.missing_guard(others_kept).await),
                            _ => None,
                        };
                        log_paused(
                            &self.params.app,
                            &self.guard_open_command(),
                            wait,
                            guard,
                            found,
                        );
                        last_log = Some(Instant::now());
                    }
                    let opens = SystemTime::now() + wait;
                    let opens_s = lease::unix_ms(opens).div_ceil(1000);
                    self.metrics
                        .claim_guard_opens
                        .set(i64::try_from(opens_s).unwrap_or(i64::MAX));
                    self.set_state(WorkerState::GuardClosed(BootInstant::now() + wait));
                    // Look again at least every GUARD_RECHECK: `guard open
                    // --force` may open it early.
                    pause = wait.min(GUARD_RECHECK) + timing::jitter(Duration::from_millis(50));
                }
                Ok(Ok(Round::Evicting(evicting))) => {
                    WorkerMetrics::count(&self.metrics.claim_attempts, "evicting");
                    detail = evicting.to_string();
                    if last_evicting_log.is_none_or(|t| t.elapsed() >= Duration::from_secs(30)) {
                        error!(policy = %evicting.policy, maxmemory = evicting.maxmemory, error = %evicting, "not claiming: redis may evict lease keys");
                        last_evicting_log = Some(Instant::now());
                    }
                    // A record kept for re-adoption is no proof on such a Redis.
                    self.set_state(WorkerState::Evicting(evicting.clone()));
                    backoff.grow();
                }
                Ok(Err(err)) if classify(&err).retried_at_start() => {
                    warn!(error = %Readable(&err), retry_in_ms = pause.as_millis() as u64, "redis unavailable; retrying claim");
                    detail = format!("redis unavailable: {}", Readable(&err));
                    backoff.grow();
                }
                Ok(Err(err)) => return Err(WorkerError::Redis(err)),
                Err(_) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(pause) = timing::claim_pause(pause, left) else {
                return Err(WorkerError::ClaimTimeout {
                    timeout: self.params.claim_timeout,
                    detail,
                });
            };
            sleep(pause).await;
        }
    }

    /// Runs the lease scripts on a key of this process ([`lease::probe`]),
    /// so a missing ACL permission shows at start, not at the first renew.
    async fn probe(&mut self) -> redis::RedisResult<()> {
        let key = self.keys().probe(self.owner.nonce());
        let conn = &mut self.conn;
        let wait = self.params.min_replicas_ack > 0;
        let steps = async {
            claim::load(conn).await?;
            lease::probe(conn, &key, &self.owner).await?;
            if wait {
                // WAIT 0: answers at once; only the ACL is checked.
                conn.wait_replicas(&key, 0, Duration::from_millis(1))
                    .await
                    .map_err(lease::step(
                        "WAIT refused (needs +wait for --min-replicas-ack)",
                    ))?;
            }
            Ok(())
        };
        // Each round trip has its own call timeout (the connection's); this
        // only bounds the whole (issue 8.4: 7 round trips never fit one).
        bounded(
            self.params.settings.call_timeout() * PROBE_ROUND_TRIPS,
            steps,
        )
        .await
    }

    /// Whether Redis may evict lease keys ([`eviction::check`], one bounded
    /// `INFO memory`); never asked with `--allow-evicting-redis`. When Redis
    /// does not answer, a last answer of "safe" stands (the call after it
    /// meets the same trouble); with no such answer the error is returned.
    async fn evicting(&mut self) -> redis::RedisResult<Option<EvictingRedis>> {
        if self.params.allow_evicting_redis {
            return Ok(None);
        }
        let answer = bounded(
            self.params.settings.call_timeout(),
            eviction::check(&mut self.conn),
        )
        .await;
        match answer {
            Ok(evicting) => {
                self.found_safe = evicting.is_none();
                Ok(evicting)
            }
            Err(err) if self.found_safe && classify(&err) == Failure::Transient => {
                debug!(error = %Readable(&err), "eviction check not answered; the last answer stands");
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    /// One pass: re-adopt the recorded lease, else claim
    /// ([`claim::claim_lowest`]; the connection's keyspace picks the guard
    /// layout).
    async fn claim_round(
        &mut self,
        recorded: &mut Option<RecordedLease>,
        warned: &mut HashSet<usize>,
    ) -> redis::RedisResult<Round> {
        self.claim_started = true;
        if let Some(rec) = recorded.as_ref() {
            if let Some(held) = self.adopt(rec).await? {
                return Ok(Round::Held(held));
            }
            *recorded = None;
            self.set_state(WorkerState::Claiming);
        }
        let keys = self.keys();
        let sent = BootInstant::now();
        let reply = bounded(
            self.params.settings.call_timeout(),
            claim::claim_lowest(
                &mut self.conn,
                &keys,
                self.params.settings.max_worker_id,
                &self.owner,
                self.params.settings.ttl,
            ),
        )
        .await
        .inspect_err(|_| WorkerMetrics::count(&self.metrics.claim_attempts, "error"))?;
        self.observe_skew(sent, reply.expires_ms);
        for index in reply.wrong_type {
            if warned.insert(index) {
                let key = self
                    .keys()
                    .id(u16::try_from(index).expect("at most 1024 keys"));
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
        Ok(Round::Held(self.held(worker_id, sent, reply.expires_ms)))
    }

    /// Re-adopts a recorded lease when the key still holds exactly the
    /// recorded owner string; never re-creates a missing key.
    async fn adopt(&mut self, rec: &RecordedLease) -> redis::RedisResult<Option<HeldLease>> {
        if rec.worker_id > self.params.settings.max_worker_id {
            return Ok(None);
        }
        let key = self.keys().id(rec.worker_id);
        let owner = Owner::from_recorded(rec.owner.clone());
        let sent = BootInstant::now();
        let reply = bounded(
            self.params.settings.call_timeout(),
            lease::renew(&mut self.conn, &key, &owner, self.params.settings.ttl, 0),
        )
        .await?;
        self.observe_skew(sent, reply.expires_ms);
        if reply.outcome == RenewOutcome::Extended {
            WorkerMetrics::count(&self.metrics.claim_attempts, "adopted");
            info!(
                worker_id = rec.worker_id,
                "re-adopted the lease recorded in the state file"
            );
            self.owner = owner;
            return Ok(Some(self.held(rec.worker_id, sent, reply.expires_ms)));
        }
        info!(
            worker_id = rec.worker_id,
            "recorded lease is gone; claiming a new ID"
        );
        Ok(None)
    }

    /// Why a claim guard was missing, as far as Redis can tell: on Cluster
    /// from the claim itself (`others_kept`); on one server by up to
    /// [`SCAN_ROUNDS`] `SCAN MATCH <prefix>*` rounds (best effort: without
    /// `+scan`, or on no answer, [`MissingGuard::Unknown`]).
    async fn missing_guard(&mut self, others_kept: bool) -> MissingGuard {
        if matches!(self.conn.keyspace().await, Ok(Keyspace::Slots)) {
            return match others_kept {
                true => MissingGuard::ShardLost,
                false => MissingGuard::NoGuardOnAnyShard,
            };
        }
        let prefix = &self.params.settings.key_prefix;
        let app_base = format!("{prefix}{}:", self.params.app);
        let guard = self.keys().guard();
        let pattern = format!("{}*", glob_escape(prefix));
        let scan = async {
            let (mut cursor, mut found) = (0u64, MissingGuard::NoKeyUnderPrefix);
            for _ in 0..SCAN_ROUNDS {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(100)
                    .query_async(&mut self.conn)
                    .await?;
                for key in keys.iter().filter(|k| **k != guard) {
                    match key.starts_with(&app_base) {
                        true => found = MissingGuard::AppKeysWithoutGuard,
                        false if found == MissingGuard::NoKeyUnderPrefix => {
                            found = MissingGuard::OtherAppsKept;
                        }
                        false => {}
                    }
                }
                if next == 0 || found == MissingGuard::AppKeysWithoutGuard {
                    return Ok::<_, redis::RedisError>(found);
                }
                cursor = next;
            }
            Ok(match found {
                MissingGuard::NoKeyUnderPrefix => MissingGuard::Unknown,
                other => other,
            })
        };
        let limit = self.params.settings.call_timeout() * SCAN_ROUNDS;
        match timeout(limit, scan).await {
            Ok(Ok(found)) => found,
            Ok(Err(err)) => {
                debug!(error = %Readable(&err), "SCAN for keys under the prefix failed");
                MissingGuard::Unknown
            }
            Err(_) => MissingGuard::Unknown,
        }
    }

    /// Who holds the IDs, by identity only (nonces stay out of logs), read
    /// the way `snowlease status` reads them, under the call timeout.
    async fn holders(&mut self) -> String {
        let read = status::read(
            &mut self.conn,
            &self.params.app,
            &self.params.settings.key_prefix,
            self.params.settings.max_worker_id,
        );
        let Ok(Ok(report)) = timeout(self.params.settings.call_timeout(), read).await else {
            return "holders unknown: redis unavailable".to_owned();
        };
        let mut by_identity: BTreeMap<&str, usize> = BTreeMap::new();
        for owner in report.leases.iter().filter_map(|e| e.owner.as_deref()) {
            *by_identity.entry(identity_of(owner)).or_default() += 1;
        }
        let mut parts: Vec<String> = by_identity
            .iter()
            .map(|(id, n)| format!("{id}: {n}"))
            .collect();
        if report.wrong_type > 0 {
            parts.push(format!("keys of the wrong type: {}", report.wrong_type));
        }
        parts.join(", ")
    }

    /// Publishes the lease and renews it until shutdown or loss.
    async fn hold(&mut self, mut held: HeldLease, shutdown: &CancellationToken) -> HoldEnd {
        let interval = self.params.settings.renew_interval;
        let ttl = self.params.settings.ttl;
        // valid_until = sent + validity, so this is timed from the send.
        let sent = held.valid_until - lease::validity(ttl);
        let mut next_renew = timing::renew_after_confirmed(sent, interval);
        self.set_state(WorkerState::Held(held.clone()));
        // A new connection (reconnect, new primary) may have lost the key or
        // met another owner: renew at once, not at the interval (issue 10).
        let mut reconnects = self.conn.reconnects();
        reconnects.mark_unchanged();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return HoldEnd::Shutdown(held),
                // A wake-up only: the renew round judges validity itself.
                _ = boot_clock::sleep_until(timing::wake_at(next_renew, held.valid_until)) => {}
                _ = reconnects.changed() => debug!("new redis connection; renewing at once"),
            }
            let round = tokio::select! {
                _ = shutdown.cancelled() => return HoldEnd::Shutdown(held),
                round = self.renew_round(&held) => round,
            };
            // After a confirmed renew, so a slow INFO never delays one.
            let round = match round {
                RenewRound::Renewed(..) => self.eviction_round().await.unwrap_or(round),
                other => other,
            };
            // A reconnect inside the round already ran the renew on it.
            reconnects.mark_unchanged();
            match round {
                RenewRound::Renewed(sent, expires_ms) => {
                    held = self.held(held.worker_id, sent, expires_ms);
                    next_renew = timing::renew_after_confirmed(sent, interval);
                    self.set_state(WorkerState::Held(held.clone()));
                }
                RenewRound::Lost(reason) => {
                    self.metrics.leases_lost.inc();
                    self.set_state(WorkerState::Lost);
                    error!(
                        worker_id = held.worker_id,
                        reason, "lease lost; stopped publishing the worker ID"
                    );
                    if let Some(err) = self.refusal.take() {
                        error!(worker_id = held.worker_id, error = %Readable(&err), "no renewal confirmed before the validity deadline: redis refused this client (password, ACL or certificate); the key stays recorded in the state file for the next start");
                        return HoldEnd::Refused(err);
                    }
                    return HoldEnd::Lost(held.worker_id);
                }
                RenewRound::Evicting(evicting) => {
                    // Unpublished at once; the key is not renewed and
                    // expires, or claim.lua re-adopts it once Redis is safe.
                    error!(worker_id = held.worker_id, policy = %evicting.policy, error = %evicting, "stopped publishing the worker ID: redis may evict lease keys");
                    self.set_state(WorkerState::Evicting(evicting));
                    return HoldEnd::GaveUp;
                }
                // Keep trying until the deadline.
                RenewRound::Failed => {
                    next_renew = timing::renew_after_failed(BootInstant::now(), interval);
                }
            }
        }
    }

    /// The eviction check of a renew round: `None` while Redis never
    /// evicts, or did not answer (the next renew meets the same trouble and
    /// handles it; the last answer stands meanwhile).
    async fn eviction_round(&mut self) -> Option<RenewRound> {
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
                    self.refusal = Some(err);
                    Some(RenewRound::Failed)
                }
                Failure::Transient => None,
            },
        }
    }

    /// Warns at start when `--min-replicas-ack` (N >= 1) does not match the
    /// replicas the primary has connected now: more than connected, nothing
    /// is published until enough link; fewer, a failover to a replica that
    /// missed a write (a planned `SENTINEL FAILOVER`, or a partition that
    /// leaves the old primary with N replicas) can still lose a lease, so
    /// the safe setting is every replica (docs/worker.md "Guarantees").
    /// Advice only: replicas come and go, and an `INFO` refused says nothing.
    async fn advise_replica_count(&mut self) {
        let wanted = self.params.min_replicas_ack;
        if wanted == 0 {
            return;
        }
        let key = self.keys().probe(self.owner.nonce());
        let call = self.conn.connected_replicas(&key);
        let connected = match bounded(self.params.settings.call_timeout(), call).await {
            Ok(connected) => connected,
            Err(err) => {
                return debug!(error = %Readable(&err), "INFO replication failed");
            }
        };
        if connected < wanted {
            warn!(
                min_replicas_ack = wanted,
                connected,
                "--min-replicas-ack is more than the replicas connected to the primary: no ID is published until enough replicas link"
            );
        } else if connected > wanted {
            warn!(
                min_replicas_ack = wanted,
                connected,
                "--min-replicas-ack is below the replicas connected to the primary: a failover to a replica that did not acknowledge (planned, or across a partition) can lose a lease; set it to the number of replicas"
            );
        }
    }

    /// Whether `--min-replicas-ack` replicas acknowledged the last write
    /// on the key of `lease` (`WAIT`, README "Guarantees"); true when none
    /// are asked for. Redis waits at most half the call timeout (the
    /// client's own limit must not cut it off) and never past `lease`'s
    /// validity deadline: a lease about to end is not worth waiting for.
    async fn acknowledged(&mut self, lease: &HeldLease) -> bool {
        let replicas = self.params.min_replicas_ack;
        if replicas == 0 {
            return true;
        }
        let limit = (self.params.settings.call_timeout() / 2).min(lease.remaining());
        if limit < Duration::from_millis(1) {
            return false;
        }
        let key = self.keys().id(lease.worker_id);
        let call = self.conn.wait_replicas(&key, replicas, limit);
        match bounded(self.params.settings.call_timeout(), call).await {
            Ok(acked) => acked >= replicas,
            Err(err) => {
                warn!(error = %Readable(&err), "WAIT for replica acknowledgement failed");
                false
            }
        }
    }

    /// Records the skew between this node's wall clock and Redis' TIME from
    /// a claim or renew sent at `sent` whose script answered `expires_ms`
    /// (TIME + TTL; 0: no TIME in the reply): local time at the middle of
    /// the round trip minus Redis time. Sets the gauge; logs a skew beyond
    /// `--max-clock-skew` at most every 30 s.
    fn observe_skew(&mut self, sent: BootInstant, expires_ms: u64) {
        if expires_ms == 0 {
            return;
        }
        let round_trip = sent.elapsed();
        let mid = SystemTime::now() - round_trip / 2;
        let redis_ms = expires_ms.saturating_sub(lease::ttl_ms(self.params.settings.ttl));
        let skew_ms = i64::try_from(lease::unix_ms(mid)).unwrap_or(i64::MAX)
            - i64::try_from(redis_ms).unwrap_or(i64::MAX);
        self.skew_ms = skew_ms;
        self.metrics.clock_skew.set(skew_ms as f64 / 1000.0);
        if self.skew_exceeded()
            && self
                .skew_logged
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(30))
        {
            self.skew_logged = Some(Instant::now());
            warn!(
                skew_ms,
                max_ms = u64::try_from(self.params.max_clock_skew.as_millis()).unwrap_or(u64::MAX),
                round_trip_ms = u64::try_from(round_trip.as_millis()).unwrap_or(u64::MAX),
                "wall clock differs from Redis' TIME beyond --max-clock-skew; a held ID stays published, a new one is not"
            );
        }
    }

    /// The last skew seen is beyond `--max-clock-skew`.
    fn skew_exceeded(&self) -> bool {
        self.skew_ms.unsigned_abs()
            > u64::try_from(self.params.max_clock_skew.as_millis()).unwrap_or(u64::MAX)
    }

    /// One renew round: the script, retried `retries` times with doubling
    /// backoff, never sent after the validity deadline.
    async fn renew_round(&mut self, held: &HeldLease) -> RenewRound {
        let key = self.keys().id(held.worker_id);
        let settings = &self.params.settings;
        let mut pauses = timing::renew_retries(settings.renew_interval, settings.retries);
        for attempt in 0u32.. {
            if !held.is_valid() {
                return RenewRound::Lost("validity deadline passed without a confirmed renewal");
            }
            let sent = BootInstant::now();
            let reply = bounded(
                self.params.settings.call_timeout(),
                lease::renew(
                    &mut self.conn,
                    &key,
                    &self.owner,
                    self.params.settings.ttl,
                    lease::recreate_before(held.redis_expires_ms, self.params.settings.ttl),
                ),
            )
            .await;
            if let Ok(reply) = &reply {
                self.observe_skew(sent, reply.expires_ms);
                self.refusal = None;
            }
            match reply.map(|r| (r.outcome, r.expires_ms)) {
                // Sentinel: only a renewal on the primary they name counts.
                Ok((RenewOutcome::Extended | RenewOutcome::Recreated, _))
                    if !self.conn.confirm_primary().await =>
                {
                    WorkerMetrics::count(&self.metrics.renewals, "unconfirmed");
                    warn!(
                        worker_id = held.worker_id,
                        attempt,
                        "renewal not confirmed on the primary the Sentinels name; retrying"
                    );
                }
                // Never extend validity from a write a failover may lose.
                Ok((RenewOutcome::Extended | RenewOutcome::Recreated, _))
                    if !self.acknowledged(held).await =>
                {
                    WorkerMetrics::count(&self.metrics.renewals, "unacknowledged");
                    warn!(
                        worker_id = held.worker_id,
                        attempt,
                        replicas = self.params.min_replicas_ack,
                        "renewal not acknowledged by enough replicas in time; retrying"
                    );
                }
                Ok((RenewOutcome::Extended, expires_ms)) => {
                    WorkerMetrics::count(&self.metrics.renewals, "renewed");
                    debug!(worker_id = held.worker_id, "lease renewed");
                    return RenewRound::Renewed(sent, expires_ms);
                }
                Ok((RenewOutcome::Recreated, expires_ms)) => {
                    WorkerMetrics::count(&self.metrics.renewals, "recreated");
                    self.metrics.reacquisitions.inc();
                    warn!(
                        worker_id = held.worker_id,
                        "lease re-created after key loss (Redis, or on Cluster the key's shard, lost its data?)"
                    );
                    return RenewRound::Renewed(sent, expires_ms);
                }
                Ok((RenewOutcome::Lost, _)) => {
                    WorkerMetrics::count(&self.metrics.renewals, "lost");
                    return RenewRound::Lost(
                        "the key holds another owner, or is gone after it may have expired",
                    );
                }
                Err(err) if !classify(&err).retried_while_held() => {
                    WorkerMetrics::count(&self.metrics.renewals, "failed");
                    error!(worker_id = held.worker_id, error = %Readable(&err), "renew refused by redis");
                    self.refusal = None;
                    return RenewRound::Lost("redis refused the renew script");
                }
                // Refused before any write of ours ran: the key stays ours
                // until Redis expires it, so only the deadline ends the lease.
                Err(err) if classify(&err) == Failure::Refused => {
                    WorkerMetrics::count(&self.metrics.renewals, "failed");
                    error!(worker_id = held.worker_id, attempt, error = %Readable(&err), "renew refused by redis; retrying until the validity deadline");
                    self.refusal = Some(err);
                }
                Err(err) => {
                    WorkerMetrics::count(&self.metrics.renewals, "failed");
                    warn!(worker_id = held.worker_id, attempt, error = %Readable(&err), "renew failed");
                    self.refusal = None;
                }
            }
            let Some(pause) = pauses.next() else { break };
            sleep(timing::retry_pause(pause, held.remaining())).await;
        }
        RenewRound::Failed
    }
}

/// Round trips of the start-up probe: `claim::load` (1) and `lease::probe`
/// (2 script loads, 2 renews, 1 release), plus one for a NOSCRIPT reload.
const PROBE_ROUND_TRIPS: u32 = 7;

/// Runs one Redis call under a timeout; a timeout becomes an I/O timeout
/// error, so it classifies as transient.
async fn bounded<T>(
    limit: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match timeout(limit, fut).await {
        Ok(result) => result,
        Err(_) => {
            Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "redis call timed out").into())
        }
    }
}

/// Removes every key in `keys` that holds `owner`, bounded by `limit`: one
/// call on one server, one per hash slot on Cluster. The lease held at the stop (`held`), and a claim that ran while
/// its reply was lost. The logs say only what is known: a reply that did
/// not come in time may hide a release that ran. Each key becomes a
/// tombstone for `handover` (see [`lease::release_keys`]). No keys (no
/// claim round started): nothing sent, nothing logged.
///
/// Returns whether Redis confirmed that no key holds `owner` any more (no
/// keys: nothing can); `false` when it refused or did not answer in time.
pub(crate) async fn release(
    conn: &mut Redis,
    keys: &[String],
    owner: &Owner,
    held: Option<u16>,
    handover: Duration,
    limit: Duration,
) -> bool {
    if keys.is_empty() {
        return true;
    }
    let release = |mut conn: Redis, keys: Vec<String>| {
        let owner = owner.clone();
        async move { lease::release_keys(&mut conn, &keys, &owner, handover).await }
    };
    let outcome = timeout(limit, async {
        let counts = conn.per_slot(keys, release).await?;
        Ok::<u64, redis::RedisError>(counts.iter().sum())
    })
    .await;
    let confirmed = matches!(outcome, Ok(Ok(_)));
    match (outcome, held) {
        (Ok(Ok(0)), Some(worker_id)) => warn!(
            worker_id,
            "lease not released: the key no longer holds our owner string"
        ),
        (Ok(Ok(0)), None) => debug!("no lease key holds our owner string"),
        (Ok(Ok(count)), Some(worker_id)) => info!(worker_id, count, "lease released"),
        (Ok(Ok(count)), None) => info!(count, "lease keys a lost claim reply left released"),
        (Ok(Err(err)), Some(worker_id)) => warn!(
            worker_id,
            error = %Readable(&err),
            "lease release not confirmed; if it did not run, the key expires after its TTL"
        ),
        (Err(_), Some(worker_id)) => warn!(
            worker_id,
            limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
            "lease release not confirmed in time; if it did not run, the key expires after its TTL"
        ),
        (_, None) => info!(
            "release of keys a lost claim reply may have left not confirmed; they expire after their TTL"
        ),
    }
    confirmed
}

/// `SCAN` rounds (`COUNT 100` each) [`Worker::missing_guard`] spends at most.
const SCAN_ROUNDS: u32 = 10;

/// What Redis can tell about a missing claim guard (issue 12 item 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MissingGuard {
    /// One server: keys of other apps exist under the prefix, none of this
    /// app: first use of the app; Redis kept its data.
    OtherAppsKept,
    /// One server: no key under the prefix: a fresh Redis or one that lost
    /// its data.
    NoKeyUnderPrefix,
    /// One server: lease keys of this app exist without its guard: Redis
    /// lost its data and holders re-created their keys, or the guard was
    /// deleted by hand.
    AppKeysWithoutGuard,
    /// Cluster: guards of other IDs or lease keys of the app exist: the
    /// shard(s) of the paused IDs lost their data.
    ShardLost,
    /// Cluster: no guard of the app on any shard met: first use of the app,
    /// or every shard lost its data.
    NoGuardOnAnyShard,
    /// `SCAN` refused, not answered, or found nothing in its rounds.
    Unknown,
}

/// Says why claims wait. A missing guard: what Redis can tell about why
/// (`found`), and how to skip the wait on first use. A guard that exists
/// and is closed was set by an earlier claim: INFO, nothing lost here.
fn log_paused(
    app: &str,
    open_cmd: &str,
    wait: Duration,
    guard: GuardFound,
    found: Option<MissingGuard>,
) {
    let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    match guard {
        GuardFound::Missing => {
            let why = match found.unwrap_or(MissingGuard::Unknown) {
                MissingGuard::OtherAppsKept => format!(
                    "first use of app {app} on this Redis (keys of other apps exist, so Redis kept its data)"
                ),
                MissingGuard::NoKeyUnderPrefix => {
                    "no key under the prefix: a fresh Redis or one that lost its data".to_owned()
                }
                MissingGuard::AppKeysWithoutGuard => format!(
                    "lease keys of app {app} exist without its guard: Redis lost its data and holders re-created their keys, or the guard was deleted"
                ),
                MissingGuard::ShardLost => format!(
                    "guards of other IDs of app {app} exist: the Cluster shard holding these IDs lost its data"
                ),
                MissingGuard::NoGuardOnAnyShard => format!(
                    "no guard of app {app} on any shard: first use of the app on this Cluster, or every shard lost its data"
                ),
                MissingGuard::Unknown => {
                    format!("first use of app {app}, a fresh Redis, or one that lost its data")
                }
            };
            warn!(
                wait_ms,
                "no claim guard in Redis: {why}; waiting one TTL so that earlier holders can renew or give up. For a new app, `{open_cmd}` before its first sidecars start spares this wait; now that a sidecar has closed the guard, only `--force` opens it, which is safe only if no sidecar of this app held an ID on this Redis in the last TTL"
            );
        }
        GuardFound::TooFar => warn!(
            wait_ms,
            "claim guard was more than one TTL ahead (set by hand, or Redis' clock went back); pulled in to one TTL"
        ),
        GuardFound::Closed => info!(
            wait_ms,
            "claim guard closed (set by an earlier claim); waiting until it opens (`snowlease status --app {app}` shows when)"
        ),
    }
}
