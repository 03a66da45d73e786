//! What `status` reports beside the leases: keys outside the range, the
//! ranges record, whether Redis may evict lease keys, and whether its
//! persistence can bring it back older.

use redis::aio::ConnectionLike;
use redis::{RedisResult, Value};
use serde::Serialize;

use super::redis_ms;
use crate::connection::Redis;
use crate::persistence::{self, Persistence};
use crate::timing::{COMMAND_CALL_TIMEOUT, bounded};
use crate::worker_id::keys::LeaseKeys;
use crate::worker_id::limits::WORKER_ID_LIMIT;
use crate::worker_id::range::WorkerRange;
use crate::worker_id::range::record::{RangeEntry, parse_record};

/// The IDs below and above `range` (within 0-1023) whose lease key exists,
/// of any type: sidecars of the app started with another range (a larger
/// `--max-worker-id`, another region's `--worker-ids`) hold them, and a
/// report of `range` would hide them. One `TYPE` per ID (what the ACL of
/// `status` allows already) in one pipeline (on a Cluster each command on
/// its own, all at once).
///
/// Errors: the first Redis error.
pub(super) async fn outside_range(
    conn: &mut Redis,
    names: &LeaseKeys,
    range: WorkerRange,
) -> RedisResult<(Vec<u16>, Vec<u16>)> {
    let ids: Vec<u16> = (0..=WORKER_ID_LIMIT)
        .filter(|id| !range.contains(*id))
        .collect();
    if ids.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let mut pipe = redis::pipe();
    for id in &ids {
        pipe.cmd("TYPE").arg(names.id(*id));
    }
    let types: Vec<String> = pipe.query_async(conn).await?;
    let (below, above) = ids
        .into_iter()
        .zip(types)
        .filter_map(|(id, key_type)| (key_type != "none").then_some(id))
        .partition(|id| *id < range.low());
    Ok((below, above))
}

/// The lines `status` prints when keys outside the range exist; empty when
/// none do.
pub(super) fn outside_range_warning(below: &[u16], above: &[u16], range: WorkerRange) -> String {
    let keys = |ids: &[u16]| {
        let (Some(lowest), Some(highest)) = (ids.first(), ids.last()) else {
            return None;
        };
        Some(match ids.len() {
            1 => ("1 key".to_owned(), format!("ID {lowest}")),
            n => (format!("{n} keys"), format!("IDs {lowest}-{highest}")),
        })
    };
    let mut out = String::new();
    if let Some((count, which)) = keys(below) {
        out += &format!(
            "warning: {count} below --worker-ids {range} ({which}) not shown: sidecars of the app with another range hold them; pass theirs to see them\n"
        );
    }
    if let Some((count, which)) = keys(above) {
        out += &match range.low() {
            // Either flag may have set this range: name both.
            0 => format!(
                "warning: {count} above --max-worker-id {} / --worker-ids {range} ({which}) not shown: sidecars of the app with a larger --max-worker-id or another range hold them; pass theirs to see them\n",
                range.high()
            ),
            _ => format!(
                "warning: {count} above --worker-ids {range} ({which}) not shown: sidecars of the app with another range hold them; pass theirs to see them\n"
            ),
        };
    }
    out
}

/// The app's ranges record as `status` reports it (`"ranges"` and
/// `"range_overlaps"` in `--json`): the `--worker-ids` of the sidecars that
/// held a lease lately (`range/record.rs`), and each two that share IDs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RangesReport {
    /// Live entries, in range order.
    pub ranges: Vec<RangeSeen>,
    /// Every two recorded ranges that share IDs.
    pub overlaps: Vec<RangeOverlap>,
}

/// One recorded range.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RangeSeen {
    /// `LOW-HIGH`.
    pub worker_ids: String,
    /// ms until the entry lapses unless a sidecar rewrites it (Redis time).
    pub expires_in_ms: u64,
}

/// Two recorded ranges that share IDs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RangeOverlap {
    /// The lower range, `LOW-HIGH`.
    pub a: String,
    /// The other one.
    pub b: String,
    /// The IDs both hold, `LOW-HIGH`.
    pub shared: String,
}

impl RangesReport {
    /// Reads the record (`GET`, the same command as the lease keys') and
    /// Redis' `TIME`; entries past their expiry are left out.
    ///
    /// Errors: the first Redis error (a record of another type included).
    pub(super) async fn read(conn: &mut Redis, names: &LeaseKeys) -> RedisResult<Self> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(names.ranges()).cmd("TIME");
        let (value, time): (Option<Vec<u8>>, Value) = pipe.query_async(conn).await?;
        let now_ms = redis_ms(time)?;
        // Bytes that are not UTF-8 (written by hand) are no entry; the entries around them
        // still count.
        let value = String::from_utf8_lossy(value.as_deref().unwrap_or_default());
        Ok(Self::of(&parse_record(&value), now_ms))
    }

    /// The report of `entries` at Redis time `now_ms`.
    pub(super) fn of(entries: &[RangeEntry], now_ms: u64) -> Self {
        let mut live: Vec<RangeEntry> = entries
            .iter()
            .filter(|e| e.expires_ms > now_ms)
            .copied()
            .collect();
        live.sort_by_key(|e| e.range);
        live.dedup_by_key(|e| e.range);
        let mut overlaps = Vec::new();
        for (i, a) in live.iter().enumerate() {
            for b in &live[i + 1..] {
                if let Some(shared) = a.range.overlap(b.range) {
                    overlaps.push(RangeOverlap {
                        a: a.range.to_string(),
                        b: b.range.to_string(),
                        shared: shared.to_string(),
                    });
                }
            }
        }
        let ranges = live
            .iter()
            .map(|e| RangeSeen {
                worker_ids: e.range.to_string(),
                expires_in_ms: e.expires_ms - now_ms,
            })
            .collect();
        Self { ranges, overlaps }
    }

    /// One warning line per two ranges that share IDs; empty when none do.
    pub(super) fn warnings(&self) -> String {
        self.overlaps
            .iter()
            .map(|o| {
                format!(
                    "warning: sidecars of the app on this Redis claim from --worker-ids {} and {}, which share IDs {}: where they are two regions' ranges, both hand out those IDs\n",
                    o.a, o.b, o.shared
                )
            })
            .collect()
    }

    /// One line listing the recorded ranges; empty when none is.
    pub(super) fn listing(&self) -> String {
        if self.ranges.is_empty() {
            return String::new();
        }
        let ranges: Vec<String> = self
            .ranges
            .iter()
            .map(|r| format!("{} ({:.1}s)", r.worker_ids, r.expires_in_ms as f64 / 1000.0))
            .collect();
        format!(
            "worker ID ranges of the app's sidecars (recorded while they hold a lease; entry expires in): {}\n",
            ranges.join(", ")
        )
    }
}

