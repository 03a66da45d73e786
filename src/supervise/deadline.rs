//! When `exec` and `lock` stop the command: the deadline math (in `exec`'s words; `lock` maps its lease deadline the same way).
//!
//! The published deadline (`valid_until`: the state file's
//! `valid_until_boot_ms` on the boot clock, or `lease_expires_in_ms` of
//! `GET /id` from the request's send; mapped onto the monotonic clock at
//! each use, so no wall-clock step moves it) is the last moment the lease is
//! surely ours; Redis lets another pod claim the ID only about 1% of the TTL
//! (at least 100 ms) later. So the command must be *gone* by the deadline,
//! not merely start stopping there. `exec` treats the ID as expiring
//! `--grace` early:
//!
//! - **Deadline.** Unless a re-read finds the lease renewed, SIGTERM at
//!   `valid_until - grace` and SIGKILL at `valid_until`. While the sidecar
//!   renews on schedule this never fires: before each renewal TTL - margin -
//!   renew interval is left (58.8 s with the defaults), and the grace must
//!   stay well below that.
//! - **Grace cap.** A grace that long would stop a healthy command before
//!   every renewal, so the grace used is capped at a quarter of the longest
//!   validity seen in a reading (about TTL - margin). The sidecar renews
//!   with about half of it left (its renew interval is at most TTL/2), which
//!   leaves a quarter for the renewal's round trip. The cap only ever
//!   shortens the time between SIGTERM and SIGKILL; it never delays them.
//! - **Loss** (the ID disappears or changes, `/id` answers 503): the lease may
//!   already be someone else's, so SIGTERM at once and SIGKILL after the
//!   grace, but never after the deadline of the last fresh reading:
//!   `min(now + grace, valid_until)`. Without a deadline (an ID file without
//!   state file) after the grace.

use std::time::{Duration, Instant};

/// The grace rules of one `exec` run (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    /// `--grace`.
    grace: Duration,
    /// Longest time left until the deadline seen in a reading.
    longest: Option<Duration>,
}

impl Deadlines {
    /// Rules for `--grace`, before any reading.
    pub(crate) fn new(grace: Duration) -> Self {
        Self {
            grace,
            longest: None,
        }
    }

    /// Notes a reading taken at `read_at` that is valid until `valid_until`
    /// (`None`: no deadline). Returns true when this shortened the grace
    /// used below `--grace` for the first time (worth a warning).
    pub(crate) fn observe(&mut self, valid_until: Option<Instant>, read_at: Instant) -> bool {
        let Some(valid_until) = valid_until else {
            return false;
        };
        let was_capped = self.grace() < self.grace;
        let left = valid_until.saturating_duration_since(read_at);
        self.longest = Some(self.longest.map_or(left, |l| l.max(left)));
        !was_capped && self.grace() < self.grace
    }

    /// The grace used: `--grace`, at most a quarter of the longest validity
    /// seen.
    pub(crate) fn grace(&self) -> Duration {
        self.longest.map_or(self.grace, |l| self.grace.min(l / 4))
    }

    /// The longest validity seen so far (for logs).
    pub(crate) fn longest(&self) -> Option<Duration> {
        self.longest
    }

    /// When to send SIGTERM unless a re-read finds the lease renewed: the
    /// grace before the deadline; `None` without a deadline.
    pub(crate) fn term_at(&self, valid_until: Option<Instant>) -> Option<Instant> {
        valid_until.map(|t| t.checked_sub(self.grace()).unwrap_or(t.min(Instant::now())))
    }

    /// True when a reading valid until `valid_until` is due for SIGTERM at
    /// `now` (its deadline is within the grace).
    pub(crate) fn expiring(&self, valid_until: Option<Instant>, now: Instant) -> bool {
        self.term_at(valid_until).is_some_and(|t| now >= t)
    }

