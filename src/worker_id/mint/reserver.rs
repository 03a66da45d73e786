//! The reserver: follows the keeper's [`WorkerState`] and feeds the desk's minter. A new
//! claim starts a minting session above the mark Redis holds (`mark.lua`); a renewal moves
//! its validity deadline; a reservation (`reserve.lua`) raises its ceiling ahead of the
//! clock; every state without a valid lease stops it; shutdown stops it for good and
//! records the last minted timestamp (`settle.lua`) before the keeper releases the key
//! (docs/worker.md, "Mint mode"). Started by [`super::spawn`]; its one error, another ID
//! format recorded for the app, ends the sidecar (exit 2).
//!
//! A reservation passes the keeper's gate (`worker_id::gate`, as a renewal does) before it
//! raises the ceiling; failed calls back off with the timing kit's [`Backoff`] and are read
//! with the connection's table ([`classify`]).
//!
//! A reservation that is refused or fails never stops minting: the minter keeps minting up
//! to the ceiling Redis already confirmed and until the lease's validity deadline, both of
//! which stay true whatever Redis answers now.
//!
//! Reservations follow demand: one at the start of a lease, then ahead of the clock (at the
//! low water) only while IDs are being minted, and at once when a request found the ceiling
//! reached. An idle sidecar makes no Redis calls beyond its renewals; its first request
//! after a pause waits for one reservation.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{debug, error, info, warn};

use super::args::MintConfig;
use super::desk::MintDesk;
use super::layout::wall_now_ms;
use super::metrics::MintMetrics;
use super::minter::{Anchor, Grant, LeaseTicket, Standby};
use super::{MintError, MintParams, script};
use crate::boot_clock::{self, BootInstant};
use crate::connection::{Readable, Redis, classify};
use crate::timing::{Backoff, bounded, ms};
use crate::worker_id::gate::{GateRefusal, WrittenKey};
use crate::worker_id::keys::MintKeys;
use crate::worker_id::state::{HeldLease, WorkerState};

/// Longest the reserver sleeps between two looks at the minter: a forward clock step or a
/// burst can make a reservation due sooner than the last look said.
const LOOK_EVERY: Duration = Duration::from_millis(250);

impl Reserver {
    /// How far past Redis' TIME a reservation may reach (`reserve.lua`'s cap): the window,
    /// plus `--max-clock-skew`, since the minting clock is trusted that far ahead of Redis
    /// (a forward re-anchor); with the window alone a clock ahead within the skew could
    /// find every reservation behind it and never mint again.
    fn reservation_cap(&self) -> Duration {
        self.params.config.max_lead() + self.params.max_clock_skew
    }

    /// How far above Redis' TIME a mark this node cannot vouch for is raised: past every
    /// reservation an earlier holder can have made (the cap) on a Redis clock up to
    /// `--max-clock-skew` ahead of this one.
    fn rollback_lead(&self) -> Duration {
        self.reservation_cap() + self.params.max_clock_skew
    }
}

/// The waits between tries of a failing format check, mark read or reservation: 50 ms
/// doubling up to 1 s, no jitter (one reserver per sidecar, each on its own worker ID).
const RETRY: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// Longest the settle call at shutdown may take: the release waits for it.
const SETTLE_LIMIT: Duration = Duration::from_secs(1);

/// What the reserver needs besides the state channel ([`super::spawn`] builds it).
pub(super) struct Reserver {
    /// The minter the handlers mint from.
    pub desk: Arc<MintDesk>,
    /// The mark's lead is set here.
    pub metrics: Arc<MintMetrics>,
    /// A clone of the keeper's connection (its own `WAIT` bookkeeping).
    pub conn: Redis,
    /// Keys, window, call bound, replicas, skew.
    pub params: MintParams,
    /// Makes the keeper renew at once (a reservation found the lease key not ours).
    pub renew_now: Arc<Notify>,
    /// The recorded format equals ours (`format.lua`): checked at start, else once here
    /// before the first mint.
    pub format_checked: bool,
}

/// The minter's last timestamp (Unix ms) at the last confirmed reservation of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReservedAt {
    /// No reservation confirmed yet in this session.
    NotYet,
    /// Confirmed when the minter's last timestamp was this (`None`: nothing minted yet).
    Minted(Option<u64>),
}

