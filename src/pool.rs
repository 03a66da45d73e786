//! Pool mode: lease resource ids (proxy endpoints, accounts) from a named
//! pool in Redis, prove ownership with a random token, hand them back with a
//! cooldown. The contract is docs/pool.md; each operation is one Lua
//! script in `pool/`, with Redis `TIME` (ms) as the only clock.
//!
//! Beyond the three keys every worker knows, snowlease keeps (same hash
//! tag, see [`PoolKeys`]): a fence counter, per-lease meta (first-acquired
//! time and the extend cap, fence, request id, token), the request ids of
//! idempotent acquires, and the admin states (disabled, parked cooldowns,
//! quarantines with reasons, strikes, the strike setting). A pool without
//! them is served as well. Names and ranges: [`limits`].
//!
//! [`cli`] is `snowlease pool ...`; [`serve`] its HTTP API for workers in
//! any language, with a background reaper and metrics. The handle's
//! operations live by concept: `acquire`, `release` (extend, release,
//! quarantine by token), `admin` (init, add, disable, enable, strikes,
//! reap) and `status`.

mod acquire;
mod admin;
mod charged;
pub mod cli;
mod error;
mod hint;
mod lease;
pub mod limits;
mod metrics;
mod release;
mod script;
pub mod serve;
mod status;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{ScriptInvocation, Value};

use crate::connection::{ConfirmPrimary, Redis};
use crate::persistence::WaitDurable;

pub(crate) use acquire::AcquireReply;
pub use acquire::{AcquireRequest, Acquired};
pub use admin::{Reaped, StrikePolicy};
pub use charged::{ChargedAcquire, acquire_charged, acquire_charged_wait, charge_source};
pub use error::PoolError;
pub use lease::{Extended, LostReason, PoolLease, Quarantine, Released};
pub use script::{PoolKeys, PoolScript};
pub use status::{AutoDisabled, Gate, Leased, PoolStatus, Quarantined};

use limits::MAX_LEASE_MS;

/// Settings of a [`Pool`] handle that every operation shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Longest total time of one lease, from its acquire: the cap
    /// first-acquired + `max_lease` is fixed at acquire and stored with the
    /// lease; an extend never sets a deadline past it, and an extend from a
    /// handle with a smaller `max_lease` lowers it for good (never raises
    /// it). Acquire refuses a longer ttl. Whole ms, 1 ms to 24 h; default
    /// 10 min.
    pub max_lease: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            max_lease: Duration::from_secs(600),
        }
    }
}

/// What a pool's connection needs for acquires and the admin calls that write a first
/// record: scripts, the first-use durability wait ([`WaitDurable`]) and the Sentinels'
/// confirmation of a grant ([`ConfirmPrimary`]). [`Redis`] has them all.
pub trait AcquireConnection:
    ConnectionLike + WaitDurable + ConfirmPrimary + Clone + Send + Sync
{
}

impl<T> AcquireConnection for T where
    T: ConnectionLike + WaitDurable + ConfirmPrimary + Clone + Send + Sync
{
}

/// A handle on one named pool. Cheap to clone (the connection is cloned,
/// which for a [`Redis`] handle shares one multiplexed connection).
#[derive(Clone)]
pub struct Pool<C = Redis> {
    conn: C,
    name: Arc<str>,
    keys: Arc<PoolKeys>,
    options: PoolOptions,
    max_lease_ms: u64,
}

impl<C> fmt::Debug for Pool<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<C> Pool<C>
where
    C: ConnectionLike + Clone + Send + Sync,
{
    /// A handle on pool `name` (1-64 chars of `[A-Za-z0-9_-]`). Touches no
    /// Redis key.
    ///
    /// Errors: [`PoolError::BadInput`] for a bad name or `max_lease`.
    pub fn new(conn: C, name: &str, options: PoolOptions) -> Result<Self, PoolError> {
        limits::name("pool", name)?;
        let max_lease_ms = limits::millis("max_lease", options.max_lease, MAX_LEASE_MS)?;
        Ok(Self {
            conn,
            name: name.into(),
            keys: Arc::new(PoolKeys::new(name)),
            options,
            max_lease_ms,
        })
    }

    /// The pool name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The connection (the budget routes of `pool serve` share it).
    pub(crate) fn conn(&self) -> &C {
        &self.conn
    }

    /// The pool's key names.
    pub fn keys(&self) -> &PoolKeys {
        &self.keys
    }

    async fn run(&self, inv: &ScriptInvocation<'_>) -> Result<Value, PoolError> {
        let mut conn = self.conn.clone();
        Ok(inv.invoke_async(&mut conn).await?)
    }

    /// [`Pool::run`] of a script that grants or extends a lease, and whether its reply
    /// counts: only where the node it ran on is still the primary ([`ConfirmPrimary`]). A
    /// lease granted on a demoted primary, which takes writes for seconds after a Sentinel
    /// failover, is one the new primary grants again, with a fence below those it handed
    /// out. An unconfirmed reply is the caller's to undo and to fail with
    /// [`unconfirmed`](crate::connection::unconfirmed).
    ///
    /// Errors: as `run`.
    async fn run_on_primary(&self, inv: &ScriptInvocation<'_>) -> Result<(Value, bool), PoolError>
    where
        C: ConfirmPrimary,
    {
        let mut conn = self.conn.clone();
        let reply = inv.invoke_async(&mut conn).await?;
        Ok((reply, conn.confirm_primary().await))
    }

    fn invocation(&self, script: PoolScript) -> ScriptInvocation<'static> {
        let mut inv = script.script().prepare_invoke();
        for key in script.keys(&self.keys) {
            inv.key(key);
        }
        inv
    }
}
