//! What a set of lease settings rides through (docs/operations.md, "Sizing for Redis
//! outages"): the longest Redis outage during which the sidecar keeps its ID published,
//! replayed from the keeper's own timing rules ([`schedule`](super::schedule)) rather than a
//! second formula, and how long the ID of a crashed pod stays taken. The worker logs it at
//! start.

use std::time::Duration;

use super::schedule;
use crate::lease;
use crate::worker_id::args::LeaseSettings;

/// The Redis outage a sidecar rides through with its settings (standalone Redis; on
/// Sentinel the primary check and with `--min-replicas-ack` the `WAIT` add a call each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutageBudget {
    /// Ridden through wherever the outage starts (it may start just before a renew is due,
    /// one renew interval after the last confirmed one).
    pub guaranteed: Duration,
    /// Ridden through when the outage starts just after a confirmed renew.
    pub best: Duration,
}

impl OutageBudget {
    /// The budget of the sidecar's own publishing: a renew confirmed before the validity
    /// deadline (TTL - 1%) keeps the ID published.
    pub(crate) fn sidecar(settings: &LeaseSettings) -> Self {
        Self::before(settings, lease::validity(settings.ttl))
    }

    /// The budget of an app under `snowlease exec --grace G --poll P`: `exec` sends SIGTERM
    /// `G` before the deadline and sees a renewed one up to `P` late (the docs' table).
    #[cfg(test)]
    pub(crate) fn exec(settings: &LeaseSettings, grace: Duration, poll: Duration) -> Self {
        let limit = lease::validity(settings.ttl).saturating_sub(grace + poll);
        Self::before(settings, limit)
    }

    /// The budget when a renew must be sent before `limit` (from the last confirmed send):
    /// Redis back by the last attempt sent before `limit` is caught by it. Attempts either
    /// fail at once (refused) or hang for the call timeout (a black hole); the budget is the
    /// smaller of the two schedules.
    fn before(settings: &LeaseSettings, limit: Duration) -> Self {
        let last = [Duration::ZERO, settings.call_timeout()]
            .into_iter()
            .filter_map(|took| last_attempt_before(settings, took, limit))
            .min();
        match last {
            Some(last) => Self {
                guaranteed: last.saturating_sub(settings.renew_interval),
                best: last,
            },
            None => Self {
                guaranteed: Duration::ZERO,
                best: Duration::ZERO,
            },
        }
    }
}

/// How long a crashed pod's ID stays taken: its key expires one TTL after the last renew
/// Redis applied, so between TTL - renew interval and TTL after the crash.
pub(crate) fn crashed_pod_holds(settings: &LeaseSettings) -> (Duration, Duration) {
    (settings.ttl - settings.renew_interval, settings.ttl)
}

/// The send time (from the last confirmed renew's send) of the last renew attempt before
/// `limit` while Redis is down and every attempt fails after `took`: the keeper's schedule
/// (keeper/holding.rs `holding` and `renew_round`): the first renew one interval after the confirmed
/// one, `retries` retries per round with doubling pauses, the next round 4 retry bases after
/// a failed one. `None` when no attempt comes before `limit`.
fn last_attempt_before(
    settings: &LeaseSettings,
    took: Duration,
    limit: Duration,
) -> Option<Duration> {
    let interval = settings.renew_interval;
    let mut at = schedule::renew_after_confirmed(Duration::ZERO, interval);
    let mut last = None;
    loop {
        let mut pauses = schedule::renew_retries(interval, settings.retries);
        loop {
            if at >= limit {
                return last;
            }
            last = Some(at);
            at += took;
            match pauses.next() {
                Some(pause) => at += pause,
                None => break,
            }
        }
        at = schedule::renew_after_failed(at, interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(ttl: u64, renew: u64, retries: u32) -> LeaseSettings {
        LeaseSettings {
            ttl: Duration::from_secs(ttl),
            renew_interval: Duration::from_secs(renew),
            retries,
            ..LeaseSettings::default()
        }
    }

    fn secs(budget: OutageBudget) -> (u64, u64) {
        (budget.guaranteed.as_secs(), budget.best.as_secs())
    }

    /// The defaults (TTL 120 s, renew 60 s, 3 retries; validity 118.8 s): attempts at 60, 61,
    /// 63, 67 s, then rounds every 4 s after the last; hanging 5 s each, the last before the
    /// deadline is at 113 s: 53 s wherever the outage starts, 113 s right after a renew.
    #[test]
    fn defaults_ride_through_53s_and_up_to_113s() {
        let defaults = LeaseSettings::default();
        assert_eq!(secs(OutageBudget::sidecar(&defaults)), (53, 113));
        let second = Duration::from_secs(1);
        assert_eq!(
            secs(OutageBudget::exec(&defaults, 10 * second, second)),
            (44, 104)
        );
        assert_eq!(
            crashed_pod_holds(&defaults),
            (Duration::from_secs(60), Duration::from_secs(120))
        );
    }

    /// The rows of docs/operations.md's sizing table: (TTL, renew interval, retries) in s
    /// -> sidecar and `exec` (10 s grace, 1 s poll) budgets in ms (guaranteed, best).
    #[test]
    fn sizing_table_rows() {
        let second = Duration::from_secs(1);
        let rows = [
            ((30, 10, 3), (14_500, 24_500), (7_000, 17_000)),
            ((60, 20, 3), (36_000, 56_000), (22_000, 42_000)),
            ((120, 60, 3), (53_000, 113_000), (44_000, 104_000)),
            ((120, 30, 3), (84_000, 114_000), (75_000, 105_000)),
            ((120, 60, 0), (54_000, 114_000), (44_000, 104_000)),
            ((120, 60, 10), (31_000, 91_000), (31_000, 91_000)),
            ((300, 60, 3), (230_000, 290_000), (223_000, 283_000)),
            ((600, 120, 3), (471_000, 591_000), (456_000, 576_000)),
        ];
        let ms = |b: OutageBudget| (b.guaranteed.as_millis(), b.best.as_millis());
        for ((ttl, renew, retries), sidecar, exec) in rows {
            let s = settings(ttl, renew, retries);
            let row = format!("{ttl}/{renew}/{retries}");
            assert_eq!(ms(OutageBudget::sidecar(&s)), sidecar, "{row}");
            let under_exec = OutageBudget::exec(&s, 10 * second, second);
            assert_eq!(ms(under_exec), exec, "{row} under exec");
        }
    }

    /// Nothing before the limit (a grace longer than the validity): no outage at all.
    #[test]
    fn a_limit_before_the_first_renew_rides_through_nothing() {
        let s = settings(10, 5, 3);
        let budget = OutageBudget::exec(&s, Duration::from_secs(9), Duration::from_secs(1));
        assert_eq!(secs(budget), (0, 0));
    }
}
