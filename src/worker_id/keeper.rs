//! The keeper: claims the lowest free worker ID, renews it, reports loss,
//! and releases its keys once the ID is unpublished.
//!
//! The loop here is the only writer of [`WorkerState`]; the file publisher,
//! HTTP and metrics read it through a `watch` channel (kubert's pattern).
//! The loop is a `KeeperPhase` and one `match` that hands each phase to its
//! own file:
//! - `claiming`: the claim phase (re-adopt, else lowest free ID, backoff).
//! - `setup`: what Redis must allow before a claim (ACL probe, eviction).
//! - `holding`: publish and renew until shutdown or loss.
//! - `gate`: the keeper's side of the one check a claim and a renew pass
//!   before they publish (`worker_id::gate` holds the checks; mint mode's
//!   reservation passes them too).
//! - `advice`: diagnosis and advice for operators (missing guard, holders,
//!   replica count, clock skew).
//! - `release`: the stop: unpublish, then remove every key of ours.

mod advice;
mod claiming;
mod gate;
mod holding;
mod release;
pub(super) mod schedule;
mod setup;
pub(super) mod sizing;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::info;

use self::advice::ClockSkew;
use self::holding::HoldEnd;
use self::setup::Setup;
use super::args::{LeaseSettings, OnLoss};
use super::claim::Claimer;
use super::keys::LeaseKeys;
use super::metrics::WorkerMetrics;
use super::range::WorkerRange;
use super::state::{HeldLease, Mode, RecordedLease, WorkerState};
use crate::boot_clock::BootInstant;
use crate::connection::{Readable, Redis};
use crate::identity::Owner;
use crate::lease;

/// Why the worker loop stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WorkerError {
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
    /// error not [`Failure::Transient`](crate::connection::Failure); while
    /// holding, a permanent error that ends the reclaim, or a refusal
    /// (`NOPERM`, `WRONGPASS`, certificate) that lasted until the validity
    /// deadline.
    #[error("redis refused: {}", Readable(.0))]
    Redis(redis::RedisError),
}

/// What the keeper needs besides its connection and owner; nothing about
/// files or HTTP.
#[derive(Debug, Clone)]
pub(crate) struct WorkerParams {
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
    /// Expiry of the tombstone each released key becomes, 100 ms-60 s
    /// (`--handover-delay`).
    pub handover_delay: Duration,
    /// Publish the worker ID to the app, or mint with it: a claimed ID last
    /// used the other way passes the gate only once that use has ended.
    pub mode: Mode,
}

/// How a keeper ended, after it unpublished and released.
#[derive(Debug)]
pub(crate) struct Stopped {
    /// The owner string used last (a re-adopted one replaces the process's
    /// own): a state file holding another is not this process's to drop.
    pub owner: Owner,
    /// Redis confirmed that no key holds `owner` any more (or no claim
    /// round ever started); `false` when it refused or did not answer.
    pub released: bool,
    /// `Err` for claim timeout, loss with `--on-loss exit`, or a Redis
    /// refusal ([`WorkerError::Redis`]).
    pub result: Result<(), WorkerError>,
}

/// Where the keeper's loop is. Each phase's work is one function; what
/// follows a phase is decided by pure functions ([`after_hold`],
/// [`after_loss`]) so the unit tests below pin the transitions.
#[derive(Debug)]
enum KeeperPhase {
    /// No lease: re-adopt the recorded one, else claim the lowest free ID.
    Claiming,
    /// A lease passed the gate: publish it and renew it.
    Holding(HeldLease),
    /// The lease of this ID was lost; `--on-loss` says what next.
    Lost(u16),
    /// Stop: the ID held at shutdown, if any, or why the loop ended.
    Stopping(Result<Option<u16>, WorkerError>),
}

/// Which keys may hold our owner string: those a claim call of ours was
/// sent for (a claim whose reply was lost may hold any key of its window),
/// the re-adopted one, and, when the owner string is a re-adopted one, every
/// lease key of the app (the earlier process's lost replies are not known).
#[derive(Debug)]
struct Ours {
    /// Owner string of this process (replaced by a re-adopted one).
    owner: Owner,
    /// A claim round started (a claim, or a re-adopted lease's renewals,
    /// may have written keys holding our owner string).
    claim_started: bool,
    /// The owner string is an earlier process's, taken over with its lease
    /// from the state file.
    readopted: Option<u16>,
}

