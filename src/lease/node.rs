//! Node stamps: values that name the Redis node (and its life) that wrote
//! them, so a script sees that Redis rolled back (`node.lua`,
//! docs/rollback-design.md).

use redis::Script;

/// `node.lua`: `node_stamp()`, `unstamp()`, `stamped()`, `stamped_here()`,
/// `node_gate()`, `lift_fence()`; for scripts built from several parts.
pub(crate) const PRELUDE: &str = include_str!("node.lua");

/// A script with `node.lua` put in front of `body`.
pub(crate) fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}

/// The integer part of a stored "<integer>.<stamp>" or of a plain
/// integer (a value written before stamps); `None` for anything else.
pub(crate) fn integer_part(value: &str) -> Option<u64> {
    let value = value.trim();
    let int = match value.split_once('.') {
        Some((int, stamp)) if !stamp.is_empty() && stamp.bytes().all(|b| b.is_ascii_digit()) => int,
        Some(_) => return None,
        None => value,
    };
    int.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stamped and plain integers read alike; anything else is unreadable.
    #[test]
    fn integer_part_reads_stamped_and_plain_values() {
        assert_eq!(
            integer_part("1796412036000.123456789012345"),
            Some(1796412036000)
        );
        assert_eq!(integer_part("42"), Some(42));
        assert_eq!(integer_part(" 42\n"), Some(42));
        for bad in ["", "x", "42.", "42.x", "42.1.2", "-1", ".5"] {
            assert_eq!(integer_part(bad), None, "{bad:?}");
        }
    }
}
