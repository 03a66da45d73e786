//! `snowlease guard open`: opens an app's claim guard (on Cluster: its
//! per-ID guards) at once on a Redis
//! that holds none of the app's lease keys, so the first sidecars of a new
//! app (or on a fresh Redis) claim without waiting one TTL. Refuses, writing
//! nothing, while any lease key of the app exists or a sidecar has closed
//! the guard (it found none: a data loss looks like that): then the guard is
//! what keeps a newcomer from taking an ID a holder still publishes.

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use redis::Script;

use super::args::AppKeysArgs;
use super::keys::LeaseKeys;
use super::limits::TTL;
use super::range::WorkerRange;
use crate::cli::{ConfigError, RedisUrlArg, parse_duration, stdout_line};
use crate::connection::{Keyspace, RedisTarget};
use crate::lease::node::{self, FirstRecord, FirstUse, OpenMode};
use crate::timing::{self, COMMAND_CALL_TIMEOUT};

static OPEN: LazyLock<Script> =
    LazyLock::new(|| crate::lease::node::script(include_str!("guard_open.lua")));

/// `snowlease guard ...`.
#[derive(Debug, Clone, Args)]
pub struct GuardArgs {
    /// What to do with the claim guard.
    #[command(subcommand)]
    pub command: GuardCommand,
}

/// Subcommands of `snowlease guard`.
#[derive(Debug, Clone, Subcommand)]
pub enum GuardCommand {
    /// Open the claim guard now (before the app's first sidecars); refused (exit 5, nothing written) while a lease key of the app exists or a sidecar has closed the guard.
    #[command(after_help = crate::exit::HELP)]
    Open(OpenArgs),
}

/// Flags of `snowlease guard open`.
#[derive(Debug, Clone, Args)]
pub struct OpenArgs {
    /// The keys: the same three flags the sidecars are given.
    #[command(flatten)]
    pub keys: AppKeysArgs,

    /// Where Redis is.
    #[command(flatten)]
    pub redis: RedisUrlArg,

    /// `--allow-evicting-redis`: without it, refused on a Redis that may evict keys.
    #[command(flatten)]
    pub eviction: crate::eviction::EvictionArgs,

    /// The sidecars' --ttl (the longest, if they differ): a guard written here stays closed that long unless it is seen durable (on every replica and in Redis' snapshot or AOF) within 60 s; 1s-1h.
    #[arg(long, env = "SNOWLEASE_TTL", default_value = TTL.default, value_parser = parse_duration)]
    pub ttl: Duration,

    /// Open even while lease keys exist or the guard is closed. Dangerous after a Redis data loss: a newcomer may take an ID that a holder still publishes until its next renew; use it only if no sidecar of the app held an ID on this Redis in the last TTL.
    #[arg(long)]
    pub force: bool,
}

/// A validated `guard open`.
#[derive(Debug, Clone)]
pub struct OpenConfig {
    keys: LeaseKeys,
    worker_ids: WorkerRange,
    app: String,
    redis: RedisTarget,
    force: bool,
    allow_evicting_redis: bool,
    ttl: Duration,
}

impl GuardArgs {
    /// Checks every flag; the first violation names its flag.
    pub fn validate(&self) -> Result<OpenConfig, ConfigError> {
        let GuardCommand::Open(open) = &self.command;
        let keys = open.keys.validate()?;
        TTL.check(open.ttl)?;
        Ok(OpenConfig {
            ttl: open.ttl,
            keys: LeaseKeys::new(&keys.key_prefix, &keys.app),
            worker_ids: keys.worker_ids,
            app: keys.app,
            redis: open.redis.target()?,
            force: open.force,
            allow_evicting_redis: open.eviction.allow_evicting_redis,
        })
    }
}

