//! Whether Redis' persistence can bring it back older than it was: the rule
//! (`save`, `appendonly`, `appendfsync`) written once, and the bounded read
//! of those settings from every primary (`CONFIG GET`) that `status` and the
//! worker's start-up advice share.
//!
//! A rollback is no longer something an operator must rule out (node stamps,
//! docs/rollback-design.md: claims close for one TTL after a restart or a
//! failover), so this only informs: where `CONFIG` is refused (an ACL
//! without `+config|get`, a managed service that renames or removes it)
//! nothing is said beyond a debug line, and nothing fails. One-off steps
//! whose writes must outlast a rollback (`mint carry-over`) wait for them
//! to be durable: `durable.rs`.

pub(crate) mod durable;

use std::time::Duration;

pub use durable::{Durability, Reach};
use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, RedisResult, Value};
use serde::Serialize;

use crate::connection::Redis;

/// A connection that can wait until the writes this process made so far would outlast a
/// Redis rollback (a restart from the last snapshot or AOF, a failover to a replica): on
/// every replica and in each primary's persistence (`persistence/durable.rs`). A store's first record
/// is made durable this way before the store opens (`lease/node_open.lua`).
pub trait WaitDurable: ConnectionLike + Send {
    /// Waits up to `limit` (1 s to 1 h in the CLI's `--durable-wait`) for the primaries
    /// `reach` names.
    ///
    /// Errors: `NotDurable` (exit 3) when a replica or a snapshot did not get there
    /// within `limit`; a Redis error. Where Redis refuses to say (a managed service's
    /// `BGSAVE`, `CONFIG`) or cannot promise it (`appendfsync no`), the answer is
    /// [`Durability::Unchecked`], not an error.
    fn wait_durable(
        &mut self,
        reach: &Reach,
        limit: Duration,
    ) -> impl Future<Output = anyhow::Result<Durability>> + Send;
}

impl WaitDurable for Redis {
    fn wait_durable(
        &mut self,
        reach: &Reach,
        limit: Duration,
    ) -> impl Future<Output = anyhow::Result<Durability>> + Send {
        durable::make_durable(self, reach, limit)
    }
}

/// The persistence settings of one Redis primary, as `CONFIG GET` gives them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Persistence {
    /// `save`: RDB snapshot points ("<seconds> <changes> ..."); empty: none.
    pub save: String,
    /// `appendonly`: `yes` or `no`.
    pub appendonly: String,
    /// `appendfsync`: `always`, `everysec` or `no`.
    pub appendfsync: String,
}

impl Persistence {
    /// True when a restart can load data older than the last write Redis
    /// acknowledged. With AOF on, Redis loads the AOF (not the RDB) at start,
    /// so only `appendfsync` matters: `always` fsyncs before replying,
    /// `everysec` loses up to about 1 s on a crash, `no` what the kernel had
    /// not flushed (up to ~30 s on Linux). With AOF off, a restart loads
    /// whatever `dump.rdb` is on disk, whatever `save` says: a scheduled
    /// snapshot, minutes old, but also without `save` points the snapshot a
    /// store's first use takes (`guard open`, a new lock or pool: its
    /// durability wait), a replica's full sync or a hand-made `BGSAVE`
    /// (Redis docs, "Redis persistence"). So only AOF with `always` is false.
    pub(crate) fn rolls_back(&self) -> bool {
        !(self.appendonly.eq_ignore_ascii_case("yes")
            && self.appendfsync.eq_ignore_ascii_case("always"))
    }

    /// What a crash-restart loads, in words, for a warning; `None` when
    /// [`Persistence::rolls_back`] is false.
    pub(crate) fn loses(&self) -> Option<String> {
        if !self.rolls_back() {
            return None;
        }
        Some(if self.appendonly.eq_ignore_ascii_case("yes") {
            format!(
                "appendonly yes with appendfsync {}: a crash loses the writes not yet fsynced (about 1 s with everysec, more with no)",
                self.appendfsync
            )
        } else if self.save.trim().is_empty() {
            "no snapshot points (save \"\") with appendonly no: a restart loads the last dump.rdb on disk, if any (the snapshot a first use takes, such as guard open's; a replica's full sync; a BGSAVE), else comes back empty".to_owned()
        } else {
            format!(
                "RDB snapshots (save \"{}\") with appendonly no: a crash-restart loads the last snapshot, up to the longest save interval old",
                self.save.trim()
            )
        })
    }

    /// The three settings from the `CONFIG GET` replies of one node, each a
    /// flat name-value list (RESP2) or a map (RESP3). `None` when one is
    /// missing (an old server or a filtered reply: nothing to judge).
    fn from_replies(replies: &[Value]) -> Option<Self> {
        let mut found = [None, None, None];
        for reply in replies {
            let pairs: Vec<(String, String)> = match reply {
                Value::Map(map) => map
                    .iter()
                    .map(|(k, v)| Some((text(k)?, text(v)?)))
                    .collect::<Option<_>>()?,
                Value::Array(items) => items
                    .chunks(2)
                    .map(|pair| match pair {
                        [k, v] => Some((text(k)?, text(v)?)),
                        _ => None,
                    })
                    .collect::<Option<_>>()?,
                _ => return None,
            };
            for (name, value) in pairs {
                let slot = PARAMETERS.iter().position(|p| name.eq_ignore_ascii_case(p));
                if let Some(slot) = slot {
                    found[slot] = Some(value);
                }
            }
        }
        let [save, appendonly, appendfsync] = found;
        Some(Self {
            save: save?,
            appendonly: appendonly?,
            appendfsync: appendfsync?,
        })
    }
}

