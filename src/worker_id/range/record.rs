//! The ranges record (`record.lua`): once it holds a lease, each sidecar writes its
//! `--worker-ids` beside the app's lease keys (`<prefix><app>:ranges`, an entry per range that
//! expires on its own) and reads the ranges the app's other sidecars on this Redis wrote; a
//! range that shares IDs with ours is logged and counted in
//! `snowlease_worker_id_range_overlaps`, and `snowlease status` lists them. Only a report:
//! claims never read it (each lease key decides alone), so a lost record costs a warning.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::WorkerRange;
use crate::connection::{Readable, Redis};
use crate::timing::{bounded, ttl_ms};
use crate::worker_id::metrics::WorkerMetrics;
use crate::worker_id::state::WorkerState;

static RECORD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("record.lua")));

/// Most ranges one record keeps (the latest): more than the regions of one app's ID space in
/// practice, few enough that a call stays short. Measured with `INFO commandstats` (300 calls,
/// the shared 2-core machine): 23 us per call with 5 entries, 44 us with 16, 128 us with 64
/// (over the 100 us `SLOWLOG` mark); each sidecar calls once per half TTL.
const MOST_ENTRIES: u32 = 16;

/// One sidecar range in the record, until `expires_ms` (Redis time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RangeEntry {
    /// The IDs the sidecars that wrote it claim from.
    pub range: WorkerRange,
    /// When the entry lapses unless rewritten, Redis ms.
    pub expires_ms: u64,
}

/// The entries of a record value (`<low>-<high>:<expires ms>` joined by `,`); an entry that
/// does not parse (written by hand) is skipped.
pub(crate) fn parse_record(value: &str) -> Vec<RangeEntry> {
    value
        .split(',')
        .filter_map(|entry| {
            let (range, expires) = entry.trim().split_once(':')?;
            let (low, high) = range.split_once('-')?;
            Some(RangeEntry {
                range: WorkerRange::new(low.parse().ok()?, high.parse().ok()?).ok()?,
                expires_ms: expires.parse().ok()?,
            })
        })
        .collect()
}

/// The other ranges of `entries` (not `ours` itself: sidecars of one deployment share their
/// range) that share IDs with `ours`, each with the shared IDs; in range order, each once.
pub(crate) fn overlaps(
    ours: WorkerRange,
    entries: &[RangeEntry],
) -> Vec<(WorkerRange, WorkerRange)> {
    let mut found: Vec<(WorkerRange, WorkerRange)> = entries
        .iter()
        .filter(|e| e.range != ours)
        .filter_map(|e| Some((e.range, ours.overlap(e.range)?)))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Writes `range` into the record at `key` for `entry_ttl` and returns every live entry.
///
/// Errors: Redis errors (the record of another type included).
pub(crate) async fn record(
    conn: &mut Redis,
    key: &str,
    range: WorkerRange,
    entry_ttl: Duration,
) -> redis::RedisResult<Vec<RangeEntry>> {
    let (value, _now): (String, u64) = RECORD
        .key(key)
        .arg(range.to_string())
        .arg(ttl_ms(entry_ttl))
        .arg(MOST_ENTRIES)
        .invoke_async(conn)
        .await?;
    Ok(parse_record(&value))
}

/// Records this sidecar's range while it holds a lease; see the module docs.
pub(crate) struct RangeRecorder {
    /// A connection of its own (a clone).
    pub conn: Redis,
    /// `<prefix><app>:ranges`.
    pub key: String,
    /// This sidecar's `--worker-ids`.
    pub range: WorkerRange,
    /// The lease TTL: the entry lasts two, rewritten every half.
    pub ttl: Duration,
    /// Timeout of one call.
    pub call_timeout: Duration,
    /// Where overlaps are counted.
    pub metrics: std::sync::Arc<WorkerMetrics>,
}

impl RangeRecorder {
    /// Until `stop` or the keeper ends: waits for a held lease, records, warns once per
    /// overlapping range, waits half a TTL.
    pub(crate) async fn run(
        self,
        mut state: watch::Receiver<WorkerState>,
        stop: CancellationToken,
    ) {
        let mut warned = HashSet::new();
        let mut failed_once = false;
        loop {
            let held = tokio::select! {
                // The stop first: a lease still held when it is asked gets no record (a call
                // that landed after the release at a stop right after the claim).
                biased;
                () = stop.cancelled() => false,
                held = state.wait_for(|s| s.valid_lease().is_some()) => held.is_ok(),
            };
            if !held {
                return;
            }
            let mut conn = self.conn.clone();
            let call = record(&mut conn, &self.key, self.range, 2 * self.ttl);
            match bounded(self.call_timeout, call).await {
                Ok(entries) => self.report(&entries, &mut warned),
                // Only a report: said once at warn, then at debug.
                Err(err) if !failed_once => {
                    failed_once = true;
                    warn!(error = %Readable(&err), key = %self.key, "cannot record --worker-ids beside the lease keys; overlapping ranges are not reported");
                }
                Err(err) => debug!(error = %Readable(&err), "recording --worker-ids failed"),
            }
            tokio::select! {
                () = tokio::time::sleep(self.ttl / 2) => {}
                () = stop.cancelled() => return,
            }
        }
    }

    /// Counts the overlaps and warns of each range not warned of before.
    fn report(&self, entries: &[RangeEntry], warned: &mut HashSet<WorkerRange>) {
        let found = overlaps(self.range, entries);
        self.metrics
            .range_overlaps
            .set(i64::try_from(found.len()).unwrap_or(i64::MAX));
        for (other, shared) in found {
            if warned.insert(other) {
                warn!(
                    worker_ids = %self.range,
                    other_worker_ids = %other,
                    shared = %shared,
                    "another sidecar of this app on this Redis claims from --worker-ids {other}, which shares IDs {shared} with ours ({}): if it is another region's range, both regions hand out those IDs; give each region a share of its own (docs/kubernetes.md, Several clusters or regions)",
                    self.range
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> WorkerRange {
        WorkerRange::parse(text).unwrap()
    }

    #[test]
    fn records_parse_and_skip_what_is_not_an_entry() {
        let entries = parse_record("512-1023:1700,0-511:1800,junk,9-3:5,1-2:x");
        assert_eq!(
            entries,
            [
                RangeEntry {
                    range: r("512-1023"),
                    expires_ms: 1700
                },
                RangeEntry {
                    range: r("0-511"),
                    expires_ms: 1800
                },
            ]
        );
        assert_eq!(parse_record(""), []);
    }

    /// Our own range (sidecars of one deployment) is no overlap; any other that shares IDs is.
    #[test]
    fn overlaps_name_the_other_range_and_the_shared_ids() {
        let entry = |text| RangeEntry {
            range: r(text),
            expires_ms: 1,
        };
        let entries = [
            entry("0-600"),
            entry("512-1023"),
            entry("0-511"),
            entry("700-900"),
            entry("0-600"),
        ];
        assert_eq!(
            overlaps(r("512-1023"), &entries),
            [(r("0-600"), r("512-600")), (r("700-900"), r("700-900"))]
        );
        assert_eq!(overlaps(r("0-511"), &[entry("512-1023")]), []);
    }
}
