//! Flags of `exec`, `id` and `install`, validated into typed settings
//! before anything starts.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use super::Source;
use super::limits::{GRACE, ID_WAIT, POLL, WAIT};
use crate::cli::{ConfigError, LogArgs, parse_duration};
use crate::published::DEFAULT_OUTPUT_FILE;

/// Where the published ID is read: `--file` or `--url`, shared by `exec`
/// and `id` (one env name per concept).
#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// ID file written by the sidecar [default: /var/run/snowlease/worker-id].
    #[arg(long, env = "SNOWLEASE_ID_FILE", conflicts_with = "url")]
    pub file: Option<PathBuf>,

    /// Sidecar URL instead of the file: the base (http://127.0.0.1:7391) or the full /id URL.
    #[arg(long, env = "SNOWLEASE_ID_URL")]
    pub url: Option<String>,
}

/// Flags of `snowlease exec`.
#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// Where the published ID is read.
    #[command(flatten)]
    pub source: SourceArgs,

    /// Environment variable that carries the worker ID to the command.
    #[arg(long, env = "SNOWLEASE_EXEC_ENV", default_value = "WORKER_ID")]
    pub env: String,

    /// How long to wait for a published ID before giving up (exit 3); 0s-24h.
    #[arg(long, env = "SNOWLEASE_EXEC_WAIT", default_value = WAIT.default, value_parser = parse_duration)]
    pub wait: Duration,

    /// How often to re-read the published ID while waiting and while the command runs; 10ms-1m.
    #[arg(long, env = "SNOWLEASE_EXEC_POLL", default_value = POLL.default, value_parser = parse_duration)]
    pub poll: Duration,

    /// SIGTERM this long before the lease's deadline (SIGKILL at it), or before SIGKILL after a loss; keep well below TTL - renew interval; 0s-10m.
    #[arg(long, env = "SNOWLEASE_EXEC_GRACE", default_value = GRACE.default, value_parser = parse_duration)]
    pub grace: Duration,

    /// Log format.
    #[command(flatten)]
    pub log: LogArgs,

    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Validated settings of `exec`.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// Where the ID is published.
    pub source: Source,
    /// Name of the environment variable for the ID.
    pub env: String,
    /// Longest wait for a first ID.
    pub wait: Duration,
    /// Re-read interval.
    pub poll: Duration,
    /// SIGTERM-to-SIGKILL time (see `deadline`).
    pub grace: Duration,
    /// Program and arguments.
    pub command: Vec<OsString>,
}

impl ExecArgs {
    /// Checks every flag; the first violation names its flag.
    pub fn validate(&self) -> Result<ExecConfig, ConfigError> {
        let source = source(self.source.file.as_deref(), self.source.url.as_deref())?;
        let env_ok = self.env.chars().next().is_some_and(|c| !c.is_ascii_digit())
            && self
                .env
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !env_ok {
            return Err(ConfigError::new(
                "--env",
                format!(
                    "{:?} must be a variable name: [A-Za-z_][A-Za-z0-9_]*",
                    self.env
                ),
            ));
        }
        WAIT.check(self.wait)?;
        POLL.check(self.poll)?;
        GRACE.check(self.grace)?;
        if self.command.first().is_none_or(|c| c.is_empty()) {
            return Err(ConfigError::new("CMD", "give the command after --"));
        }
        Ok(ExecConfig {
            source,
            env: self.env.clone(),
            wait: self.wait,
            poll: self.poll,
            grace: self.grace,
            command: self.command.clone(),
        })
    }
}

/// Flags of `snowlease id`.
#[derive(Debug, Clone, Args)]
pub struct IdArgs {
    /// Where the published ID is read.
    #[command(flatten)]
    pub source: SourceArgs,

    /// How long to wait for a published ID (exit 3 when none); 0s-24h, 0s checks once.
    #[arg(long, env = "SNOWLEASE_ID_WAIT", default_value = ID_WAIT.default, value_parser = parse_duration)]
    pub wait: Duration,
}

impl IdArgs {
    /// The source and the wait, validated.
    pub fn validate(&self) -> Result<(Source, Duration), ConfigError> {
        let source = source(self.source.file.as_deref(), self.source.url.as_deref())?;
        ID_WAIT.check(self.wait)?;
        Ok((source, self.wait))
    }
}

fn source(file: Option<&Path>, url: Option<&str>) -> Result<Source, ConfigError> {
    match (file, url) {
        (_, Some(url)) => Source::parse_url(url)
            .map(Source::Url)
            .map_err(|reason| ConfigError::new("--url", reason)),
        (Some(file), None) if file.file_name().is_none() => {
            Err(ConfigError::new("--file", "must name a file"))
        }
        (Some(file), None) => Ok(Source::File(file.to_owned())),
        (None, None) => Ok(Source::File(PathBuf::from(DEFAULT_OUTPUT_FILE))),
    }
}

/// Flags of `snowlease install`.
#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// Folder to copy this binary into (as `<DIR>/snowlease`, mode 0755).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        exec: ExecArgs,
    }

    fn args(argv: &[&str]) -> Result<ExecArgs, clap::Error> {
        Cli::try_parse_from([&["exec"], argv].concat()).map(|c| c.exec)
    }

    #[test]
    fn defaults_read_the_sidecars_default_file() {
        let config = args(&["--", "app", "-x"]).unwrap().validate().unwrap();
        assert_eq!(
            config.source,
            Source::File(PathBuf::from(DEFAULT_OUTPUT_FILE))
        );
        assert_eq!(config.env, "WORKER_ID");
        assert_eq!(
            (config.wait, config.poll, config.grace),
            (
                Duration::from_secs(60),
                Duration::from_secs(1),
                Duration::from_secs(10)
            )
        );
        assert_eq!(config.command, ["app", "-x"]);
    }

    #[test]
    fn command_needs_the_double_dash_and_file_conflicts_with_url() {
        assert!(args(&["app"]).is_err());
        assert!(args(&["--file", "/f", "--url", "http://h:1", "--", "app"]).is_err());
    }

    #[test]
    fn bad_values_name_their_flag() {
        let cases: [(&[&str], &str); 5] = [
            (&["--env", "1X"], "--env"),
            (&["--env", "A-B"], "--env"),
            (&["--poll", "1ms"], "--poll"),
            (&["--grace", "1h"], "--grace"),
            (&["--url", "https://h:1"], "--url"),
        ];
        for (extra, flag) in cases {
            let argv = [extra, &["--", "app"]].concat();
            let err = args(&argv).unwrap().validate().unwrap_err();
            assert_eq!(err.flag, flag, "{extra:?}");
        }
    }
}
