//! The bit layout of a minted Snowflake ID (`--id-layout`, `--epoch`): parsed, checked
//! against the worker IDs and the next 10 years, and used to compose and take apart IDs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config_error::ConfigError;
use crate::worker_id::range::WorkerRange;

/// `--id-layout` by default: Twitter's 41 timestamp, 10 worker, 12 sequence bits.
pub const DEFAULT_LAYOUT: &str = "41:10:12";
/// `--epoch` by default: Twitter's, 2010-11-04T01:42:54.657Z in Unix ms.
pub const DEFAULT_EPOCH_MS: u64 = 1_288_834_974_657;
/// Bits an ID may use: the sign bit stays clear, so every ID is a positive i64 (Java's
/// `long`, SQL's `BIGINT`).
const ID_BITS: u32 = 63;
/// How long a layout must last from start-up: at least 10 calendar years (3653 days).
const MUST_LAST: Duration = Duration::from_secs(3653 * 86_400);

/// Bits of the three parts of an ID, high to low: timestamp (ms since the epoch), worker ID,
/// sequence within the ms. Each at least 1, together at most 63.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdLayout {
    timestamp_bits: u32,
    worker_bits: u32,
    sequence_bits: u32,
}

/// The instant timestamps count from, in Unix ms (not after start-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch(u64);

/// The parts of one ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdParts {
    /// Unix ms of the ID's timestamp.
    pub unix_ms: u64,
    /// The worker ID.
    pub worker_id: u16,
    /// Sequence within that ms.
    pub sequence: u32,
}

impl IdLayout {
    /// The format record of this layout from `epoch`, `"<t>:<w>:<s>@<epoch Unix ms>"`
    /// (`format.lua`): two sidecars of one app mint in the same format only when it is equal.
    pub fn format(self, epoch: Epoch) -> String {
        format!(
            "{}:{}:{}@{}",
            self.timestamp_bits, self.worker_bits, self.sequence_bits, epoch.0
        )
    }

    /// Parses `TIMESTAMP:WORKER:SEQUENCE` bit counts. Errors name `--id-layout`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let bad = |why: String| ConfigError::new("--id-layout", why);
        let parts: Vec<&str> = text.split(':').collect();
        let [t, w, s] = parts[..] else {
            return Err(bad(format!(
                "{text:?} is not TIMESTAMP:WORKER:SEQUENCE bits, e.g. {DEFAULT_LAYOUT}"
            )));
        };
        let bits = |name: &str, part: &str| {
            part.parse::<u32>()
                .ok()
                .filter(|b| (1..ID_BITS).contains(b))
                .ok_or_else(|| bad(format!("{name} bits {part:?} must be an integer in 1-62")))
        };
        let layout = Self {
            timestamp_bits: bits("timestamp", t)?,
            worker_bits: bits("worker", w)?,
            sequence_bits: bits("sequence", s)?,
        };
        let sum = layout.timestamp_bits + layout.worker_bits + layout.sequence_bits;
        if sum > ID_BITS {
            return Err(bad(format!(
                "{text} uses {sum} bits; at most {ID_BITS} (the sign bit stays clear)"
            )));
        }
        Ok(layout)
    }

    /// The bits below the timestamp (worker and sequence) set: the largest ID of a
    /// millisecond is its smallest one with these.
    pub fn low_bits(self) -> u64 {
        (1u64 << (self.worker_bits + self.sequence_bits)) - 1
    }

    /// IDs per ms per worker ID: 2^sequence bits.
    pub fn sequences(self) -> u32 {
        1 << self.sequence_bits.min(31)
    }

    /// Checks that the worker bits hold every ID of `range` (`--worker-ids`, or
    /// `0-(--max-worker-id)`).
    ///
    /// Errors: [`ConfigError`] naming `--id-layout`, the range flags and the IDs the worker
    /// bits hold.
    pub fn check_workers(self, range: WorkerRange) -> Result<(), ConfigError> {
        if u64::from(range.high()) < 1u64 << self.worker_bits {
            return Ok(());
        }
        Err(ConfigError::new(
            "--id-layout",
            format!(
                "{} worker bits hold worker IDs 0-{}, but the worker IDs are {range} (--worker-ids, or 0-N from --max-worker-id N); allowed: a range within 0-{}",
                self.worker_bits,
                (1u64 << self.worker_bits) - 1,
                (1u64 << self.worker_bits) - 1
            ),
        ))
    }

    /// The first Unix ms whose timestamp no longer fits: epoch + 2^timestamp bits.
    pub fn overflows_at(self, epoch: Epoch) -> u64 {
        epoch.0.saturating_add(1u64 << self.timestamp_bits)
    }

    /// Checks that timestamps fit for 10 years from `now_unix_ms`; the error names the date
    /// (RFC 3339) of the overflow and `--id-layout` (`--epoch` moves it too).
    pub fn check_lasts(self, epoch: Epoch, now_unix_ms: u64) -> Result<(), ConfigError> {
        let overflow = self.overflows_at(epoch);
        if overflow > now_unix_ms.saturating_add(crate::timing::ms(MUST_LAST)) {
            return Ok(());
        }
        Err(ConfigError::new(
            "--id-layout",
            format!(
                "{} timestamp bits from --epoch {} overflow at {}, within 10 years; use more timestamp bits or a later --epoch",
                self.timestamp_bits,
                rfc3339(epoch.0),
                rfc3339(overflow)
            ),
        ))
    }

    /// The ID of `parts`; `None` when a part does not fit its bits (a timestamp before the
    /// epoch or past [`Self::overflows_at`] included): never a wrapped or negative ID.
    pub fn compose(self, epoch: Epoch, parts: IdParts) -> Option<u64> {
        let since = parts.unix_ms.checked_sub(epoch.0)?;
        let fits = |value: u64, bits: u32| value < 1u64 << bits;
        let (worker, sequence) = (u64::from(parts.worker_id), u64::from(parts.sequence));
        if !fits(since, self.timestamp_bits)
            || !fits(worker, self.worker_bits)
            || !fits(sequence, self.sequence_bits)
        {
            return None;
        }
        let shift = self.sequence_bits;
        Some(since << (self.worker_bits + shift) | worker << shift | sequence)
    }

    /// The parts of `id` (the inverse of [`Self::compose`]).
    pub fn decompose(self, epoch: Epoch, id: u64) -> IdParts {
        let mask = |bits: u32| (1u64 << bits) - 1;
        let shift = self.sequence_bits;
        IdParts {
            unix_ms: epoch.0 + (id >> (self.worker_bits + shift)),
            worker_id: ((id >> shift) & mask(self.worker_bits)) as u16,
            sequence: (id & mask(shift)) as u32,
        }
    }
}

