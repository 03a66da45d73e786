//! Prometheus metrics of `pool serve`, registered once; labels are only the
//! configured pool name and a closed set of outcomes (never ids or tokens).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::PoolStatus;

/// The `pool` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolLabel {
    pub(crate) pool: Arc<str>,
}

/// The `pool` and `outcome` labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolOutcome {
    pub(crate) pool: Arc<str>,
    pub(crate) outcome: &'static str,
}

/// Acquire wait buckets, seconds: 1 ms to 60 s (the longest HTTP wait).
const WAIT_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS)
}

/// Metrics of every served pool.
pub(crate) struct PoolMetrics {
    ready_due: Family<PoolLabel, Gauge>,
    ready_cooling: Family<PoolLabel, Gauge>,
    leases_valid: Family<PoolLabel, Gauge>,
    leases_expired: Family<PoolLabel, Gauge>,
    disabled: Family<PoolLabel, Gauge>,
    quarantined: Family<PoolLabel, Gauge>,
    auto_disabled: Family<PoolLabel, Gauge>,
    quarantines: Family<PoolLabel, Counter>,
    /// Unix seconds (ms precision): a float gauge, since Prometheus' base unit is seconds.
    status_time: Family<PoolLabel, Gauge<f64, AtomicU64>>,
    acquire_wait: Family<PoolOutcome, Histogram, fn() -> Histogram>,
    acquires: Family<PoolOutcome, Counter>,
    releases: Family<PoolOutcome, Counter>,
    extends: Family<PoolOutcome, Counter>,
    reaped: Family<PoolLabel, Counter>,
}

/// Outcomes of acquire: an id leased, none due in time, acquires closed
/// after a Redis restart or failover (a possible rollback), a budget's
/// denial, an error.
pub(crate) const ACQUIRE_OUTCOMES: [&str; 5] = [
    "leased",
    "empty",
    "closed_after_rollback",
    "budget_denied",
    "error",
];
/// Outcomes of release and extend besides their success.
pub(crate) const LOST_OUTCOMES: [&str; 3] = ["other_owner", "expired", "error"];

impl PoolMetrics {
    /// Registers every metric under `snowlease_pool_`, with the counters of
    /// each pool in `pools` at 0 so rates work from the start.
    pub(crate) fn new(registry: &mut Registry, pools: &[Arc<str>]) -> Self {
        let m = Self {
            ready_due: Family::default(),
            ready_cooling: Family::default(),
            leases_valid: Family::default(),
            leases_expired: Family::default(),
            disabled: Family::default(),
            quarantined: Family::default(),
            auto_disabled: Family::default(),
            quarantines: Family::default(),
            status_time: Family::default(),
            acquire_wait: Family::new_with_constructor(wait_histogram),
            acquires: Family::default(),
            releases: Family::default(),
            extends: Family::default(),
            reaped: Family::default(),
        };
        let r = registry.sub_registry_with_prefix("snowlease_pool");
        r.register(
            "ready_due",
            "Ids in ready whose due time has come (leasable now)",
            m.ready_due.clone(),
        );
        r.register(
            "ready_cooling",
            "Ids in ready still cooling down",
            m.ready_cooling.clone(),
        );
        r.register(
            "leases_valid",
            "Leases whose deadline is in the future",
            m.leases_valid.clone(),
        );
        r.register(
            "leases_expired",
            "Leases past their deadline, not yet reclaimed",
            m.leases_expired.clone(),
        );
        r.register(
            "disabled",
            "Disabled ids, leased or not",
            m.disabled.clone(),
        );
        r.register(
            "quarantined",
            "Quarantined ids that are not disabled",
            m.quarantined.clone(),
        );
        r.register(
            "auto_disabled",
            "Ids disabled by strikes (counted in disabled too)",
            m.auto_disabled.clone(),
        );
        r.register(
            "quarantines",
            "Releases into quarantine through this API",
            m.quarantines.clone(),
        );
        r.register(
            "status_timestamp_seconds",
            "Redis time (Unix seconds, ms precision) of the counts above",
            m.status_time.clone(),
        );
        r.register(
            "acquire_wait_seconds",
            "Time an HTTP acquire took, including its wait, by outcome",
            m.acquire_wait.clone(),
        );
        r.register(
            "acquires",
            "HTTP acquires by outcome: leased, empty, budget_denied, error",
            m.acquires.clone(),
        );
        r.register(
            "releases",
            "HTTP releases by outcome: released, other_owner, expired, error",
            m.releases.clone(),
        );
        r.register(
            "extends",
            "HTTP extends by outcome: extended, capped, other_owner, expired, error",
            m.extends.clone(),
        );
        r.register(
            "reaped",
            "Expired leases reclaimed by the background reaper",
            m.reaped.clone(),
        );
        for pool in pools {
            let label = |outcome| PoolOutcome {
                pool: pool.clone(),
                outcome,
            };
            for outcome in ACQUIRE_OUTCOMES {
                let _ = m.acquires.get_or_create(&label(outcome));
            }
            for outcome in ["released"].into_iter().chain(LOST_OUTCOMES) {
                let _ = m.releases.get_or_create(&label(outcome));
            }
            for outcome in ["extended", "capped"].into_iter().chain(LOST_OUTCOMES) {
                let _ = m.extends.get_or_create(&label(outcome));
            }
            let _ = m.reaped.get_or_create(&PoolLabel { pool: pool.clone() });
            let _ = m
                .quarantines
                .get_or_create(&PoolLabel { pool: pool.clone() });
        }
        m
    }

