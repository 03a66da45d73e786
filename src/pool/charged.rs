//! A pool acquire with a charge to a rate budget (`budget::Charge`),
//! atomic in one script: an id is leased only together with the charge (a
//! crawler leases a proxy and charges the domain). Here, not in `budget`:
//! it is an acquire of the pool through acquire.lua, and so budget never
//! imports pool.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{AcquireReply, AcquireRequest, Acquired, Pool, PoolError};
use crate::budget::{BudgetError, Charge, Taken};

/// The script: the generated tables, `charge_prelude.lua`, `node.lua`, both
/// `common.lua` files, acquire.lua as `acquire_pool()`, `charge.lua`.
static SOURCE: LazyLock<String> = LazyLock::new(|| {
    [
        super::limits::lua_table().as_str(),
        &crate::budget::limits::lua_table(),
        include_str!("../budget/charge_prelude.lua"),
        crate::lease::node::PRELUDE,
        include_str!("common.lua"),
        include_str!("../budget/common.lua"),
        "local function acquire_pool()\n",
        include_str!("acquire.lua"),
        "\nend\n",
        include_str!("../budget/charge.lua"),
    ]
    .concat()
});

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(&SOURCE));

/// The Lua source of the acquire with a charge, as sent (for tools).
pub fn charge_source() -> &'static str {
    &SOURCE
}

/// The answer to an acquire with a charge.
pub enum ChargedAcquire<C> {
    /// The pool's answer: leased (and charged; a replay was charged when
    /// first granted), or nothing due (nothing charged).
    Acquired(Acquired<C>),
    /// The budget denied the charge; nothing was leased.
    /// `retry_after_ms` says when to come back.
    Denied(Taken),
}

impl<C> std::fmt::Debug for ChargedAcquire<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Acquired(acquired) => f.debug_tuple("Acquired").field(acquired).finish(),
            Self::Denied(taken) => f.debug_tuple("Denied").field(taken).finish(),
        }
    }
}

/// Bad charge input as the pool's error (the CLI and HTTP name the field).
fn pool_error(err: BudgetError) -> PoolError {
    match err {
        BudgetError::BadInput { field, expected } => PoolError::BadInput { field, expected },
        other => PoolError::Reply {
            script: "acquire_charged",
            detail: other.to_string(),
        },
    }
}

/// One acquire of `pool` with `charge`, in one script call (the first
/// acquire of a new pool waits up to 5 s for its first record, as
/// [`Pool::acquire`]).
///
/// Errors: as [`Pool::acquire`]; [`PoolError::BadInput`] for a bad charge
/// (fields `budget`, `keys[i]`, `keys[i].rate`, `keys[i].burst`, `cost`).
pub async fn acquire_charged<C>(
    pool: &Pool<C>,
    req: &AcquireRequest,
    charge: &Charge,
) -> Result<ChargedAcquire<C>, PoolError>
where
    C: super::AcquireConnection,
{
    acquire_charged_within(pool, req, charge, Duration::ZERO).await
}

/// [`acquire_charged`] whose caller has `wait_left` of its own wait: that
/// bounds a new pool's first-use wait (`Pool::acquire_through`).
async fn acquire_charged_within<C>(
    pool: &Pool<C>,
    req: &AcquireRequest,
    charge: &Charge,
    wait_left: Duration,
) -> Result<ChargedAcquire<C>, PoolError>
where
    C: super::AcquireConnection,
{
    let (keys, head) = charge.checked(pool.name()).map_err(pool_error)?;
    match pool
        .acquire_through(req, &SCRIPT, &keys, &head, wait_left)
        .await?
    {
        AcquireReply::Acquired(acquired) => Ok(ChargedAcquire::Acquired(acquired)),
        AcquireReply::Other { code: 2, rest } if rest.len() == 4 => {
            Ok(ChargedAcquire::Denied(Taken {
                allowed: false,
                retry_after_ms: rest[0],
                at_ms: rest[1],
                remaining: rest[2],
                reset_after_ms: rest[3],
            }))
        }
        AcquireReply::Other { code, rest } => Err(PoolError::Reply {
            script: "acquire_charged",
            detail: format!("unknown answer {code} {rest:?}"),
        }),
    }
}

/// [`acquire_charged`], retried until `wait` has passed or `stop` is
/// cancelled: after a denial it sleeps by `retry_after_ms`, after an empty
/// pool by the pool's backoff. Returns the last answer; a denial whose
/// `retry_after_ms` is beyond what is left of `wait` at once. A new pool's
/// first acquire waits for its first record as in [`Pool::acquire_wait`]
/// (what is left of `wait`, 5-60 s).
///
/// Errors: as [`acquire_charged`], returned at once.
pub async fn acquire_charged_wait<C>(
    pool: &Pool<C>,
    req: &AcquireRequest,
    charge: &Charge,
    wait: Duration,
    stop: &CancellationToken,
) -> Result<ChargedAcquire<C>, PoolError>
where
    C: super::AcquireConnection,
{
    let start = Instant::now();
    let mut attempt: u32 = 0;
    loop {
        let left = wait.saturating_sub(start.elapsed());
        let answer = acquire_charged_within(pool, req, charge, left).await?;
        let remaining = wait.saturating_sub(start.elapsed());
        let sleep = match &answer {
            ChargedAcquire::Acquired(Acquired::Leased(_)) => return Ok(answer),
            _ if remaining.is_zero() || stop.is_cancelled() => return Ok(answer),
            // Under GCRA nobody can make the budget's retry come sooner
            // (an empty pool may: a release, so that one waits on).
            ChargedAcquire::Denied(taken) if taken.retry_after() > remaining => {
                return Ok(answer);
            }
            ChargedAcquire::Denied(taken) => crate::timing::denied_pause(
                taken.retry_after(),
                attempt,
                remaining,
                &mut rand::rng(),
            ),
            ChargedAcquire::Acquired(Acquired::Empty { next_due_in, .. }) => {
                crate::timing::wait_pause(*next_due_in, attempt, remaining, &mut rand::rng())
            }
        };
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = stop.cancelled() => return Ok(answer),
        }
        attempt = attempt.saturating_add(1);
    }
}
