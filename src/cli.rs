//! Flag pieces shared by every command: the Redis URL and log format flag
//! groups, the duration and range parsers, and [`ConfigError`], the one
//! error type of stage-two validation (exit 2, see [`crate::exit`]).
//!
//! Stage one is clap: syntax, env twins, defaults. Stage two is each
//! command's `validate()`: ranges and cross-field rules, checked before any
//! socket is bound or Redis is touched, so bad input exits 2 with nothing
//! half-written.

use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::connection::RedisTarget;

/// A configuration value outside its allowed range; names the flag.
#[derive(Debug, thiserror::Error)]
#[error("invalid value for {flag}: {reason}")]
pub struct ConfigError {
    /// The flag, as typed on the command line (e.g. `--ttl`).
    pub flag: &'static str,
    /// What is wrong and which values are allowed.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(flag: &'static str, reason: impl Into<String>) -> Self {
        Self {
            flag,
            reason: reason.into(),
        }
    }
}

/// Parses `500ms`, `2s`, `1m`, `1h` (humantime syntax) into a [`Duration`].
///
/// Errors: a message with examples when `text` is not a duration.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (examples: 500ms, 2s, 1m)"))
}

/// Checks `min <= value <= max`; the error names `flag` and the range.
pub fn check_range(
    flag: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::new(
            flag,
            format!(
                "{} is outside {}-{}",
                humantime::format_duration(value),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(())
}

/// Log line format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log shippers).
    Json,
}

/// `--log-format`, shared by every long-running command.
#[derive(Debug, Clone, Copy, Args)]
pub struct LogArgs {
    /// Log format on stderr (the filter comes from SNOWLEASE_LOG, default `info`).
    #[arg(long, env = "SNOWLEASE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `--redis-url`, shared by every command that talks to Redis.
#[derive(Debug, Clone, Args)]
pub struct RedisUrlArg {
    /// Redis URL: `redis://[user:password@]host:port[/db]`, or `rediss://` for TLS.
    // hide_env_values: --help must not print a password from the env.
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
}

impl RedisUrlArg {
    /// Parses the URL; the error names `--redis-url` and hides the password.
    pub fn target(&self) -> Result<RedisTarget, ConfigError> {
        RedisTarget::parse(&self.redis_url)
            .map_err(|reason| ConfigError::new("--redis-url", reason))
    }
}

/// Writes `text` and a newline to stdout. A closed stdout (`cmd | true`) is
/// an error (exit 1), never a panic as `println!` would make it.
///
/// Errors: the write error, named as stdout's.
pub fn stdout_line(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|err| anyhow::anyhow!("cannot write the result to stdout: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_accept_ms_s_m() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn ranges_name_the_flag_and_both_bounds() {
        let err = check_range(
            "--ttl",
            Duration::ZERO,
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
        .unwrap_err();
        assert_eq!(err.flag, "--ttl");
        assert!(err.reason.contains("1s-1m"), "{}", err.reason);
        check_range(
            "--ttl",
            Duration::from_secs(60),
            Duration::from_secs(1),
            Duration::from_secs(60),
        )
        .expect("bounds are inclusive");
    }
}
