//! Node stamps: values that name the Redis node (and its life) that wrote
//! them, so a script sees that Redis rolled back (`node.lua`,
//! docs/rollback-design.md).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::connection::{Redis, info_field};
use crate::persistence::{Durability, Reach, WaitDurable};
use crate::timing::{COMMAND_CALL_TIMEOUT, bounded};

/// `node.lua`: `node_stamp()`, `unstamp()`, `stamped()`, `stamped_here()`,
/// `node_gate()`, `lift_fence()`; for scripts built from several parts.
pub(crate) const PRELUDE: &str = include_str!("node.lua");

/// A script with `node.lua` put in front of `body`.
pub(crate) fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

/// How long a store's first use waits at most for its first record to be durable before it
/// gives up and leaves the store closed and marked new (its next user tries again): the
/// default of `mint carry-over --durable-wait` (a test in worker_id/limits.rs keeps them
/// equal).
pub(crate) const FIRST_USE_WAIT: Duration = Duration::from_secs(60);

/// The least time a first use waits for its record to be durable (one snapshot of a small
/// Redis), even when its caller's own wait (`lock --wait`, `pool acquire --wait`, `wait_ms`)
/// is shorter or none.
pub(crate) const FIRST_USE_MIN: Duration = Duration::from_secs(5);

/// How long a first use whose caller has `wait_left` of its own wait waits for its record to
/// be durable: that, but at least [`FIRST_USE_MIN`] and at most [`FIRST_USE_WAIT`]. A caller
/// that waits is not held past its wait by more than one snapshot of a small Redis; steps
/// without a wait of their own (`pool init`, `guard open`) take [`FIRST_USE_WAIT`].
pub(crate) fn first_use_limit(wait_left: Duration) -> Duration {
    wait_left.max(FIRST_USE_MIN).min(FIRST_USE_WAIT)
}

static OPEN: LazyLock<Script> = LazyLock::new(|| script(include_str!("node_open.lua")));

/// A new store's first record as its script wrote it: closed for one bound, as after a
/// rollback, because a missing record may be one a rollback lost (`node_gate` in
/// node.lua); [`open_first_use`] opens it once it is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FirstRecord {
    /// The key that holds the record.
    pub key: String,
    /// Its hash field; `None` for a string key.
    pub field: Option<&'static str>,
    /// The store's fence counter (lifted when the record was written), if it has one.
    pub fence: Option<String>,
    /// What the fence counter goes back to when the store opens: `""` deletes it.
    pub fence_reset: &'static str,
    /// The record as stored: `"[<bound_ms>:]<open_at_ms>.<stamp>[:new[:<n>]]"`.
    pub written: String,
}

impl FirstRecord {
    /// How many snapshots its node had counted when the record was written (`<n>` of its
    /// new-store mark, `rdb_saves`; `None` without one, as before Redis 7): any snapshot
    /// counted after that started after the record.
    fn snapshots_before(&self) -> Option<u64> {
        self.written.rsplit_once(":new:")?.1.parse().ok()
    }
}

/// What [`open_first_use`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FirstUse {
    /// The records are durable; those still closed as written opened now (the others
    /// opened by their own time, or were changed meanwhile: the caller reads the store
    /// again). `changed`: how many were not the record written any more (another caller
    /// changed it, or Redis restarted or failed over during the wait: its stamp is not this
    /// node's), so this call did not open them.
    Opened {
        /// Records this call found changed and left as they are.
        changed: usize,
    },
    /// Redis could not say whether they are durable (why): their new-store mark is dropped,
    /// so they open by their own time, one bound from their first use.
    Unchecked(String),
}

