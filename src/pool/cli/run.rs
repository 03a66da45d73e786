//! Runs a validated `snowlease pool` command against Redis: prints its
//! JSON (or the status table) on stdout; the errors behind exit codes 2-4.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context;

use crate::connection::Redis;
use serde_json::json;

use super::{Op, PoolCliConfig, StrikesChange, human};
use crate::pool::ChargedAcquire;
use crate::pool::hint::hint_words;
use crate::pool::{
    Acquired, Extended, Gate, LostReason, Pool, PoolOptions, PoolStatus, Released, StrikePolicy,
};

/// Most reap calls one `pool reap` makes.
const REAP_ROUNDS: usize = 1000;

/// Why a pool command ended without doing its job (exit 3 and 4, see [`crate::exit`]).
#[derive(Debug, thiserror::Error)]
pub enum PoolCliError {
    /// Acquire found no id due within `--wait`.
    #[error("nothing due in pool {pool} within --wait {wait}; {hint}")]
    NothingDue {
        /// The pool.
        pool: String,
        /// The wait, as typed.
        wait: String,
        /// When the next id is due, in words.
        hint: String,
    },
    /// Release or extend of a lease that is lost; nothing was changed.
    #[error("lease of {id} in pool {pool} is lost ({}): {}", .reason.as_str(), .reason.describe())]
    NotOwner {
        /// The pool.
        pool: String,
        /// The id.
        id: String,
        /// Why.
        reason: LostReason,
    },
}

impl PoolCliError {
    fn lost(pool: &str, id: &str, reason: LostReason) -> Self {
        Self::NotOwner {
            pool: pool.to_owned(),
            id: id.to_owned(),
            reason,
        }
    }
}

/// Runs one validated command: prints its result on stdout; `serve` runs
/// until SIGTERM/SIGINT.
///
/// Errors: [`PoolCliError`] (exit 3, 4), [`crate::pool::PoolError`] and others; see
/// `failure::code_of`.
pub async fn run(config: PoolCliConfig) -> anyhow::Result<()> {
    if let Op::Serve(serve) = config.op {
        let shutdown = crate::shutdown::listen()?;
        return crate::pool::serve::run(serve, shutdown).await;
    }
    let mut conn = config.redis.connect(config.redis_timeout)?;
    // No lease is granted or prolonged, and no pool is filled, on a Redis
    // that may evict its keys (a pool set up there fails at its first
    // acquire, or loses ids and fences later); release, reap and the rest
    // run (they only give back or count).
    let leases_or_fills = matches!(
        config.op,
        Op::Acquire { .. } | Op::Extend { .. } | Op::Init(..) | Op::Add(..)
    );
    if leases_or_fills && !config.allow_evicting_redis {
        let evicting = crate::eviction::check(&mut conn)
            .await
            .with_context(|| format!("redis {}", config.redis))?;
        if let Some(evicting) = evicting {
            return Err(evicting.into());
        }
    }
    let out = match execute(conn, config.op).await {
        Ok(out) => out,
        // Only failures of Redis itself need to say which Redis.
        Err(err) if !is_pool_answer(&err) => {
            return Err(err.context(format!("redis {}", config.redis)));
        }
        Err(err) => return Err(err),
    };
    if let Some(out) = out {
        crate::cli::stdout_line(&out)?;
    }
    Ok(())
}

/// True for the errors that are the pool's answer (exit 2, 3, 4) or a
/// budget's denial (exit 6), not a failure of Redis itself (exit 1), which
/// must say which Redis.
fn is_pool_answer(err: &anyhow::Error) -> bool {
    err.is::<PoolCliError>()
        || err.is::<crate::budget::cli::BudgetDenied>()
        || err
            .downcast_ref::<crate::pool::PoolError>()
            .is_some_and(crate::pool::PoolError::is_bad_input)
}

