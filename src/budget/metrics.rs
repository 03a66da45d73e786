//! Prometheus metrics of the budget routes, registered once under
//! `snowlease_budget_`: takes by outcome, denials by budget name. Never a
//! key label; budget names are capped at [`NAMES_MAX`] (later ones count
//! as `_other`), since callers choose them.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Most budget names given a label of their own.
pub(crate) const NAMES_MAX: usize = 100;

/// Take outcomes.
pub(crate) const OUTCOMES: [&str; 4] = ["allowed", "denied", "bad_input", "error"];

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
            "HTTP budget takes (and acquires with a charge) by outcome: allowed, denied, bad_input, error",
            m.takes.clone(),
        );
        r.register(
            "denials",
            "Budget takes denied, by budget name (at most 100 names, then _other)",
            m.denials.clone(),
        );
        r.register(
            "penalties",
            "Budget penalizes, by budget name (at most 100 names, then _other)",
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
            None => "_other".into(),
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
