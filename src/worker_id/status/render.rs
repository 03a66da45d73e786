//! `status`'s table: the report as text, one line per ID that is not
//! free, and the eviction warning above it.

use std::fmt::Write as _;

use super::{ClaimGuard, EvictionReport, GuardSummary, PersistenceReport, Report};
use crate::lease::TOMBSTONE_PREFIX;

impl EvictionReport {
    /// The table's first line, when Redis is not known to be safe.
    pub(super) fn warning(&self) -> Option<String> {
        match self {
            Self::Safe => None,
            Self::Evicting { reason, .. } => Some(format!(
                "WARNING: no sidecar claims on this Redis: {reason}\n"
            )),
            Self::Unchecked { reason } => Some(format!(
                "WARNING: cannot tell whether redis may evict lease keys: {reason}\n"
            )),
        }
    }
}

impl PersistenceReport {
    /// One line when Redis can come back older: what it loses, and what
    /// snowlease does about it; nothing otherwise.
    pub(super) fn note(&self) -> Option<String> {
        let loses = self.settings.loses()?;
        let node = self
            .node
            .as_deref()
            .map_or(String::new(), |n| format!(" (primary {n})"));
        Some(format!(
            "note: redis persistence can roll back{node}: {loses}; leases written since are lost then, so after every restart or failover new claims wait one TTL (docs/rollback-design.md)\n"
        ))
    }
}

/// The per-ID guards of a Cluster, one line; nothing while all are open.
fn render_summary(out: &mut String, s: &GuardSummary) {
    if s.closed == 0 && s.missing == 0 && s.unreadable == 0 && s.written_elsewhere == 0 {
        return;
    }
    let _ = write!(out, "claim guards (one per ID): {} open", s.open);
    if let Some(ms) = s.soonest_opens_in_ms {
        let _ = write!(
            out,
            ", {} closed (new claims of those IDs wait; the soonest opens in {:.1}s)",
            s.closed,
            ms as f64 / 1000.0
        );
    }
    if s.missing > 0 {
        let _ = write!(
            out,
            ", {} missing (a claim of such an ID sets its guard and waits one TTL: first use, or the shard lost its data)",
            s.missing
        );
    }
    if s.unreadable > 0 {
        let _ = write!(out, ", {} unreadable or of another type", s.unreadable);
    }
    if s.written_elsewhere > 0 {
        let _ = write!(
            out,
            ", {} written before a restart or failover of their shard (a claim of such an ID closes its guard for one TTL)",
            s.written_elsewhere
        );
    }
    out.push('\n');
}