    /// Sets the gauges of `pool` from a status count.
    pub(crate) fn set_status(&self, pool: &Arc<str>, status: &PoolStatus) {
        let label = PoolLabel { pool: pool.clone() };
        let set = |family: &Family<PoolLabel, Gauge>, n: u64| {
            family
                .get_or_create(&label)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set(&self.ready_due, status.ready_due);
        set(&self.ready_cooling, status.ready_cooling);
        set(&self.leases_valid, status.leases_valid);
        set(&self.leases_expired, status.leases_expired);
        set(&self.disabled, status.disabled);
        set(&self.quarantined, status.quarantined);
        set(&self.auto_disabled, status.auto_disabled);
        self.status_time
            .get_or_create(&label)
            .set(status.now_ms as f64 / 1000.0);
    }

    /// Counts one acquire and observes how long it took.
    pub(crate) fn acquired(&self, pool: &Arc<str>, outcome: &'static str, took: Duration) {
        let label = PoolOutcome {
            pool: pool.clone(),
            outcome,
        };
        self.acquires.get_or_create(&label).inc();
        self.acquire_wait
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }

    /// Counts one release.
    pub(crate) fn released(&self, pool: &Arc<str>, outcome: &'static str) {
        count(&self.releases, pool, outcome);
    }

    /// Counts one extend.
    pub(crate) fn extended(&self, pool: &Arc<str>, outcome: &'static str) {
        count(&self.extends, pool, outcome);
    }

    /// Counts one release into quarantine.
    pub(crate) fn quarantined(&self, pool: &Arc<str>) {
        self.quarantines
            .get_or_create(&PoolLabel { pool: pool.clone() })
            .inc();
    }

    /// Counts leases the reaper reclaimed.
    pub(crate) fn reaped(&self, pool: &Arc<str>, n: u64) {
        self.reaped
            .get_or_create(&PoolLabel { pool: pool.clone() })
            .inc_by(n);
    }
}

fn count(family: &Family<PoolOutcome, Counter>, pool: &Arc<str>, outcome: &'static str) {
    family
        .get_or_create(&PoolOutcome {
            pool: pool.clone(),
            outcome,
        })
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pool_and_outcome_labels() {
        let mut registry = Registry::default();
        let pool: Arc<str> = "proxies".into();
        let metrics = PoolMetrics::new(&mut registry, std::slice::from_ref(&pool));
        metrics.set_status(
            &pool,
            &PoolStatus {
                now_ms: 5,
                ready_due: 3,
                ready_cooling: 1,
                leases_valid: 2,
                leases_expired: 0,
                disabled: 1,
                quarantined: 2,
                auto_disabled: 1,
                quarantine: Vec::new(),
                auto_disabled_ids: Vec::new(),
                disabled_ids: vec!["vn-b02".into()],
                leases: Vec::new(),
                gate: crate::pool::Gate::Open,
                closed_until_ms: None,
            },
        );
        metrics.acquired(&pool, "leased", Duration::from_millis(3));
        metrics.quarantined(&pool);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("snowlease_pool_ready_due{pool=\"proxies\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("snowlease_pool_status_timestamp_seconds{pool=\"proxies\"} 0.005"),
            "{text}"
        );
        assert!(
            text.contains("snowlease_pool_acquires_total{pool=\"proxies\",outcome=\"leased\"} 1")
        );
        assert!(
            text.contains("snowlease_pool_quarantined{pool=\"proxies\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("snowlease_pool_auto_disabled{pool=\"proxies\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("snowlease_pool_quarantines_total{pool=\"proxies\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "snowlease_pool_releases_total{pool=\"proxies\",outcome=\"other_owner\"} 0"
            )
        );
        assert!(text.contains("snowlease_pool_acquire_wait_seconds_bucket{le=\"0.005\",pool=\"proxies\",outcome=\"leased\"} 1"), "{text}");
        let names = crate::http::assert_base_units(&text);
        assert!(
            names.contains(&"snowlease_pool_status_timestamp_seconds".to_string()),
            "{names:?}"
        );
        for line in text.lines().filter(|l| l.contains('{')) {
            let labels = &line[line.find('{').unwrap() + 1..line.find('}').unwrap()];
            for pair in labels.split(',') {
                let name = pair.split('=').next().unwrap();
                assert!(["pool", "outcome", "le"].contains(&name), "{line}");
            }
        }
    }
}