/// Runs `op`; returns what to print, or `None` when it printed itself
/// (acquire, which must release when its result cannot be delivered).
async fn execute(conn: Redis, op: Op) -> anyhow::Result<Option<String>> {
    let open =
        |pool: &str, max_lease: Duration| Pool::new(conn.clone(), pool, PoolOptions { max_lease });
    let default = PoolOptions::default().max_lease;
    let out = match op {
        Op::Init(pool, ids, strikes) => {
            let added = open(&pool, default)?.init_with(&ids, strikes).await?;
            json!({ "pool": pool, "added": added })
        }
        Op::Add(pool, ids) => {
            let added = open(&pool, default)?.add(&ids).await?;
            json!({ "pool": pool, "added": added })
        }
        Op::Disable(pool, ids) => {
            let disabled = open(&pool, default)?.disable(&ids).await?;
            json!({ "pool": pool, "disabled": disabled })
        }
        Op::Enable { pool, ids, force } => {
            let handle = open(&pool, default)?;
            let enabled = if force {
                handle.enable_force(&ids).await?
            } else {
                handle.enable(&ids).await?
            };
            json!({ "pool": pool, "enabled": enabled })
        }
        Op::Config { pool, set } => {
            let handle = open(&pool, default)?;
            let strikes = match set {
                StrikesChange::Read => handle.strikes().await?,
                StrikesChange::Off => handle.set_strikes(None).await?,
                StrikesChange::Set(policy) => handle.set_strikes(Some(policy)).await?,
            };
            config_json(&pool, strikes)
        }
        Op::Acquire {
            pool,
            req,
            wait,
            max_lease,
            charge,
        } => {
            let handle = open(&pool, max_lease)?;
            let acquired = match &charge {
                None => handle.acquire_wait(&req, wait).await?,
                Some(charge) => {
                    let stop = tokio_util::sync::CancellationToken::new();
                    match crate::pool::acquire_charged_wait(&handle, &req, charge, wait, &stop)
                        .await?
                    {
                        ChargedAcquire::Acquired(acquired) => acquired,
                        ChargedAcquire::Denied(taken) => {
                            return Err(crate::budget::cli::denied(&pool, &charge.budget, &taken));
                        }
                    }
                }
            };
            match acquired {
                Acquired::Leased(lease) => {
                    let text = serde_json::to_string(&lease.view())?;
                    if let Err(err) = crate::cli::stdout_line(&text) {
                        // Nobody got the token: hand the id back now instead
                        // of leaving it leased until its deadline.
                        let _ = lease.release(Duration::ZERO).await;
                        return Err(err);
                    }
                    return Ok(None);
                }
                Acquired::Empty {
                    next_due_in,
                    after_rollback,
                    ..
                } => {
                    return Err(PoolCliError::NothingDue {
                        pool,
                        wait: human(wait).to_string(),
                        hint: hint_words(next_due_in, after_rollback),
                    }
                    .into());
                }
            }
        }
        Op::Release {
            pool,
            id,
            token,
            cooldown,
            quarantine,
        } => {
            let handle = open(&pool, default)?;
            let released = match &quarantine {
                Some(q) => handle.quarantine_lease(&id, &token, q).await?,
                None => handle.release_lease(&id, &token, cooldown).await?,
            };
            match released {
                Released::Released { at_ms } => {
                    json!({ "pool": pool, "id": id, "released_at_ms": at_ms })
                }
                Released::Quarantined {
                    at_ms,
                    until_ms,
                    strikes,
                    auto_disabled,
                } => json!({
                    "pool": pool, "id": id, "released_at_ms": at_ms,
                    "quarantined_until_ms": until_ms, "strikes": strikes,
                    "auto_disabled": auto_disabled,
                }),
                Released::NotOwner { reason, .. } => {
                    return Err(PoolCliError::lost(&pool, &id, reason).into());
                }
            }
        }
        Op::Extend {
            pool,
            id,
            token,
            ttl,
            max_lease,
        } => match open(&pool, max_lease)?
            .extend_lease(&id, &token, ttl)
            .await?
        {
            Extended::Extended {
                deadline_ms,
                capped,
                ..
            } => json!({ "pool": pool, "id": id, "deadline_ms": deadline_ms, "capped": capped }),
            Extended::NotOwner { reason, .. } => {
                return Err(PoolCliError::lost(&pool, &id, reason).into());
            }
        },
        Op::Reap {
            pool,
            limit,
            cooldown,
        } => {
            let handle = open(&pool, default)?;
            let mut ids = Vec::new();
            let mut still_expired = 0;
            let mut quarantines_ended = 0;
            for _ in 0..REAP_ROUNDS {
                let reaped = handle.reap(limit, cooldown).await?;
                ids.extend(reaped.ids);
                still_expired = reaped.still_expired;
                quarantines_ended += reaped.quarantines_ended;
                if still_expired == 0 && reaped.quarantines_ended < limit as u64 {
                    break;
                }
            }
            json!({
                "pool": pool, "reclaimed": ids.len(), "ids": ids,
                "still_expired": still_expired, "quarantines_ended": quarantines_ended,
            })
        }
        Op::Status { pool, json } => {
            let handle = open(&pool, default)?;
            let status = handle.status().await?;
            // All zeros may be a typo in --pool: a pool that has no keys at
            // all is an error (exit 2), as for `pool config` (its script
            // holds the rule; one more round trip, only then).
            if status.ready_due
                + status.ready_cooling
                + status.leases_valid
                + status.leases_expired
                + status.disabled
                == 0
            {
                handle.strikes().await?;
            }
            if !json {
                return Ok(Some(status_table(&pool, &status)));
            }
            let mut value = serde_json::to_value(status)?;
            value["pool"] = pool.into();
            value
        }
        Op::Serve(_) => unreachable!("serve is run by run()"),
    };
    Ok(Some(out.to_string()))
}

