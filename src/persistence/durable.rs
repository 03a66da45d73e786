//! Making the writes a one-off step made outlast a rollback before the step reports success:
//! every replica of every primary has them (its replication offset reached the primary's,
//! read after the writes), and each primary's own persistence holds them (a snapshot that
//! finished after them, `BGSAVE SCHEDULE`; an AOF fsynced). `mint carry-over` uses it: its
//! raised floor, lost to a restart from an earlier snapshot or a failover to a lagging
//! replica, would let the new app mint IDs the old one minted (docs/rollback-design.md).
//!
//! Offsets rather than `WAIT` ([`Redis::wait_replicas`]): `WAIT` counts only the writes of
//! its own connection, so after a reconnect between the writes and the `WAIT` it proves
//! nothing (that method then answers 0, and no later `WAIT` could say yes), while the
//! offsets hold whatever connection wrote; and each shard of a Cluster is read with its own
//! replicas.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use redis::{RedisResult, Value};
use tokio::time::Instant;

use super::{NodePersistence, by_node, config_gets};
use crate::connection::{Keyspace, Redis, info_field};
use crate::timing::{COMMAND_CALL_TIMEOUT, bounded};

/// How often a replica's offset or a snapshot is looked at again.
const POLL: Duration = Duration::from_millis(100);

/// How long an AOF with `appendfsync everysec` may take to fsync a write: Redis fsyncs once a
/// second and postpones an fsync by up to 2 s while the previous one still runs (redis.conf,
/// "APPEND ONLY MODE").
const EVERYSEC_FSYNC: Duration = Duration::from_secs(3);

/// How long after a snapshot of a primary failed this process starts no other there: Redis'
/// own pause before it retries a failed snapshot of a save point (`CONFIG_BGSAVE_RETRY_DELAY`,
/// 5 s, server.h). Callers that try again every second (a lock's attempts, `pool serve`'s
/// requests) forked once each: 44 snapshots in 20 s for one lock on a full disk, and with
/// `stop-writes-on-bgsave-error` (the default) every write refused meanwhile.
const FAILED_SNAPSHOT_PAUSE: Duration = Duration::from_secs(5);

/// When a snapshot this process started or saw last failed, by primary (its name in
/// messages).
static SNAPSHOT_FAILED: LazyLock<Mutex<HashMap<Option<String>, Instant>>> =
    LazyLock::new(Mutex::default);

/// Notes that the snapshot of `node` failed now.
fn note_failed(node: &Option<String>) {
    let mut failed = SNAPSHOT_FAILED.lock().unwrap_or_else(|e| e.into_inner());
    failed.insert(node.clone(), Instant::now());
}

/// The error for `node` when its last snapshot failed less than [`FAILED_SNAPSHOT_PAUSE`] ago.
fn failed_recently(node: &Option<String>) -> Option<NotDurable> {
    let failed = SNAPSHOT_FAILED.lock().unwrap_or_else(|e| e.into_inner());
    let ago = failed.get(node)?.elapsed();
    (ago < FAILED_SNAPSHOT_PAUSE).then(|| {
        NotDurable(format!(
            "{}: the last snapshot (BGSAVE) failed {} ms ago; the next starts {} s after it",
            show(node),
            ago.as_millis(),
            FAILED_SNAPSHOT_PAUSE.as_secs()
        ))
    })
}

/// How far the writes reach beyond the primaries' memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Durability {
    /// On every replica and in each primary's persistence; says how.
    Held(String),
    /// Not checked where Redis refused to say (`CONFIG`, `INFO` or `BGSAVE` refused, e.g. a
    /// managed service) or cannot promise (`appendfsync no`); says what to do instead.
    Unchecked(String),
}

/// Which primaries a wait covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// Every primary (the one server; each shard of a Cluster): writes spread over the
    /// keyspace (`mint carry-over`'s marks).
    EveryPrimary,
    /// The primaries that hold these keys (a store's first record), each with the number of
    /// snapshots its primary had counted when the key was written (`rdb_saves`, Redis 7+;
    /// `None` when unknown): a snapshot counted after that started after the write, so a
    /// wait need not start its own (one an earlier wait started counts).
    Keys(Vec<(String, Option<u64>)>),
}

/// The primaries a wait asks: each one's name in messages (`None`: the one server), the
/// key that routes to it (`None`: every primary at once) and its snapshot count at the
/// write, if known.
struct Nodes(Vec<(Option<String>, Option<String>, Option<u64>)>);

