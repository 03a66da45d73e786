//! The minter: a pure state machine that mints IDs for one worker ID under one lease, between
//! the high-water mark read at claim (floor) and the reservation Redis confirmed (ceiling),
//! until the lease's validity deadline. No I/O, no clock reads: every call takes `now` in
//! CLOCK_BOOTTIME ms ([`crate::boot_clock::BootInstant::as_millis`]); the keeper does the
//! Redis calls and feeds their results in (docs/mint-design.md).

use super::layout::{Epoch, IdLayout, IdParts};

/// Why nothing is minting: the `state` of a 503 while no lease is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standby {
    /// No lease yet; claiming.
    Claiming,
    /// The claim guard holds claims back.
    GuardClosed,
    /// The wall clock differs from Redis' TIME beyond `--max-clock-skew`.
    ClockSkew,
    /// Redis may evict keys; nothing claimed.
    Evicting,
    /// The claim is not acknowledged by `--min-replicas-ack` (this many) replicas yet.
    Unacknowledged(u32),
    /// The worker ID was last published to an app that may still run on it.
    Handover,
    /// Re-adopting a lease recorded by an earlier process.
    Readopting,
    /// The lease was lost; reclaiming.
    Lost,
    /// Shutdown: minting stopped for good, the last timestamp is being recorded (`/readyz`
    /// says `stopping` too).
    Stopping,
}

/// Where the monotonic clock meets the wall clock: both read together (at claim, or at a
/// later forward re-anchor). The minting clock is `unix_ms + (now - boot_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// CLOCK_BOOTTIME ms at the reading.
    pub boot_ms: u64,
    /// Unix ms (wall clock) at the same reading.
    pub unix_ms: u64,
}

/// One lease to mint under, as the keeper got it from Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The worker ID of the lease.
    pub worker_id: u16,
    /// The clock reading taken at claim.
    pub anchor: Anchor,
    /// The high-water mark (Unix ms) read after the claim (`mark.lua`): every timestamp is
    /// strictly above it.
    pub floor_unix_ms: u64,
    /// The lease's validity deadline, CLOCK_BOOTTIME ms (rounded down): nothing is minted at
    /// or after it.
    pub valid_until_boot_ms: u64,
}

/// How far ahead of the minting clock the keeper reserves (`reserve.lua`), in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MintWindow {
    /// A reservation asks for the clock + this much.
    pub ahead_ms: u64,
    /// A reservation is due once the ceiling is less than this far ahead of the clock
    /// (below `ahead_ms`, so one reservation lasts `ahead_ms - low_water_ms`).
    pub low_water_ms: u64,
}

/// Why no ID was minted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MintRefusal {
    /// No lease is minting.
    NoLease(Standby),
    /// The clock is at or below the floor (the previous holders' mark); it passes it in
    /// `wait_ms`.
    ClockBehind {
        /// ms until the clock is above the floor.
        wait_ms: u64,
    },
    /// The clock is past the ceiling: the keeper must reserve further first.
    NeedsReservation,
    /// The lease's validity deadline has passed.
    LeaseInvalid,
    /// The timestamp no longer fits the layout (a clock far ahead, or the layout's end).
    LayoutExhausted,
}

impl MintRefusal {
    /// The `state` a 503 names.
    pub fn state(self) -> &'static str {
        match self {
            Self::NoLease(Standby::Claiming) => "claiming",
            Self::NoLease(Standby::GuardClosed) => "guard_closed",
            Self::NoLease(Standby::ClockSkew) => "clock_skew",
            Self::NoLease(Standby::Handover) => "handover",
            Self::NoLease(Standby::Evicting) => "evicting",
            Self::NoLease(Standby::Unacknowledged(_)) => "unacknowledged",
            Self::NoLease(Standby::Readopting) => "readopting",
            Self::NoLease(Standby::Lost) => "lost",
            Self::NoLease(Standby::Stopping) => "stopping",
            Self::ClockBehind { .. } => "clock_behind",
            Self::NeedsReservation => "reserving",
            Self::LeaseInvalid => "expired",
            Self::LayoutExhausted => "layout_exhausted",
        }
    }
}

/// What a successful [`Minter::mint`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `out` holds the count asked for.
    Done,
    /// This ms's sequence ran out first: call again once the boot clock is past `now`.
    NextMs,
}

