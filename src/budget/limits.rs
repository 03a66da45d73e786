//! The one table of rate budgets' names and ranges. The Rust checks (the
//! API, the CLI, the HTTP API) read it, and the Lua scripts get it as a
//! `BUDGET_LIMITS` table generated from it (`lua_table`) in front of
//! `common.lua`, so both sides refuse the same values;
//! `tests/it/budget.rs` proves the Lua side on a real Redis.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::BudgetError;
pub use crate::names::Range;

/// Events per period of a rate (`10` of `10/s`).
pub const RATE_COUNT: Range = Range {
    field: "rate_count",
    min: 1,
    max: 1_000_000,
};
/// The period of a rate, ms (`1000` of `10/s`): 1 ms to 1 day.
pub const RATE_PERIOD_MS: Range = Range {
    field: "rate_period_ms",
    min: 1,
    max: 86_400_000,
};
/// Units that may be taken at once from a full budget.
pub const BURST: Range = Range {
    field: "burst",
    min: 1,
    max: 1_000_000,
};
/// Units one take charges to every key (at most the smallest burst).
pub const COST: Range = Range {
    field: "cost",
    min: 1,
    max: 1_000_000,
};
/// Keys charged together in one call.
pub const KEYS_PER_CALL: Range = Range {
    field: "keys",
    min: 1,
    max: 16,
};
/// How long a penalize pushes a key back, ms: 1 ms to 1 day.
pub const PENALTY_MS: Range = Range {
    field: "penalty_ms",
    min: 1,
    max: 86_400_000,
};
/// Time a full burst takes to refill (burst / rate), ms: at most 30 days,
/// the longest a budget key lives (a cross-field rule, checked after the
/// ranges).
pub const WINDOW_MS: Range = Range {
    field: "window_ms",
    min: 0,
    max: 2_592_000_000,
};
/// Every range the scripts check, as `lua_table` hands them over.
pub const SCRIPT_RANGES: [Range; 7] = [
    RATE_COUNT,
    RATE_PERIOD_MS,
    BURST,
    COST,
    KEYS_PER_CALL,
    PENALTY_MS,
    WINDOW_MS,
];
/// Longest budget key (the part after the name), in chars of [`KEY_CHARS`].
pub const KEY_MAX: usize = 128;
/// The characters of budget keys: room for domains, `host:port` and ids.
pub const KEY_CHARS: &str = "[A-Za-z0-9_.:-]";
/// Longest wait of one HTTP take, ms (Rust only: a loop of takes).
pub const WAIT_MS: Range = Range {
    field: "wait_ms",
    min: 0,
    max: 60_000,
};
/// `budget take --wait` of the CLI, ms: 0 to 24 h (Rust only).
pub const CLI_WAIT_MS: Range = Range {
    field: "wait",
    min: 0,
    max: 86_400_000,
};

/// The rule for budget keys, in words.
pub fn key_rule() -> String {
    format!("1-{KEY_MAX} chars of {KEY_CHARS}")
}

/// True for a valid budget key (the part after the budget name).
pub fn is_key(s: &str) -> bool {
    (1..=KEY_MAX).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// A rate: `count` events per `period`, written `10/s`, `600/m`, `5/2s`,
/// `1/250ms` (the period a whole number of ms, 1 ms to 1 day; the count
/// 1 to 1,000,000, at most 1 per µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Events per period.
    pub count: u64,
    /// The period.
    pub period: Duration,
}

impl Rate {
    /// The period in ms, checked with the count; errors name `field`.
    pub(crate) fn checked(&self, field: impl fmt::Display) -> Result<(u64, u64), BudgetError> {
        let count = int(&field, self.count, RATE_COUNT)?;
        let period = u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX);
        if Duration::from_millis(period) != self.period || !RATE_PERIOD_MS.allows(period) {
            return Err(BudgetError::bad(
                &field,
                format!(
                    "a period of whole ms, {}-{} ms",
                    RATE_PERIOD_MS.min, RATE_PERIOD_MS.max
                ),
            ));
        }
        if count > period.saturating_mul(1000) {
            return Err(BudgetError::bad(&field, "at most 1 per microsecond"));
        }
        Ok((count, period))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.period.as_millis();
        match ms {
            1000 => write!(f, "{}/s", self.count),
            60_000 => write!(f, "{}/m", self.count),
            3_600_000 => write!(f, "{}/h", self.count),
            86_400_000 => write!(f, "{}/d", self.count),
            _ => write!(f, "{}/{ms}ms", self.count),
        }
    }
}

