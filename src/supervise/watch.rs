//! The loop `exec` and `lock` share while the command runs: where the watch
//! is (a [`Phase`]) and what comes next ([`next`]), decided without I/O from
//! the deadline rules (`deadline.rs`), so the unit tests below pin it.
//!
//! Each round the caller reaps the command first (its exit ends the loop),
//! then asks [`next`] and does the [`WatchStep`]: SIGKILL, the deadline within
//! the grace, its own check (lock: renew the lease; exec: read the published
//! ID), or a sleep that a passed-on signal or the command's exit cuts short.
//! After a loss the caller sends SIGTERM and moves to [`stopping`].

use std::time::{Duration, Instant};

use super::deadline::Deadlines;

/// How often a SIGKILLed command is looked at until it is reaped (its exit
/// also wakes the loop; this only bounds a missed one).
const REAP_POLL: Duration = Duration::from_millis(100);

/// Where the watch of one command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The command runs and the lease (or the published ID) is watched.
    Watching,
    /// SIGTERM went out; SIGKILL is due at `kill_at`.
    Stopping {
        /// After the grace, never after the last known deadline.
        kill_at: Instant,
    },
    /// SIGKILL went out; only the reap is left.
    Killed,
}

impl Phase {
    /// How long until SIGKILL is due: zero unless stopping (for logs).
    pub(crate) fn kill_in(self, now: Instant) -> Duration {
        match self {
            Self::Stopping { kill_at } => kill_at.saturating_duration_since(now),
            Self::Watching | Self::Killed => Duration::ZERO,
        }
    }
}

/// What the loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WatchStep {
    /// SIGKILL to the command now; the phase becomes [`Phase::Killed`].
    Kill,
    /// The deadline is within the grace (`passed`: past it) and no renewal
    /// has been seen: `lock` stops the command, `exec` reads once more (the
    /// sidecar may have renewed meanwhile).
    Expiring {
        /// The deadline itself has passed (after a pause or suspend).
        passed: bool,
    },
    /// The caller's own check is due: renew, or read the published ID.
    Check,
    /// Nothing is due before this instant.
    Sleep(Instant),
}

/// The step at `now` in `phase`, for a lease valid until `valid_until`
/// (`None`: no deadline known) whose next check is due at `check_at`.
///
/// The deadline is looked at before the check: after a pause (SIGSTOP, a VM
/// freeze) it may have passed, and then nothing is sent.
pub(crate) fn next(
    phase: Phase,
    rules: &Deadlines,
    valid_until: Option<Instant>,
    check_at: Instant,
    now: Instant,
) -> WatchStep {
    match phase {
        Phase::Stopping { kill_at } if now >= kill_at => WatchStep::Kill,
        Phase::Stopping { kill_at } => WatchStep::Sleep(kill_at),
        Phase::Killed => WatchStep::Sleep(now + REAP_POLL),
        Phase::Watching if rules.expiring(valid_until, now) => WatchStep::Expiring {
            passed: valid_until.is_some_and(|t| now >= t),
        },
        Phase::Watching if now >= check_at => WatchStep::Check,
        Phase::Watching => WatchStep::Sleep(
            rules
                .term_at(valid_until)
                .map_or(check_at, |term| term.min(check_at)),
        ),
    }
}