impl Nodes {
    /// Groups `reach`'s keys by the node that serves them (on a Cluster the slot owners
    /// named at connect): one entry per node, its count the largest of its keys' (all
    /// unknown if one is).
    async fn of(conn: &Redis, reach: &Reach) -> anyhow::Result<Self> {
        let keys = match reach {
            Reach::EveryPrimary => return Ok(Self(vec![(None, None, None)])),
            Reach::Keys(keys) => keys,
        };
        let names: Vec<String> = keys.iter().map(|(key, _)| key.clone()).collect();
        let whole = conn.keyspace().await? == Keyspace::Whole;
        let mut nodes = Vec::new();
        for group in conn.node_groups(&names).await? {
            let Some(&first) = group.first() else {
                continue;
            };
            let key = names[first].clone();
            let saves = group
                .iter()
                .map(|&at| keys[at].1)
                .collect::<Option<Vec<u64>>>()
                .and_then(|counts| counts.into_iter().max());
            let name = (!whole).then(|| format!("the primary of {key}"));
            nodes.push((name, Some(key), saves));
        }
        Ok(Self(nodes))
    }

    /// `cmd` (a command without keys) on each node: `(name, reply)`, a node's error reply
    /// kept as a value.
    async fn ask(
        &self,
        conn: &mut Redis,
        cmd: &redis::Cmd,
    ) -> RedisResult<Vec<(Option<String>, Value)>> {
        let mut replies = Vec::new();
        for (name, key, _) in &self.0 {
            match key {
                None => replies.extend(conn.on_every_primary(cmd).await?),
                Some(key) => replies.push((name.clone(), conn.call_on_key_node(cmd, key).await?)),
            }
        }
        Ok(replies)
    }
}

/// The writes were not made durable within the limit: says which node lacks what (a
/// one-off step adds that running it again is safe; a first use is retried by the store's
/// next user instead). Exit 3 (`failure.rs`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct NotDurable(String);

/// Waits (up to `limit`) until every replica of each primary `reach` names has the writes
/// this process made so far and that primary's persistence holds them.
///
/// Errors: [`NotDurable`] when a replica did not catch up or a snapshot did not finish (or
/// failed) within `limit`; a Redis error of the replication check.
pub(crate) async fn make_durable(
    conn: &mut Redis,
    reach: &Reach,
    limit: Duration,
) -> anyhow::Result<Durability> {
    let deadline = Instant::now() + limit;
    let nodes = Nodes::of(conn, reach).await?;
    let replicas = replicas_caught_up(conn, &nodes, deadline).await?;
    let persisted = match persisted(conn, &nodes, deadline).await? {
        Durability::Held(how) => how,
        unchecked => return Ok(unchecked),
    };
    Ok(Durability::Held(format!("{replicas}; {persisted}")))
}

/// Every replica's offset at or past its primary's offset read now. Says how many replicas.
async fn replicas_caught_up(
    conn: &mut Redis,
    nodes: &Nodes,
    deadline: Instant,
) -> anyhow::Result<String> {
    // Each primary's offset, and the replicas it has now: one dropped during the wait (a
    // stalled link, after repl-timeout) never got the writes, yet a failover may pick it.
    let first = info(conn, nodes, "replication").await?;
    let targets: Vec<Target> = first
        .iter()
        .map(|(node, text)| {
            let offset = field(text, "master_repl_offset")?.parse()?;
            let replicas = replicas(text).into_iter().map(|(id, _)| id).collect();
            Ok((node.clone(), offset, replicas))
        })
        .collect::<anyhow::Result<_>>()?;
    // The first look is the read that set the targets (a primary without replicas is done).
    let mut seen = Some(first);
    loop {
        let now = match seen.take() {
            Some(first) => first,
            None => info(conn, nodes, "replication").await?,
        };
        match replicas_step(&targets, &now) {
            Ok(done) => return Ok(done),
            Err(waiting) => wait_more(deadline, waiting).await?,
        }
    }
}

