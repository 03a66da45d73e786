//! Prometheus metrics of the worker mode, registered once, in the lease
//! vocabulary, with bounded labels only (no IDs, no owners).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The `outcome` label of the counters below; a closed set of values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct Outcome {
    /// e.g. `renewed`, `recreated`, `lost`, `failed`.
    pub outcome: &'static str,
}

/// Every `outcome` of `snowlease_renewals_total` (`unconfirmed`: the node that ran it is no
/// longer the Sentinel primary).
pub(crate) const RENEW_OUTCOMES: [&str; 6] = [
    "renewed",
    "recreated",
    "lost",
    "failed",
    "unconfirmed",
    "unacknowledged",
];
/// Every `outcome` of `snowlease_claim_attempts_total`.
pub(crate) const CLAIM_OUTCOMES: [&str; 9] = [
    "claimed",
    "adopted",
    "full",
    "paused",
    "evicting",
    "error",
    "unacknowledged",
    "clock_skew",
    "handover",
];

/// Counters and gauges of one worker sidecar.
#[derive(Debug, Default)]
pub(crate) struct WorkerMetrics {
    /// 1 while a valid lease is held, else 0.
    pub lease_held: Gauge,
    /// The published worker ID, -1 while none.
    pub worker_id: Gauge,
    /// How many worker IDs this sidecar claims from (`--worker-ids`, else
    /// max worker ID + 1), for ratios.
    pub worker_ids: Gauge,
    /// Other `--worker-ids` ranges recorded for the app on this Redis that
    /// share IDs with ours, at the last look (`range/record.rs`).
    pub range_overlaps: Gauge,
    /// Unix time (s) at which the closed claim guard opens; 0 otherwise.
    pub claim_guard_opens: Gauge,
    /// This node's wall clock minus Redis' TIME (s, signed), from the last
    /// claim or renew reply, half the round trip allowed for; 0 before one.
    pub clock_skew: Gauge<f64, AtomicU64>,
    /// Renew attempts by outcome: renewed, recreated, lost, failed,
    /// unconfirmed (Sentinel), unacknowledged (`--min-replicas-ack`).
    pub renewals: Family<Outcome, Counter>,
    /// Leases lost (other owner, or validity deadline passed unconfirmed).
    pub leases_lost: Counter,
    /// Keys re-created by the renew script after Redis lost them.
    pub reacquisitions: Counter,
    /// Claim attempts by outcome: claimed, adopted, full (every ID held),
    /// paused (the claim guard of every free ID is closed), evicting (Redis may
    /// evict keys, see [`crate::eviction`]), error, unacknowledged (too few
    /// replicas, `--min-replicas-ack`), clock_skew (`--max-clock-skew`).
    pub claim_attempts: Family<Outcome, Counter>,
}

impl WorkerMetrics {
    /// Registers every metric under the `snowlease_` prefix.
    pub(crate) fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("snowlease");
        r.register(
            "lease_held",
            "1 while this sidecar holds a valid worker-ID lease",
            self.lease_held.clone(),
        );
        r.register(
            "worker_id",
            "Worker ID currently published, -1 while none",
            self.worker_id.clone(),
        );
        r.register(
            "worker_ids",
            "How many worker IDs this sidecar claims from (--worker-ids, else --max-worker-id + 1)",
            self.worker_ids.clone(),
        );
        r.register(
            "worker_id_range_overlaps",
            "Other --worker-ids ranges recorded for the app on this Redis that share IDs with this sidecar's",
            self.range_overlaps.clone(),
        );
        r.register(
            "claim_guard_opens_timestamp_seconds",
            "Unix time when the closed claim guard (on Cluster: the soonest of the free IDs' guards) lets claims in; 0 while not waiting on it",
            self.claim_guard_opens.clone(),
        );
        r.register(
            "clock_skew_seconds",
            "This node's wall clock minus Redis' TIME at the last claim or renew, half the round trip allowed for",
            self.clock_skew.clone(),
        );
        r.register(
            "renewals",
            "Lease renew attempts by outcome",
            self.renewals.clone(),
        );
        r.register(
            "leases_lost",
            "Leases lost to another owner or to an unconfirmed validity deadline",
            self.leases_lost.clone(),
        );
        r.register(
            "reacquisitions",
            "Lease keys re-created after Redis lost them (restart without persistence)",
            self.reacquisitions.clone(),
        );
        r.register(
            "claim_attempts",
            "Claim attempts by outcome",
            self.claim_attempts.clone(),
        );
        self.worker_id.set(-1);
        // Every outcome at 0 from the start: a series that first appears at 1 shows no
        // `increase()`, so the first failed renewal or full claim would go unseen by alerts.
        for outcome in RENEW_OUTCOMES {
            let _ = self.renewals.get_or_create(&Outcome { outcome });
        }
        for outcome in CLAIM_OUTCOMES {
            let _ = self.claim_attempts.get_or_create(&Outcome { outcome });
        }
    }

    pub(crate) fn count(family: &Family<Outcome, Counter>, outcome: &'static str) {
        family.get_or_create(&Outcome { outcome }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every worker metric is named in base units (time in seconds).
    #[test]
    fn metric_names_use_base_units() {
        let mut registry = Registry::default();
        WorkerMetrics::default().register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let names = crate::http::assert_base_units(&text);
        assert!(
            names.contains(&"snowlease_claim_guard_opens_timestamp_seconds".to_string()),
            "{names:?}"
        );
    }

    /// Every outcome the keeper counts is one of the pre-created ones.
    #[test]
    fn counted_outcomes_are_listed() {
        // Every file of the keeper: a count may move between them.
        let keeper = [
            include_str!("keeper.rs"),
            include_str!("keeper/advice.rs"),
            include_str!("keeper/claiming.rs"),
            include_str!("keeper/gate.rs"),
            include_str!("keeper/holding.rs"),
            include_str!("keeper/release.rs"),
            include_str!("keeper/setup.rs"),
        ]
        .concat();
        for (family, listed) in [
            ("renewals", &RENEW_OUTCOMES[..]),
            ("claim_attempts", &CLAIM_OUTCOMES[..]),
        ] {
            let call = format!("count(&self.metrics.{family}, \"");
            let counted: Vec<&str> = keeper
                .match_indices(&call)
                .map(|(i, _)| keeper[i + call.len()..].split('"').next().unwrap())
                .collect();
            assert!(!counted.is_empty(), "no {call} in keeper/");
            for outcome in counted {
                assert!(listed.contains(&outcome), "{family}: {outcome} not listed");
            }
        }
    }

    /// `KNOWN_METRICS` of scripts/validate_k8s.py (the metrics alert rules may name) is
    /// exactly what the sidecar exports (mint mode's included): its families, counters with
    /// `_total`.
    #[test]
    fn known_metrics_of_the_k8s_check_are_the_exported_ones() {
        let mut registry = Registry::default();
        WorkerMetrics::default().register(&mut registry);
        crate::http::register_build_info(&mut registry);
        crate::worker_id::mint::metrics::MintMetrics::default().register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let exported: std::collections::BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| match l.split_once(' ') {
                Some((name, "counter")) => format!("{name}_total"),
                Some((name, _)) => name.to_string(),
                None => panic!("{l}"),
            })
            .collect();
        let script = include_str!("../../scripts/validate_k8s.py");
        let start = script.find("KNOWN_METRICS = {").expect("KNOWN_METRICS");
        let set = &script[start..start + script[start..].find('}').unwrap()];
        let known: std::collections::BTreeSet<String> = set
            .split('"')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        assert_eq!(known, exported);
    }
}
