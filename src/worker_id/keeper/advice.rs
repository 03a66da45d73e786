//! What the keeper tells operators besides the lease itself: why a claim
//! guard is missing (`SCAN` on one server), who holds the IDs when all are
//! taken, whether `--min-replicas-ack` matches the replicas, whether Redis'
//! persistence can bring it back older, and how far the wall clock is from
//! Redis' TIME. Advice only: none of it decides.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::Worker;
use crate::boot_clock::BootInstant;
use crate::connection::{Keyspace, Readable};
use crate::identity::identity_of;
use crate::lease;
use crate::persistence;
use crate::timing::{bounded, ms, ttl_ms};
use crate::worker_id::claim::GuardFound;
use crate::worker_id::keys::{LeaseKeys, glob_escape};
use crate::worker_id::limits::{DEFAULT_KEY_PREFIX, DEFAULT_MAX_WORKER_ID};
use crate::worker_id::status;

/// `SCAN` rounds (`COUNT 100` each) [`Worker::missing_guard`] spends at most.
const SCAN_ROUNDS: u32 = 10;

/// Least time between two warnings of a skew beyond the bound.
const SKEW_LOG_EVERY: Duration = Duration::from_secs(30);

/// What Redis can tell about a missing claim guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MissingGuard {
    /// One server: keys of other apps exist under the prefix, none of this
    /// app: first use of the app; Redis kept its data.
    OtherAppsKept,
    /// One server: no key under the prefix: a fresh Redis or one that lost
    /// its data.
    NoKeyUnderPrefix,
    /// One server: lease keys of this app exist without its guard: Redis
    /// lost its data and holders re-created their keys, or the guard was
    /// deleted by hand.
    AppKeysWithoutGuard,
    /// Cluster: guards of other IDs or lease keys of the app exist: the
    /// shard(s) of the paused IDs lost their data.
    ShardLost,
    /// Cluster: no guard of the app on any shard met: first use of the app,
    /// or every shard lost its data.
    NoGuardOnAnyShard,
    /// `SCAN` refused, not answered, or found nothing in its rounds.
    Unknown,
}

impl MissingGuard {
    /// What one `SCAN` batch adds to `self`: a lease key of this app (`<app_base><id>`,
    /// [`LeaseKeys::worker_id_of`]) settles it; a key of another app only shows that Redis
    /// kept data. The app's other keys (the guard, the format record a minting sidecar writes
    /// before its first claim, the ranges record, the hint, probes) say nothing either way: a
    /// newcomer's own format record read as "lease keys without a guard" told a first use
    /// that Redis lost its data and that only `--force` helps.
    fn with_keys(mut self, keys: &[String], lease_keys: &LeaseKeys, app_base: &str) -> Self {
        for key in keys {
            if lease_keys.worker_id_of(key).is_some() {
                self = Self::AppKeysWithoutGuard;
            } else if !key.starts_with(app_base) && self == Self::NoKeyUnderPrefix {
                self = Self::OtherAppsKept;
            }
        }
        self
    }
}

/// The clock skew seen at the last claim or renew reply, against
/// `--max-clock-skew`.
#[derive(Debug)]
pub(super) struct ClockSkew {
    /// `--max-clock-skew`.
    max: Duration,
    /// ms, local - Redis.
    ms: i64,
    /// When a skew beyond `max` was last logged (rate limit).
    logged: Option<Instant>,
}

impl ClockSkew {
    /// No skew seen yet, bounded by `max`.
    pub(super) fn new(max: Duration) -> Self {
        Self {
            max,
            ms: 0,
            logged: None,
        }
    }

    /// The last skew seen, ms (local - Redis).
    pub(super) fn ms(&self) -> i64 {
        self.ms
    }

    /// The last skew seen is beyond `--max-clock-skew`.
    pub(super) fn exceeded(&self) -> bool {
        self.ms.unsigned_abs() > ms(self.max)
    }

    /// Whether a skew beyond the bound is to be logged now (at most every
    /// [`SKEW_LOG_EVERY`]).
    fn log_now(&mut self) -> bool {
        let due = self.exceeded() && self.logged.is_none_or(|t| t.elapsed() >= SKEW_LOG_EVERY);
        if due {
            self.logged = Some(Instant::now());
        }
        due
    }
}

/// Skew (ms, local - Redis) from a script reply `expires_ms` (Redis TIME +
/// `ttl`) and local Unix ms at the middle of its round trip.
fn skew_ms(local_mid_ms: u64, expires_ms: u64, ttl: Duration) -> i64 {
    let redis_ms = expires_ms.saturating_sub(ttl_ms(ttl));
    i64::try_from(local_mid_ms).unwrap_or(i64::MAX) - i64::try_from(redis_ms).unwrap_or(i64::MAX)
}

