//! `snowlease pool ...`: flags with env twins, validated into a
//! [`PoolCliConfig`] before Redis is touched; each command prints one JSON
//! object (or the status table) on stdout; [`exit_code`] maps the outcome.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use redis::aio::ConnectionManager;
use serde_json::json;

use super::check::{self, BATCH_MAX, COOLDOWN_MAX_MS, MAX_LEASE_MAX_MS, TTL_MAX_MS};
use super::serve::ServeConfig;
use super::{
    AcquireRequest, Acquired, Extended, LostReason, Pool, PoolError, PoolOptions, PoolStatus,
    Released,
};
use crate::config::{ConfigError, LogFormat, parse_duration};
use crate::store::RedisTarget;

/// Exit code: bad input (a flag or id out of range, a duplicate or unknown
/// id, init of an existing pool); nothing was written.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code: acquire found nothing due within `--wait`.
pub const EXIT_NOTHING_DUE: u8 = 3;
/// Exit code: release or extend of a lease that is not ours or expired.
pub const EXIT_NOT_OWNER: u8 = 4;

/// Longest `--wait` of acquire.
const WAIT_MAX: Duration = Duration::from_secs(86_400);
/// Most reap calls one `pool reap` makes.
const REAP_ROUNDS: usize = 1000;

/// Flags of `snowlease pool`.
#[derive(Args)]
pub struct PoolArgs {
    /// The pool operation.
    #[command(subcommand)]
    pub command: PoolCommand,
}

/// The operations of `snowlease pool`.
#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool with its first ids, all due at once (refused when the pool exists).
    Init(IdsArgs),
    /// Add new ids to a pool, due at once (refused for ids already in it).
    Add(IdsArgs),
    /// Lease one due id; prints {"id","token","deadline_ms","fence"}.
    Acquire(AcquireArgs),
    /// Hand a lease back; the id is due again after the cooldown.
    Release(ReleaseArgs),
    /// Move a lease's deadline to now + ttl, capped at its first acquire + --max-lease.
    Extend(ExtendArgs),
    /// Return every expired lease to ready (what acquire and serve also do).
    Reap(ReapArgs),
    /// Count the pool's ids by state: a table, or --json. Never shows tokens.
    Status(StatusArgs),
    /// Take ids out of service until enable (a leased id stays leased until released).
    Disable(IdsArgs),
    /// Put disabled ids back into service.
    Enable(IdsArgs),
    /// Serve the HTTP API for workers, with a background reaper and metrics.
    Serve(ServeArgs),
}

/// Where Redis is, and how this process logs.
#[derive(Args)]
pub struct RedisArgs {
    /// Redis URL: redis://[user:password@]host:port[/db] or rediss:// for TLS.
    // hide_env_values: --help must not print a password from the env.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    pub redis_url: String,

    /// Timeout of one Redis call (10ms-60s).
    #[arg(long, env = "SNOWLEASE_REDIS_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub redis_timeout: Duration,

    /// Log format on stderr.
    #[arg(long, env = "SNOWLEASE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// One pool and its Redis.
#[derive(Args)]
pub struct PoolTarget {
    /// Pool name: 1-64 chars of [A-Za-z0-9_-]; its keys are {<pool>}:ready, {<pool>}:leases, ...
    #[arg(long, env = "SNOWLEASE_POOL")]
    pub pool: String,

    #[command(flatten)]
    pub redis: RedisArgs,
}

/// Ids given on the command line or in a file; exactly one of the two.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct IdSource {
    /// Ids, comma-separated; each 1-64 chars of [A-Za-z0-9_-].
    #[arg(long, value_delimiter = ',')]
    pub ids: Option<Vec<String>>,

    /// File of ids, one per line (blank lines and lines starting with # are skipped).
    #[arg(long)]
    pub ids_file: Option<PathBuf>,
}

/// Flags of `init`, `add`, `disable`, `enable`.
#[derive(Args)]
pub struct IdsArgs {
    #[command(flatten)]
    pub target: PoolTarget,

    #[command(flatten)]
    pub source: IdSource,
}

/// Flags of `acquire`.
#[derive(Args)]
pub struct AcquireArgs {
    #[command(flatten)]
    pub target: PoolTarget,