/// The lease being minted under.
struct ReserverSession {
    ticket: LeaseTicket,
    /// The lease key of `held`'s worker ID, named once.
    lease_key: String,
    /// The lease as last renewed; its `claimed` and `owner` name the session.
    held: HeldLease,
    /// No reservation before this instant (backoff after a failure).
    next_try: BootInstant,
    /// Reservations failed in a row: the step of [`RETRY`] the next failure waits.
    failures: u32,
    /// The minter's last timestamp at the last confirmed reservation. Minting since then
    /// makes a reservation due at the low water.
    reserved_at_last: ReservedAt,
    /// A request found the ceiling reached since the last confirmed reservation.
    wanted: bool,
}

impl Reserver {
    /// Runs until the keeper's state is `Stopping` (or its channel ends), then stops the
    /// minter for good and settles. The keeper releases only after this returns.
    ///
    /// Errors: [`MintError::FormatRefused`], another ID format is recorded for the app: the
    /// minter is stopped for good before its first ID.
    pub(super) async fn run(
        mut self,
        mut state: watch::Receiver<WorkerState>,
    ) -> Result<(), MintError> {
        let mut session: Option<ReserverSession> = None;
        let ended = loop {
            let current = state.borrow_and_update().clone();
            match current {
                WorkerState::Held(held) => {
                    match session.as_mut().filter(|s| s.held.claimed == held.claimed) {
                        Some(s) => {
                            self.desk
                                .update(|m| m.extend(s.ticket, held.valid_until.as_millis()));
                            s.held = held;
                        }
                        None => {
                            session = None;
                            match self.begin(held, &mut state).await {
                                Ok(Some(begun)) => session = Some(begun),
                                // The state moved on while the floor was read: look again now.
                                Ok(None) if state.has_changed().is_err() => break Ok(()),
                                Ok(None) => continue,
                                Err(refused) => break Err(refused),
                            }
                        }
                    }
                }
                WorkerState::Stopping => break Ok(()),
                other => {
                    self.desk.update(|m| m.stop(standby_of(&other)));
                    session = None;
                }
            }
            let changed = match session.as_mut() {
                Some(s) => self.reserve_until_change(s, &mut state).await,
                None => state.changed().await.is_ok(),
            };
            self.metrics
                .set_mark_lead(self.desk.read(|m| m.mark_lead_ms(now_ms())));
            if !changed {
                break Ok(());
            }
        };
        self.settle(session).await;
        ended
    }

