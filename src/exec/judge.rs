//! What one reading of the published ID means for the command `exec` runs
//! with it: still ours, unreadable for now, or gone (lost, or released by a
//! sidecar that stopped in order). No I/O: unit-tested below. When the
//! command is then stopped: `supervise/deadline.rs`.

use std::time::Instant;

use super::{PublishedId, Reading};
use crate::supervise::deadline::Deadlines;
use crate::timing;

/// Why the command was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gone {
    /// The ID was lost: gone, changed, stale (ERROR).
    Lost,
    /// The sidecar stopped in order and released it (INFO).
    Released,
}

/// What a reading means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Judged {
    /// The ID is still ours, fresh beyond the grace.
    Ours,
    /// The source cannot be read; the last fresh reading holds beyond the
    /// grace, so the command keeps running (the reason is for a log line).
    Unreachable(String),
    /// Stop the command, for this reason.
    Gone(Gone, String),
}

/// Judges `reading` at `now` for the command started with
/// `current.worker_id`. A reading of that ID replaces `current` and is shown
/// to `rules`; the `bool` is true when it capped the grace below `--grace`
/// for the first time (worth a warning).
pub(super) fn judge(
    reading: Reading,
    current: &mut PublishedId,
    rules: &mut Deadlines,
    now: Instant,
) -> (Judged, bool) {
    // The published deadline is on the boot clock; timers run on the
    // monotonic one, so it is mapped anew at each use (closer after a suspend).
    let until = |p: &PublishedId| p.valid_until.map(|t| t.on_monotonic(now));
    let lost = |reason: String| (Judged::Gone(Gone::Lost, reason), false);
    match reading {
        Reading::Published(p) if p.worker_id == current.worker_id => {
            let capped = rules.observe(until(&p), now);
            *current = p;
            if !rules.expiring(until(current), now) {
                return (Judged::Ours, capped);
            }
            let reason = format!(
                "the published worker ID goes stale in {} ms, within the grace of {} ms, and \
                 was not renewed",
                current.valid_until.map_or(0, |t| timing::ms(t.remaining())),
                timing::ms(rules.grace())
            );
            (Judged::Gone(Gone::Lost, reason), capped)
        }
        Reading::Published(p) => lost(format!(
            "the published worker ID changed to {}",
            p.worker_id
        )),
        Reading::Absent(reason) => lost(reason),
        Reading::Released(reason) => (Judged::Gone(Gone::Released, reason), false),
        Reading::Minting => {
            lost("the sidecar now runs in mint mode (--mint) and offers no worker ID".to_owned())
        }
        Reading::Unreachable(reason) if rules.expiring(until(current), now) => lost(format!(
            "{reason}; the last reading goes stale within the grace of {} ms",
            timing::ms(rules.grace())
        )),
        Reading::Unreachable(reason) => (Judged::Unreachable(reason), false),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::boot_clock::BootInstant;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// ID `worker_id` valid `left` from now on the boot clock.
    fn published(worker_id: u16, left: Duration) -> PublishedId {
        let at = BootInstant::from_millis(BootInstant::now().as_millis() + timing::ms(left));
        PublishedId {
            worker_id,
            valid_until: Some(at),
        }
    }

    /// A command running with ID 7 (valid 60 s) under a 10 s grace.
    fn running() -> (PublishedId, Deadlines) {
        let current = published(7, s(60));
        let mut rules = Deadlines::new(s(10));
        let now = Instant::now();
        rules.observe(current.valid_until.map(|t| t.on_monotonic(now)), now);
        (current, rules)
    }

    /// A renewed reading of our ID keeps the command and becomes current;
    /// one that goes stale within the grace stops it.
    #[test]
    fn our_id_is_kept_until_it_goes_stale_within_the_grace() {
        let (mut current, mut rules) = running();
        let renewed = published(7, s(120));
        let reading = Reading::Published(renewed);
        let judged = judge(reading, &mut current, &mut rules, Instant::now());
        assert_eq!(judged, (Judged::Ours, false));
        assert_eq!(current, renewed);
        let stale = Reading::Published(published(7, s(5)));
        let (judged, _) = judge(stale, &mut current, &mut rules, Instant::now());
        let Judged::Gone(Gone::Lost, reason) = judged else {
            panic!("{judged:?}")
        };
        assert!(reason.contains("within the grace of 10000 ms"), "{reason}");
    }

    /// A short validity caps the grace at a quarter of it, once.
    #[test]
    fn a_short_validity_caps_the_grace_once() {
        let current = published(7, Duration::from_millis(1_900));
        let mut rules = Deadlines::new(s(10));
        let mut seen = current;
        let reading = Reading::Published(current);
        let (judged, capped) = judge(reading.clone(), &mut seen, &mut rules, Instant::now());
        assert_eq!((judged, capped), (Judged::Ours, true));
        assert!(rules.grace() <= Duration::from_millis(475));
        let (_, again) = judge(reading, &mut seen, &mut rules, Instant::now());
        assert!(!again, "warned once");
    }

    /// Another ID, none, mint mode: lost; a release is no loss.
    #[test]
    fn another_id_none_or_mint_mode_is_lost_and_a_release_is_not() {
        let (mut current, mut rules) = running();
        let now = Instant::now();
        let mut gone = |reading| judge(reading, &mut current, &mut rules, now).0;
        assert_eq!(
            gone(Reading::Published(published(8, s(60)))),
            Judged::Gone(
                Gone::Lost,
                "the published worker ID changed to 8".to_owned()
            )
        );
        assert_eq!(
            gone(Reading::Absent("no ID file".to_owned())),
            Judged::Gone(Gone::Lost, "no ID file".to_owned())
        );
        assert!(matches!(
            gone(Reading::Minting),
            Judged::Gone(Gone::Lost, _)
        ));
        assert_eq!(
            gone(Reading::Released("stopped".to_owned())),
            Judged::Gone(Gone::Released, "stopped".to_owned())
        );
    }

    /// An unreadable source keeps the command while the last reading is
    /// fresh beyond the grace, and stops it within the grace.
    #[test]
    fn an_unreadable_source_is_ridden_out_until_the_grace() {
        let (mut current, mut rules) = running();
        let down = || Reading::Unreachable("connection refused".to_owned());
        assert_eq!(
            judge(down(), &mut current, &mut rules, Instant::now()).0,
            Judged::Unreachable("connection refused".to_owned())
        );
        // The last reading now 5 s from its deadline (the boot clock's: the
        // monotonic instant is mapped from it at `now`).
        current = published(7, s(5));
        let (judged, _) = judge(down(), &mut current, &mut rules, Instant::now());
        let Judged::Gone(Gone::Lost, reason) = judged else {
            panic!("{judged:?}")
        };
        assert!(reason.starts_with("connection refused; the last reading goes stale"));
    }
}