/// One look at the replicas' offsets in the `INFO replication` texts `now`: done (how many
/// replicas), or who is behind.
fn replicas_step(targets: &[Target], now: &[(Option<String>, String)]) -> Result<String, String> {
    let mut behind = Vec::new();
    let mut count = 0;
    for (node, target, before) in targets {
        let text = now.iter().find(|(n, _)| n == node).map(|(_, t)| t.as_str());
        let seen = text.map(replicas).unwrap_or_default();
        for (id, offset) in &seen {
            count += 1;
            if offset < target {
                behind.push(format!(
                    "replica {id} of {} at offset {offset} < {target}",
                    show(node)
                ));
            }
        }
        for id in before {
            if !seen.iter().any(|(now, _)| now == id) {
                behind.push(format!("{}: replica {id} dropped", show(node)));
            }
        }
    }
    match behind.is_empty() {
        true => Ok(format!("{count} replica(s) have the writes")),
        false => Err(format!(
            "replicas did not catch up in time (offsets: {}): a failover to one of them would lose the writes",
            behind.join(", ")
        )),
    }
}

/// Each primary's persistence holds the writes. Without AOF a restart loads `dump.rdb`
/// whenever one is on disk, whatever `save` says (a manual `BGSAVE`, a backup, the file a
/// replica wrote at its full sync and keeps after a promotion): so a snapshot that started
/// after the writes must finish. With AOF on now, a restart loads the AOF only if the
/// configuration file says `appendonly yes`, which `CONFIG GET` cannot show (AOF switched on
/// at run time, Redis' documented way from RDB to AOF, loads `dump.rdb` at a restart until
/// redis.conf is edited; and its first AOF is loadable only once its rewrite ends): so the
/// snapshot is waited for with AOF too (it starts once a running rewrite ends), and the AOF
/// as well: `appendfsync` (`CONFIG GET`) says how long a write may wait for its fsync.
async fn persisted(
    conn: &mut Redis,
    nodes: &Nodes,
    deadline: Instant,
) -> anyhow::Result<Durability> {
    let infos = match info(conn, nodes, "persistence").await {
        Ok(infos) => infos,
        Err(err) if refused(&err) => {
            return Ok(Durability::Unchecked(format!(
                "INFO persistence refused ({err})"
            )));
        }
        Err(err) => return Err(err),
    };
    let aof = |text: &str| info_field(text, "aof_enabled") == Some("1");
    let mut how = Vec::new();
    match snapshot_taken(conn, nodes, deadline, infos.clone()).await? {
        Ok(()) => how.push("a snapshot started after them finished"),
        Err(refused) => return Ok(Durability::Unchecked(refused)),
    }
    if let Some((node, _)) = infos
        .iter()
        .find(|(_, text)| aof(text) && info_field(text, "aof_last_write_status") != Some("ok"))
    {
        return Err(NotDurable(format!("{}: the AOF write is failing", show(node))).into());
    }
    if infos.iter().any(|(_, text)| aof(text)) {
        let nodes = match aof_settings(conn, nodes).await {
            Ok(nodes) => nodes,
            Err(err) if is_refusal(&err) => {
                return Ok(Durability::Unchecked(format!(
                    "AOF is on and its appendfsync could not be read ({err})"
                )));
            }
            Err(err) => return Err(err.into()),
        };
        let fsync = |policy: &str| {
            nodes.iter().find(|n| {
                n.settings.appendonly.eq_ignore_ascii_case("yes")
                    && n.settings.appendfsync.eq_ignore_ascii_case(policy)
            })
        };
        if let Some(node) = fsync("no") {
            return Ok(Durability::Unchecked(format!(
                "{}: appendfsync no leaves the flush of the AOF to the kernel (about 30 s on Linux): wait that long before the next step",
                show(&node.node)
            )));
        }
        if fsync("everysec").is_some() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left < EVERYSEC_FSYNC {
                return Err(NotDurable(format!(
                    "appendfsync everysec may take {} to fsync a write, more than what is left of the wait",
                    humantime::format_duration(EVERYSEC_FSYNC)
                ))
                .into());
            }
            tokio::time::sleep(EVERYSEC_FSYNC).await;
            how.push("the AOF fsynced them (everysec)");
        } else {
            how.push("the AOF fsyncs before it replies (always)");
        }
    }
    Ok(Durability::Held(how.join(", ")))
}

/// The settings (`CONFIG GET`) of the primaries the wait covers, not of every primary: a
/// shard the wait does not cover says nothing of these writes.
async fn aof_settings(conn: &mut Redis, nodes: &Nodes) -> RedisResult<Vec<NodePersistence>> {
    let mut replies = Vec::new();
    for cmd in config_gets() {
        replies.extend(nodes.ask(conn, &cmd).await?);
    }
    by_node(replies)
}