/// Whether Redis may evict lease keys, as `status` reports it: read-only,
/// it warns (exit 0) where the sidecars, `guard open`, `pool acquire` and
/// `lock` refuse, because it is the command that shows what a Redis holds
/// while something is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub(crate) enum EvictionReport {
    /// `maxmemory` is 0 or the policy is `noeviction`.
    Safe,
    /// Redis may drop lease keys: sidecars claim nothing on it.
    Evicting {
        /// `maxmemory-policy`.
        maxmemory_policy: String,
        /// `maxmemory` in bytes.
        maxmemory: u64,
        /// What it means and how to fix it.
        reason: String,
    },
    /// `INFO memory` failed (e.g. an ACL without `+info`).
    Unchecked {
        /// The Redis error.
        reason: String,
    },
}

impl EvictionReport {
    /// Reads `INFO memory` under [`COMMAND_CALL_TIMEOUT`]; a failure is
    /// [`EvictionReport::Unchecked`], never an error of `status`.
    pub(super) async fn check<C: ConnectionLike>(conn: &mut C) -> Self {
        match bounded(COMMAND_CALL_TIMEOUT, crate::eviction::check(conn)).await {
            Ok(None) => Self::Safe,
            Ok(Some(evicting)) => Self::Evicting {
                reason: evicting.to_string(),
                maxmemory_policy: evicting.policy,
                maxmemory: evicting.maxmemory,
            },
            Err(err) if err.is_timeout() => Self::Unchecked {
                reason: "INFO memory timed out".to_owned(),
            },
            Err(err) => Self::Unchecked {
                reason: crate::connection::Readable(&err).to_string(),
            },
        }
    }
}

/// Redis' persistence as `status` reports it (`"persistence"` in `--json`;
/// `null` there when `CONFIG GET` is refused or unknown, as on many managed
/// services: then nothing is said).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PersistenceReport {
    /// A restart can load data older than the last acknowledged write
    /// ([`Persistence::rolls_back`]); on a Cluster, some primary's can.
    pub rolls_back: bool,
    /// The settings of that primary (else of the first one).
    #[serde(flatten)]
    pub settings: Persistence,
    /// Cluster: that primary's address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl PersistenceReport {
    /// Reads every primary's settings under [`COMMAND_CALL_TIMEOUT`]; `None`
    /// when they cannot be read (never an error of `status`).
    pub(super) async fn read(conn: &mut Redis) -> Option<Self> {
        let nodes = match bounded(COMMAND_CALL_TIMEOUT, persistence::read(conn)).await {
            Ok(nodes) => nodes,
            Err(err) => {
                tracing::debug!(error = %crate::connection::Readable(&err), "CONFIG GET failed; persistence not reported");
                return None;
            }
        };
        // The telling primary comes first.
        let first = nodes.into_iter().next()?;
        Some(Self {
            rolls_back: first.settings.rolls_back(),
            settings: first.settings,
            node: first.node,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expired entries go; every two live ranges that share IDs are named once, with the IDs.
    #[test]
    fn ranges_report_lists_live_ranges_and_their_overlaps() {
        let entries = parse_record("512-1023:5000,0-600:4000,0-511:900,700-900:3000,512-1023:4500");
        let report = RangesReport::of(&entries, 1000);
        let listed: Vec<&str> = report
            .ranges
            .iter()
            .map(|r| r.worker_ids.as_str())
            .collect();
        assert_eq!(listed, ["0-600", "512-1023", "700-900"]);
        assert_eq!(report.ranges[0].expires_in_ms, 3000);
        let pairs: Vec<(&str, &str, &str)> = report
            .overlaps
            .iter()
            .map(|o| (o.a.as_str(), o.b.as_str(), o.shared.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("0-600", "512-1023", "512-600"),
                ("512-1023", "700-900", "700-900")
            ]
        );
        assert!(
            report.warnings().contains("share IDs 512-600"),
            "{}",
            report.warnings()
        );
        assert!(
            report.listing().contains("0-600 (3.0s), 512-1023"),
            "{}",
            report.listing()
        );
        assert_eq!(RangesReport::of(&[], 0).listing(), "");
    }
}
