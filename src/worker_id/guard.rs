//! `snowlease guard open`: opens an app's claim guard at once on a Redis
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

/// Timeout of the one Redis call.
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

/// Runs `guard open`: one script, Redis time; prints one JSON line.
///
/// Errors: [`GuardRefused`] when lease keys exist without `--force`; a
/// Redis error (unreachable, refused, guard key of another type).
pub async fn open(config: &OpenConfig) -> anyhow::Result<()> {
    let mut conn = config.redis.connect(CALL_TIMEOUT)?;
    let mut invocation = OPEN.prepare_invoke();
    for key in config.keys.ids(config.max_worker_id) {
        invocation.key(key);
    }
    invocation
        .key(config.keys.guard())
        .arg(if config.force { "1" } else { "0" });
    let call = invocation.invoke_async::<(i64, u64, i64)>(&mut conn);
    let (opened, at_ms, held) = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| anyhow::anyhow!("redis {} did not answer within 5s", config.redis))?
        .with_context(|| format!("redis {}", config.redis))?;
    if held < 0 {
        anyhow::bail!(
            "the claim guard {} has another type than string; remove it by hand",
            config.keys.guard()
        );
    }
    if opened == 0 {
        return Err(GuardRefused {
            app: config.app.clone(),
            held,
        }
        .into());
    }
    let line = serde_json::json!({ "app": config.app, "opened_at_ms": at_ms, "lease_keys": held });
    stdout_line(&line.to_string())
}