/// Holders by identity only (nonces stay out of logs): `identity: count`,
/// sorted, then keys of the wrong type if any.
fn holders_summary<'a>(owners: impl Iterator<Item = &'a str>, wrong_type: u32) -> String {
    let mut by_identity: BTreeMap<&str, usize> = BTreeMap::new();
    for owner in owners {
        *by_identity.entry(identity_of(owner)).or_default() += 1;
    }
    let mut parts: Vec<String> = by_identity
        .iter()
        .map(|(id, n)| format!("{id}: {n}"))
        .collect();
    if wrong_type > 0 {
        parts.push(format!("keys of the wrong type: {wrong_type}"));
    }
    parts.join(", ")
}

// === impl Worker ===

impl Worker {
    /// The `guard open` command for this sidecar's keys, flags that differ
    /// from their defaults included (else it would open another app's guard
    /// or check too few IDs).
    pub(super) fn guard_open_command(&self) -> String {
        let settings = &self.params.settings;
        let mut cmd = format!("snowlease guard open --app {}", self.params.app);
        if settings.key_prefix != DEFAULT_KEY_PREFIX {
            cmd += &format!(" --key-prefix {}", settings.key_prefix);
        }
        let range = settings.worker_ids;
        if range.low() != 0 {
            cmd += &format!(" --worker-ids {range}");
        } else if range.high() != DEFAULT_MAX_WORKER_ID {
            cmd += &format!(" --max-worker-id {}", range.high());
        }
        cmd
    }

    /// Why a claim guard was missing, as far as Redis can tell: on Cluster
    /// from the claim itself (`others_kept`); on one server by up to
    /// [`SCAN_ROUNDS`] `SCAN MATCH <prefix>*` rounds (best effort: without
    /// `+scan`, or on no answer, [`MissingGuard::Unknown`]).
    pub(super) async fn missing_guard(&mut self, others_kept: bool) -> MissingGuard {
        if matches!(self.conn.keyspace().await, Ok(Keyspace::Slots)) {
            return match others_kept {
                true => MissingGuard::ShardLost,
                false => MissingGuard::NoGuardOnAnyShard,
            };
        }
        let prefix = &self.params.settings.key_prefix;
        let app_base = format!("{prefix}{}:", self.params.app);
        let lease_keys = self.keys().clone();
        let pattern = format!("{}*", glob_escape(prefix));
        let scan = async {
            let (mut cursor, mut found) = (0u64, MissingGuard::NoKeyUnderPrefix);
            for _ in 0..SCAN_ROUNDS {
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(100)
                    .query_async(&mut self.conn)
                    .await?;
                found = found.with_keys(&keys, &lease_keys, &app_base);
                if next == 0 || found == MissingGuard::AppKeysWithoutGuard {
                    return Ok::<_, redis::RedisError>(found);
                }
                cursor = next;
            }
            // Rounds ran out: an empty answer so far proves nothing.
            Ok(match found {
                MissingGuard::NoKeyUnderPrefix => MissingGuard::Unknown,
                other => other,
            })
        };
        let limit = self.params.settings.call_timeout() * SCAN_ROUNDS;
        match bounded(limit, scan).await {
            Ok(found) => found,
            Err(err) => {
                debug!(error = %Readable(&err), "SCAN for keys under the prefix failed");
                MissingGuard::Unknown
            }
        }
    }

    /// Who holds the IDs, by identity only (nonces stay out of logs), read
    /// the way `snowlease status` reads them, under the call timeout.
    pub(super) async fn holders(&mut self) -> String {
        let read = status::read(
            &mut self.conn,
            &self.params.app,
            &self.params.settings.key_prefix,
            self.params.settings.worker_ids,
        );
        let Ok(report) = bounded(self.params.settings.call_timeout(), read).await else {
            return "holders unknown: redis unavailable".to_owned();
        };
        let owners = report.leases.iter().filter_map(|e| e.owner.as_deref());
        holders_summary(owners, report.wrong_type)
    }

