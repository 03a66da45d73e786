//! The keeper's timing decisions as pure functions of durations and
//! instants: when to renew, how long to pause between renew retries and
//! between claim rounds, and the caps on each. The keeper reads the clocks
//! ([`BootInstant`](crate::boot_clock::BootInstant) for validity, tokio's
//! `Instant` for the claim timeout) and passes the readings in, so the
//! unit tests below drive these rules under tokio's paused clock.
//!
//! The backoff, the jitter (75-125% of a step) and the retry base are the
//! crate's one timing kit ([`crate::timing`]); this file only sets the
//! worker's steps and caps.

use std::ops::Add;
use std::time::Duration;

use crate::timing::{Backoff, retry_base, spread};

/// First pause between claim rounds (100 ms), unless the cap is shorter.
const CLAIM_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest claim backoff step (5 s), unless the renew interval is shorter.
const CLAIM_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// After a renew round whose attempts all failed, the next round starts
/// this many retry bases later (until the validity deadline ends it).
const FAILED_ROUND_BASES: u32 = 4;

/// The claim loop's backoff: steps of 100 ms doubling up to
/// [`claim_backoff_cap`]; a step grows only after a round that found no ID
/// (all held, Redis unavailable, Redis may evict).
pub(super) struct ClaimBackoff {
    steps: Backoff,
    attempt: u32,
}

impl ClaimBackoff {
    /// The backoff of one claim phase, for `renew_interval`.
    pub(super) fn new(renew_interval: Duration) -> Self {
        let cap = claim_backoff_cap(renew_interval);
        Self {
            steps: Backoff::new(CLAIM_BACKOFF_MIN.min(cap), cap),
            attempt: 0,
        }
    }

    /// The current step, before jitter.
    pub(super) fn step(&self) -> Duration {
        self.steps.step(self.attempt)
    }

    /// The pause after a round: the current step, jittered (75-125%).
    pub(super) fn pause(&self) -> Duration {
        spread(self.step())
    }

    /// Doubles the step, up to the cap.
    pub(super) fn grow(&mut self) {
        self.attempt = self.attempt.saturating_add(1);
    }
}

/// Longest claim backoff step: the renew interval, at most 5 s.
pub(super) fn claim_backoff_cap(renew_interval: Duration) -> Duration {
    renew_interval.min(CLAIM_BACKOFF_MAX)
}

/// The pause before the next claim round, `left` before the claim
/// deadline: never past it. `None` once the deadline has passed (the claim
/// times out, exit 3).
pub(super) fn claim_pause(pause: Duration, left: Duration) -> Option<Duration> {
    (!left.is_zero()).then(|| pause.min(left))
}

/// The pauses between the attempts of one renew round: `retries` of them,
/// doubling from [`retry_base`], uncapped (at most 10 retries; each pause
/// is cut by [`retry_pause`]).
pub(super) fn renew_retries(
    renew_interval: Duration,
    retries: u32,
) -> impl Iterator<Item = Duration> {
    let steps = Backoff::new(retry_base(renew_interval), Duration::MAX).steps();
    steps.take(usize::try_from(retries).unwrap_or(usize::MAX))
}

/// The pause before the next renew attempt, `left` before the validity
/// deadline: never past it, so the round wakes at the deadline and gives
/// the ID up then rather than sending a retry after it.
pub(super) fn retry_pause(delay: Duration, left: Duration) -> Duration {
    delay.min(left)
}

/// The next renew after one confirmed on a renew sent at `sent`: one renew
/// interval after sending (the validity deadline counts from the send too).
pub(super) fn renew_after_confirmed<I: Add<Duration, Output = I>>(
    sent: I,
    renew_interval: Duration,
) -> I {
    sent + renew_interval
}