    /// Starts a session for a newly claimed lease: checks the app's ID format unless done,
    /// then reads the floor (`mark.lua`), retrying with [`RETRY`] (a renewal of the same
    /// lease meanwhile keeps it, and only the first failed read is a warning) until it is
    /// read or the keeper's state leaves this lease (then `None`; the caller looks again).
    ///
    /// Errors: [`MintError::FormatRefused`].
    async fn begin(
        &mut self,
        mut held: HeldLease,
        state: &mut watch::Receiver<WorkerState>,
    ) -> Result<Option<ReserverSession>, MintError> {
        // Nothing of an earlier lease mints while the new one's floor is read.
        self.desk.update(|m| m.stop(Standby::Claiming));
        let lease_key = self.params.lease_keys.id(held.worker_id);
        let mut attempt = 0;
        let mut warned = false;
        loop {
            if let Err(failed) = self.format_agrees().await? {
                warn!(worker_id = held.worker_id, error = %failed, failure = failed.failure(), "cannot check the app's ID format; not minting yet");
                tokio::select! {
                    changed = state.changed() => {
                        let _ = changed;
                        return Ok(None);
                    }
                    () = tokio::time::sleep(RETRY.step(attempt)) => {}
                }
                attempt += 1;
                continue;
            }
            let rollback_lead = self.rollback_lead();
            let read = script::read_mark(
                &mut self.conn,
                &self.params.mint_keys,
                &lease_key,
                &held.owner,
                rollback_lead,
            );
            let failed = match bounded(self.params.call_timeout, read).await {
                Ok(read) if read.ours => {
                    let anchor = Anchor {
                        boot_ms: now_ms(),
                        unix_ms: wall_now_ms(),
                    };
                    let expected = ms(self.rollback_lead());
                    log_if_behind(held.worker_id, read.floor_unix_ms, anchor.unix_ms, expected);
                    let grant = Grant {
                        worker_id: held.worker_id,
                        anchor,
                        floor_unix_ms: read.floor_unix_ms,
                        valid_until_boot_ms: held.valid_until.as_millis(),
                    };
                    let ticket = self.desk.update(|m| m.start(grant));
                    if read.raised {
                        info!(
                            worker_id = held.worker_id,
                            floor_unix_ms = read.floor_unix_ms,
                            wait_ms = read.floor_unix_ms.saturating_sub(read.redis_ms),
                            "the high-water mark was not written by this Redis node in its current life (a restart or failover since, which may have rolled it back, or a first mint of this worker ID): raised above Redis' TIME by --mint-window plus the skew allowance (up to 2 x --max-clock-skew), so minting starts once that has passed (docs/rollback-design.md)"
                        );
                    }
                    info!(
                        worker_id = held.worker_id,
                        floor_unix_ms = read.floor_unix_ms,
                        mark_unix_ms = read.mark_unix_ms,
                        "minting above the high-water mark"
                    );
                    return Ok(Some(ReserverSession {
                        ticket,
                        lease_key,
                        held,
                        next_try: BootInstant::now(),
                        failures: 0,
                        reserved_at_last: ReservedAt::NotYet,
                        wanted: false,
                    }));
                }
                Ok(_) => {
                    self.renew_now.notify_one();
                    Unconfirmed::NotOurs
                }
                Err(err) => Unconfirmed::Failed(err),
            };
            if warned {
                debug!(worker_id = held.worker_id, error = %failed, failure = failed.failure(), "cannot read the high-water mark again");
            } else {
                warn!(worker_id = held.worker_id, error = %failed, failure = failed.failure(), "cannot read the high-water mark; not minting yet");
                warned = true;
            }
            let retry = tokio::time::sleep(RETRY.step(attempt));
            tokio::pin!(retry);
            loop {
                tokio::select! {
                    changed = state.changed() => {
                        if changed.is_err() {
                            return Ok(None);
                        }
                        // A renewal of this lease moves its deadline only; anything else
                        // (a loss, another claim, the stop) is the caller's to look at.
                        match &*state.borrow_and_update() {
                            WorkerState::Held(renewed) if renewed.claimed == held.claimed => {
                                held = renewed.clone();
                            }
                            _ => return Ok(None),
                        }
                    }
                    () = &mut retry => break,
                }
            }
            attempt += 1;
        }
    }

    /// Whether the app's recorded ID format is ours ([`format_refusal`]): `Ok(Ok(()))` when
    /// it is, `Ok(Err(_))` when Redis did not say.
    ///
    /// Errors: [`MintError::FormatRefused`], another format is recorded: the sidecar stops
    /// (exit 2) before it mints.
    async fn format_agrees(&mut self) -> Result<Result<(), Unconfirmed>, MintError> {
        if self.format_checked {
            return Ok(Ok(()));
        }
        let params = &self.params;
        let checked = format_refusal(
            &mut self.conn,
            &params.mint_keys,
            &params.config,
            params.call_timeout,
        );
        match checked.await {
            Ok(None) => {
                self.format_checked = true;
                Ok(Ok(()))
            }
            Ok(Some(why)) => {
                error!(reason = %why, "refusing to mint: another ID format is recorded for this app; stopping");
                Err(MintError::FormatRefused(why))
            }
            Err(err) => Ok(Err(Unconfirmed::Failed(err))),
        }
    }

    /// Reserves whenever the minter's ceiling falls below the low water (or a request
    /// found it reached) until the keeper's state changes: true then, false when the
    /// channel ended.
    async fn reserve_until_change(
        &mut self,
        s: &mut ReserverSession,
        state: &mut watch::Receiver<WorkerState>,
    ) -> bool {
        loop {
            let now = BootInstant::now();
            let (due, lead, last) = self.desk.read(|m| {
                let now = now.as_millis();
                (m.reservation_due(now), m.mark_lead_ms(now), m.last_minted())
            });
            self.metrics.set_mark_lead(lead);
            let active = s.wanted || s.reserved_at_last != ReservedAt::Minted(last);
            let due = due.filter(|_| active);
            if let Some(target) = due.filter(|_| now >= s.next_try) {
                tokio::select! {
                    changed = state.changed() => return changed.is_ok(),
                    () = self.reserve(s, target) => {}
                }
                continue;
            }
            let wake = match due {
                Some(_) => s.next_try,
                None if active => now + self.until_due(lead),
                // Idle: a request that reaches the ceiling wakes us.
                None => now + LOOK_EVERY,
            };
            tokio::select! {
                changed = state.changed() => return changed.is_ok(),
                () = self.desk.reservation_wanted() => s.wanted = true,
                _ = boot_clock::sleep_until(wake) => {}
            }
        }
    }