impl Epoch {
    /// Parses `--epoch`: Unix ms (digits only) or an RFC 3339 time in UTC
    /// (`2010-11-04T01:42:54.657Z`), not after `now_unix_ms`. Errors name `--epoch`.
    pub fn parse(text: &str, now_unix_ms: u64) -> Result<Self, ConfigError> {
        let bad = |why: String| ConfigError::new("--epoch", why);
        let ms = if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            text.parse::<u64>()
                .map_err(|_| bad(format!("{text} is too large for Unix ms")))?
        } else {
            let at = humantime::parse_rfc3339(text).map_err(|err| {
                bad(format!(
                    "{text:?} is neither Unix ms nor an RFC 3339 time in UTC such as 2010-11-04T01:42:54.657Z ({err})"
                ))
            })?;
            crate::lease::unix_ms(at)
        };
        if ms > now_unix_ms {
            return Err(bad(format!(
                "{} is in the future (now {}): timestamps count from it",
                rfc3339(ms),
                rfc3339(now_unix_ms)
            )));
        }
        Ok(Self(ms))
    }

    /// The epoch in Unix ms.
    pub fn unix_ms(self) -> u64 {
        self.0
    }
}

/// Unix ms as RFC 3339 in UTC, to the ms.
fn rfc3339(unix_ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(unix_ms)).to_string()
}