    /// Warns once at start when a primary's persistence can bring Redis back
    /// older than it was (`save` points, or AOF without `appendfsync always`,
    /// [`persistence::Persistence::rolls_back`]): what it loses, and that
    /// claims close for one TTL after each restart or failover (node
    /// stamps). `CONFIG GET` refused or unknown (an ACL without
    /// `+config|get`, a managed service): a debug line, nothing else.
    pub(super) async fn advise_persistence(&mut self) {
        let call = persistence::read(&mut self.conn);
        let nodes = match bounded(self.params.settings.call_timeout(), call).await {
            Ok(nodes) => nodes,
            Err(err) => {
                return debug!(error = %Readable(&err), "CONFIG GET save/appendonly/appendfsync failed; persistence not judged");
            }
        };
        // The primary that rolls back comes first.
        let Some(first) = nodes.first().filter(|n| n.settings.rolls_back()) else {
            return;
        };
        let s = &first.settings;
        warn!(
            save = %s.save,
            appendonly = %s.appendonly,
            appendfsync = %s.appendfsync,
            node = first.node.as_deref(),
            "redis persistence can roll back: {}; a crash-restart or a failover can bring Redis back without leases it acknowledged. snowlease sees it (node stamps on the claim guard) and holds new claims for one TTL after every restart or failover, so holders from before renew or give up first; that TTL without new claims is what it costs (docs/rollback-design.md)",
            s.loses().unwrap_or_default()
        );
    }

    /// Warns at start when `--min-replicas-ack` (N >= 1) does not match the
    /// replicas the primary has connected now: more than connected, nothing
    /// is published until enough link; fewer, a failover to a replica that
    /// missed a write (a planned `SENTINEL FAILOVER`, or a partition that
    /// leaves the old primary with N replicas) can still lose a lease, so
    /// the safe setting is every replica (docs/worker.md "Guarantees").
    /// Advice only: replicas come and go, and an `INFO` refused says nothing.
    pub(super) async fn advise_replica_count(&mut self) {
        let wanted = self.params.min_replicas_ack;
        if wanted == 0 {
            return;
        }
        let key = self.keys().probe(self.ours.owner.nonce());
        let call = self.conn.connected_replicas(&key);
        let connected = match bounded(self.params.settings.call_timeout(), call).await {
            Ok(connected) => connected,
            Err(err) => {
                return debug!(error = %Readable(&err), "INFO replication failed");
            }
        };
        if connected < wanted {
            warn!(
                min_replicas_ack = wanted,
                connected,
                "--min-replicas-ack is more than the replicas connected to the primary: no ID is published until enough replicas link"
            );
        } else if connected > wanted {
            warn!(
                min_replicas_ack = wanted,
                connected,
                "--min-replicas-ack is below the replicas connected to the primary: a failover to a replica that did not acknowledge (planned, or across a partition) can lose a lease; set it to the number of replicas"
            );
        }
    }

    /// Records the skew between this node's wall clock and Redis' TIME from
    /// a claim or renew sent at `sent` whose script answered `expires_ms`
    /// (TIME + TTL; 0: no TIME in the reply): local time at the middle of
    /// the round trip minus Redis time. Sets the gauge; logs a skew beyond
    /// `--max-clock-skew` at most every 30 s.
    pub(super) fn observe_skew(&mut self, sent: BootInstant, expires_ms: u64) {
        if expires_ms == 0 {
            return;
        }
        let round_trip = sent.elapsed();
        let mid = SystemTime::now() - round_trip / 2;
        let skew_ms = skew_ms(lease::unix_ms(mid), expires_ms, self.params.settings.ttl);
        self.skew.ms = skew_ms;
        self.metrics.clock_skew.set(skew_ms as f64 / 1000.0);
        if self.skew.log_now() {
            warn!(
                skew_ms,
                max_ms = ms(self.skew.max),
                round_trip_ms = ms(round_trip),
                "wall clock differs from Redis' TIME beyond --max-clock-skew; a held ID stays published, a new one is not"
            );
        }
    }
}

/// Says why claims wait. A missing guard: what Redis can tell about why
/// (`found`), and how to skip the wait on first use. A guard that exists
/// and is closed was set by an earlier claim: INFO, nothing lost here.
pub(super) fn log_paused(
    app: &str,
    open_cmd: &str,
    wait: Duration,
    guard: GuardFound,
    found: Option<MissingGuard>,
) {
    let wait_ms = ms(wait);
    match guard {
        GuardFound::Missing => {
            let why = missing_guard_why(app, found.unwrap_or(MissingGuard::Unknown));
            warn!(
                wait_ms,
                "no claim guard in Redis: {why}; waiting one TTL so that earlier holders can renew or give up. For a new app, `{open_cmd}` before its first sidecars start spares this wait; now that a sidecar has closed the guard, only `--force` opens it, which is safe only if no sidecar of this app held an ID on this Redis in the last TTL"
            );
        }
        GuardFound::OtherNode => warn!(
            wait_ms,
            "claim guard was written on another Redis node or process: Redis restarted or failed over since, and may have come back without its last writes (an older snapshot, a replica that lagged); waiting one TTL so that holders from before can renew or give up (docs/rollback-design.md)"
        ),
        GuardFound::TooFar => warn!(
            wait_ms,
            "claim guard was more than one TTL ahead (set by hand, or Redis' clock went back); pulled in to one TTL"
        ),
        GuardFound::Closed => info!(
            wait_ms,
            "claim guard closed (set by an earlier claim); waiting until it opens (`snowlease status --app {app}` shows when)"
        ),
    }
}