impl Ours {
    /// Every key that may hold our owner string; none before the first
    /// claim round (Redis never answered, or the URL named the wrong
    /// topology). `sent`: the IDs a claim call of ours was sent for.
    fn keys(
        &self,
        keys: &LeaseKeys,
        range: WorkerRange,
        sent: impl Iterator<Item = u16>,
    ) -> Vec<String> {
        match (self.claim_started, self.readopted) {
            (false, _) => Vec::new(),
            (true, Some(_)) => keys.ids(range),
            (true, None) => sent.map(|id| keys.id(id)).collect(),
        }
    }
}

/// The keeper of one worker-ID lease: claims, renews, reclaims, releases;
/// the only writer of [`WorkerState`].
pub(crate) struct Worker {
    conn: Redis,
    /// A clone taken before any call, for the release at the stop.
    release_conn: Redis,
    params: WorkerParams,
    ours: Ours,
    /// The state file of an earlier process, until re-adopted or gone.
    recorded: Option<RecordedLease>,
    metrics: Arc<WorkerMetrics>,
    state: watch::Sender<WorkerState>,
    setup: Setup,
    skew: ClockSkew,
    /// The claims over the app's range, key names and calls built once.
    claimer: Claimer,
    /// Renew now (mint mode: a reservation found the lease key not ours, e.g. after Redis
    /// lost its data; the renewal re-creates it or finds the loss).
    renew_now: Arc<Notify>,
}

// === impl Worker ===

impl Worker {
    /// A keeper that will first try to re-adopt `recorded` (the state file
    /// of an earlier process in this pod), and the receiver of its state:
    /// `Readopting` while that record is valid, else `Claiming`.
    pub(crate) fn new(
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
        let keys = LeaseKeys::new(&params.settings.key_prefix, &params.app);
        let claimer = Claimer::over(&keys, params.settings.worker_ids);
        let worker = Self {
            claimer,
            release_conn: conn.clone(),
            conn,
            skew: ClockSkew::new(params.max_clock_skew),
            params,
            ours: Ours {
                owner,
                claim_started: false,
                readopted: None,
            },
            recorded,
            metrics,
            state,
            setup: Setup::default(),
            renew_now: Arc::new(Notify::new()),
        };
        (worker, receiver)
    }

    /// The signal that makes a held lease renew at once (mint mode's reserver).
    pub(crate) fn renew_signal(&self) -> Arc<Notify> {
        self.renew_now.clone()
    }

    /// Claims, holds and reclaims until shutdown or an error, then stops:
    /// ends the state channel, awaits `unpublished` (the publisher removing
    /// the files), and only then removes every key of ours, so no two
    /// processes publish one ID.
    pub(crate) async fn run(
        mut self,
        shutdown: CancellationToken,
        unpublished: impl Future<Output = ()>,
    ) -> Stopped {
        let result = self.run_until_stop(&shutdown).await;
        self.drain(result, unpublished).await
    }

