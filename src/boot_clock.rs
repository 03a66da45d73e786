//! Lease deadlines on CLOCK_BOOTTIME, which keeps counting while the
//! machine is suspended (CLOCK_MONOTONIC, behind `std` and tokio's
//! `Instant`, stops). A deadline judged on the monotonic clock would still
//! look far away after a suspend longer than the TTL, while Redis (on
//! another machine) has long let another owner take the key.
//!
//! Every validity check compares [`BootInstant::now`] with the deadline.
//! Tokio's timers run on CLOCK_MONOTONIC, so they serve as wake-ups only:
//! [`sleep_until`] sleeps at most [`WAKE_MAX`] at a time, so after a resume
//! a passed deadline is acted on within that bound (decisions in between,
//! e.g. before sending a renew, see it at once).

use std::ops::{Add, Sub};
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// Longest single timer sleep while waiting for a boot-clock deadline.
pub const WAKE_MAX: Duration = Duration::from_secs(1);

/// A point on CLOCK_BOOTTIME (time since boot, suspend included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// The current boot time.
    ///
    /// Panics only where CLOCK_BOOTTIME does not exist (Linux before
    /// 2.6.39); snowlease runs on Linux only.
    pub fn now() -> Self {
        let ts = clock_gettime(ClockId::CLOCK_BOOTTIME).expect("CLOCK_BOOTTIME is readable");
        let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
        let nanos = u32::try_from(ts.tv_nsec()).unwrap_or(0);
        Self(Duration::new(secs, nanos))
    }

    /// Time from `earlier` to `self`; zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time since `self` (suspend included); zero for a future instant.
    pub fn elapsed(self) -> Duration {
        Self::now().saturating_duration_since(self)
    }

    /// Time until `self`; zero once passed.
    pub fn remaining(self) -> Duration {
        self.saturating_duration_since(Self::now())
    }
}

impl Add<Duration> for BootInstant {
    type Output = Self;

    fn add(self, rhs: Duration) -> Self {
        Self(self.0 + rhs)
    }
}

impl Sub<Duration> for BootInstant {
    type Output = Self;

    /// Saturates at boot (zero).
    fn sub(self, rhs: Duration) -> Self {
        Self(self.0.saturating_sub(rhs))
    }
}

/// Waits until `deadline` has passed on the boot clock, waking at least
/// every [`WAKE_MAX`] (a suspend stretches each timer sleep by its length).
pub async fn sleep_until(deadline: BootInstant) {
    loop {
        let left = deadline.remaining();
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(WAKE_MAX)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_moves_forward_with_the_monotonic_clock() {
        let start = BootInstant::now();
        let mono = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let (boot, mono) = (start.elapsed(), mono.elapsed());
        assert!(boot >= Duration::from_millis(20), "{boot:?}");
        // Without a suspend in between both clocks agree closely.
        assert!(
            boot.abs_diff(mono) < Duration::from_millis(5),
            "{boot:?} {mono:?}"
        );
    }

    #[tokio::test]
    async fn sleep_until_returns_once_passed() {
        let deadline = BootInstant::now() + Duration::from_millis(30);
        sleep_until(deadline).await;
        assert!(BootInstant::now() >= deadline);
        assert_eq!(deadline.remaining(), Duration::ZERO);
    }
}
