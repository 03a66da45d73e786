//! The one table of `lock`'s flag limits, on the model of
//! `pool/limits.rs`: clap takes each default from here, `args.rs` checks
//! each range against it, and the test below proves every flag's `--help`
//! names the same range.

use std::time::Duration;

use crate::cli::DurationLimit;

/// Longest lock name in bytes.
pub(crate) const MAX_NAME_LEN: usize = 128;
/// `--key-prefix` by default: the key is `snowlease:lock:{<name>}`.
pub(crate) const DEFAULT_KEY_PREFIX: &str = "snowlease:lock:";
/// `--ttl`: 1 s (the renew interval, ttl/3, stays above 300 ms and the
/// validity margin, at least 100 ms, below a tenth of the TTL) to 1 h, as in
/// worker mode.
pub(crate) const TTL: DurationLimit = DurationLimit {
    flag: "--ttl",
    default: "30s",
    min: Duration::from_secs(1),
    max: Duration::from_secs(3600),
};
/// `--wait`: how long to wait for the lock, 0 s (try once) to 24 h.
pub(crate) const WAIT: DurationLimit = DurationLimit {
    flag: "--wait",
    default: "0s",
    min: Duration::ZERO,
    max: Duration::from_secs(86_400),
};
/// `--grace`: SIGTERM this long before SIGKILL, 0 s to 10 min.
pub(crate) const GRACE: DurationLimit = DurationLimit {
    flag: "--grace",
    default: "5s",
    min: Duration::ZERO,
    max: Duration::from_secs(600),
};

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    use super::*;
    use crate::cli::limit::check;
    use crate::lock::LockArgs;

    /// Every flag's `--help` and clap default follow the table.
    #[test]
    fn help_and_defaults_follow_the_table() {
        let command = LockArgs::augment_args(Command::new("lock"));
        for limit in [TTL, WAIT, GRACE] {
            check::duration(&command, &limit);
        }
    }
}