    /// Lease time: the deadline is Redis now + ttl. Whole ms, 1ms-10m, at most --max-lease.
    #[arg(long, env = "SNOWLEASE_POOL_TTL", value_parser = parse_duration)]
    pub ttl: Duration,

    /// Cooldown given to the expired leases this acquire reclaims first (0s-10m).
    #[arg(long, env = "SNOWLEASE_POOL_COOLDOWN", default_value = "0s", value_parser = parse_duration)]
    pub cooldown: Duration,

    /// Retry for this long (0s-24h), backing off by the next-due hint; then exit 3.
    #[arg(long, env = "SNOWLEASE_POOL_WAIT", default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,

    /// Idempotency key (1-64 chars of [A-Za-z0-9_-]): a retry with it answers the same lease.
    #[arg(long, env = "SNOWLEASE_POOL_REQUEST_ID")]
    pub request_id: Option<String>,

    /// Longest total lease time, extends included (1ms-24h).
    #[arg(long, env = "SNOWLEASE_POOL_MAX_LEASE", default_value = "10m", value_parser = parse_duration)]
    pub max_lease: Duration,
}

/// The lease `release` and `extend` act on.
#[derive(Args)]
pub struct LeaseRef {
    /// The leased id.
    #[arg(long, env = "SNOWLEASE_POOL_ID")]
    pub id: String,

    /// The lease's token (1-128 chars), as acquire printed it; prefer the env twin to argv.
    #[arg(long, env = "SNOWLEASE_POOL_TOKEN", hide_env_values = true)]
    pub token: String,
}

/// Flags of `release`.
#[derive(Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub target: PoolTarget,

    #[command(flatten)]
    pub lease: LeaseRef,

    /// The id is due again after this cooldown (0s-10m).
    #[arg(long, env = "SNOWLEASE_POOL_COOLDOWN", default_value = "0s", value_parser = parse_duration)]
    pub cooldown: Duration,
}

/// Flags of `extend`.
#[derive(Args)]
pub struct ExtendArgs {
    #[command(flatten)]
    pub target: PoolTarget,

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
pub struct ReapArgs {
    #[command(flatten)]
    pub target: PoolTarget,

    /// Most leases reclaimed per Redis call (1-1000).
    #[arg(long, env = "SNOWLEASE_POOL_REAP_LIMIT", default_value_t = 1000)]
    pub limit: usize,

    /// Reclaimed ids are due again after this cooldown (0s-10m).
    #[arg(long, env = "SNOWLEASE_POOL_COOLDOWN", default_value = "0s", value_parser = parse_duration)]
    pub cooldown: Duration,
}

/// Flags of `status`.
#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: PoolTarget,

    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Pools to serve (repeat the flag, or comma-separate); others answer 404.
    #[arg(
        long = "pool",
        env = "SNOWLEASE_POOL",
        value_delimiter = ',',
        required = true
    )]
    pub pools: Vec<String>,

    #[command(flatten)]
    pub redis: RedisArgs,

    /// Address of the HTTP API; keep it on loopback (tokens travel in clear).
    #[arg(long, env = "SNOWLEASE_POOL_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,

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

/// A validated `snowlease pool` command.
pub struct PoolCliConfig {
    redis: RedisTarget,
    redis_timeout: Duration,
    op: Op,
}

/// A validated operation. No `Debug`: release and extend hold a token.
enum Op {
    Init(String, Vec<String>),
    Add(String, Vec<String>),
    Disable(String, Vec<String>),
    Enable(String, Vec<String>),
    Acquire {
        pool: String,
        req: AcquireRequest,
        wait: Duration,
        max_lease: Duration,
    },
    Release {
        pool: String,
        id: String,
        token: String,
        cooldown: Duration,
    },
    Extend {
        pool: String,
        id: String,
        token: String,
        ttl: Duration,
        max_lease: Duration,
    },
    Reap {
        pool: String,
        limit: usize,
        cooldown: Duration,
    },
    Status {
        pool: String,
        json: bool,
    },
    Serve(ServeConfig),
}

