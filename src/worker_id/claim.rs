//! Worker-ID claims: the names of an app's keys and `claim.lua`, which
//! re-adopts our own key or takes the lowest free worker ID in one round
//! trip, behind the app's claim guard.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::identity::Owner;
use crate::lease::{step, ttl_ms};

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("claim.lua")));

/// Names of one app's keys, all under `<prefix><app>:` (snowlease never
/// touches other keys): lease keys `<id>`, the claim guard `guard`, and
/// start-up probe keys `probe:<nonce>`.
#[derive(Debug, Clone)]
pub struct LeaseKeys {
    base: String,
}

impl LeaseKeys {
    /// Keys of `app` under `prefix` (both validated by the caller).
    pub fn new(prefix: &str, app: &str) -> Self {
        Self {
            base: format!("{prefix}{app}:"),
        }
    }

    /// The lease key of one worker ID.
    pub fn id(&self, worker_id: u16) -> String {
        format!("{}{worker_id}", self.base)
    }

    /// The lease keys of IDs `0..=max_worker_id`, in ID order.
    pub fn ids(&self, max_worker_id: u16) -> Vec<String> {
        (0..=max_worker_id).map(|id| self.id(id)).collect()
    }

    /// The app's claim guard (see `claim.lua`).
    pub fn guard(&self) -> String {
        format!("{}guard", self.base)
    }

    /// The start-up probe key of one process.
    pub fn probe(&self, nonce: &str) -> String {
        format!("{}probe:{nonce}", self.base)
    }
}

/// What [`claim_lowest`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key at this index is ours now (`SET NX PX`).
    Claimed(usize),
    /// The key at this index already held our owner string (an earlier
    /// claim whose reply was lost had run); its TTL was reset.
    Adopted(usize),
    /// Every key is held (by others, or by keys of another type).
    AllHeld,
    /// The claim guard is closed for `wait`: Redis is fresh or lost its
    /// data, and holders from before may still publish their IDs.
    Paused {
        /// Time until claims are allowed.
        wait: Duration,
        /// What this call found the guard to be.
        guard: GuardFound,
    },
}

/// The claim guard as a paused claim found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardFound {
    /// Missing, and set now: Redis is fresh or lost its data.
    Missing,
    /// More than one TTL ahead (set by hand, or Redis' clock went back);
    /// pulled in to one TTL.
    TooFar,
    /// Closed as an earlier claim set it.
    Closed,
}

/// Result of [`claim_lowest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimReply {
    /// What happened.
    pub outcome: ClaimOutcome,
    /// Indexes of keys of another type; they are never touched.
    pub wrong_type: Vec<usize>,
    /// With `Claimed` or `Adopted`: Redis time (ms) before which the key
    /// cannot have expired (see `claim.lua`); the first renew passes it on.
    pub expires_ms: u64,
}

/// Runs `claim.lua`: in one round trip, adopts a key that already holds our
/// owner string, else, when the app's claim guard is open, takes the lowest
/// missing key with `SET NX PX`. A missing guard is set to Redis time + TTL
/// (see the script header for why).
///
/// All keys go to one script, so on Redis Cluster they would have to share
/// a slot; Cluster is not supported yet.
/// A transient error may hide a claim that ran; calling this again finds and
/// adopts that key instead of taking a second one (docs/worker.md, "Claim").
pub async fn claim_lowest<C: ConnectionLike>(
    conn: &mut C,
    keys: &[String],
    guard_key: &str,
    owner: &Owner,
    ttl: Duration,
) -> redis::RedisResult<ClaimReply> {
    let mut invocation = CLAIM.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    invocation.key(guard_key);
    let (index, how, wrong_type, wait_ms, expires_ms): (i64, i64, Vec<usize>, u64, u64) =
        invocation
            .arg(owner.as_str())
            .arg(ttl_ms(ttl))
            .invoke_async(conn)
            .await?;
    let outcome = match (usize::try_from(index), how) {
        (Ok(index), 2) => ClaimOutcome::Adopted(index),
        (Ok(index), _) => ClaimOutcome::Claimed(index),
        _ if index == -2 => ClaimOutcome::Paused {
            wait: Duration::from_millis(wait_ms),
            guard: match how {
                1 => GuardFound::Missing,
                2 => GuardFound::TooFar,
                _ => GuardFound::Closed,
            },
        },
        _ => ClaimOutcome::AllHeld,
    };
    Ok(ClaimReply {
        outcome,
        wrong_type,
        expires_ms,
    })
}

/// Loads `claim.lua` into the script cache at start, so a missing
/// `+script|load` shows before the first claim; its `TYPE` and `TIME` are
/// checked by the first claim itself.
pub(crate) async fn load<C: ConnectionLike>(conn: &mut C) -> redis::RedisResult<()> {
    CLAIM
        .load_async(conn)
        .await
        .map(drop)
        .map_err(step("SCRIPT LOAD failed (needs +script|load +evalsha)"))
}