/// The report as a table, one line per ID that is not free; the first line names the Redis
/// read (`redis`: scheme, hosts, ports, db; never the user name or password), so a report of
/// another team's Redis is seen as such.
pub(super) fn render(report: &Report, redis: &str) -> String {
    let mut out = format!(
        "app {}: {} of {} worker IDs free, {} held{}, {} wrong type (keys {}{}:{}) in {redis}\n",
        report.app,
        report.free,
        report.ids,
        report.held,
        match report.released {
            0 => String::new(),
            n => format!(", {n} released (handover delay running)"),
        },
        report.wrong_type,
        report.key_prefix,
        report.app,
        report.worker_ids
    );
    match &report.claim_guard {
        ClaimGuard::Open => {}
        ClaimGuard::Missing => out.push_str(
            "claim guard missing (first use of the app, a fresh Redis, or one that lost its data): the next claim sets it and waits one TTL; on first use `snowlease guard open` skips the wait\n",
        ),
        ClaimGuard::Closed { opens_in_ms } => {
            let _ = writeln!(
                out,
                "claim guard closed: new claims wait another {:.1}s",
                *opens_in_ms as f64 / 1000.0
            );
        }
        ClaimGuard::PerId(summary) => render_summary(&mut out, summary),
        ClaimGuard::Unreadable => {
            out.push_str("claim guard unreadable: the next claim resets it\n");
        }
        ClaimGuard::WrongType => {
            out.push_str("claim guard has the wrong type: claims fail until the key is removed\n");
        }
        ClaimGuard::WrittenElsewhere => out.push_str(
            "claim guard written before a Redis restart or failover (it may be older than leases a rollback lost): the next claim closes it for one TTL\n",
        ),
    }
    if !report.claim_guard_stamps_checked {
        out.push_str("claim guard stamps not checked (INFO refused): a guard written before a Redis restart or failover shows by its time alone\n");
    }
    if report.leases.is_empty() {
        return out;
    }
    let _ = writeln!(out, "{:>4}  {:<10}  {:>10}  OWNER", "ID", "STATE", "TTL");
    for entry in &report.leases {
        let state = match (entry.is_lease(), entry.is_tombstone()) {
            (_, true) => "released",
            (true, false) => "held",
            (false, _) => "wrong-type",
        };
        let ttl = entry.ttl_ms.map_or("no expiry".to_owned(), |ms| {
            format!("{:.1}s", ms as f64 / 1000.0)
        });
        // A tombstone's STATE says released; OWNER names who released it.
        let owner = entry.owner.as_deref().map_or_else(
            || format!("({} key, not touched)", entry.key_type),
            |o| o.strip_prefix(TOMBSTONE_PREFIX).unwrap_or(o).to_owned(),
        );
        let mark = entry.mark_lead_ms.map_or(String::new(), |lead| {
            format!("  (mint mark {:+.1}s from now)", lead as f64 / 1000.0)
        });
        let _ = writeln!(
            out,
            "{:>4}  {state:<10}  {ttl:>10}  {owner}{mark}",
            entry.worker_id
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker_id::status::Entry;

    #[test]
    fn table_marks_wrong_types_and_keys_without_expiry() {
        let report = Report {
            app: "orders".into(),
            key_prefix: "snowflake:worker:".into(),
            worker_ids: "0-4".into(),
            ids: 5,
            held: 2,
            released: 1,
            wrong_type: 1,
            free: 1,
            leases: vec![
                Entry {
                    worker_id: 0,
                    key_type: "string".into(),
                    owner: Some("10.0.0.7#00aa".into()),
                    ttl_ms: Some(119_250),
                    mark_unix_ms: Some(1_796_000_001_200),
                    mark_lead_ms: Some(1_200),
                },
                Entry {
                    worker_id: 1,
                    key_type: "string".into(),
                    owner: Some("legacy".into()),
                    ttl_ms: None,
                    mark_unix_ms: None,
                    mark_lead_ms: None,
                },
                Entry {
                    worker_id: 2,
                    key_type: "string".into(),
                    owner: Some("released:10.0.0.8#00bb".into()),
                    ttl_ms: Some(800),
                    mark_unix_ms: None,
                    mark_lead_ms: None,
                },
                Entry {
                    worker_id: 3,
                    key_type: "hash".into(),
                    owner: None,
                    ttl_ms: None,
                    mark_unix_ms: None,
                    mark_lead_ms: None,
                },
            ],
            claim_guard: ClaimGuard::Closed { opens_in_ms: 1500 },
            claim_guard_stamps_checked: true,
        };
        let text = render(&report, "redis://10.0.0.9:6379/0");
        assert!(
            text.lines()
                .next()
                .unwrap()
                .ends_with(" in redis://10.0.0.9:6379/0"),
            "{text}"
        );
        assert!(
            text.starts_with(
                "app orders: 1 of 5 worker IDs free, 2 held, 1 released (handover delay running), 1 wrong type"
            ),
            "{text}"
        );
        assert!(text.contains("new claims wait another 1.5s"), "{text}");
        assert!(
            text.contains("119.2s  10.0.0.7#00aa") || text.contains("119.3s  10.0.0.7#00aa"),
            "{text}"
        );
        assert!(
            text.contains("10.0.0.7#00aa  (mint mark +1.2s from now)"),
            "{text}"
        );
        assert!(text.contains("no expiry  legacy\n"), "{text}");
        assert!(
            text.contains("2  released          0.8s  10.0.0.8#00bb"),
            "{text}"
        );
        assert!(
            text.contains("wrong-type") && text.contains("(hash key, not touched)"),
            "{text}"
        );
    }

    /// The note names the settings and the primary; a Redis that cannot roll back gets none.
    #[test]
    fn persistence_note_only_when_redis_can_roll_back() {
        let report = |(save, appendonly, appendfsync): (&str, &str, &str), node: Option<&str>| {
            let settings = crate::persistence::Persistence {
                save: save.into(),
                appendonly: appendonly.into(),
                appendfsync: appendfsync.into(),
            };
            PersistenceReport {
                rolls_back: settings.rolls_back(),
                settings,
                node: node.map(String::from),
            }
        };
        let snapshots = ("3600 1", "no", "everysec");
        let note = report(snapshots, Some("127.0.0.1:7001")).note().unwrap();
        assert!(
            note.starts_with("note: redis persistence can roll back (primary 127.0.0.1:7001): ")
                && note.contains("save \"3600 1\"")
                && note.contains("one TTL"),
            "{note}"
        );
        assert_eq!(report(("", "yes", "always"), None).note(), None);
    }
}
