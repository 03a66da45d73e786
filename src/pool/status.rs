//! A pool's status: counts of its ids by state at one Redis time, and
//! the quarantined, auto-disabled, disabled and leased ids (never tokens).

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
    /// Counts the pool's ids by state.
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
        Ok(status)
    }
}