    /// How long until a reservation is due by the clock (`lead`: the ceiling's lead over
    /// it, ms), at most [`LOOK_EVERY`].
    fn until_due(&self, lead: Option<i64>) -> Duration {
        let left = lead.map_or(0, |lead| {
            lead - self.params.config.window.low_water_ms as i64
        });
        Duration::from_millis(left.max(1) as u64).min(LOOK_EVERY)
    }

    /// One reservation up to `target` (Unix ms). Raises the ceiling only once Redis
    /// confirmed it, we still reach the primary (Sentinel), and the replicas asked for
    /// acknowledged it; else backs off, and a reply that is not ours makes the keeper renew
    /// at once (it re-creates a key Redis lost, or finds the loss).
    async fn reserve(&mut self, s: &mut ReserverSession, target: u64) {
        let (sent_wall, sent) = (wall_now_ms(), BootInstant::now());
        let (cap, rollback_lead) = (self.reservation_cap(), self.rollback_lead());
        let call = script::reserve(
            &mut self.conn,
            &self.params.mint_keys,
            &s.lease_key,
            &s.held.owner,
            target,
            cap,
            rollback_lead,
        );
        let failed = match bounded(self.params.call_timeout, call).await {
            Ok(r) if r.ours => {
                let written = WrittenKey {
                    key: &s.lease_key,
                    replicas: self.params.min_replicas_ack,
                    call_timeout: self.params.call_timeout,
                    remaining: s.held.remaining(),
                };
                match written.reservation(&mut self.conn).await {
                    Ok(()) => return self.reserved(s, r, sent_wall, sent),
                    Err(refusal) => Unconfirmed::Gate(refusal),
                }
            }
            Ok(_) => {
                self.renew_now.notify_one();
                Unconfirmed::NotOurs
            }
            Err(err) => Unconfirmed::Failed(err),
        };
        if s.failures == 0 {
            warn!(worker_id = s.held.worker_id, error = %failed, failure = failed.failure(), "reservation failed; minting on up to the confirmed mark");
        } else {
            debug!(worker_id = s.held.worker_id, error = %failed, failure = failed.failure(), "reservation failed again");
        }
        s.next_try = BootInstant::now() + RETRY.step(s.failures);
        s.failures = s.failures.saturating_add(1);
    }

    /// A reservation Redis confirmed and the gate passed: raises the ceiling, and moves the
    /// minting clock forward to the wall clock when it agreed with Redis' TIME before and
    /// after the call (sent at `sent_wall`, Unix ms, and `sent`).
    fn reserved(
        &mut self,
        s: &mut ReserverSession,
        r: script::Reserved,
        sent_wall: u64,
        sent: BootInstant,
    ) {
        let reply_wall = wall_now_ms();
        let trusted = wall_agrees(
            [sent_wall, reply_wall],
            r.redis_ms,
            self.params.max_clock_skew + sent.elapsed(),
        );
        let anchor = Anchor {
            boot_ms: now_ms(),
            unix_ms: reply_wall,
        };
        let last = self.desk.update(|m| {
            m.raise_ceiling(s.ticket, r.mark_unix_ms);
            if trusted && m.reanchor(s.ticket, anchor) {
                debug!(
                    unix_ms = reply_wall,
                    "minting clock moved forward to the wall clock"
                );
            }
            m.last_minted()
        });
        s.reserved_at_last = ReservedAt::Minted(last);
        s.wanted = false;
        s.failures = 0;
        s.next_try = BootInstant::now();
    }