/// The settings read ([`config_gets`]).
const PARAMETERS: [&str; 3] = ["save", "appendonly", "appendfsync"];

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// One primary's settings: `node` is its address on a Cluster, `None` on
/// one server (standalone, the Sentinels' primary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodePersistence {
    /// The primary's address (Cluster only).
    pub node: Option<String>,
    /// Its settings.
    pub settings: Persistence,
}

/// Reads the settings of every primary (on a Cluster each primary, all at
/// once; else the one server). The first primary that rolls back comes
/// first, so callers that name one name the telling one.
///
/// Errors: the first error of a call or of a node's reply (`NOPERM`
/// without `+config|get`, `ERR unknown command` where `CONFIG` is renamed,
/// a timeout); a reply without the three settings is a parse error.
pub(crate) async fn read(conn: &mut Redis) -> RedisResult<Vec<NodePersistence>> {
    let mut replies = Vec::new();
    for cmd in config_gets() {
        replies.extend(conn.on_every_primary(&cmd).await?);
    }
    let mut nodes = by_node(replies)?;
    nodes.sort_by_key(|n| (!n.settings.rolls_back(), n.node.clone()));
    Ok(nodes)
}

/// The `CONFIG GET` calls that read the settings, one per setting (a call with several
/// names needs Redis 7).
pub(crate) fn config_gets() -> impl Iterator<Item = redis::Cmd> {
    PARAMETERS.into_iter().map(|parameter| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(parameter);
        cmd
    })
}

/// The settings of each node from the replies of [`config_gets`] (`(node, reply)`, in any
/// order), nodes in the order they first reply.
///
/// Errors: a node's error reply (kept as a value by the caller); a node without the three
/// settings (a parse error).
pub(crate) fn by_node(replies: Vec<(Option<String>, Value)>) -> RedisResult<Vec<NodePersistence>> {
    let mut per_node: Vec<(Option<String>, Vec<Value>)> = Vec::new();
    for (node, reply) in replies {
        let reply = reply.extract_error()?;
        match per_node.iter_mut().find(|(n, _)| *n == node) {
            Some((_, replies)) => replies.push(reply),
            None => per_node.push((node, vec![reply])),
        }
    }
    per_node
        .into_iter()
        .map(|(node, replies)| {
            let settings = Persistence::from_replies(&replies).ok_or_else(|| {
                RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "CONFIG GET did not return save, appendonly and appendfsync",
                ))
            })?;
            Ok(NodePersistence { node, settings })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(save: &str, appendonly: &str, appendfsync: &str) -> Persistence {
        Persistence {
            save: save.into(),
            appendonly: appendonly.into(),
            appendfsync: appendfsync.into(),
        }
    }

    /// Every combination of RDB and AOF: only AOF with fsync on every write
    /// cannot bring back older data (without AOF a restart loads any
    /// `dump.rdb`, also one no `save` point wrote).
    #[test]
    fn rolls_back_unless_aof_always() {
        let debian = "3600 1 300 100 60 10000";
        let cases = [
            // (save, appendonly, appendfsync, rolls back)
            (debian, "no", "everysec", true),
            ("3600 1", "no", "always", true),
            ("", "no", "everysec", true),
            ("", "no", "always", true),
            ("  ", "no", "no", true),
            ("", "yes", "everysec", true),
            ("", "yes", "no", true),
            ("", "yes", "always", false),
            (debian, "yes", "always", false),
            (debian, "yes", "everysec", true),
            (debian, "YES", "ALWAYS", false),
        ];
        for (save, aof, fsync, expected) in cases {
            let s = settings(save, aof, fsync);
            assert_eq!(s.rolls_back(), expected, "{s:?}");
            assert_eq!(s.loses().is_some(), expected, "{s:?}");
        }
    }

    /// The warning names the settings that lose writes.
    #[test]
    fn loses_names_the_settings() {
        let rdb = settings("3600 1", "no", "everysec").loses().unwrap();
        assert!(rdb.contains("save \"3600 1\"") && rdb.contains("appendonly no"));
        let aof = settings("", "yes", "everysec").loses().unwrap();
        assert!(aof.contains("appendfsync everysec"), "{aof}");
    }

    /// RESP2 flat lists and RESP3 maps read alike; a missing setting is no answer.
    #[test]
    fn replies_parse_in_both_protocols() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let replies = [
            Value::Array(vec![bulk("save"), bulk("3600 1")]),
            Value::Map(vec![(bulk("appendonly"), bulk("no"))]),
            Value::Array(vec![bulk("appendfsync"), bulk("everysec")]),
        ];
        assert_eq!(
            Persistence::from_replies(&replies),
            Some(settings("3600 1", "no", "everysec"))
        );
        assert_eq!(Persistence::from_replies(&replies[..2]), None);
        assert_eq!(Persistence::from_replies(&[Value::Nil]), None);
    }
}