/// Why a pool command ended without doing its job, for exit codes 3 and 4.
#[derive(Debug, thiserror::Error)]
pub enum PoolCliError {
    /// Acquire found no id due within `--wait`.
    #[error("nothing due in pool {pool} within --wait {wait}; {hint}")]
    NothingDue {
        /// The pool.
        pool: String,
        /// The wait, as typed.
        wait: String,
        /// When the next id is due, in words.
        hint: String,
    },
    /// Release or extend of a lease that is lost; nothing was changed.
    #[error("lease of {id} in pool {pool} is lost ({}): {}", .reason.as_str(), .reason.describe())]
    NotOwner {
        /// The pool.
        pool: String,
        /// The id.
        id: String,
        /// Why.
        reason: LostReason,
    },
}

impl PoolCliError {
    fn lost(pool: &str, id: &str, reason: LostReason) -> Self {
        Self::NotOwner {
            pool: pool.to_owned(),
            id: id.to_owned(),
            reason,
        }
    }
}

/// The exit code of a failed pool command: 2 bad input, 3 nothing due,
/// 4 not owner or expired, 1 anything else (Redis down, wrong key types).
pub fn exit_code(err: &anyhow::Error) -> u8 {
    if let Some(err) = err.downcast_ref::<PoolCliError>() {
        return match err {
            PoolCliError::NothingDue { .. } => EXIT_NOTHING_DUE,
            PoolCliError::NotOwner { .. } => EXIT_NOT_OWNER,
        };
    }
    if err.downcast_ref::<ConfigError>().is_some() {
        return EXIT_BAD_INPUT;
    }
    match err.downcast_ref::<PoolError>() {
        Some(
            PoolError::BadInput { .. }
            | PoolError::DuplicateId { .. }
            | PoolError::UnknownId { .. }
            | PoolError::AlreadyInitialized { .. },
        ) => EXIT_BAD_INPUT,
        _ => 1,
    }
}

impl PoolArgs {
    /// The log format flag of the chosen command.
    pub fn log_format(&self) -> LogFormat {
        self.redis_args().log_format
    }

    fn redis_args(&self) -> &RedisArgs {
        match &self.command {
            PoolCommand::Init(a)
            | PoolCommand::Add(a)
            | PoolCommand::Disable(a)
            | PoolCommand::Enable(a) => &a.target.redis,
            PoolCommand::Acquire(a) => &a.target.redis,
            PoolCommand::Release(a) => &a.target.redis,
            PoolCommand::Extend(a) => &a.target.redis,
            PoolCommand::Reap(a) => &a.target.redis,
            PoolCommand::Status(a) => &a.target.redis,
            PoolCommand::Serve(a) => &a.redis,
        }
    }

