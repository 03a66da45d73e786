//! The timing kit every mode shares: Redis calls bounded by a timeout,
//! `Duration`s in the whole milliseconds of logs, Lua ARGV and JSON
//! (saturating, never a lossy cast), the renew retry base, and one
//! exponential backoff with one jitter.
//!
//! `Duration` inside, units only at the edges: these conversions are those
//! edges. Each rule is a pure function, unit-tested below.
//!
//! The kit owns the timeouts: elsewhere a Redis call is bounded by
//! [`bounded`] (with [`COMMAND_CALL_TIMEOUT`] for one-off commands) and any
//! other wait by [`within`]; `tests/it/house.rs` fails on a raw
//! `tokio::time::timeout` outside its short allowlist.

use std::time::Duration;

use rand::Rng;
use redis::{RedisError, RedisResult};

/// Longest first renew retry pause (1 s).
const RETRY_BASE_MAX: Duration = Duration::from_secs(1);
/// Most jitter added to an exact next-due hint, so waiters do not all wake
/// at once.
const HINT_JITTER: Duration = Duration::from_millis(10);
/// The shortest pause between two acquire attempts of a waiter (no hot loop).
pub(crate) const MIN_WAIT_PAUSE: Duration = Duration::from_millis(5);

/// The bound of each Redis call of a one-off command that holds no lease (`status`,
/// `guard open`, `mint carry-over`): 5 s, long enough for a loaded Redis, short enough for
/// a deploy hook to fail rather than hang.
pub(crate) const COMMAND_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// The waiters' backoff (`pool acquire --wait`, HTTP acquire, `lock --wait`):
/// 10 ms doubling per empty attempt up to 500 ms.
pub(crate) const WAIT_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_millis(500));

/// `d` in whole milliseconds (rounded down), `u64::MAX` past it.
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A lease TTL in the ms of `PX` / `PEXPIRE`: rounded down, at least 1 (Redis
/// refuses 0), saturating.
pub(crate) fn ttl_ms(ttl: Duration) -> u64 {
    ms(ttl).max(1)
}

/// `d` cut to whole milliseconds (what a ms field can say of it).
pub(crate) fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(ms(d))
}

/// `d` in whole seconds, rounded up (e.g. `Retry-After`), saturating.
pub(crate) fn secs_ceil(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// First renew retry pause, for worker and lock alike: a quarter of the
/// renew interval, at most 1 s.
pub(crate) fn retry_base(renew_interval: Duration) -> Duration {
    (renew_interval / 4).min(RETRY_BASE_MAX)
}

/// Runs one Redis call under `limit`; a timeout becomes an I/O timeout
/// error (see [`timed_out`]), so it classifies as transient: the call may
/// have run.
pub(crate) async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(timed_out(limit)),
    }
}

/// Waits for `work` up to `limit`: `None` when it did not finish in time
/// (it is dropped). For waits that are no Redis call (a task's end, a
/// notification); a Redis call goes through [`bounded`], whose timeout
/// classifies as transient.
pub(crate) async fn within<F: Future>(limit: Duration, work: F) -> Option<F::Output> {
    tokio::time::timeout(limit, work).await.ok()
}

/// The error of a Redis call that got no reply within `limit`: an I/O
/// error of kind `TimedOut`, "redis call timed out after N ms".
pub(crate) fn timed_out(limit: Duration) -> RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("redis call timed out after {} ms", ms(limit)),
    )
    .into()
}

/// An exponential backoff: `first`, doubling per attempt, at most `cap`
/// (`Duration::MAX`: uncapped). Steps before jitter; see [`jitter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Backoff {
    first: Duration,
    cap: Duration,
}

impl Backoff {
    /// Steps from `first` doubling up to `cap`; a `cap` below `first` is
    /// also the first step.
    pub(crate) const fn new(first: Duration, cap: Duration) -> Self {
        Self { first, cap }
    }

    /// The step of attempt `attempt` (0: the first), saturating.
    pub(crate) fn step(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
        self.first.saturating_mul(factor).min(self.cap)
    }

    /// The steps from the first, one per attempt, endless.
    pub(crate) fn steps(self) -> impl Iterator<Item = Duration> {
        (0u32..).map(move |attempt| self.step(attempt))
    }
}