    /// The keeper's loop: one phase at a time. Returns the ID held when
    /// `shutdown` fired, if any. Errors: [`WorkerError`].
    async fn run_until_stop(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<Option<u16>, WorkerError> {
        let mut phase = KeeperPhase::Claiming;
        loop {
            phase = match phase {
                KeeperPhase::Claiming => tokio::select! {
                    _ = shutdown.cancelled() => KeeperPhase::Stopping(Ok(None)),
                    claimed = self.claiming() => match claimed {
                        Ok(held) => KeeperPhase::Holding(held),
                        Err(err) => KeeperPhase::Stopping(Err(err)),
                    },
                },
                KeeperPhase::Holding(held) => after_hold(self.holding(held, shutdown).await),
                KeeperPhase::Lost(worker_id) => after_loss(worker_id, self.params.on_loss),
                KeeperPhase::Stopping(result) => return result,
            };
        }
    }
}

impl Worker {
    fn keys(&self) -> LeaseKeys {
        LeaseKeys::new(&self.params.settings.key_prefix, &self.params.app)
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
    /// Redis says the key lives until at least `redis_expires_ms`; `claimed`
    /// is when the claim that began it was sent (`sent` for a claim).
    fn held(
        &self,
        worker_id: u16,
        claimed: BootInstant,
        sent: BootInstant,
        redis_expires_ms: u64,
    ) -> HeldLease {
        let valid_for = lease::validity(self.params.settings.ttl);
        let sent_wall = SystemTime::now() - sent.elapsed();
        HeldLease {
            worker_id,
            owner: self.ours.owner.clone(),
            claimed,
            valid_until: sent + valid_for,
            valid_until_unix_ms: lease::unix_ms(sent_wall + valid_for),
            redis_expires_ms,
            app_until: None,
        }
    }
}

/// What follows a hold: shutdown and a refusal that lasted to the deadline
/// stop the keeper; a loss goes to `--on-loss`; an evicting Redis claims
/// again (and is refused until it is safe).
fn after_hold(end: HoldEnd) -> KeeperPhase {
    match end {
        HoldEnd::Shutdown(held) => KeeperPhase::Stopping(Ok(Some(held.worker_id))),
        HoldEnd::Lost(worker_id) => KeeperPhase::Lost(worker_id),
        HoldEnd::Refused(err) => KeeperPhase::Stopping(Err(WorkerError::Redis(err))),
        HoldEnd::GaveUp => KeeperPhase::Claiming,
    }
}

/// What follows the loss of `worker_id`: exit 4 with `--on-loss exit`,
/// else a new claim.
fn after_loss(worker_id: u16, on_loss: OnLoss) -> KeeperPhase {
    match on_loss {
        OnLoss::Exit => KeeperPhase::Stopping(Err(WorkerError::LeaseLost { worker_id })),
        OnLoss::Reclaim => {
            info!("on-loss reclaim: claiming a worker ID again");
            KeeperPhase::Claiming
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(worker_id: u16) -> HeldLease {
        HeldLease {
            worker_id,
            owner: Owner::from_recorded("pod-a#00ff".into()),
            claimed: BootInstant::now(),
            valid_until: BootInstant::now(),
            valid_until_unix_ms: 0,
            redis_expires_ms: 0,
            app_until: None,
        }
    }

    /// Shutdown drains with the ID held; a loss goes to `--on-loss`; a
    /// lasting refusal drains with exit 1; an evicting Redis claims again.
    #[test]
    fn each_end_of_a_hold_leads_to_its_phase() {
        let shutdown = after_hold(HoldEnd::Shutdown(lease(3)));
        assert!(
            matches!(shutdown, KeeperPhase::Stopping(Ok(Some(3)))),
            "{shutdown:?}"
        );
        assert!(matches!(after_hold(HoldEnd::Lost(5)), KeeperPhase::Lost(5)));
        let refused =
            redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "WRONGPASS"));
        let refused = after_hold(HoldEnd::Refused(refused));
        assert!(
            matches!(refused, KeeperPhase::Stopping(Err(WorkerError::Redis(_)))),
            "{refused:?}"
        );
        assert!(matches!(after_hold(HoldEnd::GaveUp), KeeperPhase::Claiming));
    }

    /// `--on-loss exit` drains with the lost ID (exit 4); `reclaim` claims.
    #[test]
    fn on_loss_decides_between_exit_and_a_new_claim() {
        let exit = after_loss(7, OnLoss::Exit);
        assert!(
            matches!(
                exit,
                KeeperPhase::Stopping(Err(WorkerError::LeaseLost { worker_id: 7 }))
            ),
            "{exit:?}"
        );
        assert!(matches!(
            after_loss(7, OnLoss::Reclaim),
            KeeperPhase::Claiming
        ));
    }

    /// Before the first claim round no key can hold our owner string, so
    /// the stop sends nothing; after it, the keys claim calls were sent for
    /// (O(window), not the range); with a re-adopted owner string, every key
    /// of the app (the earlier process's lost replies are not known).
    #[test]
    fn keys_are_released_only_after_a_claim_round_started() {
        let keys = LeaseKeys::new("p:", "a");
        let mut ours = Ours {
            owner: Owner::from_recorded("pod-a#00ff".into()),
            claim_started: false,
            readopted: None,
        };
        assert!(
            ours.keys(&keys, WorkerRange::up_to(1023), [3, 67].into_iter())
                .is_empty()
        );
        ours.claim_started = true;
        assert_eq!(
            ours.keys(&keys, WorkerRange::up_to(1023), [3, 67].into_iter()),
            ["p:a:3", "p:a:67"]
        );
        ours.readopted = Some(5);
        let all = ours.keys(&keys, WorkerRange::up_to(31), std::iter::empty());
        assert_eq!(
            (all.len(), all[0].as_str(), all[31].as_str()),
            (32, "p:a:0", "p:a:31")
        );
    }
}
