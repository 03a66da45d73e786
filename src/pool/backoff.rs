//! How long `acquire_wait` sleeps after an empty acquire: the next-due hint
//! when it is near, else an exponential backoff, with jitter, never less
//! than a floor (no hot loop) and never past the caller's wait.

use std::time::Duration;

use rand::Rng;

/// The shortest sleep between two attempts.
pub(crate) const MIN_SLEEP: Duration = Duration::from_millis(5);
/// The first backoff step; it doubles per empty attempt.
const BASE: Duration = Duration::from_millis(10);
/// The longest backoff step.
const CAP: Duration = Duration::from_millis(500);
/// Most jitter added to an exact hint, so waiters do not all wake at once.
const HINT_JITTER: Duration = Duration::from_millis(10);

/// The sleep before attempt `attempt + 1`. `hint` is the script's
/// next-due time: exact for a cooling id, an upper bound when it comes
/// from a lease deadline (leases are often released early), so the
/// backoff bounds it; `None` means nothing becomes due by itself.
pub(crate) fn sleep_for(
    hint: Option<Duration>,
    attempt: u32,
    remaining: Duration,
    rng: &mut impl Rng,
) -> Duration {
    let step = BASE.saturating_mul(1 << attempt.min(16)).min(CAP);
    let backoff = jitter(step / 2, step, rng);
    let sleep = match hint {
        Some(hint) => (hint + jitter(Duration::ZERO, HINT_JITTER, rng)).min(backoff),
        None => backoff,
    };
    sleep.max(MIN_SLEEP).min(remaining)
}

fn jitter(lo: Duration, hi: Duration, rng: &mut impl Rng) -> Duration {
    let micros = rng.random_range(lo.as_micros() as u64..=hi.as_micros() as u64);
    Duration::from_micros(micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn never_below_the_floor_nor_past_the_wait() {
        let mut rng = rand::rng();
        for attempt in 0..40 {
            for hint in [None, Some(Duration::ZERO), Some(Duration::from_secs(30))] {
                let s = sleep_for(hint, attempt, LONG, &mut rng);
                assert!(s >= MIN_SLEEP && s <= CAP, "{attempt} {hint:?} {s:?}");
                let short = Duration::from_millis(2);
                assert_eq!(sleep_for(hint, attempt, short, &mut rng), short);
            }
        }
        assert_eq!(sleep_for(None, 3, Duration::ZERO, &mut rng), Duration::ZERO);
    }

    #[test]
    fn a_near_hint_is_followed_with_a_little_jitter() {
        let mut rng = rand::rng();
        let hint = Duration::from_millis(40);
        for _ in 0..100 {
            let s = sleep_for(Some(hint), 10, LONG, &mut rng);
            assert!(s >= hint && s <= hint + HINT_JITTER, "{s:?}");
        }
    }

    #[test]
    fn a_far_hint_is_bounded_by_the_growing_backoff() {
        let mut rng = rand::rng();
        let far = Some(Duration::from_secs(30));
        for _ in 0..100 {
            let first = sleep_for(far, 0, LONG, &mut rng);
            assert!(first <= BASE, "{first:?}");
            let later = sleep_for(far, 4, LONG, &mut rng);
            assert!(later >= BASE * 4 && later <= BASE * 16, "{later:?}");
        }
    }
}