    /// Checks every flag (and reads `--ids-file`); the first violation
    /// names its flag. Touches no Redis key.
    pub fn validate(&self) -> Result<PoolCliConfig, ConfigError> {
        let redis_args = self.redis_args();
        let redis = RedisTarget::parse(&redis_args.redis_url)
            .map_err(|reason| ConfigError::new("--redis-url", reason))?;
        let redis_timeout = redis_args.redis_timeout;
        range(
            "--redis-timeout",
            redis_timeout,
            Duration::from_millis(10),
            Duration::from_secs(60),
        )?;
        let op = match &self.command {
            PoolCommand::Init(a) => Op::Init(pool_name(&a.target.pool)?, read_ids(&a.source)?),
            PoolCommand::Add(a) => Op::Add(pool_name(&a.target.pool)?, read_ids(&a.source)?),
            PoolCommand::Disable(a) => {
                Op::Disable(pool_name(&a.target.pool)?, read_ids(&a.source)?)
            }
            PoolCommand::Enable(a) => Op::Enable(pool_name(&a.target.pool)?, read_ids(&a.source)?),
            PoolCommand::Acquire(a) => {
                let pool = pool_name(&a.target.pool)?;
                let max_lease = whole_ms("--max-lease", a.max_lease, 1, MAX_LEASE_MAX_MS)?;
                whole_ms("--ttl", a.ttl, 1, TTL_MAX_MS)?;
                if a.ttl > max_lease {
                    return Err(ConfigError::new(
                        "--ttl",
                        format!(
                            "{} is longer than --max-lease {}",
                            human(a.ttl),
                            human(max_lease)
                        ),
                    ));
                }
                let cooldown = whole_ms("--cooldown", a.cooldown, 0, COOLDOWN_MAX_MS)?;
                range("--wait", a.wait, Duration::ZERO, WAIT_MAX)?;
                let mut req = AcquireRequest::new(a.ttl).cooldown(cooldown);
                if let Some(request_id) = &a.request_id {
                    if check::name("request_id", request_id).is_err() {
                        return Err(ConfigError::new(
                            "--request-id",
                            format!("{request_id:?} must be 1-64 chars of [A-Za-z0-9_-]"),
                        ));
                    }
                    req = req.request_id(request_id.clone());
                }
                Op::Acquire {
                    pool,
                    req,
                    wait: a.wait,
                    max_lease,
                }
            }
            PoolCommand::Release(a) => {
                let (id, token) = lease_ref(&a.lease)?;
                Op::Release {
                    pool: pool_name(&a.target.pool)?,
                    id,
                    token,
                    cooldown: whole_ms("--cooldown", a.cooldown, 0, COOLDOWN_MAX_MS)?,
                }
            }
            PoolCommand::Extend(a) => {
                let (id, token) = lease_ref(&a.lease)?;
                Op::Extend {
                    pool: pool_name(&a.target.pool)?,
                    id,
                    token,
                    ttl: whole_ms("--ttl", a.ttl, 1, TTL_MAX_MS)?,
                    max_lease: whole_ms("--max-lease", a.max_lease, 1, MAX_LEASE_MAX_MS)?,
                }
            }
            PoolCommand::Reap(a) => {
                if !(1..=BATCH_MAX).contains(&a.limit) {
                    return Err(ConfigError::new(
                        "--limit",
                        format!("{} is outside 1-{BATCH_MAX}", a.limit),
                    ));
                }
                Op::Reap {
                    pool: pool_name(&a.target.pool)?,
                    limit: a.limit,
                    cooldown: whole_ms("--cooldown", a.cooldown, 0, COOLDOWN_MAX_MS)?,
                }
            }
            PoolCommand::Status(a) => Op::Status {
                pool: pool_name(&a.target.pool)?,
                json: a.json,
            },
            PoolCommand::Serve(a) => Op::Serve(serve_config(a, &redis, redis_timeout)?),
        };
        Ok(PoolCliConfig {
            redis,
            redis_timeout,
            op,
        })
    }
}

fn serve_config(
    a: &ServeArgs,
    redis: &RedisTarget,
    redis_timeout: Duration,
) -> Result<ServeConfig, ConfigError> {
    let mut pools = Vec::with_capacity(a.pools.len());
    for pool in &a.pools {
        let pool = pool_name(pool)?;
        if pools.contains(&pool) {
            return Err(ConfigError::new("--pool", format!("{pool} is given twice")));
        }
        pools.push(pool);
    }
    range(
        "--reap-interval",
        a.reap_interval,
        Duration::from_millis(10),
        Duration::from_secs(3600),
    )?;
    Ok(ServeConfig {
        pools,
        redis: redis.clone(),
        redis_timeout,
        listen: a.listen,
        reap_interval: a.reap_interval,
        reap_cooldown: whole_ms("--reap-cooldown", a.reap_cooldown, 0, COOLDOWN_MAX_MS)?,
        max_lease: whole_ms("--max-lease", a.max_lease, 1, MAX_LEASE_MAX_MS)?,
    })
}

