//! `snowlease pool ...`: the flags, with env twins. `cli/validate.rs` turns
//! them into a [`PoolCliConfig`] before Redis is touched; [`run`] executes
//! it and prints one JSON object (or the status table); `failure::code_of` maps
//! the outcome to an exit code.

mod run;
mod validate;

pub use run::{PoolCliError, run};
pub use validate::PoolCliConfig;
use validate::{Op, StrikesChange, human};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::limits::{MAX_STRIKES, REAP_LIMIT};
use crate::cli::{LogFormat, RedisArgs, parse_duration, whole};

/// Flags of `snowlease pool`.
#[derive(Args)]
pub struct PoolArgs {
    /// The pool operation.
    #[command(subcommand)]
    pub(crate) command: PoolCommand,
}

/// The operations of `snowlease pool`.
#[derive(Subcommand)]
pub(crate) enum PoolCommand {
    /// Create a pool with its first ids, all due at once (refused when the pool exists).
    Init(InitArgs),
    /// Add new ids to a pool, due at once (refused for ids already in it).
    Add(IdsArgs),
    /// Lease one due id; prints {"id","token","deadline_ms","fence"}.
    Acquire(AcquireArgs),
    /// Hand a lease back; the id is due again after the cooldown, or after --quarantine.
    Release(ReleaseArgs),
    /// Move a lease's deadline to now + ttl, capped at its first acquire + --max-lease.
    Extend(ExtendArgs),
    /// Return every expired lease, and every ended quarantine, to ready (what acquire and serve also do).
    Reap(ReapArgs),
    /// Count the pool's ids by state: a table, or --json. Never shows tokens.
    Status(PoolStatusArgs),
    /// Take ids out of service until enable (a leased id stays leased until released).
    Disable(IdsArgs),
    /// Put disabled ids back into service (a running cooldown or quarantine still applies).
    Enable(EnableArgs),
    /// Show or set the pool's strike setting (--max-strikes with --strike-window, or --strikes-off).
    Config(ConfigArgs),
    /// Serve the HTTP API for workers, with a background reaper and metrics.
    Serve(ServeArgs),
}

/// One pool and its Redis.
#[derive(Args)]
pub(crate) struct PoolTarget {
    /// Pool name P: 1-64 chars of [A-Za-z0-9_-]; its keys are {P}:ready, {P}:leases, ...
    #[arg(long, env = "SNOWLEASE_POOL")]
    pub pool: String,

    /// Where Redis is.
    #[command(flatten)]
    pub redis: RedisArgs,
}

/// Ids given on the command line or in a file; exactly one of the two.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub(crate) struct IdSource {
    /// Ids, comma-separated; each 1-64 chars of [A-Za-z0-9_-].
    #[arg(long, value_delimiter = ',')]
    pub ids: Option<Vec<String>>,

    /// File of ids, one per line (blank lines and lines starting with # are skipped).
    #[arg(long)]
    pub ids_file: Option<PathBuf>,
}

/// Flags of `init`, `add`, `disable`, `enable`.
#[derive(Args)]
pub(crate) struct IdsArgs {
    /// The pool and its Redis.
    #[command(flatten)]
    pub target: PoolTarget,

    /// Where the ids come from.
    #[command(flatten)]
    pub source: IdSource,
}

/// The strike setting: an id quarantined N times within the window is disabled.
#[derive(Args)]
pub(crate) struct StrikeArgs {
    /// Quarantines within --strike-window that disable an id (1-100); default: strikes off.
    #[arg(long, requires = "strike_window",
        value_parser = whole::<u64>(MAX_STRIKES.min, MAX_STRIKES.max), allow_negative_numbers = true)]
    pub max_strikes: Option<u64>,

    /// The window strikes are counted in (1s-30d); give it with --max-strikes.
    #[arg(long, value_parser = parse_duration, requires = "max_strikes")]
    pub strike_window: Option<Duration>,
}

/// Flags of `init`.
#[derive(Args)]
pub(crate) struct InitArgs {
    /// The pool, its Redis and the ids.
    #[command(flatten)]
    pub ids: IdsArgs,

