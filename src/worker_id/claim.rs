//! Worker-ID claims: the names of an app's keys and one call of
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

use super::range::WorkerRange;
use crate::connection::Keyspace;
use crate::identity::Owner;
use crate::lease::step;
use crate::timing::ttl_ms;

pub use self::claimer::{Claimer, claim_lowest};
pub use self::windows::{ClaimWindow, start_window, window_of, windows};

static CLAIM: LazyLock<Script> =
    LazyLock::new(|| crate::lease::node::script(include_str!("claim.lua")));

/// Names of one app's keys, all under `<prefix><app>:` (snowlease never
/// touches other keys): lease keys `<id>`, the claim guard `guard` (one
/// server) or `guard:{<lease key>}` (Cluster, one per ID), the claim hint
/// `hint` (one server, ranges over 32 IDs), the ranges record `ranges` and
/// start-up probe keys `probe:<nonce>`.
#[derive(Debug, Clone)]
pub struct LeaseKeys {
    base: String,
}

impl LeaseKeys {
    /// Keys of `app` under `prefix` (both validated by the caller: no
    /// braces, so a lease key has no hash tag of its own).
    pub fn new(prefix: &str, app: &str) -> Self {
        Self {
            base: format!("{prefix}{app}:"),
        }
    }

    /// The lease key of one worker ID.
    pub fn id(&self, worker_id: u16) -> String {
        format!("{}{worker_id}", self.base)
    }

    /// A `SCAN MATCH` pattern for every key of the app (lease keys, guards,
    /// probes; [`Self::worker_id_of`] picks the lease keys).
    pub(crate) fn pattern(&self) -> String {
        format!("{}*", glob_escape(&self.base))
    }

    /// The worker ID a key of this app is the lease key of (`<base><digits>`,
    /// as [`Self::id`] writes it), or None for any other key.
    pub(crate) fn worker_id_of(&self, key: &str) -> Option<u32> {
        let digits = key.strip_prefix(&self.base)?;
        let canonical = digits == "0" || !digits.starts_with('0');
        let id = digits.parse::<u32>().ok()?;
        (canonical && digits.bytes().all(|b| b.is_ascii_digit())).then_some(id)
    }

    /// The lease keys of the IDs of `range`, in ID order.
    pub(crate) fn ids(&self, range: WorkerRange) -> Vec<String> {
        range.ids().map(|id| self.id(id)).collect()
    }

    /// The app's claim guard on one server (standalone, Sentinel): the
    /// whole dataset is one failure domain (see `claim.lua`).
    pub(crate) fn guard(&self) -> String {
        format!("{}guard", self.base)
    }

    /// The app's claim hint on one server: the ID the last claim in a
    /// window took, where newcomers look when their first window is full
    /// (docs/worker.md, "Claim windows").
    pub(crate) fn hint(&self) -> String {
        format!("{}hint", self.base)
    }

    /// The claim guard of one worker ID on Cluster: its hash tag is the
    /// lease key itself, so it lives in the lease key's slot and is lost
    /// with it when that shard loses its data.
    pub(crate) fn id_guard(&self, worker_id: u16) -> String {
        format!("{}guard:{{{}}}", self.base, self.id(worker_id))
    }

    /// The guard of each ID of `range`, in ID order: the app guard for
    /// every ID on one server ([`Keyspace::Whole`]), the per-ID guards on
    /// Cluster ([`Keyspace::Slots`]).
    pub fn guards(&self, range: WorkerRange, keyspace: Keyspace) -> Vec<String> {
        range
            .ids()
            .map(|id| match keyspace {
                Keyspace::Slots => self.id_guard(id),
                Keyspace::Whole => self.guard(),
            })
            .collect()
    }

    /// The app's ranges record: the `--worker-ids` of its sidecars, each
    /// entry expiring on its own (`range/record.lua`).
    pub(crate) fn ranges(&self) -> String {
        format!("{}ranges", self.base)
    }

    /// The start-up probe key of one process.
    pub(crate) fn probe(&self, nonce: &str) -> String {
        format!("{}probe:{nonce}", self.base)
    }
}

/// A `SCAN MATCH` glob that matches `text` literally (glob characters in a
/// prefix or app name match only themselves).
pub(crate) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use redis::cluster_routing::Slot;

    /// Each per-ID guard hashes to its lease key's slot (so one script sees
    /// both on Cluster), and the app guard of one server keeps its name.
    #[test]
    fn per_id_guard_shares_the_lease_key_slot() {
        for (prefix, app) in [
            ("snowflake:worker:", "orders"),
            ("custom:ids:", "billing"),
            ("p", "a-b_c.d"),
        ] {
            let keys = LeaseKeys::new(prefix, app);
            assert_eq!(keys.guard(), format!("{prefix}{app}:guard"));
            let mut slots = std::collections::HashSet::new();
            for id in [0u16, 1, 7, 31, 512, 1023] {
                let (key, guard) = (keys.id(id), keys.id_guard(id));
                assert_eq!(guard, format!("{prefix}{app}:guard:{{{key}}}"));
                assert_eq!(
                    Slot::for_key(&key),
                    Slot::for_key(&guard),
                    "{key} / {guard}"
                );
                slots.insert(Slot::for_key(&key));
            }
            // The lease keys themselves spread over slots (no hash tag).
            assert!(slots.len() > 1, "{prefix}{app}: {slots:?}");
        }
    }

    #[test]
    fn lease_keys_are_told_from_other_keys_of_the_app() {
        let keys = LeaseKeys::new("p:", "a*b");
        assert_eq!(keys.pattern(), "p:a\\*b:*");
        assert_eq!(keys.worker_id_of("p:a*b:7"), Some(7));
        assert_eq!(keys.worker_id_of("p:a*b:0"), Some(0));
        assert_eq!(keys.worker_id_of("p:a*b:1023"), Some(1023));
        for other in [
            "p:a*b:guard",
            "p:a*b:07",
            "p:a*b:",
            "p:a*b:+7",
            "p:a*b:7x",
            "p:ab:7",
        ] {
            assert_eq!(keys.worker_id_of(other), None, "{other}");
        }
    }

    #[test]
    fn guards_follow_the_topology() {
        let keys = LeaseKeys::new("p:", "a");
        assert_eq!(
            keys.guards(WorkerRange::up_to(1), Keyspace::Whole),
            vec!["p:a:guard", "p:a:guard"]
        );
        assert_eq!(
            keys.guards(WorkerRange::new(7, 8).unwrap(), Keyspace::Slots),
            vec!["p:a:guard:{p:a:7}", "p:a:guard:{p:a:8}"]
        );
    }
}