/// What a stopped lease leaves for the release to record (`settle.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The worker ID of the stopped lease.
    pub worker_id: u16,
    /// The last minted timestamp (Unix ms), or the floor when nothing was minted: no ID of
    /// this lease has a later one.
    pub settled_unix_ms: u64,
}

/// Names one [`Minter::start`]. The keeper's later changes (a renewal, a reservation, a
/// re-anchor) carry it and apply only to that lease: a reply that arrives after its lease
/// ended must not extend or raise the next one (another worker ID's mark says nothing of
/// this one's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTicket(u64);

/// One lease being minted under.
#[derive(Debug, Clone)]
struct MintSession {
    ticket: LeaseTicket,
    grant: Grant,
    /// The highest reservation Redis confirmed (Unix ms); starts at the floor (nothing).
    ceiling_unix_ms: u64,
    /// The last minted timestamp (Unix ms) and sequence.
    last: Option<(u64, u32)>,
}

#[derive(Debug, Clone)]
enum MintPhase {
    Standby(Standby),
    Minting(MintSession),
}

/// Mints IDs for the one lease it is given; see the module doc.
#[derive(Debug, Clone)]
pub struct Minter {
    layout: IdLayout,
    epoch: Epoch,
    window: MintWindow,
    phase: MintPhase,
    /// Leases started so far: the next ticket.
    started: u64,
}

impl Minter {
    /// A minter for `layout` from `epoch`, claiming.
    pub fn new(layout: IdLayout, epoch: Epoch, window: MintWindow) -> Self {
        Self {
            layout,
            epoch,
            window,
            phase: MintPhase::Standby(Standby::Claiming),
            started: 0,
        }
    }

    /// Starts minting under a new lease; whatever lease was before is forgotten (its IDs are
    /// all at or below the mark Redis holds, which the new grant's floor is). The ticket
    /// names this lease in the keeper's later changes.
    pub fn start(&mut self, grant: Grant) -> LeaseTicket {
        self.started += 1;
        let ticket = LeaseTicket(self.started);
        self.phase = MintPhase::Minting(MintSession {
            ticket,
            grant,
            ceiling_unix_ms: grant.floor_unix_ms,
            last: None,
        });
        ticket
    }

    /// Stops minting (loss, shutdown, ...); returns what the stopped lease leaves to record.
    pub fn stop(&mut self, why: Standby) -> Option<Ended> {
        let ended = self.session().map(|s| Ended {
            worker_id: s.grant.worker_id,
            settled_unix_ms: s.last.map_or(s.grant.floor_unix_ms, |(t, _)| t),
        });
        self.phase = MintPhase::Standby(why);
        ended
    }

    /// A confirmed renew of the `ticket` lease moved its validity deadline (CLOCK_BOOTTIME
    /// ms). Returns false (nothing changed) when that lease is no longer minting.
    pub fn extend(&mut self, ticket: LeaseTicket, valid_until_boot_ms: u64) -> bool {
        let Some(s) = self.session_of(ticket) else {
            return false;
        };
        s.grant.valid_until_boot_ms = valid_until_boot_ms;
        true
    }

    /// A confirmed reservation of the `ticket` lease: the mark Redis now holds (Unix ms). The
    /// ceiling only rises. Returns false (nothing changed) when that lease is no longer
    /// minting.
    pub fn raise_ceiling(&mut self, ticket: LeaseTicket, mark_unix_ms: u64) -> bool {
        let Some(s) = self.session_of(ticket) else {
            return false;
        };
        s.ceiling_unix_ms = s.ceiling_unix_ms.max(mark_unix_ms);
        true
    }

    /// Moves the anchor to a new clock reading only when that puts the minting clock ahead
    /// (a wall-clock step forward, or an anchor read while the wall clock was behind).
    /// Returns whether it moved (never for another lease than `ticket`'s).
    ///
    /// Forward only is safe: timestamps still never fall (the mapping jumps ahead, and the
    /// last timestamp is kept), every one stays within the ceiling Redis confirmed (a clock
    /// far ahead only reaches the ceiling sooner, and `reserve.lua` caps a reservation at
    /// Redis' TIME + the window), and the floor is untouched. Backwards would freeze the
    /// timestamp at the last one until the clock caught up; a step back is therefore left to
    /// the monotonic clock, which never sees it.
    pub fn reanchor(&mut self, ticket: LeaseTicket, anchor: Anchor) -> bool {
        let Some(s) = self.session_of(ticket) else {
            return false;
        };
        let ahead = anchor.unix_ms > s.grant.anchor.unix_at(anchor.boot_ms);
        if ahead {
            s.grant.anchor = anchor;
        }
        ahead
    }

