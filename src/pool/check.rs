//! Input checks done in Rust before a script runs, with the same ranges the
//! scripts enforce again; and the conversion of `Duration`s to Lua ms.

use std::time::Duration;

use super::PoolError;

/// Longest pool name, id or request id.
pub(crate) const NAME_MAX: usize = 64;
/// Longest token.
pub(crate) const TOKEN_MAX: usize = 128;
/// Longest lease ttl, and longest acquire cooldown, in ms.
pub(crate) const TTL_MAX_MS: u64 = 600_000;
/// Longest cooldown, in ms.
pub(crate) const COOLDOWN_MAX_MS: u64 = 600_000;
/// Longest total lease time (`max_lease`), in ms: one day.
pub(crate) const MAX_LEASE_MAX_MS: u64 = 86_400_000;
/// Most ids per script call, and most leases one reap reclaims.
pub(crate) const BATCH_MAX: usize = 1000;

const NAME_RULE: &str = "1-64 chars of [A-Za-z0-9_-]";

fn is_name(s: &str) -> bool {
    (1..=NAME_MAX).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A pool name, id or request id: 1-64 chars of `[A-Za-z0-9_-]`.
pub(crate) fn name(field: &str, s: &str) -> Result<(), PoolError> {
    if is_name(s) {
        Ok(())
    } else {
        Err(PoolError::bad(field, NAME_RULE))
    }
}

/// A token: 1-128 bytes.
pub(crate) fn token(s: &str) -> Result<(), PoolError> {
    if (1..=TOKEN_MAX).contains(&s.len()) {
        Ok(())
    } else {
        Err(PoolError::bad("token", "1-128 chars"))
    }
}

/// A batch of 1..=`max` distinct valid ids.
pub(crate) fn ids<S: AsRef<str>>(ids: &[S], max: usize) -> Result<(), PoolError> {
    if ids.is_empty() || ids.len() > max {
        return Err(PoolError::bad("ids", format!("1-{max} ids")));
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

/// A duration as whole ms within `lo..=hi` ms, the unit of the scripts.
pub(crate) fn millis(field: &str, d: Duration, lo: u64, hi: u64) -> Result<u64, PoolError> {
    let expected = || format!("a whole number of milliseconds, {lo}-{hi} ms");
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(PoolError::bad(field, expected()));
    }
    match u64::try_from(d.as_millis()) {
        Ok(ms) if (lo..=hi).contains(&ms) => Ok(ms),
        _ => Err(PoolError::bad(field, expected())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn id_batches() {
        assert!(ids(&["a", "b"], 1000).is_ok());
        assert!(ids::<&str>(&[], 1000).is_err());
        assert!(ids(&["a"; 2], 1000).is_err());
        let many: Vec<String> = (0..1001).map(|i| format!("i{i}")).collect();
        assert!(ids(&many, 1000).is_err());
        assert!(ids(&many, usize::MAX).is_ok());
        let err = ids(&["a", "b c"], 1000).unwrap_err().to_string();
        assert!(err.contains("ids[1]"), "{err}");
        let err = ids(&["a", "b", "a"], 1000).unwrap_err();
        assert!(matches!(err, PoolError::DuplicateId { id } if id == "a"));
    }

    #[test]
    fn durations_to_millis() {
        let ms = Duration::from_millis;
        assert_eq!(millis("ttl", ms(1), 1, 600_000).unwrap(), 1);
        assert_eq!(millis("ttl", ms(600_000), 1, 600_000).unwrap(), 600_000);
        assert!(millis("ttl", ms(0), 1, 600_000).is_err());
        assert!(millis("ttl", ms(600_001), 1, 600_000).is_err());
        assert!(millis("ttl", Duration::from_micros(1500), 1, 600_000).is_err());
        assert!(millis("ttl", Duration::MAX, 1, 600_000).is_err());
        let err = millis("cooldown", Duration::from_nanos(1), 0, 600_000).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid cooldown: expected a whole number of milliseconds, 0-600000 ms"
        );
    }
}
