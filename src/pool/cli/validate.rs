//! Stage two of the pool flags: ranges, whole milliseconds, names, id
//! files and cross-field rules, checked into a [`PoolCliConfig`] before any
//! socket is bound or Redis is touched; the first violation names its flag.

use std::time::Duration;

use super::{IdSource, LeaseRef, PoolArgs, PoolCommand, ServeArgs, StrikeArgs};
use crate::cli::{ConfigError, REDIS_TIMEOUT, check_range, show_duration};
use crate::connection::RedisTarget;
use crate::pool::limits::{
    self, CLI_WAIT_MS, COOLDOWN_MS, MAX_LEASE_MS, MAX_STRIKES, QUARANTINE_MS, REAP_INTERVAL_MS,
    REAP_LIMIT, Range, STRIKE_WINDOW_MS, TTL_MS,
};
use crate::pool::serve::ServeConfig;
use crate::pool::{AcquireRequest, Quarantine, StrikePolicy};

/// A validated `snowlease pool` command.
pub struct PoolCliConfig {
    pub(super) redis: RedisTarget,
    pub(super) redis_timeout: Duration,
    /// `--allow-evicting-redis`: acquire and extend skip the eviction check.
    pub(super) allow_evicting_redis: bool,
    pub(super) op: Op,
}

/// What `pool config` does with the strike policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StrikesChange {
    /// Neither `--strikes` nor `--strikes-off`: read it.
    Read,
    /// `--strikes-off`.
    Off,
    /// `--strikes`.
    Set(StrikePolicy),
}

