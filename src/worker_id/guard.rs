//! `snowlease guard open`: opens an app's claim guard (on Cluster: its
//! per-ID guards) at once on a Redis
//! that holds none of the app's lease keys, so the first sidecars of a new
//! app (or on a fresh Redis) claim without waiting one TTL. Refuses, writing
//! nothing, while any lease key of the app exists: then the guard is what
//! keeps a newcomer from taking an ID a holder still publishes.

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use redis::Script;

use super::args::AppKeysArgs;
use super::claim::LeaseKeys;
use crate::cli::{ConfigError, RedisUrlArg, stdout_line};
use crate::connection::RedisTarget;

static OPEN: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("guard_open.lua")));

/// Timeout of each Redis call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// Open the claim guard now; refused (exit 5, nothing written) while any lease key of the app exists.
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

    /// Open even while lease keys exist. Dangerous after a Redis data loss: a newcomer may take an ID that a holder still publishes until its next renew.
    #[arg(long)]
    pub force: bool,
}

/// A validated `guard open`.
#[derive(Debug, Clone)]
pub struct OpenConfig {
    keys: LeaseKeys,
    max_worker_id: u16,
    app: String,
    redis: RedisTarget,
    force: bool,
}

impl GuardArgs {
    /// Checks every flag; the first violation names its flag.
    pub fn validate(&self) -> Result<OpenConfig, ConfigError> {
        let GuardCommand::Open(open) = &self.command;
        let keys = open.keys.validate()?;
        Ok(OpenConfig {
            keys: LeaseKeys::new(&keys.key_prefix, &keys.app),
            max_worker_id: keys.max_worker_id,
            app: keys.app,
            redis: open.redis.target()?,
            force: open.force,
        })
    }
}

/// `guard open` found lease keys and was not forced (exit 5).
#[derive(Debug, thiserror::Error)]
#[error(
    "claim guard of app {app} not opened: {held} lease key(s) of the app exist, so a holder may \
     still publish its ID (this is not a first use); let the guard run out, or use --force if you \
     know every holder is gone"
)]
pub struct GuardRefused {
    /// The app.
    pub app: String,
    /// How many lease keys exist.
    pub held: i64,
}

/// Runs `guard open` and prints one JSON line. One server: one script on
/// every (lease key, app guard) pair. Cluster: one `EXISTS` of every lease
/// key first (refused, nothing written, when any exists), then the script
/// once per ID on (lease key, per-ID guard), each re-checking its key in
/// its slot; an ID whose key appeared meanwhile is refused alone.
///
/// Errors: [`GuardRefused`] when lease keys exist without `--force`; a
/// Redis error (unreachable, refused, guard key of another type).
pub async fn open(config: &OpenConfig) -> anyhow::Result<()> {
    let mut conn = config.redis.connect(CALL_TIMEOUT)?;
    let context = || format!("redis {}", config.redis);
    let cluster = conn.is_cluster().await.with_context(context)?;
    let ids = config.keys.ids(config.max_worker_id);
    let pairs: Vec<(String, String)> = ids
        .into_iter()
        .zip(config.keys.guards(config.max_worker_id, cluster))
        .collect();
    let batches: Vec<&[(String, String)]> = match cluster {
        false => vec![&pairs[..]],
        true => {
            let mut exists = redis::cmd("EXISTS");
            exists.arg(pairs.iter().map(|(k, _)| k).collect::<Vec<_>>());
            let held = bounded(config, exists.query_async::<i64>(&mut conn))
                .await
                .with_context(context)?;
            if held > 0 && !config.force {
                return Err(GuardRefused {
                    app: config.app.clone(),
                    held,
                }
                .into());
            }
            pairs.chunks(1).collect()
        }
    };
    let (mut refused, mut held_total, mut at_ms) = (false, 0, 0);
    for batch in &batches {
        let mut invocation = OPEN.prepare_invoke();
        for (key, guard) in *batch {
            invocation.key(key).key(guard);
        }
        invocation.arg(if config.force { "1" } else { "0" });
        let call = invocation.invoke_async::<(i64, u64, i64)>(&mut conn);
        let (opened, at, held) = bounded(config, call).await.with_context(context)?;
        if held < 0 {
            anyhow::bail!(
                "the claim guard {} has another type than string; remove it by hand",
                batch[0].1
            );
        }
        refused |= opened == 0;
        held_total += held;
        at_ms = at_ms.max(at);
    }
    if refused {
        return Err(GuardRefused {
            app: config.app.clone(),
            held: held_total,
        }
        .into());
    }
    let line = serde_json::json!({
        "app": config.app,
        "opened_at_ms": at_ms,
        "lease_keys": held_total,
        "guards": if cluster { batches.len() } else { 1 },
    });
    stdout_line(&line.to_string())
}

/// One Redis call under [`CALL_TIMEOUT`].
async fn bounded<T>(
    config: &OpenConfig,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> anyhow::Result<T> {
    let reply = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| anyhow::anyhow!("redis {} did not answer within 5s", config.redis))?;
    Ok(reply?)
}