    /// The target to reserve up to now (Unix ms) when the ceiling is less than the window's
    /// low water ahead of the minting clock; `None` otherwise or without a lease.
    pub fn reservation_due(&self, now_boot_ms: u64) -> Option<u64> {
        let s = self.session()?;
        let clock = s.clock(now_boot_ms);
        (s.ceiling_unix_ms < clock.saturating_add(self.window.low_water_ms))
            .then(|| clock.saturating_add(self.window.ahead_ms))
    }

    /// The ceiling's lead over the minting clock (ms, negative once past it); `None` without
    /// a lease.
    pub fn mark_lead_ms(&self, now_boot_ms: u64) -> Option<i64> {
        let s = self.session()?;
        Some(s.ceiling_unix_ms as i64 - s.clock(now_boot_ms) as i64)
    }

    /// The last minted timestamp (Unix ms) of the current lease.
    pub fn last_minted(&self) -> Option<u64> {
        self.session()?.last.map(|(t, _)| t)
    }

    /// The worker ID being minted for.
    pub fn worker_id(&self) -> Option<u16> {
        Some(self.session()?.grant.worker_id)
    }

    /// Mints IDs into `out` until it holds `count` or this ms's sequence runs out, in
    /// strictly increasing order (also across calls). Refused, nothing is pushed and nothing
    /// changes. `now_boot_ms` must be read inside the caller's lock; an older one is
    /// harmless (the last timestamp is kept).
    pub fn mint(
        &mut self,
        now_boot_ms: u64,
        count: usize,
        out: &mut Vec<u64>,
    ) -> Result<Step, MintRefusal> {
        let (layout, epoch) = (self.layout, self.epoch);
        let sequences = layout.sequences();
        let s = match &mut self.phase {
            MintPhase::Standby(why) => return Err(MintRefusal::NoLease(*why)),
            MintPhase::Minting(s) => s,
        };
        if now_boot_ms >= s.grant.valid_until_boot_ms {
            return Err(MintRefusal::LeaseInvalid);
        }
        let t = s.clock(now_boot_ms).max(s.last.map_or(0, |(t, _)| t));
        // Before the epoch nothing fits: wait as for a floor.
        let floor = s.grant.floor_unix_ms.max(epoch.unix_ms().saturating_sub(1));
        if t <= floor {
            return Err(MintRefusal::ClockBehind {
                wait_ms: floor + 1 - t,
            });
        }
        if t > s.ceiling_unix_ms {
            return Err(MintRefusal::NeedsReservation);
        }
        let mut sequence = match s.last {
            Some((last, seq)) if last == t => seq + 1,
            _ => 0,
        };
        let worker_id = s.grant.worker_id;
        let compose = |sequence| {
            layout.compose(
                epoch,
                IdParts {
                    unix_ms: t,
                    datacenter_id: layout.datacenter_id(),
                    worker_id,
                    sequence,
                },
            )
        };
        compose(sequence.min(sequences - 1)).ok_or(MintRefusal::LayoutExhausted)?;
        while out.len() < count && sequence < sequences {
            out.push(compose(sequence).ok_or(MintRefusal::LayoutExhausted)?);
            s.last = Some((t, sequence));
            sequence += 1;
        }
        Ok(if out.len() >= count {
            Step::Done
        } else {
            Step::NextMs
        })
    }

    fn session(&self) -> Option<&MintSession> {
        match &self.phase {
            MintPhase::Minting(s) => Some(s),
            MintPhase::Standby(_) => None,
        }
    }

    fn session_of(&mut self, ticket: LeaseTicket) -> Option<&mut MintSession> {
        match &mut self.phase {
            MintPhase::Minting(s) if s.ticket == ticket => Some(s),
            _ => None,
        }
    }
}

impl Anchor {
    /// The minting clock (Unix ms) at `boot_ms`.
    fn unix_at(self, boot_ms: u64) -> u64 {
        self.unix_ms + boot_ms.saturating_sub(self.boot_ms)
    }
}

impl MintSession {
    fn clock(&self, now_boot_ms: u64) -> u64 {
        self.grant.anchor.unix_at(now_boot_ms)
    }
}

#[cfg(test)]
mod tests;
