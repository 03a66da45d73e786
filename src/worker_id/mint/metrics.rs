//! Prometheus metrics of mint mode, in the style of the worker's (`worker_id::metrics`):
//! registered once, bounded labels only (a closed set of states; no IDs).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The `state` label of `snowlease_mint_unavailable_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabel {
    /// A [`super::minter::MintRefusal::state`].
    pub state: &'static str,
}

/// Every state a `/next` 503 names ([`super::minter::MintRefusal::state`]), exported at 0 from
/// the start so an alert's `increase()` sees the first one.
pub(crate) const UNAVAILABLE_STATES: [&str; 13] = [
    "claiming",
    "guard_closed",
    "clock_skew",
    "handover",
    "evicting",
    "unacknowledged",
    "readopting",
    "lost",
    "stopping",
    "clock_behind",
    "reserving",
    "expired",
    "layout_exhausted",
];

/// Counters and gauges of minting.
#[derive(Debug, Default)]
pub(crate) struct MintMetrics {
    /// IDs answered by `/next`.
    pub minted: Counter,
    /// `/next` answered 503, by the state it named.
    pub unavailable: Family<StateLabel, Counter>,
    /// The mark's lead over the minting clock (s, signed; negative once past it), as of the
    /// last [`Self::set_mark_lead`]; 0 without a lease.
    pub mark_lead: Gauge<f64, AtomicU64>,
    /// Times a request waited for the next ms: that ms's sequence ran out.
    pub sequence_waits: Counter,
}

impl MintMetrics {
    /// Registers every metric under the `snowlease_` prefix.
    pub(crate) fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("snowlease");
        r.register("ids_minted", "IDs answered by /next", self.minted.clone());
        r.register(
            "mint_unavailable",
            "/next answered 503, by the state it named",
            self.unavailable.clone(),
        );
        r.register(
            "mint_mark_lead_seconds",
            "The high-water mark's lead over the minting clock (negative once past it); 0 without a lease",
            self.mark_lead.clone(),
        );
        r.register(
            "mint_sequence_waits",
            "Waits for the next millisecond after its sequence ran out",
            self.sequence_waits.clone(),
        );
        for state in UNAVAILABLE_STATES {
            let _ = self.unavailable.get_or_create(&StateLabel { state });
        }
    }

    /// Counts one 503 naming `state`.
    pub(crate) fn count_unavailable(&self, state: &'static str) {
        self.unavailable.get_or_create(&StateLabel { state }).inc();
    }

    /// Sets the mark's lead (ms, from [`super::minter::Minter::mark_lead_ms`]; `None`
    /// without a lease).
    pub(crate) fn set_mark_lead(&self, lead_ms: Option<i64>) {
        self.mark_lead.set(lead_ms.unwrap_or(0) as f64 / 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::super::minter::{MintRefusal, Standby};
    use super::*;

    fn encoded(metrics: &MintMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    /// Names in base units; every state at 0 from the start; the lead in seconds.
    #[test]
    fn mint_metrics_are_in_base_units_and_start_at_zero() {
        let metrics = MintMetrics::default();
        metrics.set_mark_lead(Some(-1_500));
        metrics.count_unavailable("clock_behind");
        let text = encoded(&metrics);
        let names = crate::http::assert_base_units(&text);
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(
            text.contains("snowlease_mint_mark_lead_seconds -1.5"),
            "{text}"
        );
        assert!(text.contains("snowlease_mint_unavailable_total{state=\"clock_behind\"} 1"));
        assert!(text.contains("snowlease_mint_unavailable_total{state=\"lost\"} 0"));
        assert!(text.contains("snowlease_ids_minted_total 0"));
    }

    /// Every state a refusal names is one of the pre-created ones.
    #[test]
    fn every_refusal_state_is_listed() {
        let standbys = [
            Standby::Claiming,
            Standby::GuardClosed,
            Standby::ClockSkew,
            Standby::Handover,
            Standby::Evicting,
            Standby::Unacknowledged(1),
            Standby::Readopting,
            Standby::Lost,
            Standby::Stopping,
        ];
        let refusals = standbys.map(MintRefusal::NoLease).into_iter().chain([
            MintRefusal::ClockBehind { wait_ms: 1 },
            MintRefusal::NeedsReservation,
            MintRefusal::LeaseInvalid,
            MintRefusal::LayoutExhausted,
        ]);
        let named: Vec<&str> = refusals.map(MintRefusal::state).collect();
        assert_eq!(named, UNAVAILABLE_STATES);
    }
}