/// Redis will not say: an ACL without the command (`NOPERM`), or a managed service that
/// removed or renamed it (`unknown command`). Only these make the durability unchecked;
/// any other error (a fork that failed, a timeout, a dropped connection) means the writes
/// are not durable yet, and a first record keeps its new-store mark (a store opened by its
/// time and then lost with a rollback is what the mark guards against).
fn is_refusal(err: &redis::RedisError) -> bool {
    err.code() == Some("NOPERM")
        || err
            .to_string()
            .to_ascii_lowercase()
            .contains("unknown command")
}

/// [`is_refusal`] of the Redis error in `err`'s chain, if any.
fn refused(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<redis::RedisError>())
        .any(is_refusal)
}

/// What `snapshot_taken` knows of one primary.
#[derive(Default)]
struct Snapshot {
    /// Seen with no snapshot running: any that starts after that started after the writes.
    quiet: bool,
    /// Snapshots counted then (`rdb_saves`; none before Redis 7).
    quiet_saves: Option<u64>,
    /// Our `BGSAVE` forked (it answered "started").
    started: bool,
    /// Our `BGSAVE` waits behind an AOF rewrite (it answered "scheduled").
    scheduled: bool,
}

/// Waits until every primary finished a snapshot that started after the writes: one
/// running at the first look may have started before them (unless its primary's count at
/// the write says otherwise), so it waits for that one to end and sends `BGSAVE SCHEDULE`
/// (again while Redis answers "already in progress"). The inner `Err`: BGSAVE refused,
/// saying so.
/// `first`: the `INFO persistence` texts the caller just read, for the first look.
async fn snapshot_taken(
    conn: &mut Redis,
    nodes: &Nodes,
    deadline: Instant,
    first: Vec<(Option<String>, String)>,
) -> anyhow::Result<Result<(), String>> {
    // A count read when the writes were made stands for a quiet look then.
    let mut states: Vec<(Option<String>, Snapshot)> = nodes
        .0
        .iter()
        .filter_map(|(name, _, saves)| {
            let quiet = Snapshot {
                quiet: true,
                quiet_saves: Some((*saves)?),
                ..Snapshot::default()
            };
            Some((name.clone(), quiet))
        })
        .collect();
    let mut seen = Some(first);
    loop {
        let now = match seen.take() {
            Some(first) => first,
            None => info(conn, nodes, "persistence").await?,
        };
        match snapshot_step(conn, nodes, &mut states, now).await? {
            Ok(done) => return Ok(done),
            Err(waiting) => wait_more(deadline, waiting).await?,
        }
    }
}

/// One look at every primary's snapshots, their `INFO persistence` texts `now` (sending
/// `BGSAVE SCHEDULE` where one must start):
/// done (`Ok(Ok(Ok))`; `Ok(Ok(Err))`: BGSAVE refused), or who is still waited for.
async fn snapshot_step(
    conn: &mut Redis,
    targets: &Nodes,
    nodes: &mut Vec<(Option<String>, Snapshot)>,
    now: Vec<(Option<String>, String)>,
) -> anyhow::Result<Result<Result<(), String>, String>> {
    // rdb_saves counts snapshots since start (Redis 7); older ones are judged by our own.
    let saves = |text: &str| info_field(text, "rdb_saves").and_then(|v| v.parse::<u64>().ok());
    let (mut send, mut waiting) = (false, Vec::new());
    for (node, text) in &now {
        let at = match nodes.iter().position(|(n, _)| n == node) {
            Some(at) => at,
            None => {
                nodes.push((node.clone(), Snapshot::default()));
                nodes.len() - 1
            }
        };
        let state = &mut nodes[at].1;
        let running = info_field(text, "rdb_bgsave_in_progress").is_some_and(|v| v != "0");
        // The first look with none running: any snapshot from now on started after them.
        if !state.quiet && !running {
            (state.quiet, state.quiet_saves) = (true, saves(text));
        }
        if !state.quiet {
            waiting.push(show(node));
            continue;
        }
        // rdb_saves counts a snapshot when its child forks, not when it is on disk: one
        // counted or ours is done only once none runs, and only if it succeeded (one that
        // failed before ours started is followed by ours).
        let counted = state.quiet_saves.is_some() && saves(text) > state.quiet_saves;
        if (counted || state.started) && !running {
            if last_save_ok(text) {
                continue;
            }
            if state.started {
                note_failed(node);
                return Err(
                    NotDurable(format!("{}: the snapshot (BGSAVE) failed", show(node))).into(),
                );
            }
        }
        let wants = !running && !state.started && !state.scheduled;
        if wants && let Some(paused) = failed_recently(node) {
            return Err(paused.into());
        }
        send |= wants;
        waiting.push(show(node));
    }
    if waiting.is_empty() {
        return Ok(Ok(Ok(())));
    }
    if send {
        let mut cmd = redis::cmd("BGSAVE");
        cmd.arg("SCHEDULE");
        for (node, reply) in bounded(COMMAND_CALL_TIMEOUT, targets.ask(conn, &cmd)).await? {
            let Some((_, state)) = nodes.iter_mut().find(|(n, _)| *n == node) else {
                continue;
            };
            match reply.extract_error() {
                Ok(Value::SimpleString(said)) if said.contains("scheduled") => {
                    state.scheduled = true
                }
                Ok(_) => state.started = true,
                // Another snapshot started meanwhile: waited for like the first one.
                Err(err) if err.to_string().contains("already in progress") => {}
                Err(err) if is_refusal(&err) => {
                    return Ok(Ok(Err(format!("{}: BGSAVE refused ({err})", show(&node)))));
                }
                // A fork that failed (memory, process limit): not durable, not unchecked.
                Err(err) => {
                    note_failed(&node);
                    return Err(
                        NotDurable(format!("{}: BGSAVE failed ({err})", show(&node))).into(),
                    );
                }
            }
        }
    }
    Ok(Err(format!(
        "the snapshot (BGSAVE) did not finish in time on {}",
        waiting.join(", ")
    )))
}

