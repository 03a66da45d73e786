//! Acquire: the request, the answer, one attempt (also through the
//! budget's charged script) and the wait that retries empty answers.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::limits::{self, COOLDOWN_MS, TTL_MS};
use super::script::Reply;
use super::{Pool, PoolError, PoolLease, PoolScript};
use crate::connection::{Redis, unconfirmed};
use crate::lease::node::{self, FirstRecord, FirstUse};
use crate::timing;

/// What one acquire asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// Lease time: the deadline is Redis now + ttl. Whole ms, 1 ms to
    /// 600 s, and at most [`super::PoolOptions::max_lease`].
    pub ttl: Duration,
    /// Cooldown given to the expired leases this acquire reclaims first
    /// (they become due at now + cooldown). Whole ms, 0 to 600 s.
    pub cooldown: Duration,
    /// Makes the acquire idempotent: a retry with the same request id, for
    /// as long as the lease it got is valid (extends included), answers
    /// that lease (same id, token, fence; its current deadline) instead of
    /// a new one. 1-64 chars of `[A-Za-z0-9_-]`.
    pub request_id: Option<String>,
}

impl AcquireRequest {
    /// A request for a lease of `ttl`, no cooldown, no request id.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            cooldown: Duration::ZERO,
            request_id: None,
        }
    }

    /// Sets [`AcquireRequest::cooldown`].
    pub fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// Sets [`AcquireRequest::request_id`].
    pub fn request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }
}

/// The answer to an acquire.
pub enum Acquired<C = Redis> {
    /// An id is leased to the caller.
    Leased(PoolLease<C>),
    /// No id was due. `next_due_in`: how long until one is by Redis time
    /// (exact for a cooling id; for one that is leased it assumes the lease
    /// runs to its deadline), or `None` when none will be by itself (every
    /// id disabled, or the pool empty). Back off, do not retry at once.
    Empty {
        /// Time until the next id is due, if any will be.
        next_due_in: Option<Duration>,
        /// Redis time of the attempt, ms (+ `next_due_in` = when).
        at_ms: u64,
        /// True when acquires are closed because Redis restarted or failed
        /// over since the pool was last stamped (it may have rolled back and
        /// lost leases whose holders still run), or because the pool is new
        /// and its first record was not seen durable (closed as after a
        /// rollback, docs/rollback-design.md "First use"): `next_due_in` is
        /// when they open, at most the largest max lease seen (docs/pool.md,
        /// "After a Redis rollback").
        after_rollback: bool,
    },
}

impl<C> fmt::Debug for Acquired<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Leased(lease) => f.debug_tuple("Leased").field(lease).finish(),
            Self::Empty {
                next_due_in,
                at_ms,
                after_rollback,
            } => f
                .debug_struct("Empty")
                .field("next_due_in", next_due_in)
                .field("at_ms", at_ms)
                .field("after_rollback", after_rollback)
                .finish(),
        }
    }
}

/// What a script built on acquire.lua answered (see [`Pool::acquire_through`]).
pub(crate) enum AcquireReply<C> {
    /// acquire.lua's own answers.
    Acquired(Acquired<C>),
    /// Another answer: its first integer and the integers after it.
    Other { code: i64, rest: Vec<u64> },
}

