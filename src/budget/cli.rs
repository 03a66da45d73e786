//! `snowlease budget take|penalize`: the flags (with env twins), checked
//! into a [`BudgetCliConfig`] before Redis is touched, then one call that
//! prints one JSON object; a denial is [`BudgetDenied`] (exit 6, see
//! [`crate::exit`]).

use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use tokio_util::sync::CancellationToken;

use super::limits::{self, BURST, CLI_WAIT_MS, COST, PENALTY_MS, Range};
use super::{Budget, BudgetError, BudgetKey, Rate, Taken, checked_cost, checked_keys};
use crate::cli::{
    ConfigError, LogFormat, REDIS_TIMEOUT, RedisArgs, check_range, parse_duration, whole,
};
use crate::connection::RedisTarget;

/// Flags of `snowlease budget`.
#[derive(Args)]
pub struct BudgetArgs {
    /// The budget operation.
    #[command(subcommand)]
    pub command: BudgetCommand,
}

/// The operations of `snowlease budget`.
#[derive(Subcommand)]
pub enum BudgetCommand {
    /// Charge --cost to every --key at once, or to none; prints {"allowed","remaining","retry_after_ms",...}; exit 6 when denied.
    Take(TakeArgs),
    /// Push keys back after the target answered 429/503 with a Retry-After (--penalty).
    Penalize(PenalizeArgs),
}

/// The keys of one budget and their limits.
#[derive(Args)]
pub struct BudgetTarget {
    /// Budget name N: 1-64 chars of [A-Za-z0-9_-]; its keys are snowlease:budget:{N}:<key>.
    #[arg(long, env = "SNOWLEASE_BUDGET")]
    pub name: String,

    /// Use the budget's keys in pool P, {P}:budget:N:<key>: the ones `pool acquire --pool P --budget N` charges.
    #[arg(long)]
    pub pool: Option<String>,

    /// A key of the budget, e.g. a domain (1-128 chars of [A-Za-z0-9_.:-]); repeat for several: take charges them all or none, penalize pushes back each.
    #[arg(long = "key", required = true)]
    pub keys: Vec<String>,

    /// Average rate, e.g. 10/s, 600/m, 5/2s, 1/250ms (1-1000000 per 1ms-1d); once for every key, or once per --key in order.
    #[arg(long = "rate", required = true)]
    pub rates: Vec<Rate>,

    /// Units a full budget allows at once (1-1000000); once for every key, or once per --key in order.
    #[arg(long = "burst", required = true,
        value_parser = whole::<u64>(BURST.min, BURST.max), allow_negative_numbers = true)]
    pub bursts: Vec<u64>,

    /// Where Redis is.
    #[command(flatten)]
    pub(crate) redis: RedisArgs,
}

/// Flags of `budget take`.
#[derive(Args)]
pub struct TakeArgs {
    /// The budget, its keys and limits.
    #[command(flatten)]
    pub target: BudgetTarget,

    /// Units to charge every key (1 to the smallest burst).
    #[arg(long, default_value_t = 1,
        value_parser = whole::<u64>(COST.min, COST.max), allow_negative_numbers = true)]
    pub cost: u64,

    /// Retry a denial for this long (0s-24h), sleeping retry_after_ms plus a spread; then exit 6.
    #[arg(long, env = "SNOWLEASE_BUDGET_WAIT", default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,
}

/// Flags of `budget penalize`.
#[derive(Args)]
pub struct PenalizeArgs {
    /// The budget, its keys and limits.
    #[command(flatten)]
    pub target: BudgetTarget,

    /// No take before now + this (1ms-1d, whole ms): the target's Retry-After.
    #[arg(long, value_parser = parse_duration)]
    pub penalty: Duration,
}

/// A take denied within `--wait` (exit 6); the JSON with `retry_after_ms`
/// is on stdout.
#[derive(Debug, thiserror::Error)]
#[error("denied by budget {name}: retry after {retry_after_ms} ms")]
pub struct BudgetDenied {
    /// The budget.
    pub name: String,
    /// When the take would be allowed, ms from the last attempt.
    pub retry_after_ms: u64,
}

/// A validated `snowlease budget` command.
pub struct BudgetCliConfig {
    redis: RedisTarget,
    redis_timeout: Duration,
    allow_evicting_redis: bool,
    name: String,
    pool: Option<String>,
    keys: Vec<BudgetKey>,
    op: BudgetOp,
}

enum BudgetOp {
    Take { cost: u64, wait: Duration },
    Penalize(Duration),
}

