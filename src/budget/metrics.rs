//! Prometheus metrics of the budget routes, registered once under
//! `snowlease_budget_`: takes by outcome, denials by budget name. Never a
//! key label; budget names are capped at [`NAMES_MAX`] (later ones count
//! as [`OTHER`], which no budget name can be), since callers choose them.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Most budget names given a label of their own.
pub(crate) const NAMES_MAX: usize = 100;

/// The label of budget names beyond [`NAMES_MAX`]: parentheses are not in
/// a budget name's characters, so no budget (`_other` included) shares it.
pub(crate) const OTHER: &str = "(other)";

/// Take outcomes; `replayed`: an acquire with a charge that answered an
/// earlier lease of its request id (charged once, when first granted).
pub(crate) const OUTCOMES: [&str; 5] = ["allowed", "denied", "replayed", "bad_input", "error"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabel {
    budget: Arc<str>,
}

/// The budget metrics of one `pool serve`.
pub(crate) struct BudgetMetrics {
    takes: Family<OutcomeLabel, Counter>,
    denials: Family<BudgetLabel, Counter>,
    penalties: Family<BudgetLabel, Counter>,
    names: Mutex<HashSet<Arc<str>>>,
}

impl BudgetMetrics {
    /// Registers the metrics, the take outcomes at 0.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let m = Self {
            takes: Family::default(),
            denials: Family::default(),
            penalties: Family::default(),
            names: Mutex::default(),
        };
        let r = registry.sub_registry_with_prefix("snowlease_budget");
        r.register(
            "takes",
            "HTTP budget takes (and acquires with a charge) by outcome: allowed, denied, replayed (an acquire's request id answered again, not charged), bad_input, error",
            m.takes.clone(),
        );
        r.register(
            "denials",
            "Budget takes denied, by budget name (at most 100 names, then (other))",
            m.denials.clone(),
        );
        r.register(
            "penalties",
            "Budget penalizes, by budget name (at most 100 names, then (other))",
            m.penalties.clone(),
        );
        for outcome in OUTCOMES {
            let _ = m.takes.get_or_create(&OutcomeLabel { outcome });
        }
        m
    }

    fn label(&self, name: &str) -> BudgetLabel {
        let mut names = self.names.lock().expect("not poisoned");
        let budget = match names.get(name) {
            Some(known) => known.clone(),
            None if names.len() < NAMES_MAX => {
                let new: Arc<str> = name.into();
                names.insert(new.clone());
                new
            }
            None => OTHER.into(),
        };
        BudgetLabel { budget }
    }

    /// Counts one take of `name` with `outcome` (one of [`OUTCOMES`]).
    pub(crate) fn took(&self, name: &str, outcome: &'static str) {
        self.takes.get_or_create(&OutcomeLabel { outcome }).inc();
        if outcome == "denied" {
            self.denials.get_or_create(&self.label(name)).inc();
        }
    }

    /// Counts one penalize of `name`.
    pub(crate) fn penalized(&self, name: &str) {
        self.penalties.get_or_create(&self.label(name)).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_beyond_the_cap_count_as_other_which_no_name_is() {
        assert!(!crate::names::is_name(OTHER));
        let mut registry = Registry::default();
        let m = BudgetMetrics::new(&mut registry);
        m.took("_other", "denied");
        for i in 0..NAMES_MAX {
            m.took(&format!("b{i}"), "denied");
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("{budget=\"_other\"} 1"), "{text}");
        assert!(text.contains("{budget=\"(other)\"} 1"), "{text}");
    }
}
