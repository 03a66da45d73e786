//! Logging that never blocks the lease: log lines go to stderr through a
//! bounded queue and a writer thread (tracing-appender, lossy). When stderr
//! is a pipe nobody drains, lines are dropped and counted instead of
//! stalling renewals, HTTP or the release at shutdown.

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Lines queued for stderr at most; beyond that new lines are dropped.
const QUEUE_LINES: usize = 1024;

static DROPPED: OnceLock<ErrorCounter> = OnceLock::new();

/// Flushes queued lines when dropped, waiting about 1 s at most (a stuck
/// stderr must not hold up the exit). Keep it until the process ends.
pub struct LogGuard(#[allow(dead_code)] WorkerGuard);

/// Installs the global subscriber: filter from `SNOWLEASE_LOG` (default
/// `info`), `format` on stderr, colours only on a terminal.
pub fn init(format: LogFormat) -> LogGuard {
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUE_LINES)
        .thread_name("log-writer")
        .finish(std::io::stderr());
    let _ = DROPPED.set(writer.error_counter());
    let filter =
        EnvFilter::try_from_env("SNOWLEASE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer)
        // A closed stderr (log pipe gone) must not turn into a panic that
        // skips the release of the lease.
        .log_internal_errors(false);
    match format {
        // Flat objects (timestamp, level, message, target and the fields
        // at the top level), as log platforms ingest them without mapping.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .init(),
        LogFormat::Text => builder.init(),
    }
    LogGuard(guard)
}

/// Log lines dropped so far because stderr did not keep up (0 before
/// [`init`]).
pub fn dropped_lines() -> u64 {
    DROPPED
        .get()
        .map_or(0, |counter| counter.dropped_lines() as u64)
}