impl<C> Pool<C>
where
    C: super::AcquireConnection,
{
    /// One acquire: reclaims at most 100 expired leases, then leases the
    /// first due id, or answers [`Acquired::Empty`] with the next-due hint.
    /// The token is 128 random bits in hex.
    ///
    /// The first acquire of a new pool waits up to 5 s for its first record
    /// to be durable (see [`Pool::acquire_wait`] for more).
    ///
    /// Errors: [`PoolError::BadInput`] (see [`AcquireRequest`] for ranges),
    /// [`PoolError::WrongKeyType`], [`PoolError::Redis`].
    pub async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired<C>, PoolError> {
        self.acquire_within(req, Duration::ZERO).await
    }

    /// [`Pool::acquire`] whose caller has `wait_left` of its own wait: that
    /// bounds a new pool's first-use wait ([`Pool::acquire_through`]).
    async fn acquire_within(
        &self,
        req: &AcquireRequest,
        wait_left: Duration,
    ) -> Result<Acquired<C>, PoolError> {
        let script = PoolScript::Acquire.script();
        match self
            .acquire_through(req, script, &[], &[], wait_left)
            .await?
        {
            AcquireReply::Acquired(acquired) => Ok(acquired),
            AcquireReply::Other { code, .. } => Err(PoolError::Reply {
                script: PoolScript::Acquire.name(),
                detail: format!("unknown answer {code}"),
            }),
        }
    }

    /// An acquire through `script`: acquire.lua's KEYS then `extra_keys`,
    /// `head` then acquire.lua's ARGV; its replies decoded as acquire's,
    /// any other first integer answered as [`AcquireReply::Other`] (the
    /// budget's acquire with a charge).
    ///
    /// A new pool (no record, never leased; or its first lease was lost with
    /// a rollback) answers closed until its first record is durable: this
    /// waits for that, opens it, and tries once more; where Redis will not
    /// say, the pool opens one max lease after its first use, as after a
    /// rollback; not durable in time, it stays closed and the next acquire
    /// tries again (both logged). That wait is `wait_left`, what is left of
    /// the caller's own wait (zero for one attempt), but at least 5 s (one
    /// snapshot of a small Redis) and at most 60 s
    /// ([`node::first_use_limit`]): a caller is held past its wait by one
    /// snapshot at most, not by the 60 s `pool init` gives it.
    pub(crate) async fn acquire_through(
        &self,
        req: &AcquireRequest,
        script: &redis::Script,
        extra_keys: &[String],
        head: &[String],
        wait_left: Duration,
    ) -> Result<AcquireReply<C>, PoolError> {
        let (reply, first) = self.acquire_once(req, script, extra_keys, head).await?;
        let Some(written) = first else {
            return Ok(reply);
        };
        let record = self.first_record(written);
        let mut conn = self.conn.clone();
        let limit = node::first_use_limit(wait_left);
        match node::open_first_use(&mut conn, &[record], limit).await {
            Ok(FirstUse::Opened { .. }) => {
                info!(pool = %self.name, "new pool: its first record is durable, so it opens now");
            }
            Ok(FirstUse::Unchecked(why)) => {
                warn!(pool = %self.name, why = %why, "new pool: Redis did not say whether its first record would outlast a restart or failover, so it opens one max lease after its first acquire, as after a rollback (docs/pool.md)");
                return Ok(self.acquire_once(req, script, extra_keys, head).await?.0);
            }
            Err(err) => {
                warn!(pool = %self.name, error = %err, "new pool: its first record was not seen durable, so it stays closed; the next acquire tries again (docs/pool.md)");
                return Ok(reply);
            }
        }
        Ok(self.acquire_once(req, script, extra_keys, head).await?.0)
    }

    /// The pool's node record as its script wrote it for a new pool (the
    /// `~node` field of `{P}:meta`; the fence counter goes back to 0).
    pub(crate) fn first_record(&self, written: String) -> FirstRecord {
        FirstRecord {
            key: self.keys.meta.clone(),
            field: Some("~node"),
            fence: Some(self.keys.fence.clone()),
            fence_reset: "0",
            written,
        }
    }

    /// One run of an acquire script; with the record of a new pool as its
    /// script wrote it (closed), if it was one.
    async fn acquire_once(
        &self,
        req: &AcquireRequest,
        script: &redis::Script,
        extra_keys: &[String],
        head: &[String],
    ) -> Result<(AcquireReply<C>, Option<String>), PoolError> {
        let ttl = limits::millis("ttl", req.ttl, TTL_MS)?;
        if req.ttl > self.options.max_lease {
            return Err(PoolError::bad(
                "ttl",
                format!(
                    "at most max_lease ({} ms)",
                    timing::ms(self.options.max_lease)
                ),
            ));
        }
        let cooldown = limits::millis("cooldown", req.cooldown, COOLDOWN_MS)?;
        if let Some(request_id) = &req.request_id {
            limits::name("request_id", request_id)?;
        }
        let token = format!("{:032x}", rand::random::<u128>());
        let mut inv = script.prepare_invoke();
        for key in PoolScript::Acquire
            .keys(&self.keys)
            .iter()
            .chain(extra_keys)
        {
            inv.key(key);
        }
        for arg in head {
            inv.arg(arg);
        }
        inv.arg(&token)
            .arg(ttl)
            .arg(cooldown)
            .arg(self.max_lease_ms);
        if let Some(request_id) = &req.request_id {
            inv.arg(request_id);
        }
        let (value, confirmed) = self.run_on_primary(&inv).await?;
        let mut reply = Reply::new(PoolScript::Acquire, value)?;
        match reply.int()? {
            0 => {
                let hint = reply.int()?;
                let next_due_in = u64::try_from(hint).ok().map(Duration::from_millis);
                let at_ms = reply.uint()?;
                // A fourth item only when closed: 1 after a rollback, 3 closed by this call
                // (it found the rollback), 2 a new pool (closed as after one; then its record
                // comes fifth).
                let closed = reply.int().unwrap_or(0);
                if closed == 3 {
                    // Once per rollback, not per refused acquire (pool serve answers 503s
                    // meanwhile, and logged nothing of why).
                    warn!(
                        pool = %self.name,
                        opens_in_ms = hint,
                        "acquires closed after a Redis restart or failover: it may have come back without its last writes (an older snapshot, a replica that lagged), so a holder from before may still use its id; closed for the max lease, fence lifted (docs/pool.md)"
                    );
                }
                let first = match closed {
                    2 => Some(reply.string()?),
                    _ => None,
                };
                let empty = Acquired::Empty {
                    next_due_in,
                    at_ms,
                    after_rollback: closed > 0,
                };
                Ok((AcquireReply::Acquired(empty), first))
            }
            1 => {
                let id = reply.string()?;
                let token = reply.string()?;
                let deadline_ms = reply.uint()?;
                let fence = reply.uint()?;
                reply.uint()?; // Redis now: the lease start, unless replayed
                let replayed = reply.int()? == 1;
                if !confirmed {
                    // Not handed out: give the id back at once where the node is still the
                    // primary (the Sentinels did not answer in time), instead of leaving it
                    // leased to nobody until its deadline; on a demoted one it is lost anyway.
                    if let Err(err) = self.release_lease(&id, &token, Duration::ZERO).await {
                        debug!(pool = %self.name, id, error = %err, "unconfirmed lease not released; it ends by its deadline");
                    }
                    return Err(PoolError::Redis(unconfirmed("the acquire")));
                }
                let lease = PoolLease::new(self.clone(), id, token, deadline_ms, fence, replayed);
                Ok((AcquireReply::Acquired(Acquired::Leased(lease)), None))
            }
            code => {
                let mut rest = Vec::new();
                while let Ok(n) = reply.uint() {
                    rest.push(n);
                }
                Ok((AcquireReply::Other { code, rest }, None))
            }
        }
    }

    /// Acquires, retrying empty answers until `wait` has passed: it sleeps
    /// by the next-due hint when that is near, else by a backoff from
    /// 10 ms doubling to 500 ms, with jitter, never less than 5 ms and
    /// never past `wait`; the last attempt is made when `wait` runs out.
    /// Returns the last [`Acquired::Empty`] if nothing came due in time.
    /// The same request id (if any) is sent on every attempt.
    ///
    /// The first acquire of a new pool waits for its first record to be
    /// durable (a snapshot, the replicas; docs/pool.md, "First use") for what
    /// is left of `wait`, but at least 5 s and at most 60 s: with a short
    /// `wait` on a Redis whose snapshots are slower, it answers the pool
    /// closed ([`Acquired::Empty`], `after_rollback`) about 5 s after it
    /// began, and the next acquire tries again.
    ///
    /// Errors: as [`Pool::acquire`], returned at once.
    pub async fn acquire_wait(
        &self,
        req: &AcquireRequest,
        wait: Duration,
    ) -> Result<Acquired<C>, PoolError> {
        self.acquire_wait_until(req, wait, &CancellationToken::new())
            .await
    }

    /// [`Pool::acquire_wait`] that also stops waiting when `stop` is
    /// cancelled (shutdown): it then returns the last [`Acquired::Empty`].
    /// A call already sent to Redis is never abandoned, so no lease is
    /// granted that nobody hears of.
    ///
    /// Errors: as [`Pool::acquire`], returned at once.
    pub(crate) async fn acquire_wait_until(
        &self,
        req: &AcquireRequest,
        wait: Duration,
        stop: &CancellationToken,
    ) -> Result<Acquired<C>, PoolError> {
        let start = Instant::now();
        let mut attempt = 0;
        loop {
            let left = wait.saturating_sub(start.elapsed());
            let acquired = self.acquire_within(req, left).await?;
            let Acquired::Empty { next_due_in, .. } = &acquired else {
                return Ok(acquired);
            };
            let remaining = wait.saturating_sub(start.elapsed());
            if remaining.is_zero() || stop.is_cancelled() {
                return Ok(acquired);
            }
            let sleep = timing::wait_pause(*next_due_in, attempt, remaining, &mut rand::rng());
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = stop.cancelled() => return Ok(acquired),
            }
            attempt = attempt.saturating_add(1);
        }
    }
}
