//! The one table of pool mode's names and ranges. The Rust checks (the
//! API, the CLI, the HTTP API) read it, and the Lua scripts get it as a
//! `LIMITS` table generated from it (`lua_table`) in front of
//! `common.lua`, so both sides refuse the same values;
//! `tests/it/pool_limits.rs` proves it at every boundary against a real
//! Redis. Also the conversion of `Duration`s to the scripts' ms.

use std::time::Duration;

use super::PoolError;
pub(crate) use crate::names::name_rule;
pub use crate::names::{NAME_MAX, Range, is_name};

/// Longest lease token, in bytes (at least 1).
pub const TOKEN_MAX: usize = 128;
/// Lease time, ms: 1 ms to 10 min.
pub(crate) const TTL_MS: Range = Range {
    field: "ttl_ms",
    min: 1,
    max: 600_000,
};
/// Cooldown after a release or an expiry, ms: 0 to 10 min.
pub(crate) const COOLDOWN_MS: Range = Range {
    field: "cooldown_ms",
    min: 0,
    max: 600_000,
};
/// Longest total time of one lease (the extend cap), ms: 1 ms to 24 h.
pub(crate) const MAX_LEASE_MS: Range = Range {
    field: "max_lease_ms",
    min: 1,
    max: 86_400_000,
};
/// Expired leases one reap call reclaims.
pub(crate) const REAP_LIMIT: Range = Range {
    field: "limit",
    min: 1,
    max: 1000,
};
/// Ids per init, add, disable or enable call.
pub(crate) const IDS_PER_CALL: Range = Range {
    field: "ids",
    min: 1,
    max: 1000,
};
/// Quarantine of an id at its release, ms: 1 ms to 30 days.
pub(crate) const QUARANTINE_MS: Range = Range {
    field: "quarantine_ms",
    min: 1,
    max: 2_592_000_000,
};
/// Quarantines within the strike window that disable an id (pool setting).
pub(crate) const MAX_STRIKES: Range = Range {
    field: "max_strikes",
    min: 1,
    max: 100,
};
/// The strike window, ms: 1 s to 30 days (pool setting).
pub(crate) const STRIKE_WINDOW_MS: Range = Range {
    field: "strike_window_ms",
    min: 1000,
    max: 2_592_000_000,
};
/// Every range the scripts check, as `lua_table` hands them over.
pub const SCRIPT_RANGES: [Range; 8] = [
    TTL_MS,
    COOLDOWN_MS,
    MAX_LEASE_MS,
    REAP_LIMIT,
    IDS_PER_CALL,
    QUARANTINE_MS,
    MAX_STRIKES,
    STRIKE_WINDOW_MS,
];
/// Longest quarantine reason, in bytes (0 allowed: no reason). Free text
/// for operators, without control characters (bytes 0-31 and 127), so it
/// prints on one line; never a metric label.
pub(crate) const REASON_MAX: usize = 200;
/// Most quarantined (and auto-disabled) ids one status lists; the counts
/// cover all of them.
pub(crate) const STATUS_LIST_MAX: u64 = 1000;
/// Expired leases one acquire reclaims before it leases.
pub(crate) const RECLAIM_PER_ACQUIRE: u64 = 100;
/// Entries of ready one acquire drops before it gives up on finding a due
/// id (disabled ids, or ids still leased, put back by other workers).
pub(crate) const DROPS_PER_ACQUIRE: u64 = 100;
/// Entries per key the next-due hint looks at (in chunks of
/// [`SCAN_CHUNK`]) before it answers a lower bound.
pub(crate) const HINT_SCAN: u64 = 1000;
/// Entries per read while the hint scans.
pub(crate) const SCAN_CHUNK: u64 = 100;
/// Longest wait of one HTTP acquire, ms (Rust only: the wait is a loop of
/// acquires, not a script argument).
pub(crate) const WAIT_MS: Range = Range {
    field: "wait_ms",
    min: 0,
    max: 60_000,
};