/// The next renew after a round whose attempts all failed, ending at
/// `now`: 4 retry bases later; rounds go on until the validity deadline.
pub(super) fn renew_after_failed<I: Add<Duration, Output = I>>(
    now: I,
    renew_interval: Duration,
) -> I {
    now + retry_base(renew_interval) * FAILED_ROUND_BASES
}

/// When the hold loop wakes: the next renew, or the validity deadline if
/// that comes first (the renew round then reports the loss).
pub(super) fn wake_at<I: Ord>(next_renew: I, valid_until: I) -> I {
    next_renew.min(valid_until)
}

#[cfg(test)]
mod tests {
    use tokio::time::{Instant, sleep, sleep_until, timeout_at};

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Allows a microsecond of rounding (the steps were once backon's f32).
    fn near(got: Duration, want: Duration) -> bool {
        got.abs_diff(want) < Duration::from_micros(1)
    }

    #[test]
    fn claim_backoff_doubles_from_100ms_to_the_cap() {
        let mut backoff = ClaimBackoff::new(Duration::from_secs(60));
        let mut steps = Vec::new();
        for _ in 0..9 {
            steps.push(backoff.step());
            backoff.grow();
        }
        let want = [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000];
        for (got, want) in steps.iter().zip(want) {
            assert!(near(*got, want * MS), "{steps:?}");
        }
    }

    #[test]
    fn a_short_renew_interval_caps_the_claim_backoff() {
        let mut backoff = ClaimBackoff::new(Duration::from_millis(300));
        for _ in 0..5 {
            backoff.grow();
        }
        assert_eq!(backoff.step(), 300 * MS);
        // Below 100 ms the cap is also the first step.
        assert_eq!(ClaimBackoff::new(80 * MS).step(), 80 * MS);
    }

    #[test]
    fn claim_pauses_stay_within_75_to_125_percent_of_the_step() {
        let mut backoff = ClaimBackoff::new(Duration::from_secs(60));
        for _ in 0..10 {
            backoff.grow();
        }
        let cap = claim_backoff_cap(Duration::from_secs(60));
        for _ in 0..1000 {
            let pause = backoff.pause();
            assert!(
                pause >= cap.mul_f64(0.75) && pause <= cap.mul_f64(1.25),
                "{pause:?}"
            );
        }
    }

    #[test]
    fn renew_retries_double_from_the_base_and_stop_after_retries() {
        let pauses: Vec<_> = renew_retries(Duration::from_secs(60), 3).collect();
        assert_eq!(pauses.len(), 3);
        for (got, want) in pauses.iter().zip([1000, 2000, 4000]) {
            assert!(near(*got, want * MS), "{pauses:?}");
        }
        // A quarter of a short interval; no retry at --retries 0.
        assert_eq!(retry_base(Duration::from_millis(400)), 100 * MS);
        assert_eq!(renew_retries(Duration::from_secs(60), 0).count(), 0);
        // 10 retries (the most --retries allows) keep doubling, uncapped.
        let last = renew_retries(Duration::from_secs(2), 10).last().unwrap();
        assert!(near(last, 500 * MS * 512), "{last:?}");
    }

    /// Runs one renew round whose attempts all fail, the way the keeper
    /// does: an attempt only before `valid_until`, pauses cut by it.
    /// Returns when each attempt was sent and when the round ended.
    async fn failing_round(
        valid_until: Instant,
        interval: Duration,
        retries: u32,
    ) -> (Vec<Instant>, Instant) {
        let mut sent = Vec::new();
        let mut pauses = renew_retries(interval, retries);
        loop {
            let now = Instant::now();
            if now >= valid_until {
                break;
            }
            sent.push(now);
            let Some(delay) = pauses.next() else { break };
            sleep(retry_pause(delay, valid_until - now)).await;
        }
        (sent, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn renew_retries_are_never_sent_past_the_validity_deadline() {
        let start = Instant::now();
        // Interval 2 s: pauses 500 ms, 1 s, 2 s, ...; 1.2 s of validity left.
        let valid_until = start + 1200 * MS;
        let (sent, ended) = failing_round(valid_until, Duration::from_secs(2), 10).await;
        assert_eq!(sent, [start, start + 500 * MS]);
        // The second pause (1 s) is cut at the deadline: the loss is seen
        // then, not 300 ms later.
        assert_eq!(ended, valid_until);

        // With time to spare, the round ends after its last retry.
        let start = Instant::now();
        let (sent, ended) =
            failing_round(start + Duration::from_secs(60), Duration::from_secs(2), 2).await;
        assert_eq!(sent.len(), 3);
        assert!(near(ended - start, 1500 * MS), "{:?}", ended - start);
    }

    #[tokio::test(start_paused = true)]
    async fn renews_are_scheduled_one_interval_after_sending() {
        let interval = Duration::from_secs(60);
        let sent = Instant::now();
        let valid_until = sent + Duration::from_secs(108);
        let next = renew_after_confirmed(sent, interval);
        sleep_until(wake_at(next, valid_until)).await;
        assert_eq!(Instant::now() - sent, interval);

        // A failed round: again 4 retry bases (4 s) later.
        let failed_at = Instant::now();
        let next = renew_after_failed(failed_at, interval);
        assert_eq!(next - failed_at, Duration::from_secs(4));
        // Short interval: 4 x (400 ms / 4).
        let short = renew_after_failed(failed_at, Duration::from_millis(400));
        assert_eq!(short - failed_at, 400 * MS);

        // Near the deadline the loop wakes at the deadline, not at the renew.
        let valid_until = failed_at + Duration::from_secs(3);
        sleep_until(wake_at(next, valid_until)).await;
        assert_eq!(Instant::now(), valid_until);
    }

    /// The claim loop's time accounting: each round bounded by the claim
    /// deadline, then a pause cut by it; returns when it gave up and the
    /// rounds it started.
    async fn claim_until_timeout(
        claim_timeout: Duration,
        round: Duration,
        interval: Duration,
    ) -> (Instant, u32) {
        let deadline = Instant::now() + claim_timeout;
        let mut backoff = ClaimBackoff::new(interval);
        let mut rounds = 0;
        loop {
            rounds += 1;
            // Every round finds all IDs held (or Redis down) and grows the step.
            let _ = timeout_at(deadline, sleep(round)).await;
            let pause = backoff.pause();
            backoff.grow();
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(pause) = claim_pause(pause, left) else {
                return (Instant::now(), rounds);
            };
            sleep(pause).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn claims_give_up_exactly_at_the_claim_timeout() {
        let start = Instant::now();
        let timeout = Duration::from_secs(10);
        let (gave_up, rounds) =
            claim_until_timeout(timeout, 50 * MS, Duration::from_secs(60)).await;
        assert_eq!(gave_up, start + timeout);
        // Steps 100 ms .. 3.2 s (75-125%) and 50 ms rounds: 6 pauses end
        // between 5.0 s and 8.2 s, so the 7th pause (a 5 s step: 3.75-6.25 s)
        // or, when it still ends before 10 s (about 2% of runs), the 8th is
        // cut at the deadline; one more round then finds no time left.
        assert!((8..=9).contains(&rounds), "{rounds}");

        // A round that hangs is cut at the deadline too.
        let start = Instant::now();
        let (gave_up, rounds) =
            claim_until_timeout(timeout, Duration::from_secs(60), Duration::from_secs(60)).await;
        assert_eq!((gave_up, rounds), (start + timeout, 1));
    }

    #[test]
    fn a_claim_pause_is_cut_by_the_claim_deadline() {
        assert_eq!(claim_pause(5000 * MS, 300 * MS), Some(300 * MS));
        assert_eq!(claim_pause(100 * MS, 300 * MS), Some(100 * MS));
        assert_eq!(claim_pause(100 * MS, Duration::ZERO), None);
    }
}