impl BudgetArgs {
    /// The log format flag of the chosen command.
    pub fn log_format(&self) -> LogFormat {
        self.target().redis.log.log_format
    }

    fn target(&self) -> &BudgetTarget {
        match &self.command {
            BudgetCommand::Take(a) => &a.target,
            BudgetCommand::Penalize(a) => &a.target,
        }
    }

    /// Checks every flag; the first violation names its flag. Touches no
    /// Redis key.
    pub fn validate(&self) -> Result<BudgetCliConfig, ConfigError> {
        let t = self.target();
        let redis_timeout = t.redis.redis_timeout;
        REDIS_TIMEOUT.check(redis_timeout)?;
        if !crate::names::is_name(&t.name) {
            return Err(ConfigError::new(
                "--name",
                format!("{:?} must be {}", t.name, crate::names::name_rule()),
            ));
        }
        if let Some(pool) = &t.pool
            && !crate::names::is_name(pool)
        {
            return Err(ConfigError::new(
                "--pool",
                format!("{pool:?} must be {}", crate::names::name_rule()),
            ));
        }
        let keys = keys(&t.keys, &t.rates, &t.bursts, TAKE_FLAGS)?;
        let op = match &self.command {
            BudgetCommand::Take(a) => {
                let cost = checked_cost(a.cost, &keys).map_err(|e| flag_error("--cost", e))?;
                range("--wait", a.wait, CLI_WAIT_MS)?;
                BudgetOp::Take { cost, wait: a.wait }
            }
            BudgetCommand::Penalize(a) => {
                limits::millis("penalty", a.penalty, PENALTY_MS)
                    .map_err(|e| flag_error("--penalty", e))?;
                BudgetOp::Penalize(a.penalty)
            }
        };
        Ok(BudgetCliConfig {
            redis: t.redis.redis.target()?,
            redis_timeout,
            allow_evicting_redis: t.redis.eviction.allow_evicting_redis,
            name: t.name.clone(),
            pool: t.pool.clone(),
            keys,
            op,
        })
    }
}

/// The flags of keys, rates and bursts: `budget take`'s or `pool acquire`'s.
const TAKE_FLAGS: [&str; 3] = ["--key", "--rate", "--burst"];
const CHARGE_FLAGS: [&str; 3] = ["--budget-key", "--budget-rate", "--budget-burst"];

/// The keys with their limits: rates and bursts once for all, or once per key.
fn keys(
    names: &[String],
    rates: &[Rate],
    bursts: &[u64],
    [key_flag, rate_flag, burst_flag]: [&'static str; 3],
) -> Result<Vec<BudgetKey>, ConfigError> {
    let n = names.len();
    let pick = |flag: &'static str, given: usize| match given {
        1 => Ok(false),
        g if g == n => Ok(true),
        g => Err(ConfigError::new(
            flag,
            format!("given {g} times for {n} {key_flag}: give it once, or once per {key_flag}"),
        )),
    };
    let (per_rate, per_burst) = (
        pick(rate_flag, rates.len())?,
        pick(burst_flag, bursts.len())?,
    );
    let keys: Vec<BudgetKey> = names
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let rate = rates[if per_rate { i } else { 0 }];
            BudgetKey::new(key, rate, bursts[if per_burst { i } else { 0 }])
        })
        .collect();
    checked_keys("", &keys).map_err(|err| match &err {
        BudgetError::BadInput { field, .. } if field.ends_with(".rate") => {
            flag_error(rate_flag, err)
        }
        BudgetError::BadInput { field, .. } if field.ends_with(".burst") => {
            flag_error(burst_flag, err)
        }
        _ => flag_error(key_flag, err),
    })?;
    Ok(keys)
}

fn flag_error(flag: &'static str, err: BudgetError) -> ConfigError {
    match err {
        BudgetError::BadInput { field, expected } => {
            ConfigError::new(flag, format!("{field}: expected {expected}"))
        }
        other => ConfigError::new(flag, other.to_string()),
    }
}

fn range(flag: &'static str, d: Duration, range: Range) -> Result<(), ConfigError> {
    check_range(
        flag,
        d,
        Duration::from_millis(range.min),
        Duration::from_millis(range.max),
    )
}