/// Now in Unix ms (the wall clock), for the start-up checks.
pub fn wall_now_ms() -> u64 {
    crate::lease::unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01T00:00:00Z.
    const NOW: u64 = 1_796_083_200_000;

    fn layout(text: &str) -> IdLayout {
        IdLayout::parse(text).unwrap()
    }

    #[test]
    fn layouts_parse_and_bad_ones_name_the_flag_and_range() {
        assert_eq!(
            layout(DEFAULT_LAYOUT),
            IdLayout {
                timestamp_bits: 41,
                worker_bits: 10,
                sequence_bits: 12
            }
        );
        assert_eq!(layout("1:1:61").sequences(), 1 << 31, "capped, never used");
        for (text, says) in [
            ("41:10", "TIMESTAMP:WORKER:SEQUENCE"),
            ("41:10:12:1", "TIMESTAMP:WORKER:SEQUENCE"),
            ("0:10:12", "timestamp bits \"0\" must be an integer in 1-62"),
            ("41:x:12", "worker bits"),
            ("41:10:-1", "sequence bits"),
            ("42:10:12", "64 bits; at most 63"),
        ] {
            let err = IdLayout::parse(text).unwrap_err();
            assert_eq!(err.flag, "--id-layout");
            assert!(err.reason.contains(says), "{text}: {}", err.reason);
        }
    }

    #[test]
    fn worker_bits_must_hold_the_max_worker_id() {
        let range = |low, high| WorkerRange::new(low, high).unwrap();
        assert!(layout("41:10:12").check_workers(range(0, 1023)).is_ok());
        assert!(layout("41:5:12").check_workers(range(16, 31)).is_ok());
        for wide in [range(0, 32), range(16, 40)] {
            let err = layout("41:5:12").check_workers(wide).unwrap_err();
            assert_eq!(err.flag, "--id-layout");
            for says in [
                "hold worker IDs 0-31",
                &format!("worker IDs are {wide}"),
                "--worker-ids",
                "--max-worker-id",
            ] {
                assert!(err.reason.contains(says), "{says}: {}", err.reason);
            }
        }
    }

    #[test]
    fn a_layout_that_overflows_within_10_years_names_the_date() {
        let twitter = Epoch(DEFAULT_EPOCH_MS);
        // 41 bits from 2010 last until 2080.
        assert!(layout("41:10:12").check_lasts(twitter, NOW).is_ok());
        assert_eq!(
            rfc3339(layout("41:10:12").overflows_at(twitter)),
            "2080-07-10T17:30:30.209Z"
        );
        // 39 bits from 2010 ran out in 2028, within 10 years of 2026.
        let err = layout("39:10:12").check_lasts(twitter, NOW).unwrap_err();
        assert_eq!(err.flag, "--id-layout");
        assert!(
            err.reason.contains("2028-04-05T23:39:48.545Z"),
            "{}",
            err.reason
        );
        assert!(err.reason.contains("within 10 years"), "{}", err.reason);
        // 38 bits from an epoch of now: 8.7 years.
        assert!(layout("38:10:12").check_lasts(Epoch(NOW), NOW).is_err());
        assert!(layout("39:10:12").check_lasts(Epoch(NOW), NOW).is_ok());
    }

    #[test]
    fn epochs_parse_as_unix_ms_or_rfc3339_and_not_in_the_future() {
        assert_eq!(
            Epoch::parse("2010-11-04T01:42:54.657Z", NOW).unwrap(),
            Epoch(DEFAULT_EPOCH_MS)
        );
        assert_eq!(
            Epoch::parse("1288834974657", NOW).unwrap(),
            Epoch(DEFAULT_EPOCH_MS)
        );
        for (text, says) in [
            ("", "neither Unix ms nor an RFC 3339"),
            ("2010-11-04", "neither Unix ms nor an RFC 3339"),
            ("-5", "neither Unix ms nor an RFC 3339"),
            ("99999999999999999999", "too large"),
            (
                "2030-01-01T00:00:00Z",
                "2030-01-01T00:00:00.000Z is in the future",
            ),
        ] {
            let err = Epoch::parse(text, NOW).unwrap_err();
            assert_eq!(err.flag, "--epoch");
            assert!(err.reason.contains(says), "{text:?}: {}", err.reason);
        }
    }

    #[test]
    fn ids_compose_and_decompose_and_never_overflow() {
        let (l, epoch) = (layout(DEFAULT_LAYOUT), Epoch(DEFAULT_EPOCH_MS));
        let parts = IdParts {
            unix_ms: NOW,
            worker_id: 1023,
            sequence: 4095,
        };
        let id = l.compose(epoch, parts).unwrap();
        assert_eq!(id, (NOW - DEFAULT_EPOCH_MS) << 22 | 1023 << 12 | 4095);
        assert_eq!(l.decompose(epoch, id), parts);
        let max = IdParts {
            unix_ms: l.overflows_at(epoch) - 1,
            ..parts
        };
        let top = l.compose(epoch, max).unwrap();
        assert!(top < 1 << 63, "the sign bit stays clear");
        assert_eq!(l.decompose(epoch, top), max);
        let refused = [
            IdParts {
                unix_ms: l.overflows_at(epoch),
                ..parts
            },
            IdParts {
                unix_ms: DEFAULT_EPOCH_MS - 1,
                ..parts
            },
            IdParts {
                worker_id: 1024,
                ..parts
            },
            IdParts {
                sequence: 4096,
                ..parts
            },
        ];
        for parts in refused {
            assert_eq!(l.compose(epoch, parts), None, "{parts:?}");
        }
    }
}