/// `{"pool", "max_strikes", "strike_window_ms"}`, both null when off.
fn config_json(pool: &str, strikes: Option<StrikePolicy>) -> serde_json::Value {
    json!({
        "pool": pool,
        "max_strikes": strikes.map(|s| s.max_strikes),
        "strike_window_ms": strikes.map(|s| crate::timing::ms(s.window)),
    })
}

/// Whether acquires are open, in words: the gate's line of the status table.
fn gate_line(s: &PoolStatus) -> String {
    match (s.gate, s.closed_until_ms) {
        (Gate::Open, _) => "acquires open".to_owned(),
        (Gate::Closed, until) => {
            let until = until.unwrap_or(s.now_ms);
            let left = human(Duration::from_millis(until.saturating_sub(s.now_ms)));
            format!(
                "acquires closed for {left} (until {until} ms, Redis time): Redis restarted or failed over and may have come back without its last writes, or the pool is new and Redis would not say whether its first record is durable; ids shown free may still be held by holders from before (docs/pool.md, \"After a Redis rollback\")"
            )
        }
        (Gate::New, _) => "acquires closed: a new pool, opened by the first acquire that sees its first record durable (a snapshot and every replica; docs/pool.md, \"First use\")".to_owned(),
        (Gate::RolledBack, _) => "acquires closed: Redis restarted or failed over since the pool's record was written (it may have rolled back); the next acquire closes acquires for the largest max lease from then (docs/pool.md, \"After a Redis rollback\")".to_owned(),
    }
}

fn status_table(pool: &str, s: &PoolStatus) -> String {
    let mut out = format!("pool {pool} (Redis time {} ms)\n", s.now_ms);
    let _ = writeln!(out, "{}\n", gate_line(s));
    let rows = [
        ("ready, due", s.ready_due),
        ("ready, cooling down", s.ready_cooling),
        ("leased, valid", s.leases_valid),
        ("leased, expired", s.leases_expired),
        ("quarantined", s.quarantined),
        ("disabled", s.disabled),
        ("  by strikes", s.auto_disabled),
    ];
    let _ = writeln!(out, "{:<22} {:>8}", "state", "ids");
    for (state, n) in rows {
        let _ = writeln!(out, "{state:<22} {n:>8}");
    }
    if !s.quarantine.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<24} {:>12}  reason",
            "quarantined id", "time left"
        );
    }
    for q in &s.quarantine {
        let left = human(Duration::from_millis(q.left_ms)).to_string();
        let flag = if q.disabled { " (disabled)" } else { "" };
        let _ = writeln!(out, "{:<24} {left:>12}  {}{flag}", q.id, q.reason);
    }
    if !s.auto_disabled_ids.is_empty() {
        let _ = writeln!(out, "\n{:<24} disabled by strikes", "id");
    }
    for a in &s.auto_disabled_ids {
        let _ = writeln!(out, "{:<24} at {} ms: {}", a.id, a.at_ms, a.reason);
    }
    if !s.disabled_ids.is_empty() {
        let _ = writeln!(out, "\ndisabled id");
    }
    for id in &s.disabled_ids {
        let _ = writeln!(out, "{id}");
    }
    if !s.leases.is_empty() {
        let _ = writeln!(out, "\n{:<24} {:>12}", "leased id", "time left");
    }
    for l in &s.leases {
        let left = match l.left_ms {
            0 => "expired".to_owned(),
            ms => human(Duration::from_millis(ms)).to_string(),
        };
        let _ = writeln!(out, "{:<24} {left:>12}", l.id);
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lists_every_state() {
        let status = PoolStatus {
            now_ms: 7,
            ready_due: 1,
            ready_cooling: 2,
            leases_valid: 3,
            leases_expired: 4,
            disabled: 5,
            quarantined: 1,
            auto_disabled: 0,
            quarantine: vec![crate::pool::Quarantined {
                id: "vn-a01".into(),
                until_ms: 90_007,
                left_ms: 90_000,
                reason: "captcha wall".into(),
                disabled: false,
            }],
            auto_disabled_ids: Vec::new(),
            disabled_ids: vec!["vn-b02".into()],
            leases: Vec::new(),
            gate: Gate::Closed,
            closed_until_ms: Some(60_007),
        };
        let table = status_table("p", &status);
        assert!(
            table.contains("\nacquires closed for 1m (until 60007 ms"),
            "{table}"
        );
        assert!(table.starts_with("pool p (Redis time 7 ms)"), "{table}");
        assert!(table.contains("leased, expired               4"), "{table}");
        assert!(table.contains("quarantined                   1"), "{table}");
        assert!(
            table.contains("vn-a01 ") && table.contains(" 1m 30s  captcha wall"),
            "{table}"
        );
    }
}
