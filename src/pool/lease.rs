//! A held pool lease, what extend and release answer about it, and the
//! quarantine a release may give.

use std::fmt;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::connection::Redis;
use serde::Serialize;

use super::script::Reply;
use super::{Pool, PoolError};

/// The answer to an extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extended {
    /// The lease is still ours, with a new deadline.
    Extended {
        /// The new deadline, ms of Redis time.
        deadline_ms: u64,
        /// True when the total cap (first-acquired + max_lease), not the
        /// ttl, set the deadline: the lease cannot be extended further.
        capped: bool,
        /// Redis time of the extend, ms.
        at_ms: u64,
    },
    /// The lease is lost; nothing was changed.
    NotOwner {
        /// Why the lease is lost.
        reason: LostReason,
        /// Redis time of the attempt, ms.
        at_ms: u64,
    },
}

/// The answer to a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The id is back in the pool (due after the cooldown).
    Released {
        /// Redis time of the release, ms: the end of the lease.
        at_ms: u64,
    },
    /// The id is in quarantine (out of rotation) until `until_ms`.
    Quarantined {
        /// Redis time of the release, ms: the end of the lease.
        at_ms: u64,
        /// When the quarantine ends, ms of Redis time.
        until_ms: u64,
        /// Quarantines of the id within the strike window, this one
        /// included; 0 when strikes are off.
        strikes: u64,
        /// True when this quarantine reached the strike limit and disabled
        /// the id (only `enable` brings it back).
        auto_disabled: bool,
    },
    /// The lease was already lost; nothing was changed. A late release
    /// proves nothing: the id may have been leased to someone else.
    NotOwner {
        /// Why the lease is lost.
        reason: LostReason,
        /// Redis time of the attempt, ms.
        at_ms: u64,
    },
}

/// A quarantine given at release: the id is out of rotation until Redis
/// now + `duration`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    /// Whole ms, 1 ms to 30 days (`limits::QUARANTINE_MS`). Replaces the
    /// cooldown.
    pub duration: Duration,
    /// Free text for operators (`limits::REASON_MAX` bytes at most, no
    /// control characters; may be empty). Never a metric label.
    pub reason: String,
}

/// A lease as JSON: `{"id", "token", "deadline_ms", "fence"}`.
#[derive(Serialize)]
pub(crate) struct LeaseView<'a> {
    id: &'a str,
    token: &'a str,
    deadline_ms: u64,
    fence: u64,
}

/// Why an extend or release found the lease lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReason {
    /// `owners[id]` holds another token, or none: the lease was reclaimed
    /// or released, and maybe given to someone else.
    OtherOwner,
    /// Still our token, but the deadline has passed (not yet reclaimed).
    Expired,
}

/// A lease on one id of a pool, as acquire answered it. Its `Debug` never
/// shows the token.
pub struct PoolLease<C = Redis> {
    pool: Pool<C>,
    id: String,
    token: String,
    deadline_ms: u64,
    fence: u64,
    replayed: bool,
}

impl<C> fmt::Debug for PoolLease<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolLease")
            .field("pool", &self.pool.name)
            .field("id", &self.id)
            .field("token", &"<redacted>")
            .field("deadline_ms", &self.deadline_ms)
            .field("fence", &self.fence)
            .field("replayed", &self.replayed)
            .finish()
    }
}

impl<C> PoolLease<C>
where
    C: ConnectionLike + crate::connection::ConfirmPrimary + Clone + Send + Sync,
{
    pub(super) fn new(
        pool: Pool<C>,
        id: String,
        token: String,
        deadline_ms: u64,
        fence: u64,
        replayed: bool,
    ) -> Self {
        Self {
            pool,
            id,
            token,
            deadline_ms,
            fence,
            replayed,
        }
    }

    /// The leased id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The lease's token (32 hex chars): proof of ownership. Keep it out of
    /// logs.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The deadline, ms of Redis time, as of the last acquire or extend.
    pub fn deadline_ms(&self) -> u64 {
        self.deadline_ms
    }

    /// The fence: from a per-pool counter, strictly greater than the fence
    /// of every lease acquired before in this pool. Send it along with
    /// writes to the resource so stale holders can be refused.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// True when acquire answered an earlier call's lease for the same
    /// request id.
    pub fn replayed(&self) -> bool {
        self.replayed
    }

    /// What the CLI prints and the HTTP API answers for this lease: the
    /// only places a token leaves the process.
    pub(crate) fn view(&self) -> LeaseView<'_> {
        LeaseView {
            id: &self.id,
            token: &self.token,
            deadline_ms: self.deadline_ms,
            fence: self.fence,
        }
    }

    /// Extends the lease to Redis now + `ttl` (capped, see
    /// [`Pool::extend_lease`]); on success the deadline here follows.
    pub async fn extend(&mut self, ttl: Duration) -> Result<Extended, PoolError> {
        let outcome = self.pool.extend_lease(&self.id, &self.token, ttl).await?;
        if let Extended::Extended { deadline_ms, .. } = outcome {
            self.deadline_ms = deadline_ms;
        }
        Ok(outcome)
    }

    /// Releases the lease into quarantine (see [`Pool::quarantine_lease`]).
    pub async fn quarantine(&self, quarantine: &Quarantine) -> Result<Released, PoolError> {
        self.pool
            .quarantine_lease(&self.id, &self.token, quarantine)
            .await
    }

    /// Releases the lease with a `cooldown` (see [`Pool::release_lease`]).
    /// Safe to retry after a transient error: a second release answers
    /// [`Released::NotOwner`].
    pub async fn release(&self, cooldown: Duration) -> Result<Released, PoolError> {
        self.pool
            .release_lease(&self.id, &self.token, cooldown)
            .await
    }
}

impl LostReason {
    /// The reason as the CLI and the HTTP API name it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::OtherOwner => "other_owner",
            Self::Expired => "expired",
        }
    }

    /// What it means, for messages.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::OtherOwner => {
                "the id is not held with this token (released, reclaimed, or leased again)"
            }
            Self::Expired => "the lease deadline has passed",
        }
    }
}

pub(super) fn lost_reason(reply: &mut Reply) -> Result<LostReason, PoolError> {
    match reply.string()?.as_str() {
        "expired" => Ok(LostReason::Expired),
        _ => Ok(LostReason::OtherOwner),
    }
}
