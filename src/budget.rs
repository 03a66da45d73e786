//! Rate budgets: how many requests per second may hit a website (or an
//! account), beside the pool that says which proxy sends them. GCRA in one
//! Lua script on Redis `TIME` (`budget/take.lua`), one round trip per take;
//! the limits travel with every call (a changed rate applies at once, no
//! stored config), and every key expires when its budget is full again.
//! The contract is docs/pool.md, "Rate budgets"; names and ranges:
//! [`limits`].
//!
//! Several keys of one budget (a domain and a (proxy, domain) pair) are
//! charged all or nothing: they share the hash tag `{<name>}`, so that
//! holds on Cluster too. [`cli`] is `snowlease budget ...`; [`serve`] adds
//! `POST /budgets/{name}/take` and `/penalize` to `pool serve`.

mod charge;
pub mod cli;
mod error;
pub mod limits;
mod metrics;
mod script;
pub mod serve;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::connection::Redis;
pub use charge::{Charge, charge_key};
pub use error::BudgetError;
pub use limits::Rate;
pub use script::{BudgetScript, budget_key};

use limits::{BURST, COST, KEYS_PER_CALL, PENALTY_MS};

/// The limit of one key: `rate` on average, up to `burst` at once from a
/// full budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The average rate (see [`Rate`] for ranges).
    pub rate: Rate,
    /// Units a full budget allows at once: 1 to 1,000,000, and a full
    /// burst refills within 30 days (burst / rate).
    pub burst: u64,
}

impl Limit {
    /// The script's three arguments: rate_count, rate_period_ms, burst.
    /// Errors name `keys[<i>].rate` or `keys[<i>].burst`.
    fn args(&self, i: usize) -> Result<[u64; 3], BudgetError> {
        let (count, period) = self.rate.checked(KeyField::part(i, "rate"))?;
        let burst = limits::int(KeyField::part(i, "burst"), self.burst, BURST)?;
        // burst * period / count <= max, exact (no division), as the script.
        let refill = u128::from(burst) * u128::from(period);
        if refill > u128::from(limits::WINDOW_MS.max) * u128::from(count) {
            return Err(BudgetError::bad(
                KeyField::part(i, "burst"),
                format!(
                    "a burst that refills within {} ms at the rate (burst / rate)",
                    limits::WINDOW_MS.max
                ),
            ));
        }
        Ok([count, period, burst])
    }
}

/// The name of key `i`'s field in errors, `keys[<i>]` or
/// `keys[<i>].<part>`: formatted only into an error, since the checks run
/// on every take.
#[derive(Debug, Clone, Copy)]
struct KeyField {
    i: usize,
    part: &'static str,
}

impl KeyField {
    fn part(i: usize, part: &'static str) -> Self {
        Self { i, part }
    }
}

impl fmt::Display for KeyField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.part {
            "" => write!(f, "keys[{}]", self.i),
            part => write!(f, "keys[{}].{part}", self.i),
        }
    }
}

/// One key of a take, with its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetKey {
    /// The key within the budget, e.g. a domain: 1-128 chars of
    /// `[A-Za-z0-9_.:-]`.
    pub key: String,
    /// Its limit.
    pub limit: Limit,
}

impl BudgetKey {
    /// `key` limited by `rate` and `burst`.
    pub fn new(key: impl Into<String>, rate: Rate, burst: u64) -> Self {
        Self {
            key: key.into(),
            limit: Limit { rate, burst },
        }
    }
}

/// The answer to a take (and the budget half of an acquire with a charge).
/// Times are whole ms, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Taken {
    /// True when every key was charged; false when none was.
    pub allowed: bool,
    /// The cost that could still be taken now (smallest over the keys).
    pub remaining: u64,
    /// When this take would be allowed, ms from now; 0 when allowed.
    pub retry_after_ms: u64,
    /// When every key is full again (and its Redis key gone), ms from now.
    pub reset_after_ms: u64,
    /// Redis time of the take, ms.
    pub at_ms: u64,
}