/// The phase after SIGTERM at `now`: SIGKILL after the grace, but never
/// after `valid_until`, the last deadline known to be ours (the lease may be
/// someone else's after it).
pub(crate) fn stopping(rules: &Deadlines, now: Instant, valid_until: Option<Instant>) -> Phase {
    Phase::Stopping {
        kill_at: rules.kill_at(now, valid_until),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// A 10 s grace, and a lease valid 60 s from `now`.
    fn watched(now: Instant) -> (Deadlines, Option<Instant>) {
        let mut rules = Deadlines::new(s(10));
        let valid_until = now + s(60);
        rules.observe(Some(valid_until), now);
        (rules, Some(valid_until))
    }

    /// While watching: sleep until the check or the grace before the
    /// deadline, whichever comes first; the check when it is due.
    #[test]
    fn watching_sleeps_until_the_check_or_the_grace_before_the_deadline() {
        let now = Instant::now();
        let (rules, valid_until) = watched(now);
        let check_at = now + s(20);
        let step = next(Phase::Watching, &rules, valid_until, check_at, now);
        assert_eq!(step, WatchStep::Sleep(check_at));
        assert_eq!(
            next(Phase::Watching, &rules, valid_until, check_at, check_at),
            WatchStep::Check
        );
        // A check later than the grace before the deadline: woken for SIGTERM.
        let late = now + s(55);
        let step = next(Phase::Watching, &rules, valid_until, late, now);
        assert_eq!(step, WatchStep::Sleep(now + s(50)));
        // No deadline known: only the check wakes.
        let step = next(Phase::Watching, &rules, None, late, now);
        assert_eq!(step, WatchStep::Sleep(late));
    }

    /// The deadline within the grace comes before a due check, and says
    /// whether it has passed (after a pause nothing is sent).
    #[test]
    fn the_deadline_comes_before_a_due_check() {
        let now = Instant::now();
        let (rules, valid_until) = watched(now);
        let in_grace = now + s(50);
        assert_eq!(
            next(Phase::Watching, &rules, valid_until, now, in_grace),
            WatchStep::Expiring { passed: false }
        );
        assert_eq!(
            next(Phase::Watching, &rules, valid_until, now, in_grace - MS),
            WatchStep::Check
        );
        let after = now + s(61);
        assert_eq!(
            next(Phase::Watching, &rules, valid_until, now, after),
            WatchStep::Expiring { passed: true }
        );
        assert_eq!(
            next(Phase::Watching, &rules, None, now + s(3600), now + s(1000)),
            WatchStep::Sleep(now + s(3600))
        );
    }

    /// After SIGTERM: SIGKILL after the grace, never after the deadline;
    /// once killed, the loop only waits for the reap.
    #[test]
    fn a_stop_kills_after_the_grace_but_never_after_the_deadline() {
        let now = Instant::now();
        let (rules, valid_until) = watched(now);
        let phase = stopping(&rules, now, valid_until);
        assert_eq!(
            phase,
            Phase::Stopping {
                kill_at: now + s(10)
            }
        );
        assert_eq!(
            next(phase, &rules, valid_until, now, now),
            WatchStep::Sleep(now + s(10))
        );
        assert_eq!(
            next(phase, &rules, valid_until, now, now + s(10)),
            WatchStep::Kill
        );
        // A loss 3 s before the deadline: SIGKILL at the deadline.
        let late = now + s(57);
        let phase = stopping(&rules, late, valid_until);
        assert_eq!(
            phase,
            Phase::Stopping {
                kill_at: now + s(60)
            }
        );
        // Neither checks nor the deadline matter once stopping or killed.
        assert_eq!(
            next(Phase::Killed, &rules, valid_until, now, late),
            WatchStep::Sleep(late + REAP_POLL)
        );
    }

    /// The loop's timing under tokio's paused clock: a 1 s renew interval
    /// and 10 s of validity with a 1 s grace are checked every second, and a
    /// lease never renewed is stopped exactly the grace before its deadline.
    #[tokio::test(start_paused = true)]
    async fn a_lease_never_renewed_is_stopped_the_grace_before_its_deadline() {
        let start = tokio::time::Instant::now();
        let std_now = |at: tokio::time::Instant| at.into_std();
        let mut rules = Deadlines::new(s(1));
        let valid_until = Some(std_now(start) + s(10));
        rules.observe(valid_until, std_now(start));
        let mut check_at = std_now(start) + s(1);
        let mut checks = 0;
        let stopped_at = loop {
            let now = std_now(tokio::time::Instant::now());
            match next(Phase::Watching, &rules, valid_until, check_at, now) {
                WatchStep::Sleep(until) => tokio::time::sleep_until(until.into()).await,
                WatchStep::Check => {
                    checks += 1;
                    check_at = now + s(1);
                }
                WatchStep::Expiring { passed } => {
                    assert!(!passed);
                    break now;
                }
                WatchStep::Kill => unreachable!("not stopping"),
            }
        };
        assert_eq!(stopped_at - std_now(start), s(9));
        assert_eq!(checks, 8, "checks at 1 s .. 8 s; the 9th is the stop");
    }
}
