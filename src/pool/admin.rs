//! Admin operations on a pool's ids: init, add, disable, enable, the
//! strike setting, and the reap that reclaims expired leases.

use std::time::Duration;

use redis::{RedisError, Value};
use tracing::warn;

use super::limits::{self, COOLDOWN_MS, IDS_PER_CALL, MAX_STRIKES, REAP_LIMIT, STRIKE_WINDOW_MS};
use super::script::Reply;
use super::{Pool, PoolError, PoolScript};
use crate::lease::node::{self, FirstUse};

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

impl<C> Pool<C>
where
    C: super::AcquireConnection,
{
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
        inv.arg(&strikes[0]).arg(&strikes[1]).arg(self.max_lease_ms);
        for id in chunks.next().unwrap_or_default() {
            inv.arg(id.as_ref());
        }
        let (added, written) = init_reply(self.run(&inv).await?)?;
        let mut added = added;
        for chunk in chunks {
            added += self.batch(PoolScript::Add, &[], chunk).await?;
        }
        self.open_first_use(written).await?;
        Ok(added)
    }

    /// Opens the pool `init` wrote closed once its record is durable
    /// (`lease::node::open_first_use`): where Redis cannot say, it stays
    /// closed until its own time (logged); not durable in time is
    /// [`PoolError::NotDurable`].
    async fn open_first_use(&self, written: String) -> Result<(), PoolError> {
        let record = self.first_record(written);
        let mut conn = self.conn.clone();
        let not_durable = |detail: String| PoolError::NotDurable {
            pool: self.name.to_string(),
            detail,
        };
        match node::open_first_use(&mut conn, &[record], node::FIRST_USE_WAIT).await {
            Ok(FirstUse::Opened { .. }) => Ok(()),
            Ok(FirstUse::Unchecked(why)) => {
                warn!(pool = %self.name, why = %why, "new pool: Redis did not say whether its first record would outlast a restart or failover, so it opens one max lease after the init, as after a rollback (docs/pool.md)");
                Ok(())
            }
            Err(err) => Err(match err.downcast::<RedisError>() {
                Ok(err) => PoolError::Redis(err),
                Err(err) => not_durable(format!("{err:#}")),
            }),
        }
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
}

/// A script's count reply.
/// init.lua's `{added, record}`.
fn init_reply(value: Value) -> Result<(u64, String), PoolError> {
    let bad = |detail: String| PoolError::Reply {
        script: PoolScript::Init.name(),
        detail,
    };
    match value {
        Value::Array(items) => match &items[..] {
            [Value::Int(n), record] if *n >= 0 => Ok((
                *n as u64,
                redis::from_redis_value_ref(record).map_err(|e| bad(e.to_string()))?,
            )),
            other => Err(bad(format!("expected {{added, record}}, got {other:?}"))),
        },
        other => Err(bad(format!("expected {{added, record}}, got {other:?}"))),
    }
}

fn count_reply(script: PoolScript, value: Value) -> Result<u64, PoolError> {
    match value {
        Value::Int(n) if n >= 0 => Ok(n as u64),
        other => Err(PoolError::Reply {
            script: script.name(),
            detail: format!("expected a count, got {other:?}"),
        }),
    }
}