impl FromStr for Rate {
    type Err = String;

    /// `<count>/<period>`: the period a unit (`ms`, `s`, `m`, `h`, `d`) or a
    /// duration (`2s`, `250ms`). Ranges are checked later.
    fn from_str(text: &str) -> Result<Self, String> {
        let usage = || format!("{text:?} is not a rate like 10/s, 600/m, 5/2s or 1/250ms");
        let (count, period) = text.trim().split_once('/').ok_or_else(usage)?;
        // Digits only: u64's parser also takes a sign ("+10/s").
        let count = count.trim();
        if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(usage());
        }
        let count: u64 = count.parse().map_err(|_| usage())?;
        let period = match period.trim() {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            other => humantime::parse_duration(other).map_err(|_| usage())?,
        };
        Ok(Self { count, period })
    }
}

/// The Lua table the scripts check against; put in front of `common.lua`.
pub(crate) fn lua_table() -> String {
    let mut out = String::from(
        "-- BUDGET_LIMITS: generated from src/budget/limits.rs, the one table of names and ranges.\n\
         -- Integer ranges are {min, max}.\nlocal BUDGET_LIMITS = {\n",
    );
    out += &format!(
        "  name_max = {},\n  key_max = {KEY_MAX},\n",
        crate::names::NAME_MAX
    );
    for r in SCRIPT_RANGES {
        out += &format!("  {} = {{ {}, {} }},\n", r.field, r.min, r.max);
    }
    out + "}\n"
}

/// An integer within `range`; the error names `field`.
pub(crate) fn int(field: impl fmt::Display, n: u64, range: Range) -> Result<u64, BudgetError> {
    if range.allows(n) {
        Ok(n)
    } else {
        Err(BudgetError::bad(field, range.expected()))
    }
}

/// A duration the scripts take in ms: whole ms within `range`.
pub(crate) fn millis(field: &str, d: Duration, range: Range) -> Result<u64, BudgetError> {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if Duration::from_millis(ms) == d && range.allows(ms) {
        Ok(ms)
    } else {
        Err(BudgetError::bad(
            field,
            format!(
                "a whole number of milliseconds, {}-{} ms",
                range.min, range.max
            ),
        ))
    }
}

/// A budget key (see [`is_key`]).
pub(crate) fn key(field: impl fmt::Display, s: &str) -> Result<(), BudgetError> {
    if is_key(s) {
        Ok(())
    } else {
        Err(BudgetError::bad(field, key_rule()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        let r = |s: &str| s.parse::<Rate>().unwrap();
        assert_eq!(r("10/s").period, Duration::from_secs(1));
        assert_eq!(r("600/m").count, 600);
        assert_eq!(r("5/2s").period, Duration::from_secs(2));
        assert_eq!(r("10/ms").period, Duration::from_millis(1));
        assert_eq!(r("1/250ms").period, Duration::from_millis(250));
        assert_eq!(r("10/s").to_string(), "10/s");
        assert_eq!(r("1/250ms").to_string(), "1/250ms");
        assert!("10".parse::<Rate>().is_err());
        assert!("x/s".parse::<Rate>().is_err());
        assert!("-1/s".parse::<Rate>().is_err());
    }

    #[test]
    fn rates_are_checked() {
        let r = |s: &str| s.parse::<Rate>().unwrap().checked("rate");
        assert_eq!(r("10/s").unwrap(), (10, 1000));
        assert!(r("0/s").is_err());
        assert!(r("1/2d").is_err());
        assert!(r("2000/1ms").is_err());
        assert!(r("1/1500us").is_err());
        assert_eq!(
            r("0/s").unwrap_err().to_string(),
            "invalid rate: expected an integer 1-1000000"
        );
    }

    #[test]
    fn keys_take_domains() {
        assert!(is_key("example.com"));
        assert!(is_key("10.0.0.1:3128"));
        assert!(!is_key(""));
        assert!(!is_key("a b"));
        assert!(!is_key("{tag}"));
        assert!(!is_key(&"a".repeat(KEY_MAX + 1)));
    }
}