/// `guard open` found what makes opening unsafe and was not forced (exit 5).
#[derive(Debug, thiserror::Error)]
pub(crate) enum GuardRefused {
    /// Lease keys of the app exist and a guard is missing: a holder may
    /// still publish its ID (not a first use; the guard was lost).
    #[error(
        "claim guard of app {app} not opened: {held} lease key(s) of the app exist but a claim \
         guard is missing (lost with data, or removed), so a holder may still publish its ID; \
         sidecars close the guard and claim one TTL later on their own, or use --force if you \
         know every holder is gone"
    )]
    LeaseKeys {
        /// The app.
        app: String,
        /// How many lease keys (strings) exist.
        held: i64,
    },
    /// A guard is closed: a sidecar's claim found it missing within the
    /// last TTL (a data loss, or sidecars that started first on a fresh
    /// Redis), and holders from before a loss may still publish their IDs.
    #[error(
        "claim guard of app {app} not opened: it is closed and opens by itself in {opens_in_ms} \
         ms. A sidecar's claim closed it because it found no guard (a Redis that lost its data, \
         or sidecars that started before this command) or one written before a Redis restart \
         or failover; or an earlier guard open closed it for one of these reasons, or could not \
         see it durable (its warning or exit 3 said so). Holders from before may still publish \
         their IDs until then. Wait, or use --force only if no sidecar of this app held an ID \
         on this Redis in the last TTL"
    )]
    Closed {
        /// The app.
        app: String,
        /// ms until the latest closed guard opens (Redis time).
        opens_in_ms: u64,
    },
}

/// `guard open` saw its guard durable but could not open it: the guard is no longer the one
/// it wrote (Redis restarted or failed over during the wait, so its stamp is another node's
/// now, or someone changed it). Exit 3 (`failure.rs`).
#[derive(Debug, thiserror::Error)]
#[error(
    "claim guard of app {app} not opened: {guards} guard(s) changed during the wait for \
     durability (Redis restarted or failed over, or the key was written by hand); claims \
     treat such a guard as after a rollback and wait one TTL; run guard open again after that"
)]
pub(crate) struct NotOpened {
    /// The app.
    app: String,
    /// Guards found changed.
    guards: usize,
}

/// What a pre-read or the script found: lease keys (strings), the ms
/// until the latest closed guard opens, and whether every guard is open.
#[derive(Debug, Default, Clone, Copy)]
struct OpenFindings {
    held: i64,
    closed_ms: u64,
    all_open: bool,
}

impl OpenFindings {
    /// The refusal these findings call for without `--force`: none when
    /// every guard is open already (opening is then a no-op).
    fn refusal(self, config: &OpenConfig) -> Option<GuardRefused> {
        let app = config.app.clone();
        match (self.held, self.closed_ms) {
            _ if config.force || self.all_open => None,
            (held, _) if held > 0 => Some(GuardRefused::LeaseKeys { app, held }),
            (_, opens_in_ms) if opens_in_ms > 0 => Some(GuardRefused::Closed { app, opens_in_ms }),
            _ => None,
        }
    }
}