    /// Stops minting for good and records the last minted timestamp, so the next holder
    /// mints at once instead of waiting for our reservation to pass. A failed settle leaves
    /// the mark as the next floor: later, never wrong.
    async fn settle(mut self, session: Option<ReserverSession>) {
        let ended = self.desk.update(|m| m.stop(Standby::Stopping));
        let (Some(s), Some(ended)) = (session, ended) else {
            return;
        };
        let rollback_lead = self.rollback_lead();
        let call = script::settle(
            &mut self.conn,
            &self.params.mint_keys,
            &s.lease_key,
            &s.held.owner,
            ended.settled_unix_ms,
            rollback_lead,
        );
        match bounded(self.params.call_timeout.min(SETTLE_LIMIT), call).await {
            Ok(settled) if settled.ours => info!(
                worker_id = ended.worker_id,
                settled_unix_ms = settled.settled_unix_ms,
                "recorded the last minted timestamp"
            ),
            Ok(_) => info!(
                worker_id = ended.worker_id,
                "the lease key was no longer ours; the mark stays the next floor"
            ),
            Err(err) => {
                let failed = Unconfirmed::Failed(err);
                warn!(
                    worker_id = ended.worker_id,
                    error = %failed,
                    failure = failed.failure(),
                    "cannot record the last minted timestamp; the next holder waits for the mark"
                );
            }
        }
    }
}

/// Why a call of the reserver confirmed nothing, as it is logged.
enum Unconfirmed {
    /// The call failed; the connection's table ([`classify`]) says how.
    Failed(redis::RedisError),
    /// The lease key does not hold our owner string.
    NotOurs,
    /// Redis confirmed the reservation; the keeper's gate did not.
    Gate(GateRefusal),
}

impl Unconfirmed {
    /// The `failure` field of its log line: the row of the connection's table a failed call
    /// falls in (`transient`, `refused`: this client's password, ACL or certificate,
    /// `permanent`), or `answered` when Redis answered. Each is retried alike: minting goes
    /// on up to the confirmed mark and the lease's deadline whatever Redis says now.
    fn failure(&self) -> &'static str {
        match self {
            Self::Failed(err) => classify(err).failure.label(),
            Self::NotOurs | Self::Gate(_) => "answered",
        }
    }
}

impl std::fmt::Display for Unconfirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed(err) => Readable(err).fmt(f),
            Self::NotOurs => f.write_str("the lease key does not hold our owner string"),
            Self::Gate(GateRefusal::NotPrimary) => f.write_str("the node is no longer the primary"),
            Self::Gate(GateRefusal::Unacknowledged) => {
                f.write_str("too few replicas acknowledged the reservation")
            }
            Self::Gate(other) => write!(f, "the keeper's gate refused it: {other:?}"),
        }
    }
}

/// Records our ID format as the app's (`format.lua`) unless one is recorded, and compares:
/// `None` when the recorded format is ours; else why this sidecar must not mint. A mark in
/// Unix ms bounds IDs only among sidecars that encode time alike: one with another `--epoch`
/// or `--id-layout` would mint IDs an earlier holder minted; one with another
/// `--datacenter-id` holds the same worker IDs on this Redis, so the app's datacenter is
/// fixed like its layout.
///
/// Errors: the Redis call failed or timed out (`call_timeout`).
pub(super) async fn format_refusal(
    conn: &mut Redis,
    keys: &MintKeys,
    config: &MintConfig,
    call_timeout: Duration,
) -> redis::RedisResult<Option<String>> {
    let ours = config.layout.format(config.epoch);
    let call = script::record_format(conn, keys, &ours);
    let recorded = bounded(call_timeout, call).await?;
    Ok((recorded != ours).then(|| {
        format!(
            "this app mints IDs in the format {recorded} (layout@epoch ms[,datacenter=ID], recorded in {}), this sidecar in {ours}: minting in both could give one ID twice; keep --id-layout, --epoch and --datacenter-id of the app, or mint under a new --app",
            keys.format()
        )
    }))
}

/// The 503 state of a keeper state without a valid lease.
fn standby_of(state: &WorkerState) -> Standby {
    match state {
        WorkerState::Claiming => Standby::Claiming,
        WorkerState::Readopting(_) => Standby::Readopting,
        WorkerState::GuardClosed(_) => Standby::GuardClosed,
        WorkerState::ClockSkewed(_) => Standby::ClockSkew,
        WorkerState::Handover(_) => Standby::Handover,
        WorkerState::Evicting(_) => Standby::Evicting,
        WorkerState::Unacknowledged(replicas) => Standby::Unacknowledged(*replicas),
        WorkerState::Lost | WorkerState::Held(_) => Standby::Lost,
        WorkerState::Stopping => Standby::Stopping,
    }
}

