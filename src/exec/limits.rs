//! The one table of `exec`'s and `id`'s flag limits, on the model of
//! `lock/limits.rs`: clap takes each default from here, `args.rs` checks
//! each range against it, and the test below proves every flag's `--help`
//! names the same range.

use std::time::Duration;

use crate::cli::DurationLimit;

/// `exec --wait`: how long to wait for a first published ID, 0 s to 24 h.
pub(crate) const WAIT: DurationLimit = DurationLimit {
    flag: "--wait",
    default: "60s",
    min: Duration::ZERO,
    max: Duration::from_secs(86_400),
};
/// `exec --poll`: how often the published ID is read, 10 ms (the sidecar is
/// local, but each read is a file read or an HTTP call) to 1 min.
pub(crate) const POLL: DurationLimit = DurationLimit {
    flag: "--poll",
    default: "1s",
    min: Duration::from_millis(10),
    max: Duration::from_secs(60),
};
/// `exec --grace`: SIGTERM this long before SIGKILL, 0 s to 10 min
/// (`supervise/deadline.rs` caps it at a quarter of the lease's validity).
pub(crate) const GRACE: DurationLimit = DurationLimit {
    flag: "--grace",
    default: "10s",
    min: Duration::ZERO,
    max: Duration::from_secs(600),
};
/// `id --wait`: 0 s (read once) to 24 h.
pub(crate) const ID_WAIT: DurationLimit = DurationLimit {
    flag: "--wait",
    default: "0s",
    min: Duration::ZERO,
    max: Duration::from_secs(86_400),
};

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    use super::*;
    use crate::cli::limit::check;
    use crate::exec::{ExecArgs, IdArgs};

    /// Every flag's `--help` and clap default follow the table.
    #[test]
    fn help_and_defaults_follow_the_table() {
        let exec = ExecArgs::augment_args(Command::new("exec"));
        for limit in [WAIT, POLL, GRACE] {
            check::duration(&exec, &limit);
        }
        check::duration(&IdArgs::augment_args(Command::new("id")), &ID_WAIT);
    }
}