/// The reason a missing guard's warning gives for `found`.
fn missing_guard_why(app: &str, found: MissingGuard) -> String {
    match found {
        MissingGuard::OtherAppsKept => format!(
            "first use of app {app} on this Redis (keys of other apps exist, so Redis kept its data)"
        ),
        MissingGuard::NoKeyUnderPrefix => {
            "no key under the prefix: a fresh Redis or one that lost its data".to_owned()
        }
        MissingGuard::AppKeysWithoutGuard => format!(
            "lease keys of app {app} exist without its guard: Redis lost its data and holders re-created their keys, or the guard was deleted"
        ),
        MissingGuard::ShardLost => format!(
            "guards of other IDs of app {app} exist: the Cluster shard holding these IDs lost its data"
        ),
        MissingGuard::NoGuardOnAnyShard => format!(
            "no guard of app {app} on any shard: first use of the app on this Cluster, or every shard lost its data"
        ),
        MissingGuard::Unknown => {
            format!("first use of app {app}, a fresh Redis, or one that lost its data")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    /// A key of the app settles the diagnosis; the guard itself does not
    /// count; keys of other apps only show that Redis kept its data.
    #[test]
    fn scanned_keys_tell_why_the_guard_is_missing() {
        let (lk, base) = (LeaseKeys::new("p:", "orders"), "p:orders:");
        let start = MissingGuard::NoKeyUnderPrefix;
        assert_eq!(start.with_keys(&keys(&[]), &lk, base), start);
        // The app's own keys that are not lease keys say nothing (a minting newcomer writes
        // its format record before its first claim).
        let own = keys(&[
            "p:orders:guard",
            "p:orders:format",
            "p:orders:ranges",
            "p:orders:hint",
            "p:orders:probe:ab",
        ]);
        assert_eq!(start.with_keys(&own, &lk, base), start);
        let other = keys(&["p:billing:0"]);
        assert_eq!(
            start.with_keys(&other, &lk, base),
            MissingGuard::OtherAppsKept
        );
        let ours = keys(&["p:billing:0", "p:orders:3"]);
        assert_eq!(
            start.with_keys(&ours, &lk, base),
            MissingGuard::AppKeysWithoutGuard
        );
        // Once settled, a later batch of other apps' keys does not undo it.
        let settled = MissingGuard::AppKeysWithoutGuard;
        assert_eq!(settled.with_keys(&other, &lk, base), settled);
    }

    /// Skew is local minus Redis, Redis' time being the reply less the TTL.
    #[test]
    fn skew_is_local_minus_redis_time() {
        let ttl = Duration::from_secs(120);
        let redis_now = 1_700_000_000_000u64;
        assert_eq!(skew_ms(redis_now + 700, redis_now + 120_000, ttl), 700);
        assert_eq!(skew_ms(redis_now - 40, redis_now + 120_000, ttl), -40);
    }

    /// The bound is strict and symmetric: ahead and behind count alike.
    #[test]
    fn skew_beyond_the_bound_either_way_is_exceeded() {
        let mut skew = ClockSkew::new(Duration::from_millis(500));
        for (ms, exceeded) in [(500, false), (501, true), (-500, false), (-501, true)] {
            skew.ms = ms;
            assert_eq!(skew.exceeded(), exceeded, "{ms}");
        }
    }

    /// A lasting skew is logged once per 30 s, not at every reply.
    #[tokio::test(start_paused = true)]
    async fn a_lasting_skew_is_logged_every_30_s() {
        let mut skew = ClockSkew::new(Duration::from_millis(500));
        assert!(!skew.log_now(), "no skew: nothing to log");
        skew.ms = 900;
        assert!(skew.log_now());
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(!skew.log_now());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(skew.log_now());
    }

    /// Holders by identity, sorted, nonces dropped; wrong-type keys last.
    #[test]
    fn holders_are_counted_by_identity() {
        let owners = ["pod-b#n1", "pod-a#n2", "pod-b#n3"];
        let summary = holders_summary(owners.into_iter(), 0);
        assert_eq!(summary, "pod-a: 1, pod-b: 2");
        assert!(holders_summary(std::iter::empty(), 2).ends_with("keys of the wrong type: 2"));
    }
}
