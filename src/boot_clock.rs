//! Lease deadlines on CLOCK_BOOTTIME, which keeps counting while the
//! machine is suspended (CLOCK_MONOTONIC, behind `std` and tokio's
//! `Instant`, stops). A deadline judged on the monotonic clock would still
//! look far away after a suspend longer than the TTL, while Redis (on
//! another machine) has long let another owner take the key.
//!
//! Every validity check compares [`BootInstant::now`] with the deadline.
//! Tokio's timers run on CLOCK_MONOTONIC, so they serve as wake-ups only:
//! `sleep_until` sleeps at most `WAKE_MAX` at a time, so after a resume
//! a passed deadline is acted on within that bound (decisions in between,
//! e.g. before sending a renew, see it at once).
//!
//! The sidecar hands its deadline to `exec` and `id` in the state file on
//! this clock ([`BootInstant::as_millis`]) with the kernel's [`boot_id`]:
//! every process on the node (every container of a pod) reads the same
//! CLOCK_BOOTTIME, and, unlike the wall clock, no NTP step moves it.

use std::ops::{Add, Sub};
use std::sync::OnceLock;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// Longest single timer sleep while waiting for a boot-clock deadline.
pub(crate) const WAKE_MAX: Duration = Duration::from_secs(1);

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

    /// The instant `ms` milliseconds after boot (the state file's
    /// `valid_until_boot_ms`).
    pub fn from_millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// Milliseconds since boot, rounded down: a deadline written this way
    /// ends no later than the instant itself.
    pub fn as_millis(self) -> u64 {
        crate::timing::ms(self.0)
    }

    /// This instant on the monotonic clock (tokio and `std` timers), as
    /// seen at `now`: after a suspend it is that much closer.
    pub(crate) fn on_monotonic(self, now: std::time::Instant) -> std::time::Instant {
        now + self.remaining()
    }

    /// Time from `earlier` to `self`; zero when `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time since `self` (suspend included); zero for a future instant.
    pub(crate) fn elapsed(self) -> Duration {
        Self::now().saturating_duration_since(self)
    }

    /// Time until `self`; zero once passed.
    pub(crate) fn remaining(self) -> Duration {
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

/// The kernel's ID of this boot (`/proc/sys/kernel/random/boot_id`, a
/// UUID, the same for every process and container on the node; proc(5)),
/// read once. A boot-clock instant written under another boot ID means
/// nothing here. `None` when unreadable (no /proc): then no boot-clock
/// instant from a file is believed.
pub fn boot_id() -> Option<&'static str> {
    static BOOT_ID: OnceLock<Option<String>> = OnceLock::new();
    BOOT_ID
        .get_or_init(|| {
            let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
            Some(text.trim().to_owned()).filter(|id| !id.is_empty())
        })
        .as_deref()
}

/// Waits until `deadline` has passed on the boot clock, waking at least
/// every [`WAKE_MAX`] (a suspend stretches each timer sleep by its length).
pub(crate) async fn sleep_until(deadline: BootInstant) {
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

    #[test]
    fn millis_round_down_and_back() {
        let t = BootInstant(Duration::new(12, 345_678_901));
        assert_eq!(t.as_millis(), 12_345);
        assert!(BootInstant::from_millis(t.as_millis()) <= t);
        assert_eq!(BootInstant::from_millis(12_345).as_millis(), 12_345);
    }

    #[test]
    fn boot_id_is_the_kernels_and_stable() {
        let id = boot_id().expect("Linux has /proc/sys/kernel/random/boot_id");
        assert_eq!(id.len(), 36, "a UUID: {id}");
        assert_eq!(boot_id(), Some(id));
    }

    #[tokio::test]
    async fn sleep_until_returns_once_passed() {
        let deadline = BootInstant::now() + Duration::from_millis(30);
        sleep_until(deadline).await;
        assert!(BootInstant::now() >= deadline);
        assert_eq!(deadline.remaining(), Duration::ZERO);
    }
}