impl Taken {
    /// [`Taken::retry_after_ms`] as a duration.
    pub fn retry_after(&self) -> Duration {
        Duration::from_millis(self.retry_after_ms)
    }
}

/// The answer to a penalize. Times are whole ms, rounded up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Penalized {
    /// When a take of 1 is allowed again, ms from now.
    pub retry_after_ms: u64,
    /// When every key is full again, ms from now.
    pub reset_after_ms: u64,
    /// Redis time of the call, ms.
    pub at_ms: u64,
}

/// A handle on one named budget. Cheap to clone.
#[derive(Clone)]
pub struct Budget<C = Redis> {
    conn: C,
    name: Arc<str>,
    /// Where its keys are: `snowlease:budget:{<name>}:` or, for the keys a
    /// pool's acquire charges, `{<pool>}:budget:<name>:`.
    prefix: Arc<str>,
}

impl<C> fmt::Debug for Budget<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Checks keys and limits; answers the script's KEYS (under `prefix`) and
/// the per-key ARGV. Shared with the pool's acquire with a charge.
pub(crate) fn checked_keys(
    prefix: &str,
    keys: &[BudgetKey],
) -> Result<(Vec<String>, Vec<u64>), BudgetError> {
    if !KEYS_PER_CALL.allows(keys.len() as u64) {
        let (min, max) = (KEYS_PER_CALL.min, KEYS_PER_CALL.max);
        return Err(BudgetError::bad("keys", format!("{min}-{max} keys")));
    }
    let mut names = Vec::with_capacity(keys.len());
    let mut args = Vec::with_capacity(3 * keys.len());
    for (i, k) in keys.iter().enumerate() {
        let field = KeyField::part(i, "");
        limits::key(field, &k.key)?;
        let full = format!("{prefix}{}", k.key);
        if names.contains(&full) {
            return Err(BudgetError::bad(field, "each key once"));
        }
        names.push(full);
        args.extend(k.limit.args(i)?);
    }
    Ok((names, args))
}

/// Checks `cost` against its range and every key's burst.
pub(crate) fn checked_cost(cost: u64, keys: &[BudgetKey]) -> Result<u64, BudgetError> {
    let cost = limits::int("cost", cost, COST)?;
    match keys.iter().map(|k| k.limit.burst).min() {
        Some(burst) if cost > burst => Err(BudgetError::bad(
            "cost",
            format!("at most the burst ({burst})"),
        )),
        _ => Ok(cost),
    }
}

