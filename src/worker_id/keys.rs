//! The names of one app's keys, all under `<prefix><app>:` (snowlease never touches other
//! keys): the lease keys and what claims keep beside them ([`LeaseKeys`]), and mint mode's
//! marks and format record ([`MintKeys`]). Their one home: the claim, the keeper, `status`,
//! `guard open`, mint and `mint carry-over` import them from here.

use crate::connection::Keyspace;
use crate::worker_id::range::WorkerRange;

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

/// Names of the mint keys of one app, beside its lease keys under `<prefix><app>:`: per
/// worker ID the mark `mark:{<lease key>}` and the settled record `settled:{<lease key>}`.
/// The hash tag is the lease key, so on Cluster both live in its slot (one script call, and
/// lost together with it). Neither expires: the mark outlives every lease.
#[derive(Debug, Clone)]
pub struct MintKeys {
    base: String,
}

impl MintKeys {
    /// Keys of `app` under `prefix` (validated by the caller, as for
    /// [`LeaseKeys`]).
    pub fn new(prefix: &str, app: &str) -> Self {
        Self {
            base: format!("{prefix}{app}:"),
        }
    }

    /// The high-water mark (Unix ms) of the worker ID whose lease key is `lease_key`.
    pub fn mark(&self, lease_key: &str) -> String {
        format!("{}mark:{{{lease_key}}}", self.base)
    }

    /// The settled record (Unix ms) of the worker ID whose lease key is `lease_key`.
    pub fn settled(&self, lease_key: &str) -> String {
        format!("{}settled:{{{lease_key}}}", self.base)
    }

    /// The app's ID format record, `<prefix><app>:format`.
    pub fn format(&self) -> String {
        format!("{}format", self.base)
    }
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