    /// The strike setting.
    #[command(flatten)]
    pub strikes: StrikeArgs,
}

/// Flags of `enable`.
#[derive(Args)]
pub(crate) struct EnableArgs {
    /// The pool, its Redis and the ids.
    #[command(flatten)]
    pub ids: IdsArgs,

    /// Also end the quarantine of each id now (without it a quarantine runs to its end).
    #[arg(long)]
    pub force: bool,
}

/// Flags of `config`.
#[derive(Args)]
pub(crate) struct ConfigArgs {
    /// The pool and its Redis.
    #[command(flatten)]
    pub target: PoolTarget,

    /// The strike setting to store.
    #[command(flatten)]
    pub strikes: StrikeArgs,

    /// Turn strikes off.
    #[arg(long, conflicts_with_all = ["max_strikes", "strike_window"])]
    pub strikes_off: bool,
}

/// Flags of `acquire`.
#[derive(Args)]
pub(crate) struct AcquireArgs {
    /// The pool and its Redis.
    #[command(flatten)]
    pub target: PoolTarget,

    /// Lease time: the deadline is Redis now + ttl. Whole ms, 1ms-10m, at most --max-lease.
    #[arg(long, env = "SNOWLEASE_POOL_TTL", value_parser = parse_duration)]
    pub ttl: Duration,

    /// Not a cooldown after your own lease (give that at release): before it leases, acquire
    /// reclaims up to 100 expired leases of others, and their ids are due again only after this
    /// (0s-10m). `--cooldown` is its old name.
    #[arg(
        long,
        alias = "cooldown",
        env = "SNOWLEASE_POOL_RECLAIM_COOLDOWN",
        default_value = "0s",
        value_parser = parse_duration
    )]
    pub reclaim_cooldown: Duration,

    /// Retry for this long (0s-24h), backing off by the next-due hint; then exit 3. A new
    /// pool's first acquire waits for its first snapshot within it, but at least 5s.
    #[arg(long, env = "SNOWLEASE_POOL_WAIT", default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,

    /// Idempotency key (1-64 chars of [A-Za-z0-9_-]): a retry with it answers the same lease.
    #[arg(long, env = "SNOWLEASE_POOL_REQUEST_ID")]
    pub request_id: Option<String>,

    /// Longest total lease time, extends included (1ms-24h).
    #[arg(long, env = "SNOWLEASE_POOL_MAX_LEASE", default_value = "10m", value_parser = parse_duration)]
    pub max_lease: Duration,

    /// `--budget`: lease only together with a charge to a rate budget.
    #[command(flatten)]
    pub budget: crate::budget::cli::ChargeArgs,
}

/// The lease `release` and `extend` act on.
#[derive(Args)]
pub(crate) struct LeaseRef {
    /// The leased id.
    #[arg(long, env = "SNOWLEASE_POOL_ID")]
    pub id: String,

    /// The lease's token (1-128 chars), as acquire printed it; prefer the env twin to argv.
    #[arg(long, env = "SNOWLEASE_POOL_TOKEN", hide_env_values = true)]
    pub token: String,
}

/// Flags of `release`.
#[derive(Args)]
pub(crate) struct ReleaseArgs {
    /// The pool and its Redis.
    #[command(flatten)]
    pub target: PoolTarget,

    /// The lease: id and token.
    #[command(flatten)]
    pub lease: LeaseRef,

    /// The id is due again after this cooldown (0s-10m).
    #[arg(long, env = "SNOWLEASE_POOL_COOLDOWN", default_value = "0s", value_parser = parse_duration)]
    pub cooldown: Duration,

    /// Put the id out of rotation for this long instead (1ms-30d, whole ms): the resource is bad.
    #[arg(long, value_parser = parse_duration)]
    pub quarantine: Option<Duration>,

    /// Why, for operators (at most 200 bytes, no control characters); needs --quarantine.
    #[arg(long, requires = "quarantine")]
    pub reason: Option<String>,
}

/// Flags of `extend`.
#[derive(Args)]
pub(crate) struct ExtendArgs {
    /// The pool and its Redis.
    #[command(flatten)]
    pub target: PoolTarget,

