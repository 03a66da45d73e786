//! Flags of `snowlease lock`, validated into [`LockConfig`] before Redis is
//! touched, and the names of a lock's keys.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;

use crate::cli::{ConfigError, LogArgs, RedisUrlArg, parse_duration, validate_key_prefix};
use crate::connection::RedisTarget;

use super::limits::{DEFAULT_KEY_PREFIX, GRACE, MAX_NAME_LEN, TTL, WAIT};

/// Flags of `snowlease lock`; docs/lock.md.
#[derive(Debug, Clone, Args)]
pub struct LockArgs {
    /// Lock name: 1-128 characters of [A-Za-z0-9_.:-]; the key is <prefix>{<name>}.
    #[arg(long, env = "SNOWLEASE_LOCK_NAME")]
    pub name: String,

    /// Where Redis is.
    #[command(flatten)]
    pub redis: RedisUrlArg,

    /// Prefix of the lock's keys: <prefix>{<name>} and <prefix>{<name>}:fence.
    #[arg(long, env = "SNOWLEASE_LOCK_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,

    /// Lease TTL in Redis (PX), renewed every ttl/3: 1s-1h.
    #[arg(long, env = "SNOWLEASE_LOCK_TTL", default_value = TTL.default, value_parser = parse_duration)]
    pub ttl: Duration,

    /// How long to wait for the lock (exit 69 when not acquired); 0s tries once; 0s-24h.
    #[arg(long, env = "SNOWLEASE_LOCK_WAIT", default_value = WAIT.default, value_parser = parse_duration)]
    pub wait: Duration,

    /// SIGTERM this long before the lease's deadline (SIGKILL at it), or before SIGKILL after a loss; at most a quarter of TTL - margin is used; 0s-10m.
    #[arg(long, env = "SNOWLEASE_LOCK_GRACE", default_value = GRACE.default, value_parser = parse_duration)]
    pub grace: Duration,

    /// Log format.
    #[command(flatten)]
    pub log: LogArgs,

    /// Nothing on stderr unless lock fails: no info or warning lines, and no line when another
    /// owner held the lock for all of --wait (exit 69 stays); errors (Redis unavailable, exit 1,
    /// 2, 75, 126, 127) are still said. For cron, which mails any output. SNOWLEASE_LOG, when
    /// set, still sets the log filter.
    #[arg(long, short, env = "SNOWLEASE_LOCK_QUIET")]
    pub quiet: bool,

    /// Whether a Redis that may evict keys is accepted.
    #[command(flatten)]
    pub eviction: crate::eviction::EvictionArgs,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Validated settings of `lock`.
#[derive(Debug, Clone)]
pub struct LockConfig {
    /// The lock's keys.
    pub keys: LockKeys,
    /// Where Redis is, with the URL kept out of logs.
    pub redis: RedisTarget,
    /// PX of the lock key; renewed every `ttl / 3`.
    pub ttl: Duration,
    /// Longest wait for the lock; zero tries once.
    pub wait: Duration,
    /// SIGTERM-to-SIGKILL time (capped as in `exec`, see `supervise/deadline.rs`).
    pub grace: Duration,
    /// Program and arguments.
    pub command: Vec<OsString>,
    /// `--allow-evicting-redis`: hold the lock even where Redis may evict it.
    pub allow_evicting_redis: bool,
}

impl LockConfig {
    /// Time between renewals: a third of the TTL, so two renewals can fail
    /// before the validity deadline.
    pub(crate) fn renew_interval(&self) -> Duration {
        self.ttl / 3
    }

    /// Timeout of one renew call: a quarter of the renew interval, within
    /// 100 ms-5 s (the worker's rule), so retries fit before the deadline.
    pub(crate) fn call_timeout(&self) -> Duration {
        (self.renew_interval() / 4).clamp(Duration::from_millis(100), Duration::from_secs(5))
    }

