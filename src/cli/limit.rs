//! One definition per flag limit: its name, default and range. The mode's
//! `limits.rs` tables hold them; clap takes the default from there, the
//! validation the range, and a unit test of each table checks that the
//! flag's `--help` text names the same range.

use std::time::Duration;

use super::{ConfigError, check_range, parse_duration};

/// A duration flag: default as typed in the docs, range inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurationLimit {
    /// The flag as typed, e.g. `--ttl`.
    pub flag: &'static str,
    /// The default as clap shows it, e.g. `120s`.
    pub default: &'static str,
    /// The smallest value allowed.
    pub min: Duration,
    /// The largest value allowed.
    pub max: Duration,
}

impl DurationLimit {
    /// The default as a `Duration`.
    ///
    /// Panics when `default` does not parse (each table's test proves it does).
    pub(crate) fn default_value(&self) -> Duration {
        parse_duration(self.default).expect("the table's defaults parse")
    }

    /// `value` within the range; the error names the flag and the range.
    ///
    /// Errors: [`ConfigError`] for `value` outside `min..=max`.
    pub(crate) fn check(&self, value: Duration) -> Result<(), ConfigError> {
        check_range(self.flag, value, self.min, self.max)
    }
}

/// `--redis-timeout` of the one-shot commands that share [`RedisArgs`](super::RedisArgs)
/// (`pool`, `budget`): one Redis call, 10 ms to 60 s.
pub(crate) const REDIS_TIMEOUT: DurationLimit = DurationLimit {
    flag: "--redis-timeout",
    default: "5s",
    min: Duration::from_millis(10),
    max: Duration::from_secs(60),
};

/// A count flag: default and range inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CountLimit {
    /// The flag as typed, e.g. `--retries`.
    pub flag: &'static str,
    /// The default.
    pub default: u32,
    /// The smallest value allowed.
    pub min: u32,
    /// The largest value allowed.
    pub max: u32,
}

impl CountLimit {
    /// `value` within the range; the error names the flag and the range
    /// (`11 is outside 0-10`).
    ///
    /// Errors: [`ConfigError`] for `value` outside `min..=max`.
    pub(crate) fn check(&self, value: u32) -> Result<(), ConfigError> {
        if (self.min..=self.max).contains(&value) {
            return Ok(());
        }
        Err(ConfigError::new(
            self.flag,
            format!("{value} is outside {}-{}", self.min, self.max),
        ))
    }
}

/// Test support: whether `help` names the range `min-max` (durations in
/// any unit, `60s` or `1m`), and the default is within the range.
#[cfg(test)]
pub(crate) mod check {
    use clap::Command;

    use super::*;

    /// The `--help` line of `flag` in `command`.
    pub(crate) fn help_of(command: &Command, flag: &str) -> String {
        let long = flag.trim_start_matches("--");
        let arg = command
            .get_arguments()
            .find(|a| a.get_long() == Some(long))
            .unwrap_or_else(|| panic!("no flag {flag}"));
        arg.get_help().map(ToString::to_string).unwrap_or_default()
    }

    /// The default clap shows for `flag` in `command`.
    fn default_of(command: &Command, flag: &str) -> String {
        let long = flag.trim_start_matches("--");
        let arg = command.get_arguments().find(|a| a.get_long() == Some(long));
        let values = arg
            .map(|a| a.get_default_values().to_vec())
            .unwrap_or_default();
        values
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect()
    }

    /// The `a-b` pairs of a help text.
    fn ranges(help: &str) -> Vec<(String, String)> {
        help.split(|c: char| c.is_whitespace() || "(),;:.".contains(c))
            .filter_map(|word| word.split_once('-'))
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect()
    }

    /// `help` names `limit`'s range; its default parses and lies within it.
    pub(crate) fn duration(command: &Command, limit: &DurationLimit) {
        let help = help_of(command, limit.flag);
        let named = ranges(&help)
            .iter()
            .any(|(a, b)| parse_duration(a) == Ok(limit.min) && parse_duration(b) == Ok(limit.max));
        assert!(
            named,
            "{} --help does not say {limit:?}: {help}",
            limit.flag
        );
        let default = limit.default_value();
        assert!(limit.check(default).is_ok(), "{limit:?}");
        assert_eq!(
            default_of(command, limit.flag),
            limit.default,
            "{}",
            limit.flag
        );
    }

    /// `help` names `limit`'s range; its default lies within it.
    pub(crate) fn count(command: &Command, limit: &CountLimit) {
        let help = help_of(command, limit.flag);
        let (min, max) = (limit.min.to_string(), limit.max.to_string());
        let named = ranges(&help).iter().any(|(a, b)| *a == min && *b == max);
        assert!(
            named,
            "{} --help does not say {limit:?}: {help}",
            limit.flag
        );
        assert!(limit.check(limit.default).is_ok(), "{limit:?}");
        let default = default_of(command, limit.flag);
        assert_eq!(default, limit.default.to_string(), "{}", limit.flag);
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    use super::*;

    /// The shared flags' `--help` and clap default follow their limits.
    #[test]
    fn shared_flags_follow_their_limits() {
        let command = super::super::RedisArgs::augment_args(Command::new("pool"));
        check::duration(&command, &REDIS_TIMEOUT);
    }
}
