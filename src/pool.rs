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
//! any language, with a background reaper and metrics.

// Shared with `lock`, whose waiters back off the same way.
pub mod cli;
mod error;
mod hint;
mod lease;
pub mod limits;
mod metrics;
mod script;
pub mod serve;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::connection::Redis;
use crate::timing;
use redis::{ScriptInvocation, Value};
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use error::PoolError;
pub use lease::{Extended, LostReason, PoolLease, Released};
pub use script::{PoolKeys, PoolScript};

use lease::lost_reason;
use limits::{
    COOLDOWN_MS, IDS_PER_CALL, MAX_LEASE_MS, MAX_STRIKES, QUARANTINE_MS, REAP_LIMIT,
    STRIKE_WINDOW_MS, TTL_MS,
};
use script::Reply;

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

/// What one acquire asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// Lease time: the deadline is Redis now + ttl. Whole ms, 1 ms to
    /// 600 s, and at most [`PoolOptions::max_lease`].
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
    },
}

impl<C> fmt::Debug for Acquired<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Leased(lease) => f.debug_tuple("Leased").field(lease).finish(),
            Self::Empty { next_due_in, at_ms } => f
                .debug_struct("Empty")
                .field("next_due_in", next_due_in)
                .field("at_ms", at_ms)
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

/// The pool's strike setting: an id quarantined `max_strikes` times within
/// `window` is disabled, until `enable`. Stored in `{P}:config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrikePolicy {
    /// Quarantines that disable an id, 1-100 (`limits::MAX_STRIKES`).
    pub max_strikes: u32,
    /// The window they are counted in: whole ms, 1 s to 30 days
    /// (`limits::STRIKE_WINDOW_MS`).
    pub window: Duration,
}

impl StrikePolicy {
    /// The two script arguments (`off`, `off` for none), checked.
    fn args(policy: Option<Self>) -> Result<[String; 2], PoolError> {
        let Some(p) = policy else {
            return Ok(["off".into(), "off".into()]);
        };
        let max = limits::count("max_strikes", p.max_strikes as usize, MAX_STRIKES)?;
        let window = limits::millis("strike_window", p.window, STRIKE_WINDOW_MS)?;
        Ok([max.to_string(), window.to_string()])
    }
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

/// The answer to a reap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// The ids whose expired leases were reclaimed.
    pub ids: Vec<String>,
    /// Expired leases left for another call.
    pub still_expired: u64,
    /// Quarantines that ended (their ids due now, unless disabled).
    pub quarantines_ended: u64,
    /// Redis time of the reap, ms.
    pub at_ms: u64,
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