    /// Timeout of the calls outside the hold loop (connecting, the start-up
    /// probe, an acquire attempt, the release): half the validity (TTL -
    /// margin), within 100 ms-5 s. Nothing runs under the lock yet, so only
    /// the acquire is bound by the lease at all: a reply later than the
    /// validity would leave no time to run the command.
    pub(crate) fn setup_timeout(&self) -> Duration {
        (crate::lease::validity(self.ttl) / 2)
            .clamp(Duration::from_millis(100), Duration::from_secs(5))
    }
}

impl LockArgs {
    /// Checks every flag; the first violation names its flag.
    pub fn validate(&self) -> Result<LockConfig, ConfigError> {
        validate_name(&self.name)?;
        let redis = self.redis.target()?;
        validate_key_prefix(&self.key_prefix)?;
        TTL.check(self.ttl)?;
        WAIT.check(self.wait)?;
        GRACE.check(self.grace)?;
        if self.command.first().is_none_or(|c| c.is_empty()) {
            return Err(ConfigError::new("CMD", "give the command after --"));
        }
        Ok(LockConfig {
            keys: LockKeys::new(&self.key_prefix, &self.name),
            redis,
            ttl: self.ttl,
            wait: self.wait,
            grace: self.grace,
            command: self.command.clone(),
            allow_evicting_redis: self.eviction.allow_evicting_redis,
        })
    }
}

/// Lock names: 1-128 characters of `[A-Za-z0-9_.:-]`: no spaces, and no
/// braces, which would break the `{<name>}` hash tag.
fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok = (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            "--name",
            format!("{name:?} must be 1-{MAX_NAME_LEN} characters of [A-Za-z0-9_.:-]"),
        ))
    }
}

/// The keys of one lock. Both carry the hash tag `{<name>}`, so they share
/// a Redis Cluster slot and one script may touch both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    lock: String,
    name: String,
}

impl LockKeys {
    /// Keys of lock `name` under `prefix` (both validated by the caller).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        Self {
            lock: format!("{prefix}{{{name}}}"),
            name: name.to_owned(),
        }
    }

    /// The lock name, for logs.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The lease key: holds the owner string while the lock is held.
    pub(crate) fn lock(&self) -> &str {
        &self.lock
    }

    /// The fence counter: counted up by every acquire, never expires.
    pub(crate) fn fence(&self) -> String {
        format!("{}:fence", self.lock)
    }

    /// The node record: which Redis node (and life) last saw the lock, the
    /// largest TTL seen (ms), and when acquires open after a rollback
    /// (`acquire.lua`).
    pub(crate) fn node(&self) -> String {
        format!("{}:node", self.lock)
    }

    /// The start-up probe key of one process (see `lease::probe`).
    pub(crate) fn probe(&self, nonce: &str) -> String {
        format!("{}:probe:{nonce}", self.lock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lock: LockArgs,
    }

    fn args(argv: &[&str]) -> Result<LockArgs, clap::Error> {
        Cli::try_parse_from([&["lock"], argv].concat()).map(|c| c.lock)
    }

    #[test]
    fn defaults_and_key_layout() {
        let config = args(&["--name", "nightly-report", "--", "./report.sh"])
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(config.keys.lock(), "snowlease:lock:{nightly-report}");
        assert_eq!(config.keys.fence(), "snowlease:lock:{nightly-report}:fence");
        assert_eq!(
            (config.ttl, config.wait, config.grace),
            (
                Duration::from_secs(30),
                Duration::ZERO,
                Duration::from_secs(5)
            )
        );
        assert_eq!(config.renew_interval(), Duration::from_secs(10));
        assert_eq!(config.call_timeout(), Duration::from_millis(2500));
        assert_eq!(config.setup_timeout(), Duration::from_secs(5));
        assert_eq!(config.command, ["./report.sh"]);
    }

    #[test]
    fn command_needs_the_double_dash() {
        assert!(args(&["--name", "a", "./report.sh"]).is_err());
        assert!(args(&["--name", "a"]).is_err());
    }

    #[test]
    fn bad_values_name_their_flag() {
        let long = "n".repeat(MAX_NAME_LEN + 1);
        let cases: [(&[&str], &str); 9] = [
            (&["--name", ""], "--name"),
            (&["--name", "a b"], "--name"),
            (&["--name", "a{b}"], "--name"),
            (&["--name", &long], "--name"),
            (&["--ttl", "0s"], "--ttl"),
            (&["--ttl", "2h"], "--ttl"),
            (&["--wait", "25h"], "--wait"),
            (&["--key-prefix", "a{"], "--key-prefix"),
            (&["--redis-url", "http://h:1"], "--redis-url"),
        ];
        for (extra, flag) in cases {
            let name: &[&str] = if extra[0] == "--name" {
                &[]
            } else {
                &["--name", "ok"]
            };
            let argv = [name, extra, &["--", "cmd"]].concat();
            let err = args(&argv).unwrap().validate().unwrap_err();
            assert_eq!(err.flag, flag, "{extra:?}");
        }
        let max = "n".repeat(MAX_NAME_LEN);
        assert!(validate_name(&max).is_ok() && validate_name("a.b:c_d-1").is_ok());
    }
}