fn human(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

fn range(flag: &'static str, d: Duration, lo: Duration, hi: Duration) -> Result<(), ConfigError> {
    if d < lo || d > hi {
        return Err(ConfigError::new(
            flag,
            format!("{} is outside {}-{}", human(d), human(lo), human(hi)),
        ));
    }
    Ok(())
}

/// A duration the scripts take in ms: whole ms within `lo..=hi` ms.
fn whole_ms(flag: &'static str, d: Duration, lo: u64, hi: u64) -> Result<Duration, ConfigError> {
    match check::millis(flag, d, lo, hi) {
        Ok(_) => Ok(d),
        Err(_) => Err(ConfigError::new(
            flag,
            format!(
                "{} is not a whole number of milliseconds within {}-{}",
                human(d),
                human(Duration::from_millis(lo)),
                human(Duration::from_millis(hi))
            ),
        )),
    }
}

fn pool_name(pool: &str) -> Result<String, ConfigError> {
    check::name("pool", pool).map_err(|_| {
        ConfigError::new(
            "--pool",
            format!("{pool:?} must be 1-64 chars of [A-Za-z0-9_-]"),
        )
    })?;
    Ok(pool.to_owned())
}

fn lease_ref(lease: &LeaseRef) -> Result<(String, String), ConfigError> {
    if check::name("id", &lease.id).is_err() {
        return Err(ConfigError::new(
            "--id",
            format!("{:?} must be 1-64 chars of [A-Za-z0-9_-]", lease.id),
        ));
    }
    // Never echo the token: it may be a real one with a typo.
    if check::token(&lease.token).is_err() {
        return Err(ConfigError::new(
            "--token",
            format!("must be 1-128 chars (got {})", lease.token.len()),
        ));
    }
    Ok((lease.id.clone(), lease.token.clone()))
}

/// The ids of `--ids` or `--ids-file`, all checked: 1-64 chars of
/// `[A-Za-z0-9_-]`, no duplicates, at least one.
fn read_ids(source: &IdSource) -> Result<Vec<String>, ConfigError> {
    let (flag, items): (&'static str, Vec<(String, String)>) = match (&source.ids, &source.ids_file)
    {
        (Some(ids), _) => (
            "--ids",
            ids.iter()
                .enumerate()
                .map(|(i, id)| (format!("item {}", i + 1), id.clone()))
                .collect(),
        ),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::new("--ids-file", format!("cannot read {}: {e}", path.display()))
            })?;
            let items = text
                .lines()
                .enumerate()
                .map(|(n, line)| (format!("line {}", n + 1), line.trim().to_owned()))
                .filter(|(_, id)| !id.is_empty() && !id.starts_with('#'))
                .collect();
            ("--ids-file", items)
        }
        (None, None) => return Err(ConfigError::new("--ids", "give --ids or --ids-file")),
    };
    if items.is_empty() {
        return Err(ConfigError::new(flag, "no ids given"));
    }
    let mut seen = std::collections::HashMap::with_capacity(items.len());
    for (place, id) in &items {
        if check::name("id", id).is_err() {
            return Err(ConfigError::new(
                flag,
                format!("{place}: {id:?} must be 1-64 chars of [A-Za-z0-9_-]"),
            ));
        }
        if let Some(first) = seen.insert(id.as_str(), place) {
            return Err(ConfigError::new(
                flag,
                format!("{place}: {id} is given twice (first at {first})"),
            ));
        }
    }
    Ok(items.into_iter().map(|(_, id)| id).collect())
}

/// Runs one validated command: prints its result on stdout; `serve` runs
/// until SIGTERM/SIGINT.
///
/// Errors: [`PoolCliError`] (exit 3, 4), [`PoolError`] and others; see
/// [`exit_code`].
pub async fn run(config: PoolCliConfig) -> anyhow::Result<()> {
    if let Op::Serve(serve) = config.op {
        let shutdown = crate::shutdown::listen()?;
        return super::serve::run(serve, shutdown).await;
    }
    let conn = config.redis.connect(config.redis_timeout)?;
    let out = match execute(conn, config.op).await {
        Ok(out) => out,
        // Only failures of Redis itself need to say which Redis.
        Err(err) if exit_code(&err) == 1 => {
            return Err(err.context(format!("redis {}", config.redis)));
        }
        Err(err) => return Err(err),
    };
    println!("{out}");
    Ok(())
}