    /// The lease: id and token.
    #[command(flatten)]
    pub lease: LeaseRef,

    /// New deadline: Redis now + ttl. Whole ms, 1ms-10m.
    #[arg(long, env = "SNOWLEASE_POOL_TTL", value_parser = parse_duration)]
    pub ttl: Duration,

    /// Longest total lease time from its acquire (1ms-24h).
    #[arg(long, env = "SNOWLEASE_POOL_MAX_LEASE", default_value = "10m", value_parser = parse_duration)]
    pub max_lease: Duration,
}

/// Flags of `reap`.
#[derive(Args)]
pub(crate) struct ReapArgs {
    /// The pool and its Redis.
    #[command(flatten)]
    pub target: PoolTarget,

    /// Most leases reclaimed per Redis call (1-1000).
    #[arg(long, env = "SNOWLEASE_POOL_REAP_LIMIT", default_value_t = REAP_LIMIT.max as usize,
        value_parser = whole::<usize>(REAP_LIMIT.min, REAP_LIMIT.max), allow_negative_numbers = true)]
    pub limit: usize,

    /// Reclaimed ids are due again after this cooldown (0s-10m).
    #[arg(long, env = "SNOWLEASE_POOL_COOLDOWN", default_value = "0s", value_parser = parse_duration)]
    pub cooldown: Duration,
}

/// Flags of `status`.
#[derive(Args)]
pub(crate) struct PoolStatusArgs {
    /// The pool and its Redis.
    #[command(flatten)]
    pub target: PoolTarget,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `serve`.
#[derive(Args)]
pub(crate) struct ServeArgs {
    /// Pools to serve (repeat the flag, or comma-separate); others answer 404.
    #[arg(
        long = "pool",
        env = "SNOWLEASE_POOL",
        value_delimiter = ',',
        required = true
    )]
    pub pools: Vec<String>,

    /// Where Redis is.
    #[command(flatten)]
    pub redis: RedisArgs,

    /// Address of the HTTP API; keep it on loopback (tokens travel in clear). Port 7392: next
    /// to the worker's 7391, off the ports apps and sidecars use (docs/worker.md, "Why port 7391").
    #[arg(long, env = "SNOWLEASE_POOL_LISTEN", default_value = "127.0.0.1:7392")]
    pub listen: SocketAddr,

    /// `--max-connections`, `--http-header-timeout`.
    #[command(flatten)]
    pub http: crate::http::HttpArgs,

    /// Time between background reaper rounds per pool (10ms-1h).
    #[arg(long, env = "SNOWLEASE_POOL_REAP_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub reap_interval: Duration,

    /// Cooldown the reaper gives the ids of expired leases (0s-10m).
    #[arg(long, env = "SNOWLEASE_POOL_REAP_COOLDOWN", default_value = "0s", value_parser = parse_duration)]
    pub reap_cooldown: Duration,

    /// Longest total lease time, extends included (1ms-24h).
    #[arg(long, env = "SNOWLEASE_POOL_MAX_LEASE", default_value = "10m", value_parser = parse_duration)]
    pub max_lease: Duration,
}

impl PoolArgs {
    /// The log format flag of the chosen command.
    pub fn log_format(&self) -> LogFormat {
        self.redis_args().log.log_format
    }

    /// Whether the command runs until stopped (`serve`), not once.
    pub fn is_serve(&self) -> bool {
        matches!(self.command, PoolCommand::Serve(_))
    }

    fn redis_args(&self) -> &RedisArgs {
        match &self.command {
            PoolCommand::Add(a) | PoolCommand::Disable(a) => &a.target.redis,
            PoolCommand::Init(a) => &a.ids.target.redis,
            PoolCommand::Enable(a) => &a.ids.target.redis,
            PoolCommand::Config(a) => &a.target.redis,
            PoolCommand::Acquire(a) => &a.target.redis,
            PoolCommand::Release(a) => &a.target.redis,
            PoolCommand::Extend(a) => &a.target.redis,
            PoolCommand::Reap(a) => &a.target.redis,
            PoolCommand::Status(a) => &a.target.redis,
            PoolCommand::Serve(a) => &a.redis,
        }
    }
}