    fn invocation(&self, script: PoolScript) -> ScriptInvocation<'static> {
        let mut inv = script.script().prepare_invoke();
        for key in script.keys(&self.keys) {
            inv.key(key);
        }
        inv
    }

    /// Runs `script` with `head` and then `ids` as ARGV; answers its count.
    async fn batch<S: AsRef<str>>(
        &self,
        script: PoolScript,
        head: &[&str],
        ids: &[S],
    ) -> Result<u64, PoolError> {
        let mut inv = self.invocation(script);
        for arg in head {
            inv.arg(*arg);
        }
        for id in ids {
            inv.arg(id.as_ref());
        }
        count_reply(script, self.run(&inv).await?)
    }

    /// Creates the pool with `ids` (each 1-64 chars of `[A-Za-z0-9_-]`, no
    /// duplicates), all due at once. More than 1000 ids go in one init of
    /// the first 1000 and then `add` calls of at most 1000; all ids are
    /// checked before the first call. Returns how many ids were added.
    ///
    /// Errors: [`PoolError::AlreadyInitialized`] when any pool key exists;
    /// [`PoolError::BadInput`], [`PoolError::DuplicateId`],
    /// [`PoolError::WrongKeyType`], [`PoolError::Redis`].
    pub async fn init<S: AsRef<str>>(&self, ids: &[S]) -> Result<u64, PoolError> {
        self.init_with(ids, None).await
    }

    /// [`Pool::init`] that also stores the strike setting (`None`: off),
    /// in the same script call as the first ids.
    ///
    /// Errors: as [`Pool::init`]; [`PoolError::BadInput`] for a policy out
    /// of range.
    pub async fn init_with<S: AsRef<str>>(
        &self,
        ids: &[S],
        strikes: Option<StrikePolicy>,
    ) -> Result<u64, PoolError> {
        limits::ids(ids)?;
        let strikes = StrikePolicy::args(strikes)?;
        let mut chunks = ids.chunks(IDS_PER_CALL.max as usize);
        let mut inv = self.invocation(PoolScript::Init);
        inv.arg(&strikes[0]).arg(&strikes[1]);
        for id in chunks.next().unwrap_or_default() {
            inv.arg(id.as_ref());
        }
        let mut added = count_reply(PoolScript::Init, self.run(&inv).await?)?;
        for chunk in chunks {
            added += self.batch(PoolScript::Add, &[], chunk).await?;
        }
        Ok(added)
    }

    /// Adds new `ids` to the pool, due at once, in calls of at most 1000
    /// ids (each call all or nothing; all ids are checked before the
    /// first). Returns how many ids were added.
    ///
    /// Errors: [`PoolError::DuplicateId`] for an id given twice or already
    /// in ready, leases, owners or disabled; [`PoolError::BadInput`],
    /// [`PoolError::WrongKeyType`], [`PoolError::Redis`].
    pub async fn add<S: AsRef<str>>(&self, ids: &[S]) -> Result<u64, PoolError> {
        self.in_batches(PoolScript::Add, &[], ids).await
    }

    /// Takes `ids` out of service (calls of at most 1000 ids): a ready id
    /// leaves ready now; a leased one stays leased and leaves ready out at
    /// its release or expiry. Returns how many were newly disabled.
    ///
    /// Errors: [`PoolError::UnknownId`], [`PoolError::DuplicateId`],
    /// [`PoolError::BadInput`], [`PoolError::WrongKeyType`],
    /// [`PoolError::Redis`].
    pub async fn disable<S: AsRef<str>>(&self, ids: &[S]) -> Result<u64, PoolError> {
        self.in_batches(PoolScript::Disable, &[], ids).await
    }

    /// Puts disabled `ids` back into service (calls of at most 1000 ids):
    /// due when they were before being disabled (a cooldown still running
    /// is kept), else at once; a leased one at its release or expiry, a
    /// quarantined one at the quarantine's end. Returns how many were
    /// enabled.
    ///
    /// Errors: as [`Pool::disable`].
    pub async fn enable<S: AsRef<str>>(&self, ids: &[S]) -> Result<u64, PoolError> {
        self.in_batches(PoolScript::Enable, &["0"], ids).await
    }

    /// [`Pool::enable`] that also ends the quarantine of each id now
    /// (`enable --force`), disabled or not. Returns how many ids were
    /// enabled or had their quarantine ended.
    ///
    /// Errors: as [`Pool::disable`].
    pub async fn enable_force<S: AsRef<str>>(&self, ids: &[S]) -> Result<u64, PoolError> {
        self.in_batches(PoolScript::Enable, &["1"], ids).await
    }

    /// Checks all `ids`, then runs `script` on batches of at most 1000,
    /// each after the arguments `head`.
    async fn in_batches<S: AsRef<str>>(
        &self,
        script: PoolScript,
        head: &[&str],
        ids: &[S],
    ) -> Result<u64, PoolError> {
        limits::ids(ids)?;
        let mut count = 0;
        for chunk in ids.chunks(IDS_PER_CALL.max as usize) {
            count += self.batch(script, head, chunk).await?;
        }
        Ok(count)
    }

    /// The pool's strike setting (`None`: off).
    ///
    /// Errors: [`PoolError::NoPool`], [`PoolError::WrongKeyType`],
    /// [`PoolError::Redis`].
    pub async fn strikes(&self) -> Result<Option<StrikePolicy>, PoolError> {
        self.config(&[]).await
    }

    /// Sets the pool's strike setting (`None`: off); answers it as stored.
    ///
    /// Errors: [`PoolError::BadInput`] for a policy out of range;
    /// [`PoolError::NoPool`], [`PoolError::WrongKeyType`],
    /// [`PoolError::Redis`].
    pub async fn set_strikes(
        &self,
        strikes: Option<StrikePolicy>,
    ) -> Result<Option<StrikePolicy>, PoolError> {
        let args = StrikePolicy::args(strikes)?;
        self.config(&args).await
    }

    async fn config(&self, args: &[String]) -> Result<Option<StrikePolicy>, PoolError> {
        let mut inv = self.invocation(PoolScript::Config);
        for arg in args {
            inv.arg(arg);
        }
        let mut reply = Reply::new(PoolScript::Config, self.run(&inv).await?)?;
        let max_strikes = reply.uint()?;
        let window = reply.uint()?;
        Ok((max_strikes > 0).then(|| StrikePolicy {
            max_strikes: u32::try_from(max_strikes).unwrap_or(u32::MAX),
            window: Duration::from_millis(window),
        }))
    }

    /// One acquire: reclaims at most 100 expired leases, then leases the
    /// first due id, or answers [`Acquired::Empty`] with the next-due hint.
    /// The token is 128 random bits in hex.
    ///
    /// Errors: [`PoolError::BadInput`] (see [`AcquireRequest`] for ranges),
    /// [`PoolError::WrongKeyType`], [`PoolError::Redis`].
    pub async fn acquire(&self, req: &AcquireRequest) -> Result<Acquired<C>, PoolError> {
        let script = PoolScript::Acquire.script();
        match self.acquire_through(req, script, &[], &[]).await? {
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
    pub(crate) async fn acquire_through(
        &self,
        req: &AcquireRequest,
        script: &redis::Script,
        extra_keys: &[String],
        head: &[String],
    ) -> Result<AcquireReply<C>, PoolError> {
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
        let mut reply = Reply::new(PoolScript::Acquire, self.run(&inv).await?)?;
        match reply.int()? {
            0 => {
                let hint = reply.int()?;
                let next_due_in = u64::try_from(hint).ok().map(Duration::from_millis);
                let at_ms = reply.uint()?;
                Ok(AcquireReply::Acquired(Acquired::Empty {
                    next_due_in,
                    at_ms,
                }))
            }
            1 => {
                let id = reply.string()?;
                let token = reply.string()?;
                let deadline_ms = reply.uint()?;
                let fence = reply.uint()?;
                reply.uint()?; // Redis now: the lease start, unless replayed
                let replayed = reply.int()? == 1;
                Ok(AcquireReply::Acquired(Acquired::Leased(PoolLease::new(
                    self.clone(),
                    id,
                    token,
                    deadline_ms,
                    fence,
                    replayed,
                ))))
            }
            code => {
                let mut rest = Vec::new();
                while let Ok(n) = reply.uint() {
                    rest.push(n);
                }
                Ok(AcquireReply::Other { code, rest })
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
            let acquired = self.acquire(req).await?;
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

    /// Extends the lease of `id` held with `token` (the CLI and HTTP form of
    /// [`PoolLease::extend`]): deadline = Redis now + `ttl` (whole ms,
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
        let mut reply = Reply::new(PoolScript::Extend, self.run(&inv).await?)?;
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
    /// of [`PoolLease::release`]): the id becomes due at Redis now +
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

    /// Reclaims at most `limit` (1-1000) expired leases: their ids become
    /// due at Redis now + `cooldown` (whole ms, 0 to 600 s), disabled ones
    /// stay out of ready; and ends at most `limit` quarantines whose time
    /// has come (their ids due now, disabled ones left out). For a maintenance loop, so expired leases come
    /// back even when nobody acquires.
    ///
    /// Errors: [`PoolError::BadInput`], [`PoolError::WrongKeyType`],
    /// [`PoolError::Redis`].
    pub async fn reap(&self, limit: usize, cooldown: Duration) -> Result<Reaped, PoolError> {
        let limit = limits::count("limit", limit, REAP_LIMIT)?;
        let cooldown = limits::millis("cooldown", cooldown, COOLDOWN_MS)?;
        let mut inv = self.invocation(PoolScript::Reap);
        inv.arg(limit).arg(cooldown);
        let mut reply = Reply::new(PoolScript::Reap, self.run(&inv).await?)?;
        Ok(Reaped {
            at_ms: reply.uint()?,
            still_expired: reply.uint()?,
            quarantines_ended: reply.uint()?,
            ids: reply.rest_strings()?,
        })
    }

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

/// A script's count reply.
fn count_reply(script: PoolScript, value: Value) -> Result<u64, PoolError> {
    match value {
        Value::Int(n) if n >= 0 => Ok(n as u64),
        other => Err(PoolError::Reply {
            script: script.name(),
            detail: format!("expected a count, got {other:?}"),
        }),
    }
}