/// Runs one validated command and prints its JSON. A denied take prints
/// too, then fails with [`BudgetDenied`]. Redis errors fail (exit 1): the
/// caller must treat them as denied.
pub async fn run(config: BudgetCliConfig) -> anyhow::Result<()> {
    let redis = config.redis.clone();
    let mut conn = config.redis.connect(config.redis_timeout)?;
    // An evicting Redis may drop a budget's key: the budget would be full
    // again, a limit (or a penalty) that does not hold.
    if !config.allow_evicting_redis {
        let evicting = crate::eviction::check(&mut conn)
            .await
            .with_context(|| format!("redis {redis}"))?;
        if let Some(evicting) = evicting {
            return Err(crate::eviction::EvictingBudgets(evicting).into());
        }
    }
    let budget = match &config.pool {
        Some(pool) => Budget::in_pool(conn, pool, &config.name)?,
        None => Budget::new(conn, &config.name)?,
    };
    match config.op {
        BudgetOp::Take { cost, wait } => {
            let taken = budget
                .take_wait(&config.keys, cost, wait, &CancellationToken::new())
                .await
                .with_context(|| format!("redis {redis}"))?;
            crate::cli::stdout_line(&take_json(&config.name, &taken).to_string())?;
            if !taken.allowed {
                return Err(BudgetDenied {
                    name: config.name,
                    retry_after_ms: taken.retry_after_ms,
                }
                .into());
            }
        }
        BudgetOp::Penalize(penalty) => {
            let p = budget
                .penalize(&config.keys, penalty)
                .await
                .with_context(|| format!("redis {redis}"))?;
            let mut value = serde_json::to_value(p)?;
            value["name"] = config.name.into();
            crate::cli::stdout_line(&value.to_string())?;
        }
    }
    Ok(())
}

/// A take as JSON: `{"name", "allowed", "remaining", "retry_after_ms", "reset_after_ms", "at_ms"}`.
pub(crate) fn take_json(name: &str, taken: &Taken) -> serde_json::Value {
    let mut value = serde_json::to_value(taken).unwrap_or_default();
    value["name"] = name.into();
    value
}

/// `pool acquire --budget ...`: a charge made with the acquire, atomically.
#[derive(Args)]
pub struct ChargeArgs {
    /// Lease only together with a charge to this rate budget (1-64 chars of [A-Za-z0-9_-]);
    /// its keys are {<pool>}:budget:<name>:<key>. Denied: exit 6, retry_after_ms on stdout.
    #[arg(long, requires_all = ["budget_keys", "budget_rates", "budget_bursts"])]
    pub budget: Option<String>,

    /// A key to charge with --budget, e.g. the domain (repeat for several, charged all or nothing).
    #[arg(long = "budget-key", requires = "budget")]
    pub budget_keys: Vec<String>,

    /// The rate of --budget, e.g. 10/s; once for every key, or once per --budget-key.
    #[arg(long = "budget-rate", requires = "budget")]
    pub budget_rates: Vec<Rate>,

    /// The burst of --budget (1-1000000); once for every key, or once per --budget-key.
    #[arg(long = "budget-burst", requires = "budget",
        value_parser = whole::<u64>(BURST.min, BURST.max), allow_negative_numbers = true)]
    pub budget_bursts: Vec<u64>,

    /// Units charged to every --budget-key (1 to the smallest burst).
    #[arg(long, default_value_t = 1, requires = "budget",
        value_parser = whole::<u64>(COST.min, COST.max), allow_negative_numbers = true)]
    pub budget_cost: u64,
}

impl ChargeArgs {
    /// The checked charge, or `None` without `--budget`.
    pub fn charge(&self, pool: &str) -> Result<Option<super::Charge>, ConfigError> {
        let Some(budget) = &self.budget else {
            return Ok(None);
        };
        if !crate::names::is_name(budget) {
            return Err(ConfigError::new(
                "--budget",
                format!("{budget:?} must be {}", crate::names::name_rule()),
            ));
        }
        let keys = keys(
            &self.budget_keys,
            &self.budget_rates,
            &self.budget_bursts,
            CHARGE_FLAGS,
        )?;
        let charge = super::Charge {
            budget: budget.clone(),
            keys,
            cost: self.budget_cost,
        };
        charge
            .checked(pool)
            .map_err(|e| flag_error("--budget-cost", e))?;
        Ok(Some(charge))
    }
}

/// A denied acquire with a charge: prints the denial's JSON, answers
/// [`BudgetDenied`] (exit 6).
pub(crate) fn denied(pool: &str, budget: &str, taken: &Taken) -> anyhow::Error {
    let mut value = take_json(budget, taken);
    value["pool"] = pool.into();
    if let Err(err) = crate::cli::stdout_line(&value.to_string()) {
        return err;
    }
    BudgetDenied {
        name: budget.to_owned(),
        retry_after_ms: taken.retry_after_ms,
    }
    .into()
}