/// A random pause from `lo` to `hi` (microsecond steps): spreads the
/// retries of many processes.
pub(crate) fn jitter(lo: Duration, hi: Duration, rng: &mut impl Rng) -> Duration {
    let micros = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let (lo, hi) = (micros(lo), micros(hi));
    Duration::from_micros(rng.random_range(lo.min(hi)..=hi))
}

/// 75-125% of `base`: the sidecars' retry spread. Not backon's 0-100%,
/// which would stretch a pause to twice its cap.
pub(crate) fn spread(base: Duration) -> Duration {
    jitter(base * 3 / 4, base * 5 / 4, &mut rand::rng())
}

/// How long a waiter sleeps after an empty acquire attempt `attempt`
/// (`pool acquire --wait`, HTTP acquire, `lock --wait`): the next-due hint
/// when it is near, else [`WAIT_BACKOFF`] jittered to 50-100% of its step,
/// never less than [`MIN_WAIT_PAUSE`] (no hot loop) and never past
/// `remaining`. `hint` is exact for a cooling pool id, an upper bound when
/// it comes from a lease deadline (leases are often released early), so
/// the backoff bounds it; `None` means nothing becomes due by itself.
pub(crate) fn wait_pause(
    hint: Option<Duration>,
    attempt: u32,
    remaining: Duration,
    rng: &mut impl Rng,
) -> Duration {
    let step = WAIT_BACKOFF.step(attempt);
    let backoff = jitter(step / 2, step, rng);
    let pause = match hint {
        Some(hint) => (hint + jitter(Duration::ZERO, HINT_JITTER, rng)).min(backoff),
        None => backoff,
    };
    pause.max(MIN_WAIT_PAUSE).min(remaining)
}

/// Most doublings of [`denied_pause`]'s spread: after 5 denials in a row a waiter wakes within
/// `retry_after` to 33 x `retry_after`.
const DENIED_SPREAD_DOUBLINGS: u32 = 5;

