//! A charge to a rate budget made together with a pool acquire (the
//! acquire itself is `pool::charged`): which budget, keys and cost, checked,
//! and where its keys live. The budget's keys live in the pool's hash tag,
//! `{<pool>}:budget:<name>:<key>`, so this works on Cluster; they are not
//! the keys of `budget take` (`snowlease:budget:{<name>}:<key>`).

use super::{BudgetError, BudgetKey, checked_cost, checked_keys};

/// A charge made together with a pool acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The budget name: 1-64 chars of `[A-Za-z0-9_-]`.
    pub budget: String,
    /// The keys charged, all or none (1-16, see [`BudgetKey`]).
    pub keys: Vec<BudgetKey>,
    /// Units charged to every key: 1 to the smallest burst.
    pub cost: u64,
}

impl Charge {
    /// The prefix of this charge's keys in `pool`.
    fn prefix(&self, pool: &str) -> String {
        format!("{{{pool}}}:budget:{}:", self.budget)
    }

    /// Checks the charge: its KEYS and the head of its ARGV.
    pub(crate) fn checked(&self, pool: &str) -> Result<(Vec<String>, Vec<String>), BudgetError> {
        if !crate::names::is_name(&self.budget) {
            return Err(BudgetError::bad("budget", crate::names::name_rule()));
        }
        let (keys, args) = checked_keys(&self.prefix(pool), &self.keys)?;
        let cost = checked_cost(self.cost, &self.keys)?;
        let mut head = vec![keys.len().to_string(), cost.to_string()];
        head.extend(args.iter().map(u64::to_string));
        Ok((keys, head))
    }
}

/// The Redis key of `key` of budget `budget` charged with acquires of
/// `pool`: `{<pool>}:budget:<budget>:<key>`. Not checked here.
pub fn charge_key(pool: &str, budget: &str, key: &str) -> String {
    format!("{{{pool}}}:budget:{budget}:{key}")
}
