//! The Redis side of one `lock` run: one connection, our owner string, and
//! each call bounded by a timeout, so the hold loop never waits on Redis
//! past a deadline.

use std::time::Duration;

use redis::RedisResult;
use tracing::{info, warn};

use super::LockKeys;
use super::acquire::{self, LockAcquired};
use crate::boot_clock::BootInstant;
use crate::connection::{Readable, Redis, RedisTarget, unconfirmed};
use crate::eviction::Eviction;
use crate::identity::Owner;
use crate::lease::node::{FirstRecord, FirstUse};
use crate::lease::{self, RenewOutcome};
use crate::timing;

/// One process's connection and owner string for one lock.
pub(crate) struct Session {
    conn: Redis,
    owner: Owner,
    keys: LockKeys,
    ttl: Duration,
}

impl Session {
    /// A lazy connection: nothing is sent yet. `timeout` bounds connecting
    /// and each reply; every call below has its own, shorter or equal,
    /// limit too. Call inside a tokio runtime.
    ///
    /// Errors: the client configuration is invalid.
    pub(crate) fn open(
        redis: &RedisTarget,
        keys: LockKeys,
        owner: Owner,
        ttl: Duration,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let conn = redis.connect(timeout)?;
        // Acquires answer their own repeat ("already ours"), renewals check the owner.
        conn.resend_after_idle();
        Ok(Self {
            conn,
            owner,
            keys,
            ttl,
        })
    }

    /// Our owner string (the value of the lock key while we hold it).
    pub(crate) fn owner(&self) -> &Owner {
        &self.owner
    }

    /// The lock's keys.
    pub(crate) fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// `lease::probe` on a key of this process: every command the renew and
    /// release scripts need is allowed, and nothing is left behind.
    pub(crate) async fn probe(&mut self, limit: Duration) -> RedisResult<()> {
        let key = self.keys.probe(self.owner.nonce());
        let probe = lease::probe(&mut self.conn, &key, &self.owner);
        timing::bounded(limit, probe).await
    }

    /// `INFO memory`: whether Redis may evict keys (a lock key evicted
    /// while held lets a second holder in).
    pub(crate) async fn eviction(&mut self, limit: Duration) -> RedisResult<Eviction> {
        let check = crate::eviction::check(&mut self.conn);
        timing::bounded(limit, check).await.map(Eviction::from)
    }

    /// Opens a new lock once its first record is durable (`lease::node::open_first_use`),
    /// waiting up to `limit` for that; true when it opened. Logs what came of it: where
    /// Redis would not say, the lock opens one TTL after its first use; where the record
    /// was not durable in time, it stays closed and the next attempt tries again.
    pub(crate) async fn open_first_use(&mut self, record: FirstRecord, limit: Duration) -> bool {
        let lock = self.keys.name().to_owned();
        match lease::node::open_first_use(&mut self.conn, &[record], limit).await {
            Ok(FirstUse::Opened { .. }) => {
                info!(
                    lock,
                    "new lock: its first record is durable, so it opens now"
                );
                true
            }
            Ok(FirstUse::Unchecked(why)) => {
                warn!(
                    lock,
                    why = %why,
                    "new lock: Redis did not say whether its first record would outlast a restart or failover, so it opens one TTL after its first use, as after a rollback (docs/lock.md)"
                );
                false
            }
            Err(err) => {
                warn!(
                    lock,
                    error = %err,
                    "new lock: its first record was not seen durable, so it stays closed; the next attempt tries again (docs/lock.md)"
                );
                false
            }
        }
    }

    /// One run of `acquire.lua`, sent now.
    ///
    /// Behind Sentinel an acquire that made us the holder counts only where the node it ran
    /// on is still the primary (`Redis::confirm_primary`): a demoted primary takes writes for seconds
    /// after a failover, and hands out fences below those of the new primary.
    pub(crate) async fn acquire(&mut self, limit: Duration) -> RedisResult<LockAcquired> {
        let call = async {
            let acquired =
                acquire::acquire(&mut self.conn, &self.keys, &self.owner, self.ttl).await?;
            if matches!(acquired, LockAcquired::Ours { .. }) && !self.conn.confirm_primary().await {
                // Not ours to use: free the key where the node is still the primary (the
                // Sentinels did not answer in time) rather than park the lock for one TTL.
                let _ = lease::release(&mut self.conn, self.keys.lock(), &self.owner).await;
                return Err(unconfirmed("the acquire"));
            }
            Ok(acquired)
        };
        timing::bounded(limit, call).await
    }

    /// The lease core's owner-checked renew, re-creating never (bound 0): a missing
    /// key means the lock is lost (Redis lost data, or someone deleted it),
    /// never that we may set it again; the fence would not prove it ours.
    /// Returns the outcome and the instant the call was sent.
    pub(crate) async fn renew(
        &mut self,
        limit: Duration,
    ) -> (RedisResult<RenewOutcome>, BootInstant) {
        let sent = BootInstant::now();
        let call = async {
            let reply =
                lease::renew(&mut self.conn, self.keys.lock(), &self.owner, self.ttl, 0).await?;
            // As the acquire: a renewal on a demoted primary proves nothing (retried until the
            // lease's deadline; the new primary lacks the key if the writes were lost).
            if reply.outcome != RenewOutcome::Lost && !self.conn.confirm_primary().await {
                return Err(unconfirmed("the renew"));
            }
            Ok(reply.outcome)
        };
        let reply = timing::bounded(limit, call).await;
        (reply, sent)
    }

    /// The lease core's compare-and-delete: deletes the lock key only while
    /// it holds our owner string. Logged; a failure leaves the key to expire.
    pub(crate) async fn release(&mut self, limit: Duration) {
        let release = lease::release(&mut self.conn, self.keys.lock(), &self.owner);
        let lock = self.keys.name().to_owned();
        match timing::bounded(limit, release).await {
            Ok(true) => info!(lock, "lock released"),
            Ok(false) => warn!(
                lock,
                "lock not released: the key no longer holds our owner string"
            ),
            Err(err) => {
                warn!(lock, error = %Readable(&err), "lock not released; it expires after its TTL")
            }
        }
    }
}