/// How long a waiter sleeps after its `attempt`-th denial in a row by a rate budget (GCRA,
/// `budget take --wait`, a charged acquire's wait): never before `retry_after` (nobody can
/// make a unit come sooner), plus a spread of 0 to 2^min(attempt, 5) x `retry_after`, never
/// past `remaining`. Every waiter denied at once hears the same `retry_after`; without the
/// spread all of them woke together and all but one were denied again (30 waiters on 10/s:
/// 16.5 script calls per admission measured; 7.3 with it, `tests/it/budget.rs`). The cost: a
/// lone waiter may wait up to twice the hint on its first retry.
pub(crate) fn denied_pause(
    retry_after: Duration,
    attempt: u32,
    remaining: Duration,
    rng: &mut impl Rng,
) -> Duration {
    let base = retry_after.max(Duration::from_millis(1));
    let spread = base.saturating_mul(1 << attempt.min(DENIED_SPREAD_DOUBLINGS));
    (base + jitter(Duration::ZERO, spread, rng)).min(remaining)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn ms_conversions_saturate_instead_of_wrapping() {
        assert_eq!(ms(Duration::from_micros(1999)), 1);
        assert_eq!(ms(Duration::MAX), u64::MAX);
        assert_eq!(ttl_ms(Duration::from_micros(10)), 1);
        assert_eq!(ttl_ms(Duration::MAX), u64::MAX);
        assert_eq!(whole_ms(Duration::from_micros(2500)), 2 * MS);
        assert_eq!(secs_ceil(Duration::ZERO), 0);
        assert_eq!(secs_ceil(1001 * MS), 2);
        assert_eq!(secs_ceil(Duration::from_secs(3)), 3);
        assert_eq!(secs_ceil(Duration::MAX), u64::MAX);
    }

    #[test]
    fn the_retry_base_is_a_quarter_of_the_interval_at_most_1s() {
        assert_eq!(retry_base(400 * MS), 100 * MS);
        assert_eq!(retry_base(Duration::from_secs(60)), Duration::from_secs(1));
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_saturates() {
        let backoff = Backoff::new(100 * MS, 5000 * MS);
        let steps: Vec<_> = backoff.steps().take(8).collect();
        let want = [100, 200, 400, 800, 1600, 3200, 5000, 5000];
        assert_eq!(steps, want.map(|n| n * MS));
        assert_eq!(backoff.step(u32::MAX), 5000 * MS);
        let uncapped = Backoff::new(MS, Duration::MAX);
        assert_eq!(uncapped.step(10), 1024 * MS);
        assert_eq!(uncapped.step(200), MS * u32::MAX);
        // A cap below the first step is the first step.
        assert_eq!(Backoff::new(100 * MS, 80 * MS).step(0), 80 * MS);
    }

    #[test]
    fn denied_pauses_never_come_before_the_hint_and_spread_with_each_denial() {
        let mut rng = rand::rng();
        let hint = Duration::from_millis(100);
        let big = Duration::from_secs(3600);
        for attempt in 0..8 {
            let most = hint * (1 + (1 << attempt.min(5)));
            let pauses: Vec<_> = (0..500)
                .map(|_| denied_pause(hint, attempt, big, &mut rng))
                .collect();
            assert!(pauses.iter().all(|p| *p >= hint && *p <= most), "{attempt}");
            // Spread out, not all at the hint: the widest bucket holds few.
            let late = pauses
                .iter()
                .filter(|p| **p > hint + (most - hint) / 2)
                .count();
            assert!(late > 100, "{attempt}: {late} of 500 in the later half");
        }
        let short = Duration::from_millis(30);
        assert_eq!(denied_pause(hint, 3, short, &mut rng), short);
        assert!(denied_pause(Duration::ZERO, 0, big, &mut rng) >= Duration::from_millis(1));
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let mut rng = rand::rng();
        for _ in 0..1000 {
            let j = jitter(5 * MS, 10 * MS, &mut rng);
            assert!((5 * MS..=10 * MS).contains(&j), "{j:?}");
            let s = spread(100 * MS);
            assert!((75 * MS..=125 * MS).contains(&s), "{s:?}");
        }
        assert_eq!(jitter(MS, MS, &mut rng), MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bounded_call_times_out_into_a_transient_io_error() {
        let never = std::future::pending::<RedisResult<()>>();
        let err = bounded(250 * MS, never).await.unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert!(
            err.to_string()
                .contains("redis call timed out after 250 ms")
        );
        assert_eq!(bounded(MS, async { Ok(7) }).await.unwrap(), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_within_a_limit_is_none_past_it() {
        assert_eq!(within(MS, std::future::pending::<()>()).await, None);
        assert_eq!(within(MS, async { 7 }).await, Some(7));
    }

    #[test]
    fn wait_pauses_never_go_below_the_floor_nor_past_the_wait() {
        let mut rng = rand::rng();
        let cap = WAIT_BACKOFF.step(u32::MAX);
        for attempt in 0..40 {
            for hint in [None, Some(Duration::ZERO), Some(Duration::from_secs(30))] {
                let s = wait_pause(hint, attempt, LONG, &mut rng);
                assert!(s >= MIN_WAIT_PAUSE && s <= cap, "{attempt} {hint:?} {s:?}");
                let short = Duration::from_millis(2);
                assert_eq!(wait_pause(hint, attempt, short, &mut rng), short);
            }
        }
        assert_eq!(
            wait_pause(None, 3, Duration::ZERO, &mut rng),
            Duration::ZERO
        );
    }

    #[test]
    fn a_near_hint_is_followed_with_a_little_jitter() {
        let mut rng = rand::rng();
        let hint = Duration::from_millis(40);
        for _ in 0..100 {
            let s = wait_pause(Some(hint), 10, LONG, &mut rng);
            assert!(s >= hint && s <= hint + HINT_JITTER, "{s:?}");
        }
    }

    #[test]
    fn a_far_hint_is_bounded_by_the_growing_backoff() {
        let mut rng = rand::rng();
        let far = Some(Duration::from_secs(30));
        let base = WAIT_BACKOFF.step(0);
        for _ in 0..100 {
            let first = wait_pause(far, 0, LONG, &mut rng);
            assert!(first <= base, "{first:?}");
            let later = wait_pause(far, 4, LONG, &mut rng);
            assert!(later >= base * 4 && later <= base * 16, "{later:?}");
        }
    }
}
