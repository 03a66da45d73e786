//! [`WorkerRange`]: the worker IDs a sidecar may claim (`--worker-ids LOW-HIGH`, or
//! `--max-worker-id N` as `0-N`), so that regions or clusters with a Redis each split one
//! ID space between them (docs/kubernetes.md, "Several clusters or regions").

pub(crate) mod record;

use std::fmt;
use std::ops::RangeInclusive;

use crate::config_error::ConfigError;

use super::limits::{WORKER_ID_LIMIT, WORKER_IDS};

/// Worker IDs `low..=high`, within 0-1023 (the 10 worker bits of a Snowflake ID), `low <=
/// high`. Lease keys keep the real ID: `<prefix><app>:<id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerRange {
    low: u16,
    high: u16,
}

impl WorkerRange {
    /// IDs `0..=max_worker_id` (`--max-worker-id`); `max_worker_id` at most 1023.
    pub fn up_to(max_worker_id: u16) -> Self {
        Self {
            low: 0,
            high: max_worker_id.min(WORKER_ID_LIMIT),
        }
    }

    /// IDs `low..=high`.
    ///
    /// Errors: [`ConfigError`] naming `--worker-ids` and the allowed range when `low >
    /// high` or `high > 1023`.
    pub fn new(low: u16, high: u16) -> Result<Self, ConfigError> {
        if high > WORKER_ID_LIMIT {
            return Err(ConfigError::new(
                WORKER_IDS.flag,
                format!(
                    "{low}-{high} reaches past {WORKER_ID_LIMIT}; worker IDs are {}-{} (10 bits)",
                    WORKER_IDS.min, WORKER_IDS.max
                ),
            ));
        }
        if low > high {
            return Err(ConfigError::new(
                WORKER_IDS.flag,
                format!("{low}-{high} is empty: LOW must not be above HIGH"),
            ));
        }
        Ok(Self { low, high })
    }

    /// Parses `LOW-HIGH` (`512-1023`) or one ID (`7`, the range `7-7`).
    ///
    /// Errors: [`ConfigError`] naming `--worker-ids`: not of that form, or outside 0-1023.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let bad = || {
            ConfigError::new(
                WORKER_IDS.flag,
                format!(
                    "{text:?} is not LOW-HIGH, e.g. 512-1023 (whole numbers within {}-{})",
                    WORKER_IDS.min, WORKER_IDS.max
                ),
            )
        };
        let (low, high) = text
            .trim()
            .split_once('-')
            .unwrap_or((text.trim(), text.trim()));
        let number = |part: &str| {
            let part = part.trim();
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            // Digits past u16 are outside the range anyway: say so with the range, naming the
            // text as given (not a clamped 65535 nobody typed).
            part.parse::<u16>().map_err(|_| {
                ConfigError::new(
                    WORKER_IDS.flag,
                    format!(
                        "{} reaches past {WORKER_ID_LIMIT}; worker IDs are {}-{} (10 bits)",
                        text.trim(),
                        WORKER_IDS.min,
                        WORKER_IDS.max
                    ),
                )
            })
        };
        Self::new(number(low)?, number(high)?)
    }

    /// The lowest ID.
    pub fn low(self) -> u16 {
        self.low
    }

    /// The highest ID.
    pub fn high(self) -> u16 {
        self.high
    }

    /// How many IDs (1-1024).
    pub fn len(self) -> u32 {
        u32::from(self.high - self.low) + 1
    }

    /// Never empty: kept for the `len` lint.
    pub fn is_empty(self) -> bool {
        false
    }

    /// Whether `id` is in the range.
    pub fn contains(self, id: u16) -> bool {
        (self.low..=self.high).contains(&id)
    }

    /// The IDs, lowest first.
    pub fn ids(self) -> RangeInclusive<u16> {
        self.low..=self.high
    }

    /// The IDs both ranges hold, if any.
    pub fn overlap(self, other: Self) -> Option<Self> {
        let (low, high) = (self.low.max(other.low), self.high.min(other.high));
        (low <= high).then_some(Self { low, high })
    }
}

impl fmt::Display for WorkerRange {
    /// `LOW-HIGH`, as `--worker-ids` takes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.low, self.high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bad_ones_name_the_flag_and_range() {
        let r = WorkerRange::parse("512-1023").unwrap();
        assert_eq!((r.low(), r.high(), r.len()), (512, 1023, 512));
        assert_eq!(r.to_string(), "512-1023");
        assert_eq!(
            WorkerRange::parse("7").unwrap(),
            WorkerRange::new(7, 7).unwrap()
        );
        assert_eq!(WorkerRange::parse("0-1023").unwrap().len(), 1024);
        assert_eq!(WorkerRange::up_to(31), WorkerRange::parse("0-31").unwrap());
        for (text, says) in [
            ("512-1024", "reaches past 1023"),
            ("0-99999", "reaches past 1023"),
            ("65536-70000", "65536-70000 reaches past 1023"),
            ("9-3", "is empty"),
            ("", "not LOW-HIGH"),
            ("-5", "not LOW-HIGH"),
            ("1-", "not LOW-HIGH"),
            ("a-b", "not LOW-HIGH"),
            ("1-2-3", "not LOW-HIGH"),
            ("1..3", "not LOW-HIGH"),
        ] {
            let err = WorkerRange::parse(text).unwrap_err();
            assert_eq!(err.flag, "--worker-ids", "{text}");
            assert!(err.reason.contains(says), "{text}: {}", err.reason);
            assert!(
                err.reason.contains("0-1023") || says == "is empty",
                "{text}: {}",
                err.reason
            );
        }
    }

    #[test]
    fn overlaps_are_the_shared_ids() {
        let r = |text| WorkerRange::parse(text).unwrap();
        assert_eq!(r("0-511").overlap(r("512-1023")), None);
        assert_eq!(r("0-600").overlap(r("512-1023")), Some(r("512-600")));
        assert_eq!(r("0-1023").overlap(r("5-9")), Some(r("5-9")));
        assert!(r("5-9").contains(5) && r("5-9").contains(9) && !r("5-9").contains(10));
        assert_eq!(r("3-5").ids().collect::<Vec<_>>(), [3, 4, 5]);
    }
}
