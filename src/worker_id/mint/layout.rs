//! The bit layout of a minted Snowflake ID (`--id-layout`, `--epoch`, `--datacenter-id`):
//! parsed, checked against the worker IDs and the next 10 years, and used to compose and take
//! apart IDs.

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

/// Most datacenter bits: a datacenter ID is a `u16` (Snowflake's own layout has 5).
const MAX_DATACENTER_BITS: u32 = 16;

/// Bits of the parts of an ID, high to low: timestamp (ms since the epoch), datacenter ID
/// (0 bits unless given, Snowflake's 5 + 5 split of its machine bits), worker ID, sequence
/// within the ms; timestamp, worker and sequence at least 1 bit each, all together at most
/// 63. Also the datacenter ID this sidecar puts into its IDs (`--datacenter-id`, 0 without
/// datacenter bits): it is part of the app's format record like the bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdLayout {
    timestamp_bits: u32,
    datacenter_bits: u32,
    worker_bits: u32,
    sequence_bits: u32,
    datacenter_id: u16,
}

/// The instant timestamps count from, in Unix ms (not after start-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch(u64);

/// The parts of one ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdParts {
    /// Unix ms of the ID's timestamp.
    pub unix_ms: u64,
    /// The datacenter ID (0 in a layout without datacenter bits).
    pub datacenter_id: u16,
    /// The worker ID.
    pub worker_id: u16,
    /// Sequence within that ms.
    pub sequence: u32,
}

impl IdLayout {
    /// The format record of this layout from `epoch` (`format.lua`): two sidecars of one app
    /// mint in the same format only when it is equal. Without datacenter bits
    /// `"<t>:<w>:<s>@<epoch Unix ms>"`, as before they existed; with them
    /// `"<t>:<d>:<w>:<s>@<epoch Unix ms>,datacenter=<id>"`, so another datacenter ID on one
    /// app is another format.
    pub fn format(self, epoch: Epoch) -> String {
        if self.datacenter_bits == 0 {
            return format!(
                "{}:{}:{}@{}",
                self.timestamp_bits, self.worker_bits, self.sequence_bits, epoch.0
            );
        }
        format!(
            "{}:{}:{}:{}@{},datacenter={}",
            self.timestamp_bits,
            self.datacenter_bits,
            self.worker_bits,
            self.sequence_bits,
            epoch.0,
            self.datacenter_id
        )
    }

    /// The layout and epoch of a format record ([`Self::format`]'s inverse).
    ///
    /// Errors: text naming the record when it is not of that form.
    pub fn parse_format(record: &str, now_unix_ms: u64) -> Result<(Self, Epoch), String> {
        let bad = |why: String| format!("{record:?}: {why}");
        let (layout, rest) = record
            .split_once('@')
            .ok_or_else(|| bad("not <layout>@<epoch ms>".into()))?;
        let (epoch, datacenter_id) = match rest.split_once(",datacenter=") {
            Some((epoch, id)) => (epoch, Some(id)),
            None => (rest, None),
        };
        let mut parsed = Self::parse(layout).map_err(|e| bad(e.to_string()))?;
        if let Some(id) = datacenter_id {
            let id = id.parse().map_err(|_| bad(format!("datacenter {id:?}")))?;
            parsed = parsed
                .with_datacenter_id(id)
                .map_err(|e| bad(e.to_string()))?;
        }
        let epoch = Epoch::parse(epoch, now_unix_ms).map_err(|e| bad(e.to_string()))?;
        Ok((parsed, epoch))
    }