/// Waits (up to `limit`) until the records this process wrote would outlast a rollback
/// (on the primaries that hold them, and their replicas), then opens each one that is still closed as written (`node_open.lua`); where Redis will
/// not say, lets them open by their time instead.
///
/// Errors: `NotDurable` (not there within `limit`: the records stay closed and marked new,
/// so the next user of the store tries again; running the step again is safe); a Redis
/// error.
pub(crate) async fn open_first_use<C: WaitDurable>(
    conn: &mut C,
    records: &[FirstRecord],
    limit: Duration,
) -> anyhow::Result<FirstUse> {
    let reach = Reach::Keys(
        records
            .iter()
            .map(|record| (record.key.clone(), record.snapshots_before()))
            .collect(),
    );
    let durability = conn.wait_durable(&reach, limit).await?;
    let mode = match durability {
        Durability::Held(_) => OpenMode::Durable,
        Durability::Unchecked(_) => OpenMode::ByTime,
    };
    let changed = open_records(conn, records, mode).await?;
    Ok(match durability {
        Durability::Held(_) => FirstUse::Opened { changed },
        Durability::Unchecked(why) => FirstUse::Unchecked(format!(
            "{why}; grant +bgsave (and +config|get where AOF is on) so that new stores open at once"
        )),
    })
}

/// How [`open_records`] opens the records it is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenMode {
    /// Now: they were seen durable (or `--force` says no holder can be lost).
    Durable,
    /// By their own time: Redis would not say whether they are durable.
    ByTime,
    /// Not at all: deleted again, as if never written (the caller gives up).
    Withdraw,
}

/// Runs `node_open.lua` on each record; how many it found changed (answer 0: not the
/// record written any more, left as it is).
///
/// Errors: a Redis error (the records stay as they are).
pub(crate) async fn open_records<C: ConnectionLike>(
    conn: &mut C,
    records: &[FirstRecord],
    mode: OpenMode,
) -> anyhow::Result<usize> {
    let mode = match mode {
        OpenMode::Durable => "durable",
        OpenMode::ByTime => "unchecked",
        OpenMode::Withdraw => "withdraw",
    };
    let mut changed = 0;
    for record in records {
        let mut open = OPEN.prepare_invoke();
        open.key(&record.key);
        if let Some(fence) = &record.fence {
            open.key(fence);
        }
        open.arg(record.field.unwrap_or(""))
            .arg(&record.written)
            .arg(record.fence_reset)
            .arg(mode);
        let answer: i64 = bounded(COMMAND_CALL_TIMEOUT, open.invoke_async(conn)).await?;
        changed += usize::from(answer == 0);
    }
    Ok(changed)
}

/// The integer part of a stored "<integer>.<stamp>" or of a plain
/// integer (a value written before stamps); `None` for anything else.
pub(crate) fn integer_part(value: &str) -> Option<u64> {
    let value = value.trim();
    let int = match value.split_once('.') {
        Some((int, stamp)) if !stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit()) => int,
        Some(_) => return None,
        None => value,
    };
    int.parse().ok()
}

/// The stamp part of a stored "<integer>.<stamp>"; `None` for a plain
/// integer (written before stamps) or anything else.
pub(crate) fn stamp_part(value: &str) -> Option<&str> {
    let (_, stamp) = value.trim().split_once('.')?;
    (!stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit())).then_some(stamp)
}

/// The stamp of the node that serves each of `keys` (one server: its one
/// stamp for all; Cluster: each slot owner's, one `INFO all` per node: its
/// server, replication and commandstats sections in one round trip); `None` when an
/// `INFO` is refused or unreadable (then no stamp is judged).
pub(crate) async fn stamps_of_key_nodes(conn: &mut Redis, keys: &[String]) -> Option<Vec<String>> {
    let mut stamps = vec![String::new(); keys.len()];
    for group in conn.node_groups(keys).await.ok()? {
        let key = &keys[*group.first()?];
        let text = conn.info_on_key_node("all", key).await.ok()?;
        let stamp = stamp_from_info(&text)?;
        for at in group {
            stamps[at].clone_from(&stamp);
        }
    }
    Some(stamps)
}

