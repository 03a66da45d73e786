//! Logging that never blocks the lease: log lines go to stderr through a
//! bounded queue and a writer thread (tracing-appender, lossy). When stderr
//! is a pipe nobody drains, lines are dropped and counted instead of
//! stalling renewals, HTTP or the release at shutdown.

use std::io::IsTerminal;

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config_error::ConfigError;

/// Log line format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for log shippers).
    Json,
}

/// Lines queued for stderr at most; beyond that new lines are dropped.
const QUEUE_LINES: usize = 1024;

/// Flushes queued lines when dropped, waiting about 1 s at most (a stuck
/// stderr must not hold up the exit). Keep it until the process ends.
pub struct LogGuard {
    _flush: WorkerGuard,
    format: LogFormat,
}

impl LogGuard {
    /// The format the subscriber writes.
    pub fn format(&self) -> LogFormat {
        self.format
    }
}

/// How long a command runs, which sets its default log filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// A sidecar or server: logs its start-up facts.
    UntilStopped,
    /// One action, then exit: start-up facts left out unless asked for.
    Once,
    /// One action asked to be quiet (`lock --quiet`): errors only unless
    /// `SNOWLEASE_LOG` asks for more.
    Quiet,
}

/// Environment variable of the log filter.
const FILTER_ENV: &str = "SNOWLEASE_LOG";

/// The log filter in `SNOWLEASE_LOG`: a default level and/or
/// `target=level` pairs, comma-separated (`info`, `snowlease=debug,warn`;
/// levels `trace`, `debug`, `info`, `warn`, `error`, `off`). Unset or
/// empty: `default` (see [`init`]). tracing-subscriber's `Targets` reads it (no regex engine
/// in the binary, unlike `EnvFilter`).
///
/// Errors: a value `Targets` cannot read, naming the variable.
fn filter_from_env(default: &str) -> Result<Targets, ConfigError> {
    parse_filter(&std::env::var(FILTER_ENV).unwrap_or_default(), default)
}

/// Target of start-up facts a long-running command logs (e.g. the Redis
/// topology it detected) and a one-shot command keeps to itself unless
/// `SNOWLEASE_LOG` asks.
pub(crate) const START_TARGET: &str = "snowlease::start";

/// Reads a `SNOWLEASE_LOG` value (see [`filter_from_env`]); `default`
/// when it is empty.
fn parse_filter(value: &str, default: &str) -> Result<Targets, ConfigError> {
    let value = if value.trim().is_empty() {
        default
    } else {
        value.trim()
    };
    // `Targets` reads a bare word as a target at every level, so a typo
    // such as `degub` would turn on trace logs of a target that does not
    // exist: a bare word must be a level.
    let bare_non_level = value
        .split(',')
        .any(|d| !d.contains('=') && d.trim().parse::<LevelFilter>().is_err());
    let parsed = if bare_non_level {
        Err(())
    } else {
        value.parse::<Targets>().map_err(drop)
    };
    parsed.map_err(|()| {
        ConfigError::new(
            FILTER_ENV,
            format!(
                "{value:?} is not a log filter: a level (trace, debug, info, warn, error, off) \
                 and/or target=level pairs separated by commas, e.g. snowlease=debug,warn"
            ),
        )
    })
}

/// Installs the global subscriber: filter from `SNOWLEASE_LOG` (a level
/// and/or `target=level` pairs, comma-separated; default `info`; see
/// docs/flags.md), `format` on stderr, colours only on a terminal. Errors: an unreadable `SNOWLEASE_LOG` (nothing is installed).
///
/// `Run::Once` (a command that does one thing and exits: pool commands
/// but `serve`, `lock`) leaves out the `START_TARGET` events by default.
pub fn init(format: LogFormat, run: Run) -> Result<LogGuard, ConfigError> {
    let default = match run {
        Run::UntilStopped => "info".to_owned(),
        Run::Once => format!("info,{START_TARGET}=warn"),
        Run::Quiet => "error".to_owned(),
    };
    let filter = filter_from_env(&default)?;
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUE_LINES)
        .thread_name("log-writer")
        .finish(std::io::stderr());
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer)
        // A closed stderr (log pipe gone) must not turn into a panic that
        // skips the release of the lease.
        .log_internal_errors(false);
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        // Flat objects (timestamp, level, message, target and the fields
        // at the top level), as log platforms ingest them without mapping.
        LogFormat::Json => registry
            .with(
                layer
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false),
            )
            .init(),
        LogFormat::Text => registry.with(layer).init(),
    }
    Ok(LogGuard {
        _flush: guard,
        format,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn filter_reads_levels_and_targets() {
        let empty = parse_filter("", "info").unwrap();
        assert!(empty.would_enable("snowlease", &Level::INFO));
        assert!(!empty.would_enable("snowlease", &Level::DEBUG));
        let pairs = parse_filter("snowlease=debug,warn", "info").unwrap();
        assert!(pairs.would_enable("snowlease::worker_id", &Level::DEBUG));
        assert!(!pairs.would_enable("redis", &Level::INFO));
        assert!(pairs.would_enable("redis", &Level::WARN));
    }

    #[test]
    fn unreadable_filter_names_the_variable() {
        for bad in ["loud", "snowlease=loud", "snowlease=debug,,=x"] {
            let err = parse_filter(bad, "info").map(drop).unwrap_err().to_string();
            assert!(err.contains("SNOWLEASE_LOG"), "{bad}: {err}");
        }
    }
}