async fn execute(conn: ConnectionManager, op: Op) -> anyhow::Result<String> {
    let open =
        |pool: &str, max_lease: Duration| Pool::new(conn.clone(), pool, PoolOptions { max_lease });
    let default = PoolOptions::default().max_lease;
    let out = match op {
        Op::Init(pool, ids) => {
            let added = open(&pool, default)?.init(&ids).await?;
            json!({ "pool": pool, "added": added })
        }
        Op::Add(pool, ids) => {
            let added = open(&pool, default)?.add(&ids).await?;
            json!({ "pool": pool, "added": added })
        }
        Op::Disable(pool, ids) => {
            let disabled = open(&pool, default)?.disable(&ids).await?;
            json!({ "pool": pool, "disabled": disabled })
        }
        Op::Enable(pool, ids) => {
            let enabled = open(&pool, default)?.enable(&ids).await?;
            json!({ "pool": pool, "enabled": enabled })
        }
        Op::Acquire {
            pool,
            req,
            wait,
            max_lease,
        } => match open(&pool, max_lease)?.acquire_wait(&req, wait).await? {
            Acquired::Leased(lease) => return Ok(serde_json::to_string(&lease.view())?),
            Acquired::Empty { next_due_in, .. } => {
                return Err(PoolCliError::NothingDue {
                    pool,
                    wait: human(wait).to_string(),
                    hint: hint_words(next_due_in),
                }
                .into());
            }
        },
        Op::Release {
            pool,
            id,
            token,
            cooldown,
        } => match open(&pool, default)?
            .release_lease(&id, &token, cooldown)
            .await?
        {
            Released::Released { at_ms } => {
                json!({ "pool": pool, "id": id, "released_at_ms": at_ms })
            }
            Released::NotOwner { reason, .. } => {
                return Err(PoolCliError::lost(&pool, &id, reason).into());
            }
        },
        Op::Extend {
            pool,
            id,
            token,
            ttl,
            max_lease,
        } => match open(&pool, max_lease)?
            .extend_lease(&id, &token, ttl)
            .await?
        {
            Extended::Extended {
                deadline_ms,
                capped,
                ..
            } => json!({ "pool": pool, "id": id, "deadline_ms": deadline_ms, "capped": capped }),
            Extended::NotOwner { reason, .. } => {
                return Err(PoolCliError::lost(&pool, &id, reason).into());
            }
        },
        Op::Reap {
            pool,
            limit,
            cooldown,
        } => {
            let handle = open(&pool, default)?;
            let mut ids = Vec::new();
            let mut still_expired = 0;
            for _ in 0..REAP_ROUNDS {
                let reaped = handle.reap(limit, cooldown).await?;
                ids.extend(reaped.ids);
                still_expired = reaped.still_expired;
                if still_expired == 0 {
                    break;
                }
            }
            json!({ "pool": pool, "reclaimed": ids.len(), "ids": ids, "still_expired": still_expired })
        }
        Op::Status { pool, json } => {
            let status = open(&pool, default)?.status().await?;
            if !json {
                return Ok(status_table(&pool, &status));
            }
            let mut value = serde_json::to_value(status)?;
            value["pool"] = pool.into();
            value
        }
        Op::Serve(_) => unreachable!("serve is run by run()"),
    };
    Ok(out.to_string())
}

/// The next-due hint in words.
pub(crate) fn hint_words(next_due_in: Option<Duration>) -> String {
    match next_due_in {
        Some(d) => format!(
            "the next id is due in {} (sooner if a lease is released early)",
            human(Duration::from_millis(d.as_millis() as u64))
        ),
        None => "no id will become due by itself (every id disabled, or the pool empty)".into(),
    }
}