/// `acquire --wait` of the CLI, ms: 0 to 24 h (Rust only, like [`WAIT_MS`]).
pub(crate) const CLI_WAIT_MS: Range = Range {
    field: "wait",
    min: 0,
    max: 86_400_000,
};
/// `serve --reap-interval`, ms: 10 ms to 1 h (Rust only).
pub(crate) const REAP_INTERVAL_MS: Range = Range {
    field: "reap_interval",
    min: 10,
    max: 3_600_000,
};

/// The rule for tokens, in words.
pub(crate) fn token_rule() -> String {
    format!("1-{TOKEN_MAX} chars")
}

/// The rule for reasons, in words.
pub(crate) fn reason_rule() -> String {
    format!("at most {REASON_MAX} bytes, no control characters")
}

/// True for a valid quarantine reason (see [`REASON_MAX`]).
pub(crate) fn is_reason(s: &str) -> bool {
    s.len() <= REASON_MAX && !s.bytes().any(|b| b < 0x20 || b == 0x7f)
}

/// True for a valid token.
pub fn is_token(s: &str) -> bool {
    (1..=TOKEN_MAX).contains(&s.len())
}

/// The Lua table the scripts check against; put in front of `common.lua`.
pub(crate) fn lua_table() -> String {
    let mut out = String::from(
        "-- LIMITS: generated from src/pool/limits.rs, the one table of names and ranges.\n\
         -- Integer ranges are {min, max}.\nlocal LIMITS = {\n",
    );
    out += &format!(
        "  name_max = {NAME_MAX},\n  token_max = {TOKEN_MAX},\n  reason_max = {REASON_MAX},\n"
    );
    out += &format!("  status_list_max = {STATUS_LIST_MAX},\n");
    out += &format!(
        "  reclaim_per_acquire = {RECLAIM_PER_ACQUIRE},\n  drops_per_acquire = {DROPS_PER_ACQUIRE},\n  \
         hint_scan = {HINT_SCAN},\n  scan_chunk = {SCAN_CHUNK},\n"
    );
    for r in SCRIPT_RANGES {
        out += &format!("  {} = {{ {}, {} }},\n", r.field, r.min, r.max);
    }
    out + "}\n"
}

/// A pool name, id or request id (see [`is_name`]).
pub(crate) fn name(field: &str, s: &str) -> Result<(), PoolError> {
    if is_name(s) {
        Ok(())
    } else {
        Err(PoolError::bad(field, name_rule()))
    }
}

/// A token (see [`is_token`]).
pub(crate) fn token(s: &str) -> Result<(), PoolError> {
    if is_token(s) {
        Ok(())
    } else {
        Err(PoolError::bad("token", token_rule()))
    }
}

/// A list of at least one distinct valid id (any number: callers send
/// them in calls of at most [`IDS_PER_CALL`]).
pub(crate) fn ids<S: AsRef<str>>(ids: &[S]) -> Result<(), PoolError> {
    if ids.is_empty() {
        return Err(PoolError::bad("ids", "at least one id"));
    }
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    for (i, id) in ids.iter().enumerate() {
        let id = id.as_ref();
        name(&format!("ids[{i}]"), id)?;
        if !seen.insert(id) {
            return Err(PoolError::DuplicateId { id: id.to_owned() });
        }
    }
    Ok(())
}

/// A duration as whole ms within `range`, the unit of the scripts;
/// `field` names it in the error.
pub(crate) fn millis(field: &str, d: Duration, range: Range) -> Result<u64, PoolError> {
    let expected = || {
        format!(
            "a whole number of milliseconds, {}-{} ms",
            range.min, range.max
        )
    };
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(PoolError::bad(field, expected()));
    }
    // Saturating: past u64 ms is past every range's max.
    match crate::timing::ms(d) {
        ms if range.allows(ms) => Ok(ms),
        _ => Err(PoolError::bad(field, expected())),
    }
}