/// The stamp `node.lua`'s `node_stamp()` computes on the node whose `INFO`
/// text (its server, replication and commandstats sections) is given: 15
/// decimal digits of the first 12 hex digits of SHA1(`run_id:master_replid`),
/// with `:<n>` after the replid when n > 0 `REPLICAOF`/`SLAVEOF` ran there.
/// `None` when run_id or master_replid is missing. (A test on a real server
/// keeps the two equal.)
pub(crate) fn stamp_from_info(info: &str) -> Option<String> {
    let run_id = info_field(info, "run_id")?;
    let replid = info_field(info, "master_replid")?;
    let calls: u64 = ["slaveof", "replicaof"]
        .iter()
        .filter_map(|name| {
            let stats = info_field(info, &format!("cmdstat_{name}"))?;
            stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let replid = match calls {
        0 => replid.to_owned(),
        n => format!("{replid}:{n}"),
    };
    let digest = sha1_smol::Sha1::from(format!("{run_id}:{replid}"))
        .digest()
        .to_string();
    let head = u64::from_str_radix(&digest[..12], 16).ok()?;
    Some(format!("{head:015}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stamp of a value, and a node's stamp from its INFO texts.
    #[test]
    fn stamps_are_read_and_computed() {
        assert_eq!(
            stamp_part("1796412036000.123456789012345"),
            Some("123456789012345")
        );
        for none in ["42", "42.", "42.x", ""] {
            assert_eq!(stamp_part(none), None, "{none:?}");
        }
        let server = "# Server\r\nrun_id:abc\r\n";
        let replication = "# Replication\r\nmaster_replid:def\r\nmaster_replid2:000\r\n";
        // SHA1("abc:def") = 0ce84d8d01f2..., and 0x0ce84d8d01f2 = 14191873032690.
        assert_eq!(
            stamp_from_info(&format!("{server}{replication}")).as_deref(),
            Some("014191873032690")
        );
        assert_eq!(stamp_from_info(&format!("{server}# Replication\r\n")), None);
        // Two SLAVEOF and one REPLICAOF ran: SHA1("abc:def:3") = c61bd9c1d7a9...
        let stats = "# Commandstats\r\ncmdstat_get:calls=9,usec=1\r\n\
            cmdstat_slaveof:calls=2,usec=40,usec_per_call=20.00\r\n\
            cmdstat_replicaof:calls=1,usec=20\r\n";
        assert_eq!(
            stamp_from_info(&format!("{server}{replication}{stats}")).as_deref(),
            Some("217822919776169")
        );
    }

    /// The snapshot count a new-store mark carries; none without one.
    #[test]
    fn a_first_record_names_the_snapshots_before_it() {
        let record = |written: &str| FirstRecord {
            key: "k".into(),
            field: None,
            fence: None,
            fence_reset: "",
            written: written.into(),
        };
        assert_eq!(
            record("30000:1796412036000.123456789012345:new:7").snapshots_before(),
            Some(7)
        );
        for none in [
            "30000:1796412036000.123456789012345:new",
            "1796412036000.123456789012345",
            "30000:1796412036000.123456789012345:new:x",
        ] {
            assert_eq!(record(none).snapshots_before(), None, "{none:?}");
        }
    }

    /// A first use waits what is left of its caller's wait, 5-60 s.
    #[test]
    fn first_use_limit_is_the_callers_wait_within_5_to_60_s() {
        let s = Duration::from_secs;
        assert_eq!(first_use_limit(Duration::ZERO), s(5));
        assert_eq!(first_use_limit(s(1)), s(5));
        assert_eq!(first_use_limit(s(12)), s(12));
        assert_eq!(first_use_limit(s(3600)), s(60));
    }

    /// Stamped and plain integers read alike; anything else is unreadable.
    #[test]
    fn integer_part_reads_stamped_and_plain_values() {
        assert_eq!(
            integer_part("1796412036000.123456789012345"),
            Some(1796412036000)
        );
        assert_eq!(integer_part("42"), Some(42));
        assert_eq!(integer_part(" 42\n"), Some(42));
        for bad in ["", "x", "42.", "42.x", "42.1.2", "-1", ".5"] {
            assert_eq!(integer_part(bad), None, "{bad:?}");
        }
    }
}