/// Runs `guard open` and prints one JSON line. One server: a `SCAN` for
/// lease keys of IDs outside `--worker-ids` (the app guard covers every
/// ID, whatever range the sidecars use), then one script on every (lease
/// key, app guard) pair, counting those too. Cluster: a pre-read of every
/// lease key's type and per-ID guard (refused, nothing written, on a lease
/// key or a closed guard unless every guard is open), then the script once
/// per ID on (lease key, per-ID guard), each re-checking in its slot; an ID
/// whose key appeared meanwhile is refused alone. Guards that are all open
/// already (with or without lease keys under them) make it a no-op: nothing
/// is written and the line says `"already_open": true` (exit 0), so a
/// deploy hook can run this on every deploy. A guard written on another node or life of
/// Redis (a restart, a failover) is closed for one TTL as a claim would close it (exit 0, a
/// warning, `"closed_after_rollback"`), never opened without `--force`.
///
/// Errors: `GuardRefused` without `--force`; `EvictingRedis`
/// without `--allow-evicting-redis` (exit 1, nothing written); a Redis error
/// (unreachable, refused, guard key of another type).
pub async fn open(config: &OpenConfig) -> anyhow::Result<()> {
    let mut conn = config.redis.connect(COMMAND_CALL_TIMEOUT)?;
    let context = || format!("redis {}", config.redis);
    let keyspace = conn.keyspace().await.with_context(context)?;
    // Sidecars claim nothing there: opening would only hide the cause.
    if !config.allow_evicting_redis {
        let evicting = crate::eviction::check(&mut conn).await;
        if let Some(evicting) = evicting.with_context(context)? {
            return Err(evicting.into());
        }
    }
    let ids = config.keys.ids(config.worker_ids);
    let pairs: Vec<(String, String)> = ids
        .into_iter()
        .zip(config.keys.guards(config.worker_ids, keyspace))
        .collect();
    // One server: keys beyond the range, which the script counts with its
    // own. Cluster: the pre-read only gates (the scripts count every key).
    let beyond = match keyspace {
        Keyspace::Whole => beyond_range(config, &mut conn)
            .await
            .with_context(context)?,
        Keyspace::Slots => {
            let read = pre_read(config, &mut conn, &pairs).await;
            if let Some(refused) = read.with_context(context)?.refusal(config) {
                return Err(refused.into());
            }
            0
        }
    };
    let batches: Vec<&[(String, String)]> = match keyspace {
        Keyspace::Whole => vec![&pairs[..]],
        Keyspace::Slots => pairs.chunks(1).collect(),
    };
    let (mut refused, mut already_open, mut total, mut at_ms) =
        (false, true, OpenFindings::default(), 0);
    // Guards of another node or life closed now for one TTL (answer 3), and until when.
    let (mut rolled_back, mut rolled_back_ms) = (0usize, 0u64);
    let mut written: Vec<FirstRecord> = Vec::new();
    for batch in &batches {
        let mut invocation = OPEN.prepare_invoke();
        for (key, guard) in *batch {
            invocation.key(key).key(guard);
        }
        invocation
            .arg(if config.force { "1" } else { "0" })
            .arg(beyond)
            .arg(timing::ttl_ms(config.ttl));
        let call = invocation.invoke_async::<(i64, u64, i64, u64, String)>(&mut conn);
        // A guard of another node is closed by the script (answer 3), never refused.
        let (opened, at, held, closed_ms, guard_written) =
            bounded(config, call).await.with_context(context)?;
        if opened == 1 {
            // One record per guard key (on one server every pair names the app's guard).
            for (_, guard) in *batch {
                if written.iter().any(|record| record.key == *guard) {
                    continue;
                }
                written.push(FirstRecord {
                    key: guard.clone(),
                    field: None,
                    fence: None,
                    fence_reset: "",
                    written: guard_written.clone(),
                });
            }
        }
        if held < 0 {
            anyhow::bail!(
                "the claim guard {} has another type than string; remove it by hand",
                batch[0].1
            );
        }
        if opened == 3 {
            rolled_back += 1;
            rolled_back_ms = rolled_back_ms.max(closed_ms);
        }
        refused |= opened == 0;
        already_open &= opened == 2;
        total.held += held;
        total.closed_ms = total.closed_ms.max(closed_ms);
        at_ms = at_ms.max(at);
    }
    if refused {
        // On Cluster guards written before an ID's refusal stay closed (one TTL).
        return Err(total.refusal(config).expect("the script refused").into());
    }
    let mut line = serde_json::json!({
        "app": config.app,
        "opened_at_ms": at_ms,
        "already_open": already_open,
        "lease_keys": total.held,
        "guards": batches.len(),
        "redis": config.redis.to_string(),
    });
    if rolled_back > 0 {
        // Not an error: the app is not new; claims wait as after any rollback.
        eprintln!(
            "warning: the claim guard of app {} was written before Redis last restarted or failed over (or by a version without node stamps), so Redis may have come back without its newest lease keys while their holders still publish them: closed for one TTL ({} ms), as a claim would close it; claims open then (docs/rollback-design.md). --force opens it now, only if no sidecar of this app held an ID on this Redis in the last TTL",
            config.app, rolled_back_ms
        );
        line["closed_after_rollback"] = serde_json::json!(rolled_back);
        line["opens_in_ms"] = serde_json::json!(rolled_back_ms);
    }
    if !written.is_empty() {
        let first_use = node::open_first_use(&mut conn, &written, node::FIRST_USE_WAIT).await;
        let unchecked = |why: &str| {
            format!(
                "the guard stays closed until {} ms (one TTL), as after a data loss: {why}",
                at_ms + timing::ms(config.ttl)
            )
        };
        if first_use.is_err() {
            // Taken back, so that guard open run again (a retried Job) is not refused by
            // its own closed guard; claims meanwhile find no guard and close it themselves.
            node::open_records(&mut conn, &written, OpenMode::Withdraw)
                .await
                .with_context(context)?;
        }
        let not_durable = || {
            format!(
                "claim guard of app {} on redis {}: not seen durable, so it is taken back (no guard, as before this command; it is safe to run again)",
                config.app, config.redis
            )
        };
        match first_use.with_context(not_durable)? {
            FirstUse::Opened { changed: 0 } => {}
            // Redis restarted or failed over during the wait (the guard's stamp is not this
            // node's any more), or the guard was changed: not opened by this call.
            FirstUse::Opened { changed } => {
                return Err(NotOpened {
                    app: config.app.clone(),
                    guards: changed,
                }
                .into());
            }
            // --force: the operator says no holder can be lost with the guard.
            FirstUse::Unchecked(why) if config.force => {
                node::open_records(&mut conn, &written, OpenMode::Durable)
                    .await
                    .with_context(context)?;
                eprintln!("warning: durability unchecked ({why}); the guard is open now (--force)");
                line["durability_unchecked"] = serde_json::json!(why);
            }
            FirstUse::Unchecked(why) => {
                let said = unchecked(&why);
                eprintln!("warning: durability unchecked: {said}");
                line["opened_at_ms"] = serde_json::json!(at_ms + timing::ms(config.ttl));
                line["durability_unchecked"] = serde_json::json!(said);
            }
        }
    }
    stdout_line(&line.to_string())
}

