//! Extend, release and quarantine a lease named by its id and token (the
//! CLI and HTTP forms of [`super::PoolLease`]'s methods).

use std::time::Duration;

use redis::ScriptInvocation;
use redis::aio::ConnectionLike;

use super::lease::lost_reason;
use super::limits::{self, COOLDOWN_MS, QUARANTINE_MS, TTL_MS};
use super::script::Reply;
use super::{Extended, Pool, PoolError, PoolScript, Quarantine, Released};
use crate::connection::{ConfirmPrimary, unconfirmed};

impl<C> Pool<C>
where
    C: ConnectionLike + ConfirmPrimary + Clone + Send + Sync,
{
    /// Extends the lease of `id` held with `token` (the CLI and HTTP form of
    /// [`super::PoolLease::extend`]): deadline = Redis now + `ttl` (whole ms,
    /// 1 ms to 600 s), capped at the lease's total cap (fixed at acquire;
    /// this handle's `max_lease` may lower it, never raise it).
    ///
    /// Errors: [`PoolError::BadInput`], [`PoolError::WrongKeyType`],
    /// [`PoolError::Redis`]. A lost lease is [`Extended::NotOwner`].
    pub async fn extend_lease(
        &self,
        id: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Extended, PoolError> {
        limits::name("id", id)?;
        limits::token(token)?;
        let ttl = limits::millis("ttl", ttl, TTL_MS)?;
        let mut inv = self.invocation(PoolScript::Extend);
        inv.arg(id).arg(token).arg(ttl).arg(self.max_lease_ms);
        let (value, confirmed) = self.run_on_primary(&inv).await?;
        if !confirmed {
            // Extended (or not) on a node that may be demoted: the holder learns nothing.
            return Err(PoolError::Redis(unconfirmed("the extend")));
        }
        let mut reply = Reply::new(PoolScript::Extend, value)?;
        if reply.int()? == 0 {
            let at_ms = reply.uint()?;
            let reason = lost_reason(&mut reply)?;
            return Ok(Extended::NotOwner { reason, at_ms });
        }
        Ok(Extended::Extended {
            deadline_ms: reply.uint()?,
            at_ms: reply.uint()?,
            capped: reply.int()? == 1,
        })
    }

    /// Releases the lease of `id` held with `token` (the CLI and HTTP form
    /// of [`super::PoolLease::release`]): the id becomes due at Redis now +
    /// `cooldown` (whole ms, 0 to 600 s), or stays out of ready if disabled.
    ///
    /// Errors: [`PoolError::BadInput`], [`PoolError::WrongKeyType`],
    /// [`PoolError::Redis`]. A lost lease is [`Released::NotOwner`].
    pub async fn release_lease(
        &self,
        id: &str,
        token: &str,
        cooldown: Duration,
    ) -> Result<Released, PoolError> {
        limits::name("id", id)?;
        limits::token(token)?;
        let cooldown = limits::millis("cooldown", cooldown, COOLDOWN_MS)?;
        let mut inv = self.invocation(PoolScript::Release);
        inv.arg(id).arg(token).arg(cooldown);
        self.release(inv).await
    }

    /// Releases the lease of `id` held with `token` into quarantine: the
    /// id is out of rotation (not in ready, never acquired) until Redis
    /// now + `quarantine.duration`, then due; a stale token changes
    /// nothing. With strikes set ([`Pool::set_strikes`]) this may disable
    /// the id ([`Released::Quarantined`] says so).
    ///
    /// Errors: [`PoolError::BadInput`] (see [`Quarantine`] for ranges),
    /// [`PoolError::WrongKeyType`], [`PoolError::Redis`]. A lost lease is
    /// [`Released::NotOwner`].
    pub async fn quarantine_lease(
        &self,
        id: &str,
        token: &str,
        quarantine: &Quarantine,
    ) -> Result<Released, PoolError> {
        limits::name("id", id)?;
        limits::token(token)?;
        let ms = limits::millis("quarantine", quarantine.duration, QUARANTINE_MS)?;
        limits::reason(&quarantine.reason)?;
        let mut inv = self.invocation(PoolScript::Release);
        inv.arg(id)
            .arg(token)
            .arg(0)
            .arg(ms)
            .arg(&quarantine.reason);
        self.release(inv).await
    }

    async fn release(&self, inv: ScriptInvocation<'_>) -> Result<Released, PoolError> {
        let mut reply = Reply::new(PoolScript::Release, self.run(&inv).await?)?;
        let released = reply.int()? == 1;
        let at_ms = reply.uint()?;
        if !released {
            let reason = lost_reason(&mut reply)?;
            return Ok(Released::NotOwner { reason, at_ms });
        }
        let until_ms = reply.uint()?;
        let strikes = reply.uint()?;
        let auto_disabled = reply.int()? == 1;
        if until_ms == 0 {
            return Ok(Released::Released { at_ms });
        }
        Ok(Released::Quarantined {
            at_ms,
            until_ms,
            strikes,
            auto_disabled,
        })
    }
}
