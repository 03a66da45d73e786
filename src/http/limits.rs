//! `--max-connections` and `--http-header-timeout`: the flags, their
//! ranges and defaults, and the validated limits `serve` enforces.

use std::time::Duration;

use clap::Args;

use crate::cli::{ConfigError, check_range, parse_duration, whole};

/// `--max-connections` and `--http-header-timeout`, shared by every HTTP
/// listener (the worker sidecar, `pool serve`).
#[derive(Debug, Clone, Copy, Args)]
pub struct HttpArgs {
    /// Most HTTP connections open at once (1-65536), also kept 128 below the open-file limit; at the cap a new connection closes the oldest idle one.
    #[arg(long, env = "SNOWLEASE_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS,
        value_parser = whole::<u32>(1, MAX_CONNECTIONS_LIMIT.into()), allow_negative_numbers = true)]
    pub max_connections: u32,

    /// Longest a connection may go without a complete request header (100ms-10m): from connect, and between keep-alive requests.
    #[arg(long, env = "SNOWLEASE_HTTP_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub http_header_timeout: Duration,
}

/// `--max-connections` by default: far more than a pod's app, kubelet and
/// Prometheus open (a handful), and about 3 MB of idle connections.
pub(crate) const DEFAULT_MAX_CONNECTIONS: u32 = 512;

/// Largest request body (bytes): the JSON bodies of `pool serve` are well
/// under 1 KiB (ids and tokens of at most 128 characters, a reason of at
/// most 200 bytes), and the worker's routes take none. At the cap of 512
/// connections, bodies in flight hold 8 MiB at most.
pub(crate) const BODY_LIMIT: usize = 16 * 1024;

/// Largest `--max-connections`.
pub(crate) const MAX_CONNECTIONS_LIMIT: u32 = 65_536;

/// The validated [`HttpArgs`]: what [`serve`] enforces on each connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most connections served at once, 1-65536 (lowered at serve time to
    /// fit the open-file limit, [`open_files::connection_bound`]).
    pub max_connections: usize,
    /// Longest wait for a complete request header, counted from connect
    /// and from the end of the previous response (the keep-alive idle
    /// timeout), 100 ms-10 min.
    pub header_timeout: Duration,
}

impl Default for ConnectionLimits {
    /// The flags' defaults: 512 connections, 5 s.
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
            header_timeout: Duration::from_secs(5),
        }
    }
}

impl HttpArgs {
    /// Checks both ranges; the first violation names its flag.
    pub fn validate(&self) -> Result<ConnectionLimits, ConfigError> {
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.max_connections) {
            return Err(ConfigError::new(
                "--max-connections",
                format!(
                    "{} is outside 1-{MAX_CONNECTIONS_LIMIT}",
                    self.max_connections
                ),
            ));
        }
        check_range(
            "--http-header-timeout",
            self.http_header_timeout,
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        Ok(ConnectionLimits {
            max_connections: self.max_connections as usize,
            header_timeout: self.http_header_timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_out_of_range_name_their_flag() {
        let args = |max_connections, http_header_timeout| HttpArgs {
            max_connections,
            http_header_timeout,
        };
        let cases = [
            (args(0, Duration::from_secs(5)), "--max-connections"),
            (args(65_537, Duration::from_secs(5)), "--max-connections"),
            (
                args(512, Duration::from_millis(99)),
                "--http-header-timeout",
            ),
            (args(512, Duration::from_secs(601)), "--http-header-timeout"),
        ];
        for (args, flag) in cases {
            assert_eq!(args.validate().unwrap_err().flag, flag, "{args:?}");
        }
        let limits = args(65_536, Duration::from_secs(600)).validate().unwrap();
        assert_eq!(limits.max_connections, 65_536);
    }
}