/// A quarantine reason (see [`is_reason`]).
pub(crate) fn reason(s: &str) -> Result<(), PoolError> {
    if is_reason(s) {
        Ok(())
    } else {
        Err(PoolError::bad("reason", reason_rule()))
    }
}

/// A count within `range`; `field` names it in the error.
pub(crate) fn count(field: &str, n: usize, range: Range) -> Result<u64, PoolError> {
    match u64::try_from(n) {
        Ok(n) if range.allows(n) => Ok(n),
        _ => Err(PoolError::bad(field, range.expected())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::PoolScript;

    #[test]
    fn names() {
        assert!(name("pool", "proxy-eu_1").is_ok());
        assert!(name("pool", &"a".repeat(64)).is_ok());
        for bad in ["", "a b", "a{b}", "a:b", "é", &"a".repeat(65)] {
            let err = name("pool", bad).unwrap_err().to_string();
            assert_eq!(
                err, "invalid pool: expected 1-64 chars of [A-Za-z0-9_-]",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tokens() {
        assert!(token("x").is_ok());
        assert!(token(&"x".repeat(128)).is_ok());
        assert!(token("").is_err());
        assert!(token(&"x".repeat(129)).is_err());
    }

    #[test]
    fn id_lists() {
        assert!(ids(&["a", "b"]).is_ok());
        assert!(ids::<&str>(&[]).is_err());
        assert!(ids(&["a"; 2]).is_err());
        let many: Vec<String> = (0..1001).map(|i| format!("i{i}")).collect();
        assert!(ids(&many).is_ok());
        let err = ids(&["a", "b c"]).unwrap_err().to_string();
        assert!(err.contains("ids[1]"), "{err}");
        let err = ids(&["a", "b", "a"]).unwrap_err();
        assert!(matches!(err, PoolError::DuplicateId { id } if id == "a"));
    }

    #[test]
    fn durations_to_millis() {
        let ms = Duration::from_millis;
        assert_eq!(millis("ttl", ms(1), TTL_MS).unwrap(), 1);
        assert_eq!(millis("ttl", ms(600_000), TTL_MS).unwrap(), 600_000);
        assert!(millis("ttl", ms(0), TTL_MS).is_err());
        assert!(millis("ttl", ms(600_001), TTL_MS).is_err());
        assert!(millis("ttl", Duration::from_micros(1500), TTL_MS).is_err());
        assert!(millis("ttl", Duration::MAX, TTL_MS).is_err());
        let err = millis("cooldown", Duration::from_nanos(1), COOLDOWN_MS).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid cooldown: expected a whole number of milliseconds, 0-600000 ms"
        );
    }

    /// The scripts take every limit from the generated table: no script's
    /// code (comments aside) writes a range's bound or a length itself
    /// (1000 is left out: it is also the ms in a second).
    #[test]
    fn scripts_hard_code_no_limit() {
        let table = lua_table();
        for r in SCRIPT_RANGES {
            assert!(table.contains(&format!("  {} = {{ {}, {} }},", r.field, r.min, r.max)));
        }
        let mut bounds: Vec<u64> = SCRIPT_RANGES.iter().map(|r| r.max).collect();
        bounds.extend([
            NAME_MAX as u64,
            TOKEN_MAX as u64,
            REASON_MAX as u64,
            RECLAIM_PER_ACQUIRE,
        ]);
        bounds.extend([DROPS_PER_ACQUIRE, HINT_SCAN, SCAN_CHUNK, STATUS_LIST_MAX]);
        bounds.retain(|b| *b != 1000);
        for s in PoolScript::ALL {
            let source = s.source();
            assert!(source.starts_with(&table), "{}", s.name());
            let code: String = source[table.len()..]
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect();
            for bound in &bounds {
                let found = code.match_indices(&bound.to_string()).any(|(i, m)| {
                    let digit = |c: Option<char>| c.is_some_and(|c| c.is_ascii_digit());
                    !digit(code[..i].chars().last()) && !digit(code[i + m.len()..].chars().next())
                });
                assert!(!found, "{} writes {bound} itself", s.name());
            }
        }
    }
}