/// One server: lease keys (strings) of the app's IDs outside
/// `--worker-ids` (above `--max-worker-id`), found with a full `SCAN` of `<prefix><app>:*`.
async fn beyond_range(
    config: &OpenConfig,
    conn: &mut crate::connection::Redis,
) -> anyhow::Result<i64> {
    let (mut cursor, mut held) = (0u64, 0);
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor).arg("MATCH").arg(config.keys.pattern());
        scan.arg("COUNT").arg(1000).arg("TYPE").arg("string");
        let (next, keys) = bounded(config, scan.query_async::<(u64, Vec<String>)>(conn)).await?;
        held += keys
            .iter()
            .filter_map(|k| config.keys.worker_id_of(k))
            .filter(|id| !u16::try_from(*id).is_ok_and(|id| config.worker_ids.contains(id)))
            .count() as i64;
        if next == 0 {
            return Ok(held);
        }
        cursor = next;
    }
}

/// Cluster: the type of every lease key and the value of its per-ID guard
/// (each command to its slot's node), against one node's `TIME`.
async fn pre_read(
    config: &OpenConfig,
    conn: &mut crate::connection::Redis,
    pairs: &[(String, String)],
) -> anyhow::Result<OpenFindings> {
    let mut pipe = redis::pipe();
    for (key, guard) in pairs {
        pipe.cmd("TYPE").arg(key).cmd("MGET").arg(guard);
    }
    let replies: Vec<redis::Value> = bounded(config, pipe.query_async(conn)).await?;
    let (secs, micros): (u64, u64) = bounded(config, redis::cmd("TIME").query_async(conn)).await?;
    let now_ms = secs * 1000 + micros / 1000;
    let mut found = OpenFindings {
        all_open: true,
        ..OpenFindings::default()
    };
    for pair in replies.chunks(2) {
        let kind: String = redis::from_redis_value(pair[0].clone())?;
        let guard: Vec<Option<String>> = redis::from_redis_value(pair[1].clone())?;
        found.held += i64::from(kind == "string");
        let open_at = guard
            .first()
            .cloned()
            .flatten()
            .and_then(|g| crate::lease::node::integer_part(&g));
        found.all_open &= open_at.is_some_and(|at: u64| at <= now_ms);
        if let Some(open_at) = open_at.filter(|at: &u64| *at > now_ms) {
            found.closed_ms = found.closed_ms.max(open_at - now_ms);
        }
    }
    Ok(found)
}

/// One Redis call under [`COMMAND_CALL_TIMEOUT`]; no answer in time is
/// "redis <url> did not answer within 5s".
async fn bounded<T>(
    config: &OpenConfig,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> anyhow::Result<T> {
    timing::bounded(COMMAND_CALL_TIMEOUT, call)
        .await
        .map_err(|err| {
            if err.is_timeout() {
                anyhow::anyhow!(
                    "redis {} did not answer within {}s",
                    config.redis,
                    COMMAND_CALL_TIMEOUT.as_secs()
                )
            } else {
                err.into()
            }
        })
}
