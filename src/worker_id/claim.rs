//! Worker-ID claims: one call of
//! `claim.lua`, which re-adopts our own key or takes the lowest free worker
//! ID of its pairs behind their claim guard: one guard per app on one
//! server, one per ID key in that key's slot on Cluster (docs/worker.md,
//! "Claim guard"). Which pairs a call gets: `claim/claimer.rs`.

pub(crate) mod claimer;
pub(crate) mod windows;

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Script, ServerErrorKind};

use super::keys::LeaseKeys;
use crate::identity::Owner;
use crate::lease::step;
use crate::timing::ttl_ms;

pub use self::claimer::{Claimer, claim_lowest};
pub use self::windows::{ClaimWindow, start_window, window_of, windows};

static CLAIM: LazyLock<Script> =
    LazyLock::new(|| crate::lease::node::script(include_str!("claim.lua")));

/// What a claim did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key of this worker ID is ours now (`SET NX PX`).
    Claimed(usize),
    /// The key of this worker ID already held our owner string (an earlier
    /// claim whose reply was lost had run); its TTL was reset.
    Adopted(usize),
    /// Every key is held (by others, or by keys of another type).
    AllHeld,
    /// No key could be taken and at least one free ID's claim guard is
    /// closed: holders from before a data loss may still publish those IDs.
    Paused {
        /// Time until the soonest closed guard opens.
        wait: Duration,
        /// What this call found the guards to be.
        guard: GuardFound,
    },
}

/// The claim guards as a paused claim found them (the most telling one:
/// missing before another node before too far before closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardFound {
    /// Missing, and set now: first use, or Redis (on Cluster: the shard)
    /// lost its data.
    Missing,
    /// More than one TTL ahead (set by hand, or Redis' clock went back);
    /// pulled in to one TTL.
    TooFar,
    /// Written on another node, or by a version without node stamps: Redis
    /// restarted (from an older RDB or AOF, perhaps) or failed over (to a
    /// replica that may have missed writes) since, so it may have rolled
    /// back and lost leases; closed for one TTL now (docs/rollback-design.md).
    OtherNode,
    /// Closed as an earlier claim set it.
    Closed,
}

impl GuardFound {
    /// The more telling of two findings, `self` on a tie: missing before another node
    /// before too far before closed. `claim.lua` ranks the guards of one call the same way
    /// (its `rank` table; `tests/it/claim_script.rs` runs both for every pair); a Cluster
    /// claim ranks its calls' findings with this.
    pub fn more_telling(self, other: Self) -> Self {
        let rank = |g| match g {
            Self::Missing => 3,
            Self::OtherNode => 2,
            Self::TooFar => 1,
            Self::Closed => 0,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// Result of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimReply {
    /// What happened.
    pub outcome: ClaimOutcome,
    /// Worker IDs whose key has another type; they are never touched.
    pub wrong_type: Vec<usize>,
    /// With `Claimed` or `Adopted`: Redis time (ms) before which the key
    /// cannot have expired (see `claim.lua`); the first renew passes it on.
    pub expires_ms: u64,
    /// Cluster, with a missing guard: guards of other IDs or lease keys of
    /// the app exist, so only some shards lost their data. Always false on
    /// one server.
    pub other_shards_kept_data: bool,
    /// Round trips this claim made: script calls, and on Cluster each read
    /// of a window's keys (one pipeline per node, at once) once.
    pub calls: u32,
}

/// `claim.lua`'s reply: index, how, wrong, wait_ms, expires_ms, hint.
type RawReply = (i64, i64, Vec<usize>, u64, u64, i64);

/// An `EVALSHA` of `claim.lua` over `keys` (pairs, then the hint key when
/// `window` is given: the worker ID of the first pair and the step between
/// pairs' IDs), built once and sent as often as needed.
pub(crate) fn claim_cmd<K: AsRef<str>>(
    keys: &[K],
    owner: &Owner,
    ttl: Duration,
    window: Option<(u16, u16)>,
) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(CLAIM.get_hash()).arg(keys.len());
    for key in keys {
        cmd.arg(key.as_ref());
    }
    cmd.arg(owner.as_str()).arg(ttl_ms(ttl));
    if let Some((first_id, step)) = window {
        cmd.arg(first_id).arg(step);
    }
    cmd
}

/// Sends one `claim_cmd`; a script cache without `claim.lua` (a restart,
/// `SCRIPT FLUSH`) gets it loaded and the call sent again, as redis-rs'
/// `invoke_async` does. Returns the reply and the ID the hint names.
pub(crate) async fn run_claim<C: ConnectionLike>(
    conn: &mut C,
    cmd: &Cmd,
) -> redis::RedisResult<(ClaimReply, Option<u16>)> {
    let raw: RawReply = match cmd.query_async(conn).await {
        Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            CLAIM.load_async(conn).await?;
            cmd.query_async(conn).await?
        }
        other => other?,
    };
    let hint = u16::try_from(raw.5).ok();
    Ok((reply_of(raw), hint))
}

fn reply_of((index, how, wrong_type, wait_ms, expires_ms, _): RawReply) -> ClaimReply {
    let outcome = match (usize::try_from(index), how) {
        (Ok(index), 2) => ClaimOutcome::Adopted(index),
        (Ok(index), _) => ClaimOutcome::Claimed(index),
        _ if index == -2 => ClaimOutcome::Paused {
            wait: Duration::from_millis(wait_ms),
            guard: match how {
                1 => GuardFound::Missing,
                2 => GuardFound::TooFar,
                3 => GuardFound::OtherNode,
                _ => GuardFound::Closed,
            },
        },
        _ => ClaimOutcome::AllHeld,
    };
    ClaimReply {
        outcome,
        wrong_type,
        expires_ms,
        other_shards_kept_data: false,
        calls: 1,
    }
}

/// Runs `claim.lua` once on `pairs` of (lease key, its guard) in ID order:
/// adopts a key that holds our owner string, else takes the first free key
/// whose guard is open. Indexes in the reply are positions in `pairs`. On
/// Cluster every key of one call must share a slot (one pair per call).
///
/// Errors: Redis errors; a guard of another type than string.
pub async fn claim_pairs<C: ConnectionLike>(
    conn: &mut C,
    pairs: &[(String, String)],
    owner: &Owner,
    ttl: Duration,
) -> redis::RedisResult<ClaimReply> {
    let keys: Vec<&str> = pairs
        .iter()
        .flat_map(|(key, guard)| [key.as_str(), guard.as_str()])
        .collect();
    let cmd = claim_cmd(&keys, owner, ttl, None);
    Ok(run_claim(conn, &cmd).await?.0)
}

/// Loads `claim.lua` into the script cache at start, so a missing
/// `+script|load` shows before the first claim; its `MGET`, `SET` and
/// `TIME` are checked by the first claim itself.
pub(crate) async fn load<C: ConnectionLike>(conn: &mut C) -> redis::RedisResult<()> {
    CLAIM
        .load_async(conn)
        .await
        .map(drop)
        .map_err(step("SCRIPT LOAD failed (needs +script|load +evalsha)"))
}
