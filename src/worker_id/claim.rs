//! Worker-ID claims: the names of an app's keys and `claim.lua`, which
//! re-adopts our own key or takes the lowest free worker ID behind its
//! claim guard: on one server in one round trip with one guard per app, on
//! Cluster with one guard per ID key in that key's slot (docs/worker.md, "Claim
//! guard").

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::connection::{Keyspace, Redis};
use crate::identity::Owner;
use crate::lease::step;
use crate::timing::ttl_ms;

static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("claim.lua")));

/// Names of one app's keys, all under `<prefix><app>:` (snowlease never
/// touches other keys): lease keys `<id>`, the claim guard `guard` (one
/// server) or `guard:{<lease key>}` (Cluster, one per ID), and start-up
/// probe keys `probe:<nonce>`.
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

    /// The lease keys of IDs `0..=max_worker_id`, in ID order.
    pub(crate) fn ids(&self, max_worker_id: u16) -> Vec<String> {
        (0..=max_worker_id).map(|id| self.id(id)).collect()
    }

    /// The app's claim guard on one server (standalone, Sentinel): the
    /// whole dataset is one failure domain (see `claim.lua`).
    pub(crate) fn guard(&self) -> String {
        format!("{}guard", self.base)
    }

    /// The claim guard of one worker ID on Cluster: its hash tag is the
    /// lease key itself, so it lives in the lease key's slot and is lost
    /// with it when that shard loses its data.
    pub(crate) fn id_guard(&self, worker_id: u16) -> String {
        format!("{}guard:{{{}}}", self.base, self.id(worker_id))
    }

    /// The guard of each ID, in ID order: the app guard for every ID on
    /// one server ([`Keyspace::Whole`]), the per-ID guards on Cluster
    /// ([`Keyspace::Slots`]).
    pub fn guards(&self, max_worker_id: u16, keyspace: Keyspace) -> Vec<String> {
        (0..=max_worker_id)
            .map(|id| match keyspace {
                Keyspace::Slots => self.id_guard(id),
                Keyspace::Whole => self.guard(),
            })
            .collect()
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

/// What [`claim_lowest`] did.
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
/// missing before too far before closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardFound {
    /// Missing, and set now: first use, or Redis (on Cluster: the shard)
    /// lost its data.
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
    /// Worker IDs whose key has another type; they are never touched.
    pub wrong_type: Vec<usize>,
    /// With `Claimed` or `Adopted`: Redis time (ms) before which the key
    /// cannot have expired (see `claim.lua`); the first renew passes it on.
    pub expires_ms: u64,
    /// Cluster, with a missing guard: guards of other IDs or lease keys of
    /// the app exist, so only some shards lost their data. Always false on
    /// one server.
    pub other_shards_kept_data: bool,
    /// Redis calls this claim made (a Cluster MGET counts once).
    pub calls: u32,
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
    let mut invocation = CLAIM.prepare_invoke();
    for (key, guard) in pairs {
        invocation.key(key).key(guard);
    }
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
        other_shards_kept_data: false,
        calls: 1,
    })
}

/// Claims the lowest free worker ID of `0..=max_worker_id`, or adopts a key
/// that already holds our owner string (docs/worker.md, "Claim").
///
/// One server ([`Redis::keyspace`] whole): one `claim.lua` call with every
/// pair, all naming the app guard: one round trip. Cluster: a single-key
/// `MGET` of every lease key (`Redis::read_each`: one pipeline per node, at
/// once) finds our own key and the free ones;
/// then `claim.lua` runs on one (lease key, per-ID guard) pair per call,
/// free IDs in ID order, until one is taken. A free ID behind a closed
/// guard (its shard lost data) does not stop the walk: IDs on shards that
/// kept their data can still be claimed. The `MGET` is only a hint: each
/// script call decides on its own slot.
///
/// A transient error may hide a claim that ran; calling this again finds and
/// adopts that key instead of taking a second one. Errors: Redis errors (the
/// first connect's included).
pub async fn claim_lowest(
    conn: &mut Redis,
    keys: &LeaseKeys,
    max_worker_id: u16,
    owner: &Owner,
    ttl: Duration,
) -> redis::RedisResult<ClaimReply> {
    let keyspace = conn.keyspace().await?;
    let ids = keys.ids(max_worker_id);
    let guards = keys.guards(max_worker_id, keyspace);
    let pairs: Vec<(String, String)> = ids.iter().cloned().zip(guards).collect();
    if keyspace == Keyspace::Whole {
        return claim_pairs(conn, &pairs, owner, ttl).await;
    }
    // One single-key MGET per ID (nil for a key of another type too), one
    // pipeline per node, all at once (a multi-slot MGET, split by redis-rs,
    // failed with a result-count mismatch during a failover).
    let values = conn.read_each(&ids).await?;
    let mut calls = 1;
    let ours = values
        .iter()
        .position(|v| v.as_deref() == Some(owner.as_str()));
    let candidates: Vec<usize> = match ours {
        Some(index) => vec![index],
        None => (0..pairs.len()).filter(|i| values[*i].is_none()).collect(),
    };
    let held = values.iter().any(Option::is_some);
    let (mut wrong_type, mut paused) = (Vec::new(), None::<(Duration, GuardFound)>);
    let mut guard_existed = false;
    for index in candidates {
        let reply = claim_pairs(conn, std::slice::from_ref(&pairs[index]), owner, ttl).await?;
        calls += 1;
        wrong_type.extend(reply.wrong_type.iter().map(|_| index));
        match reply.outcome {
            ClaimOutcome::Claimed(_) | ClaimOutcome::Adopted(_) => {
                let outcome = match reply.outcome {
                    ClaimOutcome::Adopted(_) => ClaimOutcome::Adopted(index),
                    _ => ClaimOutcome::Claimed(index),
                };
                return Ok(ClaimReply {
                    outcome,
                    wrong_type,
                    expires_ms: reply.expires_ms,
                    other_shards_kept_data: false,
                    calls,
                });
            }
            ClaimOutcome::Paused { wait, guard } => {
                guard_existed |= guard != GuardFound::Missing;
                paused = Some(match paused {
                    None => (wait, guard),
                    Some((w, g)) => (w.min(wait), telling(g, guard)),
                });
            }
            // Taken meanwhile, or another type; an open guard existed.
            ClaimOutcome::AllHeld => guard_existed = true,
        }
    }
    let outcome = match paused {
        Some((wait, guard)) => ClaimOutcome::Paused { wait, guard },
        None => ClaimOutcome::AllHeld,
    };
    let missing = matches!(
        outcome,
        ClaimOutcome::Paused {
            guard: GuardFound::Missing,
            ..
        }
    );
    Ok(ClaimReply {
        outcome,
        wrong_type,
        expires_ms: 0,
        other_shards_kept_data: missing && (held || guard_existed),
        calls,
    })
}

/// The more telling of two guard findings (as `claim.lua` ranks them).
fn telling(a: GuardFound, b: GuardFound) -> GuardFound {
    let rank = |g| match g {
        GuardFound::Missing => 2,
        GuardFound::TooFar => 1,
        GuardFound::Closed => 0,
    };
    if rank(b) > rank(a) { b } else { a }
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
            keys.guards(1, Keyspace::Whole),
            vec!["p:a:guard", "p:a:guard"]
        );
        assert_eq!(
            keys.guards(1, Keyspace::Slots),
            vec!["p:a:guard:{p:a:0}", "p:a:guard:{p:a:1}"]
        );
    }
}
