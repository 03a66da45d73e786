//! Prometheus metrics of the worker mode, registered once, in the lease
//! vocabulary, with bounded labels only (no IDs, no owners).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The `outcome` label of the counters below; a closed set of values.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// e.g. `renewed`, `recreated`, `lost`, `failed`.
    pub outcome: &'static str,
}

/// Counters and gauges of one worker sidecar.
#[derive(Debug, Default)]
pub struct WorkerMetrics {
    /// 1 while a valid lease is held, else 0.
    pub lease_held: Gauge,
    /// The published worker ID, -1 while none.
    pub worker_id: Gauge,
    /// How many worker IDs the app has (max worker ID + 1), for ratios.
    pub worker_ids: Gauge,
    /// Unix time (s) at which the closed claim guard opens; 0 otherwise.
    pub claim_guard_opens: Gauge,
    /// Renew attempts by outcome: renewed, recreated, lost, failed.
    pub renewals: Family<Outcome, Counter>,
    /// Leases lost (other owner, or validity deadline passed unconfirmed).
    pub leases_lost: Counter,
    /// Keys re-created by the renew script after Redis lost them.
    pub reacquisitions: Counter,
    /// Claim attempts by outcome: claimed, adopted, full (every ID held),
    /// paused (claim guard closed after a Redis reset), evicting (Redis may
    /// evict keys, see [`crate::eviction`]), error.
    pub claim_attempts: Family<Outcome, Counter>,
}

impl WorkerMetrics {
    /// Registers every metric under the `snowlease_` prefix.
    pub fn register(&self, registry: &mut Registry) {
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
            "How many worker IDs the app has (--max-worker-id + 1)",
            self.worker_ids.clone(),
        );
        r.register(
            "claim_guard_opens_timestamp_seconds",
            "Unix time when the app's closed claim guard lets claims in; 0 while not waiting on it",
            self.claim_guard_opens.clone(),
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
    }

    pub(crate) fn count(family: &Family<Outcome, Counter>, outcome: &'static str) {
        family.get_or_create(&Outcome { outcome }).inc();
    }
}