impl<C> Budget<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    /// A handle on budget `name` (1-64 chars of `[A-Za-z0-9_-]`). Touches
    /// no Redis key.
    ///
    /// Errors: [`BudgetError::BadInput`] for a bad name.
    pub fn new(conn: C, name: &str) -> Result<Self, BudgetError> {
        if !crate::names::is_name(name) {
            return Err(BudgetError::bad("name", crate::names::name_rule()));
        }
        Ok(Self {
            conn,
            name: name.into(),
            prefix: budget_key(name, "").into(),
        })
    }

    /// A handle on budget `name` as acquires of `pool` charge it
    /// (`pool::acquire_charged`): keys `{<pool>}:budget:<name>:<key>`, to take
    /// from or penalize the same budget outside an acquire.
    ///
    /// Errors: [`BudgetError::BadInput`] for a bad pool or budget name.
    pub fn in_pool(conn: C, pool: &str, name: &str) -> Result<Self, BudgetError> {
        if !crate::names::is_name(pool) {
            return Err(BudgetError::bad("pool", crate::names::name_rule()));
        }
        let mut budget = Self::new(conn, name)?;
        budget.prefix = charge_key(pool, name, "").into();
        Ok(budget)
    }

    /// The budget name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `script` with `head` and the keys and limits [`checked_keys`]
    /// answered (checked once per call by the caller, not again here).
    async fn run(
        &self,
        script: BudgetScript,
        head: u64,
        (names, args): (Vec<String>, Vec<u64>),
    ) -> Result<redis::Value, BudgetError> {
        let mut inv = script.script().prepare_invoke();
        for name in &names {
            inv.key(name);
        }
        inv.arg(head);
        for arg in args {
            inv.arg(arg);
        }
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async(&mut conn).await?)
    }

    /// Charges `cost` (1 to the smallest burst) to every key, or to none,
    /// in one script call.
    ///
    /// Errors: [`BudgetError::BadInput`] (1-16 distinct keys, see
    /// [`Limit`] and [`Rate`] for ranges), [`BudgetError::WrongKeyType`],
    /// [`BudgetError::Redis`] (fail closed: treat as denied).
    pub async fn take(&self, keys: &[BudgetKey], cost: u64) -> Result<Taken, BudgetError> {
        // Keys first: a bad burst is named before the cost it bounds.
        let checked = checked_keys(&self.prefix, keys)?;
        let cost = checked_cost(cost, keys)?;
        let value = self.run(BudgetScript::Take, cost, checked).await?;
        taken(script::ints(BudgetScript::Take, value, 5)?)
    }

    /// Takes, retrying a denial by its `retry_after_ms` until `wait` has
    /// passed (the last attempt when it runs out) or `stop` is cancelled.
    /// Returns the last denial if none was allowed in time, at once when
    /// its `retry_after_ms` is beyond what is left of `wait`.
    ///
    /// Errors: as [`Budget::take`], returned at once.
    pub async fn take_wait(
        &self,
        keys: &[BudgetKey],
        cost: u64,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Result<Taken, BudgetError> {
        let start = Instant::now();
        let mut attempt: u32 = 0;
        loop {
            let taken = self.take(keys, cost).await?;
            let left = wait.saturating_sub(start.elapsed());
            // Under GCRA nobody can make a retry come sooner: one beyond
            // the wait is the answer now, not after sleeping the wait out.
            if taken.allowed || left.is_zero() || taken.retry_after() > left || stop.is_cancelled()
            {
                return Ok(taken);
            }
            // Others may take first: waiters spread past the hint.
            let sleep =
                crate::timing::denied_pause(taken.retry_after(), attempt, left, &mut rand::rng());
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = stop.cancelled() => return Ok(taken),
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// Pushes every key back by `penalty` (whole ms, 1 ms to 1 day): no
    /// take is allowed before Redis now + `penalty`, then the budget
    /// refills from empty at its rate. For a target that answered 429 or
    /// 503 with a Retry-After. A key already further back is kept.
    ///
    /// Errors: as [`Budget::take`].
    pub async fn penalize(
        &self,
        keys: &[BudgetKey],
        penalty: Duration,
    ) -> Result<Penalized, BudgetError> {
        let penalty = limits::millis("penalty", penalty, PENALTY_MS)?;
        let checked = checked_keys(&self.prefix, keys)?;
        let value = self.run(BudgetScript::Penalize, penalty, checked).await?;
        let [retry_after_ms, reset_after_ms, at_ms] =
            script::ints(BudgetScript::Penalize, value, 3)?[..]
        else {
            unreachable!("ints checked the length")
        };
        Ok(Penalized {
            retry_after_ms,
            reset_after_ms,
            at_ms,
        })
    }
}

/// A take's reply: allowed, remaining, retry_after_ms, reset_after_ms, now_ms.
pub(crate) fn taken(reply: Vec<u64>) -> Result<Taken, BudgetError> {
    let [allowed, remaining, retry_after_ms, reset_after_ms, at_ms] = reply[..] else {
        return Err(BudgetError::Reply {
            script: "take",
            detail: format!("expected 5 items, got {reply:?}"),
        });
    };
    Ok(Taken {
        allowed: allowed == 1,
        remaining,
        retry_after_ms,
        reset_after_ms,
        at_ms,
    })
}
