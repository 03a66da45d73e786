//! The one table of worker-ID mode's flag limits, on the model of
//! `pool/limits.rs`: clap takes each default from here, `args.rs` checks
//! each range against it, [`LeaseSettings::default`](super::args::LeaseSettings)
//! follows it, and the tests below prove every flag's `--help` names the
//! same range (`worker`'s, mint mode's included, and `mint carry-over`'s).

use std::time::Duration;

use crate::cli::{CountLimit, DurationLimit};

/// The largest worker ID (10 bits), where the published files' format has it.
pub(crate) use crate::published::WORKER_ID_LIMIT;
/// `--max-worker-id` by default: 32 IDs, 0-31 (5 bits of a Snowflake ID).
pub(crate) const DEFAULT_MAX_WORKER_ID: u16 = 31;
/// `--max-worker-id`: the highest ID handed out, 0-1023 (10 bits).
pub(crate) const MAX_WORKER_ID: CountLimit = CountLimit {
    flag: "--max-worker-id",
    default: DEFAULT_MAX_WORKER_ID as u32,
    min: 0,
    max: WORKER_ID_LIMIT as u32,
};
/// `--worker-ids LOW-HIGH`: the worker IDs a sidecar claims, within 0-1023 (10 bits); not
/// given with `--max-worker-id` (that flag is `0-N`). No default of its own: unset, the
/// range is `0-(--max-worker-id)`.
pub(crate) const WORKER_IDS: IdRangeLimit = IdRangeLimit {
    flag: "--worker-ids",
    min: 0,
    max: WORKER_ID_LIMIT,
};

/// A flag that takes a range of worker IDs, and the IDs it may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdRangeLimit {
    /// The flag as typed.
    pub flag: &'static str,
    /// The lowest ID a range may start at.
    pub min: u16,
    /// The highest ID a range may reach.
    pub max: u16,
}

/// `--key-prefix` by default: lease keys are `snowflake:worker:<app>:<id>`.
pub(crate) const DEFAULT_KEY_PREFIX: &str = "snowflake:worker:";
/// `--ttl`: the lease key's PX, 1 s to 1 h.
pub(crate) const TTL: DurationLimit = DurationLimit {
    flag: "--ttl",
    default: "120s",
    min: Duration::from_secs(1),
    max: Duration::from_secs(3600),
};
/// `--renew-interval`: 100 ms up to half the TTL (`max`: half the longest
/// TTL; `args.rs` checks the TTL's half). Each renew is a Redis call and
/// rewrites the state file (fsync), so `1ns` once meant ~740 renewals a second.
pub(crate) const RENEW_INTERVAL: DurationLimit = DurationLimit {
    flag: "--renew-interval",
    default: "60s",
    min: Duration::from_millis(100),
    max: Duration::from_secs(1800),
};
/// `--retries`: retries of a failed renew round, 0-10.
pub(crate) const RETRIES: CountLimit = CountLimit {
    flag: "--retries",
    default: 3,
    min: 0,
    max: 10,
};
/// `--claim-timeout`: no ID claimed for this long is exit 3; 1 s to 24 h.
pub(crate) const CLAIM_TIMEOUT: DurationLimit = DurationLimit {
    flag: "--claim-timeout",
    default: "5m",
    min: Duration::from_secs(1),
    max: Duration::from_secs(86_400),
};
/// `--handover-delay`: the released ID stays blocked this long, 100 ms to 60 s.
pub(crate) const HANDOVER_DELAY: DurationLimit = DurationLimit {
    flag: "--handover-delay",
    default: "1s",
    min: Duration::from_millis(100),
    max: Duration::from_secs(60),
};
/// `--min-replicas-ack`: replicas that must acknowledge (`WAIT`), 0-16
/// (more than any sane deployment).
pub(crate) const MIN_REPLICAS_ACK: CountLimit = CountLimit {
    flag: "--min-replicas-ack",
    default: 0,
    min: 0,
    max: 16,
};
/// `--max-clock-skew`: largest |wall clock - Redis TIME| at which a claimed
/// ID is published, 10 ms to 60 s.
pub(crate) const MAX_CLOCK_SKEW: DurationLimit = DurationLimit {
    flag: "--max-clock-skew",
    default: "500ms",
    min: Duration::from_millis(10),
    max: Duration::from_secs(60),
};
/// `--mint-window` (`worker --mint`, `mint carry-over`): how far ahead of its clock the
/// sidecar reserves timestamps in Redis, 100 ms to 60 s. One reservation (a small script
/// call) per half window of minting.
pub(crate) const MINT_WINDOW: DurationLimit = DurationLimit {
    flag: "--mint-window",
    default: "2s",
    min: Duration::from_millis(100),
    max: Duration::from_secs(60),
};
/// `--durable-wait` (`mint carry-over`): how long it waits for its writes to reach every
/// replica and a snapshot, 1 s to 1 h (a `BGSAVE` of a large dataset takes minutes).
pub(crate) const DURABLE_WAIT: DurationLimit = DurationLimit {
    flag: "--durable-wait",
    default: "60s",
    min: Duration::from_secs(1),
    max: Duration::from_secs(3600),
};

#[cfg(test)]
mod tests {
    use clap::{Args, Command};

    use super::*;
    use crate::cli::limit::check;
    use crate::cli::show_duration;
    use crate::worker_id::args::WorkerArgs;
    use crate::worker_id::carry::CarryArgs;

    /// Every flag's `--help` and clap default follow the table.
    #[test]
    fn help_and_defaults_follow_the_table() {
        let command = WorkerArgs::augment_args(Command::new("worker"));
        for limit in [
            TTL,
            CLAIM_TIMEOUT,
            HANDOVER_DELAY,
            MAX_CLOCK_SKEW,
            MINT_WINDOW,
        ] {
            check::duration(&command, &limit);
        }
        for limit in [RETRIES, MIN_REPLICAS_ACK, MAX_WORKER_ID] {
            check::count(&command, &limit);
        }
        // The range flag names its bounds.
        let help = check::help_of(&command, WORKER_IDS.flag);
        let range = format!("{}-{}", WORKER_IDS.min, WORKER_IDS.max);
        assert!(help.contains(&range), "{help}");
        // The renew interval's upper bound is the TTL's half.
        let help = check::help_of(&command, RENEW_INTERVAL.flag);
        let range = format!("{}-ttl/2", show_duration(RENEW_INTERVAL.min));
        assert!(help.contains(&range), "{help}");
        assert_eq!(RENEW_INTERVAL.max, TTL.max / 2);
        assert!(RENEW_INTERVAL.default_value() <= TTL.default_value() / 2);
    }

    /// A store's first use waits as long as carry-over does by default (lease/node.rs
    /// cannot read this table: worker_id builds on lease).
    #[test]
    fn first_use_waits_the_default_durable_wait() {
        assert_eq!(
            humantime::parse_duration(DURABLE_WAIT.default).unwrap(),
            crate::lease::node::FIRST_USE_WAIT
        );
    }

    /// `mint carry-over` takes the old app's `--mint-window` and `--max-clock-skew` with the
    /// sidecar's ranges and defaults.
    #[test]
    fn carry_over_follows_the_table() {
        let command = CarryArgs::augment_args(Command::new("carry-over"));
        for limit in [MINT_WINDOW, MAX_CLOCK_SKEW, DURABLE_WAIT] {
            check::duration(&command, &limit);
        }
    }
}