/// A validated operation. No `Debug`: release and extend hold a token.
pub(super) enum Op {
    Init(String, Vec<String>, Option<StrikePolicy>),
    Add(String, Vec<String>),
    Disable(String, Vec<String>),
    Enable {
        pool: String,
        ids: Vec<String>,
        force: bool,
    },
    /// `pool config`: read the strike policy, or set it, or turn strikes off.
    Config {
        pool: String,
        set: StrikesChange,
    },
    Acquire {
        pool: String,
        req: AcquireRequest,
        wait: Duration,
        max_lease: Duration,
        charge: Option<crate::budget::Charge>,
    },
    Release {
        pool: String,
        id: String,
        token: String,
        cooldown: Duration,
        quarantine: Option<Quarantine>,
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

impl PoolArgs {
    /// Checks every flag (and reads `--ids-file`); the first violation
    /// names its flag. Touches no Redis key.
    pub fn validate(&self) -> Result<PoolCliConfig, ConfigError> {
        let redis_args = self.redis_args();
        let redis = redis_args.redis.target()?;
        let redis_timeout = redis_args.redis_timeout;
        let allow_evicting_redis = redis_args.eviction.allow_evicting_redis;
        REDIS_TIMEOUT.check(redis_timeout)?;
        let op = match &self.command {
            PoolCommand::Init(a) => Op::Init(
                pool_name(&a.ids.target.pool)?,
                read_ids(&a.ids.source)?,
                strikes(&a.strikes)?,
            ),
            PoolCommand::Add(a) => Op::Add(pool_name(&a.target.pool)?, read_ids(&a.source)?),
            PoolCommand::Disable(a) => {
                Op::Disable(pool_name(&a.target.pool)?, read_ids(&a.source)?)
            }
            PoolCommand::Enable(a) => Op::Enable {
                pool: pool_name(&a.ids.target.pool)?,
                ids: read_ids(&a.ids.source)?,
                force: a.force,
            },
            PoolCommand::Config(a) => {
                let set = match (a.strikes_off, strikes(&a.strikes)?) {
                    (true, _) => StrikesChange::Off,
                    (false, Some(policy)) => StrikesChange::Set(policy),
                    (false, None) => StrikesChange::Read,
                };
                Op::Config {
                    pool: pool_name(&a.target.pool)?,
                    set,
                }
            }
            PoolCommand::Acquire(a) => {
                let pool = pool_name(&a.target.pool)?;
                let max_lease = whole_ms("--max-lease", a.max_lease, MAX_LEASE_MS)?;
                whole_ms("--ttl", a.ttl, TTL_MS)?;
                if a.ttl > max_lease {
                    return Err(ConfigError::new(
                        "--ttl",
                        format!(
                            "{} is longer than --max-lease {}",
                            show_duration(a.ttl),
                            show_duration(max_lease)
                        ),
                    ));
                }
                let cooldown = whole_ms("--reclaim-cooldown", a.reclaim_cooldown, COOLDOWN_MS)?;
                range("--wait", a.wait, CLI_WAIT_MS)?;
                let mut req = AcquireRequest::new(a.ttl).cooldown(cooldown);
                if let Some(request_id) = &a.request_id {
                    req = req.request_id(name("--request-id", request_id)?);
                }
                Op::Acquire {
                    charge: a.budget.charge(&pool)?,
                    pool,
                    req,
                    wait: a.wait,
                    max_lease,
                }
            }
            PoolCommand::Release(a) => {
                let (id, token) = lease_ref(&a.lease)?;
                let quarantine = match a.quarantine {
                    Some(d) => Some(Quarantine {
                        duration: whole_ms("--quarantine", d, QUARANTINE_MS)?,
                        reason: reason(a.reason.as_deref().unwrap_or_default())?,
                    }),
                    None => None,
                };
                Op::Release {
                    pool: pool_name(&a.target.pool)?,
                    id,
                    token,
                    cooldown: whole_ms("--cooldown", a.cooldown, COOLDOWN_MS)?,
                    quarantine,
                }
            }
            PoolCommand::Extend(a) => {
                let (id, token) = lease_ref(&a.lease)?;
                Op::Extend {
                    pool: pool_name(&a.target.pool)?,
                    id,
                    token,
                    ttl: whole_ms("--ttl", a.ttl, TTL_MS)?,
                    max_lease: whole_ms("--max-lease", a.max_lease, MAX_LEASE_MS)?,
                }
            }
            PoolCommand::Reap(a) => {
                if limits::count("limit", a.limit, REAP_LIMIT).is_err() {
                    return Err(ConfigError::new(
                        "--limit",
                        format!(
                            "{} is outside {}-{}",
                            a.limit, REAP_LIMIT.min, REAP_LIMIT.max
                        ),
                    ));
                }
                Op::Reap {
                    pool: pool_name(&a.target.pool)?,
                    limit: a.limit,
                    cooldown: whole_ms("--cooldown", a.cooldown, COOLDOWN_MS)?,
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
            allow_evicting_redis,
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
    range("--reap-interval", a.reap_interval, REAP_INTERVAL_MS)?;
    Ok(ServeConfig {
        pools,
        redis: redis.clone(),
        redis_timeout,
        allow_evicting_redis: a.redis.eviction.allow_evicting_redis,
        listen: a.listen,
        http: a.http.validate()?,
        reap_interval: a.reap_interval,
        reap_cooldown: whole_ms("--reap-cooldown", a.reap_cooldown, COOLDOWN_MS)?,
        max_lease: whole_ms("--max-lease", a.max_lease, MAX_LEASE_MS)?,
    })
}

pub(super) fn human(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

/// A duration within `range` (ms), not necessarily whole ms.
fn range(flag: &'static str, d: Duration, range: Range) -> Result<(), ConfigError> {
    let (lo, hi) = (
        Duration::from_millis(range.min),
        Duration::from_millis(range.max),
    );
    check_range(flag, d, lo, hi)
}

/// A duration the scripts take in ms: whole ms within `range` (the rule is
/// [`limits::millis`]). The error says which of the two it is not.
fn whole_ms(flag: &'static str, d: Duration, range: Range) -> Result<Duration, ConfigError> {
    if limits::millis(flag, d, range).is_ok() {
        return Ok(d);
    }
    self::range(flag, d, range)?;
    Err(ConfigError::new(
        flag,
        format!(
            "{} is not a whole number of milliseconds (Redis counts in ms)",
            show_duration(d)
        ),
    ))
}

/// The strike setting of `--max-strikes` and `--strike-window` (clap makes
/// them come together); `None` when neither is given.
fn strikes(a: &StrikeArgs) -> Result<Option<StrikePolicy>, ConfigError> {
    let (Some(max), Some(window)) = (a.max_strikes, a.strike_window) else {
        return Ok(None);
    };
    let max_strikes = u32::try_from(max)
        .ok()
        .filter(|m| MAX_STRIKES.allows(u64::from(*m)))
        .ok_or_else(|| {
            ConfigError::new(
                "--max-strikes",
                format!("{max} is outside {}-{}", MAX_STRIKES.min, MAX_STRIKES.max),
            )
        })?;
    let window = whole_ms("--strike-window", window, STRIKE_WINDOW_MS)?;
    Ok(Some(StrikePolicy {
        max_strikes,
        window,
    }))
}

/// A quarantine reason (`--reason`), checked, echoed in the error only by
/// its length.
fn reason(text: &str) -> Result<String, ConfigError> {
    if !limits::is_reason(text) {
        return Err(ConfigError::new(
            "--reason",
            format!(
                "must be {} (got {} bytes)",
                limits::reason_rule(),
                text.len()
            ),
        ));
    }
    Ok(text.to_owned())
}

/// A pool name, id or request id given with `flag`.
fn name(flag: &'static str, value: &str) -> Result<String, ConfigError> {
    if !limits::is_name(value) {
        return Err(ConfigError::new(
            flag,
            format!("{value:?} must be {}", limits::name_rule()),
        ));
    }
    Ok(value.to_owned())
}

fn pool_name(pool: &str) -> Result<String, ConfigError> {
    name("--pool", pool)
}

fn lease_ref(lease: &LeaseRef) -> Result<(String, String), ConfigError> {
    let id = name("--id", &lease.id)?;
    // Never echo the token: it may be a real one with a typo.
    if !limits::is_token(&lease.token) {
        return Err(ConfigError::new(
            "--token",
            format!(
                "must be {} (got {})",
                limits::token_rule(),
                lease.token.len()
            ),
        ));
    }
    Ok((id, lease.token.clone()))
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
        if !limits::is_name(id) {
            return Err(ConfigError::new(
                flag,
                format!("{place}: {id:?} must be {}", limits::name_rule()),
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

    /// `--ttl 11m` is whole ms but too long; `--ttl 1500us` is in range but
    /// not whole ms: each message says which (both said "not a whole number
    /// of milliseconds within 1ms-10m").
    #[test]
    fn whole_ms_and_range_are_told_apart() {
        let reason = |ttl: &str| match parse(&["acquire", "--pool", "p", "--ttl", ttl])
            .unwrap()
            .validate()
        {
            Err(err) => err.reason,
            Ok(_) => panic!("--ttl {ttl} validated"),
        };
        assert_eq!(reason("11m"), "11m is outside 1ms-10m");
        assert_eq!(reason("0s"), "0s is outside 1ms-10m");
        let err = reason("1500us");
        assert!(
            err.starts_with("1500us is not a whole number of milliseconds"),
            "{err}"
        );
        assert!(!err.contains("outside"), "{err}");
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
}
