//! The rules pool and budget share: names (pool names, ids, request ids,
//! budget names: 1-64 chars of `[A-Za-z0-9_-]`) and the integer range of a
//! script argument, checked alike in Rust and in the generated Lua tables
//! (`pool::limits`, `budget::limits`). At the top, so neither mode imports
//! the other for them.

/// Longest pool name, id or request id; each is 1-64 chars of
/// `NAME_CHARS`.
pub const NAME_MAX: usize = 64;
/// The characters of pool names, ids and request ids.
pub(crate) const NAME_CHARS: &str = "[A-Za-z0-9_-]";

/// An integer range of one script argument, in its unit (ms or a count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The argument's name in the scripts (their ARGV and error replies)
    /// and in the HTTP API, e.g. `ttl_ms`.
    pub field: &'static str,
    /// The smallest value allowed.
    pub min: u64,
    /// The largest value allowed.
    pub max: u64,
}

impl Range {
    /// True when `n` is within the range.
    pub const fn allows(self, n: u64) -> bool {
        self.min <= n && n <= self.max
    }

    /// What is accepted, in the words the scripts use too.
    pub(crate) fn expected(self) -> String {
        format!("an integer {}-{}", self.min, self.max)
    }
}

/// The rule for names and ids, in words: `1-64 chars of [A-Za-z0-9_-]`.
pub(crate) fn name_rule() -> String {
    format!("1-{NAME_MAX} chars of {NAME_CHARS}")
}

/// True for a valid pool name, id or request id.
pub fn is_name(s: &str) -> bool {
    (1..=NAME_MAX).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