/// Logs when the clock is behind the floor: minting waits (`503 clock_behind`) until it passes
/// it, never mints below. Within `expected_ms` (the rollback lead: window + 2 x skew) that is the
/// previous holder's reservation ahead of its clock, after a crash or a re-adoption: info;
/// beyond, this clock is behind Redis' view of time: a warning.
fn log_if_behind(worker_id: u16, floor_unix_ms: u64, clock_unix_ms: u64, expected_ms: u64) {
    let Some(behind_ms) = floor_unix_ms.checked_sub(clock_unix_ms).filter(|b| *b > 0) else {
        return;
    };
    if behind_ms <= expected_ms {
        info!(
            worker_id,
            behind_ms,
            "waiting out the previous holder's reservation: /next answers 503 clock_behind until the clock passes it"
        );
    } else {
        warn!(
            worker_id,
            behind_ms,
            "the clock is behind the previous holders' high-water mark beyond --mint-window: /next answers 503 clock_behind until it passes it"
        );
    }
}

/// Whether the wall clock read before and after a call agrees with the Redis `TIME` read
/// within it, within `slack` (the skew bound plus the round trip) both times: a clock that
/// stepped during the call agrees on one side only, and must not move the minting clock.
fn wall_agrees(walls: [u64; 2], redis_ms: u64, slack: Duration) -> bool {
    let slack = ms(slack);
    walls.iter().all(|wall| wall.abs_diff(redis_ms) <= slack)
}

fn now_ms() -> u64 {
    BootInstant::now().as_millis()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker_id::mint::minter::MintRefusal;
    use crate::worker_id::publish::routes::state_name;

    /// One set of state names: while no lease is held, `/next` answers the state `/readyz`
    /// names (its 503 at shutdown said `draining` where `/readyz` said `stopping`).
    #[test]
    fn next_names_the_states_readyz_names() {
        let at = BootInstant::now();
        let evicting = crate::eviction::EvictingRedis {
            policy: "allkeys-lru".into(),
            maxmemory: 1,
        };
        for state in [
            WorkerState::Claiming,
            WorkerState::Readopting(at),
            WorkerState::GuardClosed(at),
            WorkerState::ClockSkewed(900),
            WorkerState::Handover(at),
            WorkerState::Evicting(evicting),
            WorkerState::Unacknowledged(1),
            WorkerState::Lost,
            WorkerState::Stopping,
        ] {
            let next = MintRefusal::NoLease(standby_of(&state)).state();
            assert_eq!(next, state_name(&state), "{state:?}");
        }
    }

    /// The wall clock moves the minting clock only when it agrees with Redis before and after
    /// the call: a step during the call (seen once as 30 s of `503 reserving`) does not.
    #[test]
    fn a_wall_clock_stepped_during_the_call_is_not_trusted() {
        let slack = Duration::from_millis(500);
        assert!(wall_agrees([10_000, 10_003], 10_001, slack));
        assert!(wall_agrees([10_400, 10_450], 10_001, slack));
        assert!(
            !wall_agrees([10_000, 40_003], 10_001, slack),
            "a step ahead mid-call"
        );
        assert!(
            !wall_agrees([40_000, 10_003], 10_001, slack),
            "a step back mid-call"
        );
        assert!(!wall_agrees([11_000, 11_003], 10_001, slack), "skewed");
    }

    /// Every state without a valid lease maps to the 503 state apps see.
    #[test]
    fn states_without_a_lease_map_to_their_standby() {
        assert_eq!(standby_of(&WorkerState::Claiming), Standby::Claiming);
        assert_eq!(standby_of(&WorkerState::Lost), Standby::Lost);
        assert_eq!(standby_of(&WorkerState::ClockSkewed(5)), Standby::ClockSkew);
        assert_eq!(standby_of(&WorkerState::Stopping), Standby::Stopping);
        let soon = BootInstant::now();
        assert_eq!(
            standby_of(&WorkerState::GuardClosed(soon)),
            Standby::GuardClosed
        );
        assert_eq!(
            standby_of(&WorkerState::Readopting(soon)),
            Standby::Readopting
        );
    }
}