    /// When to send SIGKILL after SIGTERM at `stopped`: after the grace, but
    /// never after the deadline `valid_until` of the last fresh reading.
    pub(crate) fn kill_at(&self, stopped: Instant, valid_until: Option<Instant>) -> Instant {
        let after_grace = stopped + self.grace();
        valid_until.map_or(after_grace, |t| t.min(after_grace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn deadline_stop_starts_grace_early_and_kills_at_the_deadline() {
        let now = Instant::now();
        let mut rules = Deadlines::new(s(10));
        // Defaults: TTL 120 s - margin 1.2 s, renewed every 60 s.
        let valid_until = now + Duration::from_millis(118_800);
        assert!(!rules.observe(Some(valid_until), now));
        assert_eq!(rules.grace(), s(10));
        assert_eq!(rules.term_at(Some(valid_until)), Some(valid_until - s(10)));
        // Just before the renewal 58.8 s are left: far from stopping.
        assert!(!rules.expiring(Some(valid_until), now + s(60)));
        // Frozen sidecar: SIGTERM 10 s early, SIGKILL at the deadline.
        let term = valid_until - s(10);
        assert!(!rules.expiring(Some(valid_until), term - Duration::from_millis(1)));
        assert!(rules.expiring(Some(valid_until), term));
        assert_eq!(rules.kill_at(term, Some(valid_until)), valid_until);
        // Without a deadline nothing expires and SIGKILL follows the grace.
        assert_eq!(rules.term_at(None), None);
        assert!(!rules.expiring(None, now + s(1_000)));
        assert_eq!(rules.kill_at(now, None), now + s(10));
    }

    #[test]
    fn loss_kills_after_the_grace_but_never_after_the_deadline() {
        let now = Instant::now();
        let mut rules = Deadlines::new(s(10));
        let valid_until = now + s(100);
        rules.observe(Some(valid_until), now);
        // Loss long before the deadline: the full grace.
        assert_eq!(rules.kill_at(now, Some(valid_until)), now + s(10));
        // Loss 3 s before the deadline: SIGKILL at the deadline.
        let late = valid_until - s(3);
        assert_eq!(rules.kill_at(late, Some(valid_until)), valid_until);
        // Deadline already passed: SIGKILL at once.
        let after = valid_until + s(1);
        assert!(rules.kill_at(after, Some(valid_until)) <= after);
    }

    #[test]
    fn grace_is_capped_at_a_quarter_of_the_longest_validity() {
        let now = Instant::now();
        // Test-sized lease: TTL 2 s - margin 100 ms, renewed every 500 ms.
        let mut rules = Deadlines::new(s(10));
        assert_eq!(rules.grace(), s(10), "no reading yet");
        assert!(rules.observe(Some(now + Duration::from_millis(1_400)), now));
        assert_eq!(rules.grace(), Duration::from_millis(350));
        // A longer validity raises the cap, a shorter one keeps it; warned once.
        assert!(!rules.observe(Some(now + Duration::from_millis(1_900)), now));
        assert!(!rules.observe(Some(now + Duration::from_millis(1_000)), now));
        assert_eq!(rules.grace(), Duration::from_millis(475));
        assert_eq!(rules.longest(), Some(Duration::from_millis(1_900)));
        // Just before each renewal 1.4 s are left: no stop.
        let valid_until = now + Duration::from_millis(1_900);
        assert!(!rules.expiring(Some(valid_until), now + Duration::from_millis(500)));
        // Frozen: SIGTERM 475 ms early, SIGKILL at the deadline.
        let term = rules.term_at(Some(valid_until)).unwrap();
        assert_eq!(term, valid_until - Duration::from_millis(475));
        assert_eq!(rules.kill_at(term, Some(valid_until)), valid_until);
        // A grace below the cap is kept.
        let mut short = Deadlines::new(Duration::from_millis(300));
        assert!(!short.observe(Some(valid_until), now));
        assert_eq!(short.grace(), Duration::from_millis(300));
    }
}