fn status_table(pool: &str, s: &PoolStatus) -> String {
    let mut out = format!("pool {pool} (Redis time {} ms)\n", s.now_ms);
    let rows = [
        ("ready, due", s.ready_due),
        ("ready, cooling down", s.ready_cooling),
        ("leased, valid", s.leases_valid),
        ("leased, expired", s.leases_expired),
        ("disabled", s.disabled),
    ];
    let _ = writeln!(out, "{:<22} {:>8}", "state", "ids");
    for (state, n) in rows {
        let _ = writeln!(out, "{state:<22} {n:>8}");
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: PoolCommand,
    }

    fn parse(argv: &[&str]) -> Result<PoolArgs, clap::Error> {
        let mut full = vec!["pool"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full).map(|cli| PoolArgs {
            command: cli.command,
        })
    }

    fn flag_of(argv: &[&str]) -> &'static str {
        match parse(argv).unwrap().validate() {
            Err(err) => err.flag,
            Ok(_) => panic!("{argv:?} validated"),
        }
    }

    #[test]
    fn acquire_flags_validate() {
        let args = parse(&["acquire", "--pool", "p", "--ttl", "30s", "--wait", "2s"]).unwrap();
        let config = args.validate().unwrap();
        match config.op {
            Op::Acquire { req, wait, .. } => {
                assert_eq!(req.ttl, Duration::from_secs(30));
                assert_eq!(wait, Duration::from_secs(2));
            }
            _ => panic!("not acquire"),
        }
    }

    #[test]
    fn out_of_range_values_name_their_flag() {
        let cases: [(&[&str], &str); 9] = [
            (&["acquire", "--pool", "p", "--ttl", "0s"], "--ttl"),
            (&["acquire", "--pool", "p", "--ttl", "11m"], "--ttl"),
            (&["acquire", "--pool", "p", "--ttl", "1500us"], "--ttl"),
            (
                &["acquire", "--pool", "p", "--ttl", "2m", "--max-lease", "1m"],
                "--ttl",
            ),
            (&["acquire", "--pool", "a:b", "--ttl", "1s"], "--pool"),
            (
                &[
                    "acquire",
                    "--pool",
                    "p",
                    "--ttl",
                    "1s",
                    "--request-id",
                    "a b",
                ],
                "--request-id",
            ),
            (
                &["release", "--pool", "p", "--id", "x", "--token", ""],
                "--token",
            ),
            (&["init", "--pool", "p", "--ids", "a,b,a"], "--ids"),
            (&["serve", "--pool", "p,p"], "--pool"),
        ];
        for (argv, flag) in cases {
            assert_eq!(flag_of(argv), flag, "{argv:?}");
        }
    }

    #[test]
    fn token_is_never_echoed() {
        let long = "s".repeat(129);
        let args = parse(&[
            "extend", "--pool", "p", "--id", "x", "--token", &long, "--ttl", "1s",
        ]);
        let err = args.unwrap().validate().err().unwrap();
        assert_eq!(err.flag, "--token");
        assert!(!err.to_string().contains("sss"), "{err}");
    }

    #[test]
    fn ids_come_from_exactly_one_source() {
        assert!(parse(&["init", "--pool", "p"]).is_err());
        assert!(parse(&["init", "--pool", "p", "--ids", "a", "--ids-file", "f"]).is_err());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ids");
        std::fs::write(&file, "# proxies\na\n\n b \nc\n").unwrap();
        let args = parse(&["add", "--pool", "p", "--ids-file", file.to_str().unwrap()]).unwrap();
        match args.validate().unwrap().op {
            Op::Add(pool, ids) => assert_eq!(
                (pool.as_str(), ids),
                ("p", vec!["a".into(), "b".into(), "c".into()])
            ),
            _ => panic!("not add"),
        }
        std::fs::write(&file, "a\nb c\n").unwrap();
        let args = parse(&["add", "--pool", "p", "--ids-file", file.to_str().unwrap()]).unwrap();
        let err = args.validate().err().unwrap();
        assert_eq!(err.flag, "--ids-file");
        assert!(err.reason.contains("line 2"), "{err}");
    }

    #[test]
    fn exit_codes() {
        let code = |e: anyhow::Error| exit_code(&e);
        assert_eq!(code(PoolError::bad("ttl", "1-2").into()), 2);
        assert_eq!(
            code(anyhow::Error::from(PoolError::DuplicateId { id: "a".into() }).context("redis x")),
            2
        );
        assert_eq!(
            code(PoolCliError::lost("p", "a", LostReason::Expired).into()),
            4
        );
        let due = PoolCliError::NothingDue {
            pool: "p".into(),
            wait: "1s".into(),
            hint: hint_words(None),
        };
        assert_eq!(code(due.into()), 3);
        assert_eq!(code(anyhow::anyhow!("redis down")), 1);
    }

    #[test]
    fn table_lists_every_state() {
        let status = PoolStatus {
            now_ms: 7,
            ready_due: 1,
            ready_cooling: 2,
            leases_valid: 3,
            leases_expired: 4,
            disabled: 5,
        };
        let table = status_table("p", &status);
        assert!(table.starts_with("pool p (Redis time 7 ms)"), "{table}");
        assert!(table.contains("leased, expired               4"), "{table}");
    }
}