/// The last snapshot succeeded (`rdb_last_bgsave_status:ok`).
fn last_save_ok(text: &str) -> bool {
    info_field(text, "rdb_last_bgsave_status") == Some("ok")
}

/// A step still waits for `waiting`: the [`NotDurable`] at `deadline`, else a pause of
/// [`POLL`] before the next look.
async fn wait_more(deadline: Instant, waiting: String) -> anyhow::Result<()> {
    if Instant::now() >= deadline {
        return Err(NotDurable(waiting).into());
    }
    tokio::time::sleep(POLL).await;
    Ok(())
}

/// `INFO <section>` of each node, as text.
async fn info(
    conn: &mut Redis,
    nodes: &Nodes,
    section: &str,
) -> anyhow::Result<Vec<(Option<String>, String)>> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    let replies = bounded(COMMAND_CALL_TIMEOUT, nodes.ask(conn, &cmd)).await?;
    replies
        .into_iter()
        .map(|(node, reply)| -> RedisResult<_> {
            let reply: Value = reply.extract_error()?;
            Ok((node, redis::from_redis_value(reply)?))
        })
        .collect::<RedisResult<_>>()
        .map_err(Into::into)
}

/// The value of `name:` in an `INFO` text ([`info_field`]); an error without it.
fn field<'a>(text: &'a str, name: &str) -> anyhow::Result<&'a str> {
    info_field(text, name).ok_or_else(|| anyhow::anyhow!("INFO has no {name}"))
}

/// A primary (`None`: the one server), its `master_repl_offset` after the writes, and the
/// replicas it had then (`ip:port`).
type Target = (Option<String>, u64, Vec<String>);

/// Every `slaveN:` line of an `INFO replication` text: the replica (`ip:port`) and its
/// `offset=`.
fn replicas(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|line| line.strip_prefix("slave")?.split_once(':'))
        .filter_map(|(_, rest)| {
            let value = |key: &str| rest.split(',').find_map(|kv| kv.strip_prefix(key));
            let offset = value("offset=")?.trim().parse().ok()?;
            Some((format!("{}:{}", value("ip=")?, value("port=")?), offset))
        })
        .collect()
}

fn show(node: &Option<String>) -> String {
    node.clone().unwrap_or_else(|| "the primary".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_offsets_and_fields_are_read_from_info() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
            slave0:ip=127.0.0.1,port=6380,state=online,offset=120,lag=0\r\n\
            slave1:ip=127.0.0.1,port=6381,state=wait_bgsave,offset=0,lag=1\r\n\
            master_repl_offset:140\r\nslave_read_repl_offset:0\r\n";
        assert_eq!(
            replicas(text),
            [
                ("127.0.0.1:6380".to_owned(), 120),
                ("127.0.0.1:6381".to_owned(), 0)
            ]
        );
        assert_eq!(field(text, "master_repl_offset").unwrap(), "140");
        assert!(field(text, "rdb_saves").is_err());
    }
}