    /// Parses `TIMESTAMP:WORKER:SEQUENCE` or `TIMESTAMP:DATACENTER:WORKER:SEQUENCE` bit counts
    /// (the 3-part form has 0 datacenter bits); datacenter ID 0. Errors name `--id-layout`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let bad = |why: String| ConfigError::new("--id-layout", why);
        let parts: Vec<&str> = text.split(':').collect();
        let (t, d, w, s) = match parts[..] {
            [t, w, s] => (t, None, w, s),
            [t, d, w, s] => (t, Some(d), w, s),
            _ => {
                return Err(bad(format!(
                    "{text:?} is not TIMESTAMP:WORKER:SEQUENCE or TIMESTAMP:DATACENTER:WORKER:SEQUENCE bits, e.g. {DEFAULT_LAYOUT} or 41:5:5:12"
                )));
            }
        };
        let bits = |name: &str, part: &str| {
            part.parse::<u32>()
                .ok()
                .filter(|b| (1..ID_BITS).contains(b))
                .ok_or_else(|| bad(format!("{name} bits {part:?} must be an integer in 1-62")))
        };
        let datacenter_bits = match d {
            None => 0,
            Some(d) => d
                .parse::<u32>()
                .ok()
                .filter(|b| *b <= MAX_DATACENTER_BITS)
                .ok_or_else(|| {
                    bad(format!(
                        "datacenter bits {d:?} must be an integer in 0-{MAX_DATACENTER_BITS}"
                    ))
                })?,
        };
        let layout = Self {
            timestamp_bits: bits("timestamp", t)?,
            datacenter_bits,
            worker_bits: bits("worker", w)?,
            sequence_bits: bits("sequence", s)?,
            datacenter_id: 0,
        };
        let sum = layout.timestamp_bits
            + layout.datacenter_bits
            + layout.worker_bits
            + layout.sequence_bits;
        if sum > ID_BITS {
            return Err(bad(format!(
                "{text} uses {sum} bits; at most {ID_BITS} (the sign bit stays clear)"
            )));
        }
        Ok(layout)
    }

    /// This layout minting with datacenter ID `id` (`--datacenter-id`).
    ///
    /// Errors: [`ConfigError`] naming `--datacenter-id` and its range, 0 to 2^D - 1 for the D
    /// datacenter bits of `--id-layout` (only 0 without datacenter bits).
    pub fn with_datacenter_id(self, id: u16) -> Result<Self, ConfigError> {
        if u64::from(id) < 1u64 << self.datacenter_bits {
            return Ok(Self {
                datacenter_id: id,
                ..self
            });
        }
        let reason = match self.datacenter_bits {
            0 => format!(
                "{id} needs datacenter bits in --id-layout (TIMESTAMP:DATACENTER:WORKER:SEQUENCE, e.g. 41:5:5:12); without them only 0"
            ),
            d => format!(
                "{id} is outside 0-{} ({d} datacenter bits of --id-layout)",
                (1u64 << d) - 1
            ),
        };
        Err(ConfigError::new("--datacenter-id", reason))
    }

    /// The datacenter ID this layout mints with (0 without datacenter bits).
    pub fn datacenter_id(self) -> u16 {
        self.datacenter_id
    }

    /// The bits below the timestamp (datacenter, worker and sequence) set: the largest ID of a
    /// millisecond is its smallest one with these.
    pub fn low_bits(self) -> u64 {
        (1u64 << (self.datacenter_bits + self.worker_bits + self.sequence_bits)) - 1
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

    /// The ID of `parts`: timestamp, datacenter, worker, sequence from high bits to low;
    /// `None` when a part does not fit its bits (a timestamp before the epoch or past
    /// [`Self::overflows_at`] included): never a wrapped or negative ID.
    pub fn compose(self, epoch: Epoch, parts: IdParts) -> Option<u64> {
        let since = parts.unix_ms.checked_sub(epoch.0)?;
        let fits = |value: u64, bits: u32| value < 1u64 << bits;
        let datacenter = u64::from(parts.datacenter_id);
        let (worker, sequence) = (u64::from(parts.worker_id), u64::from(parts.sequence));
        if !fits(since, self.timestamp_bits)
            || !fits(datacenter, self.datacenter_bits)
            || !fits(worker, self.worker_bits)
            || !fits(sequence, self.sequence_bits)
        {
            return None;
        }
        let (s, w, d) = (self.sequence_bits, self.worker_bits, self.datacenter_bits);
        Some(since << (d + w + s) | datacenter << (w + s) | worker << s | sequence)
    }

    /// The parts of `id` (the inverse of [`Self::compose`]).
    pub fn decompose(self, epoch: Epoch, id: u64) -> IdParts {
        let mask = |bits: u32| (1u64 << bits) - 1;
        let (s, w, d) = (self.sequence_bits, self.worker_bits, self.datacenter_bits);
        IdParts {
            unix_ms: epoch.0 + (id >> (d + w + s)),
            datacenter_id: ((id >> (w + s)) & mask(d)) as u16,
            worker_id: ((id >> s) & mask(w)) as u16,
            sequence: (id & mask(s)) as u32,
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
                datacenter_bits: 0,
                worker_bits: 10,
                sequence_bits: 12,
                datacenter_id: 0,
            }
        );
        assert_eq!(layout("1:1:61").sequences(), 1 << 31, "capped, never used");
        for (text, says) in [
            ("41:10", "TIMESTAMP:WORKER:SEQUENCE"),
            ("41:1:10:12:1", "TIMESTAMP:WORKER:SEQUENCE"),
            ("41:10:12:1", "64 bits; at most 63"),
            (
                "41:17:1:1",
                "datacenter bits \"17\" must be an integer in 0-16",
            ),
            ("41:x:5:12", "datacenter bits"),
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
            datacenter_id: 0,
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
        let no_datacenter = IdParts {
            datacenter_id: 1,
            ..parts
        };
        assert_eq!(l.compose(epoch, no_datacenter), None, "0 datacenter bits");
    }

    /// `41:5:5:12`: timestamp, 5 datacenter bits, 5 worker bits, sequence; each part comes
    /// back from the ID, and a part too large for its bits is refused.
    #[test]
    fn ids_with_datacenter_bits_compose_and_decompose() {
        let epoch = Epoch(DEFAULT_EPOCH_MS);
        let l = layout("41:5:5:12").with_datacenter_id(17).unwrap();
        assert_eq!(l.datacenter_id(), 17);
        let parts = IdParts {
            unix_ms: NOW,
            datacenter_id: 17,
            worker_id: 31,
            sequence: 4095,
        };
        let id = l.compose(epoch, parts).unwrap();
        assert_eq!(
            id,
            (NOW - DEFAULT_EPOCH_MS) << 22 | 17 << 17 | 31 << 12 | 4095
        );
        assert_eq!(l.decompose(epoch, id), parts);
        // The same bits read as the 3-part default layout: datacenter and worker run together.
        let flat = layout(DEFAULT_LAYOUT).decompose(epoch, id);
        assert_eq!((flat.worker_id, flat.datacenter_id), (17 << 5 | 31, 0));
        assert_eq!(l.low_bits(), (1 << 22) - 1);
        for bad in [
            IdParts {
                datacenter_id: 32,
                ..parts
            },
            IdParts {
                worker_id: 32,
                ..parts
            },
        ] {
            assert_eq!(l.compose(epoch, bad), None, "{bad:?}");
        }
        // Smallest and largest datacenter IDs, and a zero-bit datacenter part in the 4-part form.
        for (text, dc) in [("41:5:5:12", 0), ("41:5:5:12", 31), ("41:0:10:12", 0)] {
            let l = layout(text).with_datacenter_id(dc).unwrap();
            let parts = IdParts {
                datacenter_id: dc,
                worker_id: 3,
                ..parts
            };
            assert_eq!(l.decompose(epoch, l.compose(epoch, parts).unwrap()), parts);
        }
    }

    /// The two examples of docs/app.md ("Taking an ID apart") decode as the table says.
    #[test]
    fn the_docs_examples_decode() {
        let epoch = Epoch(DEFAULT_EPOCH_MS);
        let at = 1_796_083_200_123;
        let default = layout(DEFAULT_LAYOUT).decompose(epoch, 2_127_553_261_067_649_029);
        assert_eq!(
            default,
            IdParts {
                unix_ms: at,
                datacenter_id: 0,
                worker_id: 660,
                sequence: 5
            }
        );
        let dc = layout("41:5:5:12").decompose(epoch, 2_127_553_261_067_255_813);
        assert_eq!(
            dc,
            IdParts {
                unix_ms: at,
                datacenter_id: 17,
                worker_id: 20,
                sequence: 5
            }
        );
    }

    /// `--datacenter-id` fits the datacenter bits; without them only 0; the error names the
    /// flag and the range.
    #[test]
    fn the_datacenter_id_must_fit_its_bits() {
        let err = layout("41:5:5:12").with_datacenter_id(32).unwrap_err();
        assert_eq!(err.flag, "--datacenter-id");
        assert!(err.reason.contains("outside 0-31"), "{}", err.reason);
        let err = layout(DEFAULT_LAYOUT).with_datacenter_id(1).unwrap_err();
        assert_eq!(err.flag, "--datacenter-id");
        assert!(
            err.reason.contains("needs datacenter bits"),
            "{}",
            err.reason
        );
        assert!(layout(DEFAULT_LAYOUT).with_datacenter_id(0).is_ok());
    }

    /// The format record: the 3-part form as before; datacenter bits and ID in it otherwise,
    /// so another datacenter ID is another format; parse_format reads both back.
    #[test]
    fn format_records_carry_the_datacenter_id() {
        let epoch = Epoch(DEFAULT_EPOCH_MS);
        assert_eq!(
            layout(DEFAULT_LAYOUT).format(epoch),
            "41:10:12@1288834974657"
        );
        assert_eq!(
            layout("41:0:10:12").format(epoch),
            "41:10:12@1288834974657",
            "0 datacenter bits are the 3-part form"
        );
        let dc3 = layout("41:5:5:12").with_datacenter_id(3).unwrap();
        let dc4 = layout("41:5:5:12").with_datacenter_id(4).unwrap();
        assert_eq!(dc3.format(epoch), "41:5:5:12@1288834974657,datacenter=3");
        assert_ne!(dc3.format(epoch), dc4.format(epoch));
        for l in [layout(DEFAULT_LAYOUT), dc3] {
            assert_eq!(
                IdLayout::parse_format(&l.format(epoch), NOW),
                Ok((l, epoch))
            );
        }
        for bad in [
            "41:10:12",
            "41:5:5:12@1,datacenter=x",
            "41:5:5:12@1,datacenter=32",
        ] {
            assert!(IdLayout::parse_format(bad, NOW).is_err(), "{bad}");
        }
    }
}
