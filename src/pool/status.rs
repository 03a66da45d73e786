//! A pool's status: counts of its ids by state at one Redis time, the
//! quarantined, auto-disabled, disabled and leased ids (never tokens), and
//! whether acquires are open (the node gate, docs/pool.md).

use redis::aio::ConnectionLike;
use serde::Serialize;

use super::script::Reply;
use super::{Pool, PoolError, PoolScript};

/// Counts of a pool's ids by state, at one Redis time, and the
/// quarantined and auto-disabled ids. Never tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolStatus {
    /// Redis time of the count, ms.
    pub now_ms: u64,
    /// Ids in ready and due (score <= now).
    pub ready_due: u64,
    /// Ids in ready, cooling down (score > now).
    pub ready_cooling: u64,
    /// Leases whose deadline is after now.
    pub leases_valid: u64,
    /// Leases past their deadline, not yet reclaimed.
    pub leases_expired: u64,
    /// Disabled ids, leased, quarantined or not.
    pub disabled: u64,
    /// Quarantined ids that are not disabled (disabled comes first).
    pub quarantined: u64,
    /// Ids disabled by strikes (they count in `disabled` too).
    pub auto_disabled: u64,
    /// Quarantines, soonest end first (at most
    /// `limits::STATUS_LIST_MAX`), disabled ones included.
    pub quarantine: Vec<Quarantined>,
    /// Ids disabled by strikes (at most `limits::STATUS_LIST_MAX`).
    pub auto_disabled_ids: Vec<AutoDisabled>,
    /// Disabled ids, by hand or by strikes, sorted (at most
    /// `limits::STATUS_LIST_MAX`).
    pub disabled_ids: Vec<String>,
    /// Leased ids, soonest deadline first, expired ones included (at most
    /// `limits::STATUS_LIST_MAX`); never tokens.
    pub leases: Vec<Leased>,
    /// Whether acquires are open, by the pool's node record as the next
    /// acquire would judge it now (status only reads it). While not
    /// [`Gate::Open`], acquires answer "no id due" closed
    /// ([`super::Acquired::Empty`] with `after_rollback`), whatever the
    /// counts above say.
    pub gate: Gate,
    /// With [`Gate::Closed`]: when acquires open by time, ms of Redis time;
    /// `None` for every other gate (open, or not opened by time).
    pub closed_until_ms: Option<u64>,
}

/// Whether a pool's acquires are open (docs/pool.md, "After a Redis
/// rollback" and "First use"). In JSON: `"open"`, `"closed"`, `"new"`,
/// `"rolled_back"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    /// Acquires lease as usual.
    Open,
    /// Closed until [`PoolStatus::closed_until_ms`]: an acquire found that
    /// Redis restarted or failed over (it may have rolled back), or the
    /// pool is new and Redis would not say whether its first record is
    /// durable (no `+bgsave`, `appendfsync no`).
    Closed,
    /// A new pool (its first record marked new, or no record yet in a
    /// pool that never leased): closed until an acquire sees its first
    /// record durable (a snapshot, every replica), which opens it.
    New,
    /// Redis restarted or failed over since the pool's record was written
    /// (a record of another node or an earlier life, an unreadable one, or
    /// none in a pool that leased): the next acquire closes acquires for the
    /// largest max lease seen, from then.
    RolledBack,
}

/// One leased id, as status shows it (no token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Leased {
    /// The id.
    pub id: String,
    /// The lease's deadline, ms of Redis time.
    pub deadline_ms: u64,
    /// Time left at the status's Redis time, ms; 0 once expired (the id
    /// comes back at the next acquire or reap).
    pub left_ms: u64,
}

/// One quarantined id, as status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Quarantined {
    /// The id.
    pub id: String,
    /// When the quarantine ends, ms of Redis time.
    pub until_ms: u64,
    /// Time left at the status's Redis time, ms (0 when it has ended and
    /// the id waits for the next acquire or reap to come back).
    pub left_ms: u64,
    /// The reason given at release (may be empty).
    pub reason: String,
    /// True when the id is disabled too: it stays out when the quarantine ends.
    pub disabled: bool,
}

/// One id disabled by strikes, as status shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AutoDisabled {
    /// The id.
    pub id: String,
    /// When it was disabled, ms of Redis time.
    pub at_ms: u64,
    /// What happened: the strike count, the window and the last reason.
    pub reason: String,
}

impl<C> Pool<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    /// Counts the pool's ids by state, and says whether acquires are open
    /// ([`PoolStatus::gate`]). Writes nothing.
    ///
    /// Errors: [`PoolError::WrongKeyType`], [`PoolError::Redis`].
    pub async fn status(&self) -> Result<PoolStatus, PoolError> {
        let inv = self.invocation(PoolScript::Status);
        let mut reply = Reply::new(PoolScript::Status, self.run(&inv).await?)?;
        let now_ms = reply.uint()?;
        let mut status = PoolStatus {
            now_ms,
            ready_due: reply.uint()?,
            ready_cooling: reply.uint()?,
            leases_valid: reply.uint()?,
            leases_expired: reply.uint()?,
            disabled: reply.uint()?,
            quarantined: reply.uint()?,
            auto_disabled: reply.uint()?,
            quarantine: Vec::new(),
            auto_disabled_ids: Vec::new(),
            disabled_ids: Vec::new(),
            leases: Vec::new(),
            gate: Gate::Open,
            closed_until_ms: None,
        };
        for _ in 0..reply.uint()? {
            let id = reply.string()?;
            let until_ms = reply.uint()?;
            status.quarantine.push(Quarantined {
                id,
                until_ms,
                left_ms: until_ms.saturating_sub(now_ms),
                reason: reply.text()?,
                disabled: reply.int()? == 1,
            });
        }
        for _ in 0..reply.uint()? {
            status.auto_disabled_ids.push(AutoDisabled {
                id: reply.string()?,
                at_ms: reply.uint()?,
                reason: reply.text()?,
            });
        }
        for _ in 0..reply.uint()? {
            status.disabled_ids.push(reply.string()?);
        }
        for _ in 0..reply.uint()? {
            let id = reply.string()?;
            let deadline_ms = reply.uint()?;
            status.leases.push(Leased {
                id,
                deadline_ms,
                left_ms: deadline_ms.saturating_sub(now_ms),
            });
        }
        status.gate = match reply.string()?.as_str() {
            "open" => Gate::Open,
            "closed" => Gate::Closed,
            "new" => Gate::New,
            "rolled_back" => Gate::RolledBack,
            other => {
                return Err(PoolError::Reply {
                    script: PoolScript::Status.name(),
                    detail: format!("unknown gate {other:?}"),
                });
            }
        };
        status.closed_until_ms = u64::try_from(reply.int()?).ok();
        Ok(status)
    }
}
