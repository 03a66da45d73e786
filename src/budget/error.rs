//! `BudgetError`: what a budget call can fail with, including the error
//! codes the Lua scripts answer (see `common.lua`).

use redis::RedisError;

use crate::connection::ScriptError;

/// Why a budget call failed. Bad input and wrong key types are permanent;
/// for [`BudgetError::Redis`] the charge may or may not have happened, and
/// callers fail closed (deny).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// An argument out of its range, refused by the Rust checks or by the
    /// script itself; nothing was written. `field` names it (`rate`,
    /// `burst`, `cost`, `keys[1]`, `name`, ...); `expected` gives the range.
    #[error("invalid {field}: expected {expected}")]
    BadInput {
        /// The argument.
        field: String,
        /// What would have been accepted, with units and range.
        expected: String,
    },
    /// A budget key holds something other than a GCRA time; nothing was
    /// written.
    #[error(
        "bad key in redis: budget key {key} holds {found}, expected a number (a budget's time)"
    )]
    WrongKeyType {
        /// The full key name.
        key: String,
        /// What it holds (a Redis type, or `string` for a string that is not
        /// a time the scripts wrote: not a decimal, nan, inf, negative or
        /// beyond any window).
        found: String,
    },
    /// Redis or the connection failed; the charge may or may not have
    /// happened.
    #[error("redis: {}", crate::connection::Readable(.0))]
    Redis(#[source] RedisError),
    /// A script answered something this version does not understand.
    #[error("unexpected reply from the budget {script} script: {detail}")]
    Reply {
        /// The script name (`take`, `penalize`).
        script: &'static str,
        /// What was wrong with the reply.
        detail: String,
    },
}

impl BudgetError {
    /// `field` is rendered only here, so a check on every call can pass a
    /// [`std::fmt::Display`] that formats a name like `keys[2].burst` lazily.
    pub(crate) fn bad(field: impl std::fmt::Display, expected: impl Into<String>) -> Self {
        Self::BadInput {
            field: field.to_string(),
            expected: expected.into(),
        }
    }
}

/// Turns the scripts' error replies into their variants (read by the one
/// decoder, `connection::ScriptError`); everything else stays a Redis error.
impl From<RedisError> for BudgetError {
    fn from(err: RedisError) -> Self {
        match ScriptError::of(&err) {
            Some(ScriptError::BadArg { field, expected }) => Self::BadInput { field, expected },
            Some(ScriptError::KeyType { key, found, .. }) => Self::WrongKeyType { key, found },
            // The pool's codes: not answered by a budget script.
            Some(_) | None => Self::Redis(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    }

    #[test]
    fn script_codes_become_variants() {
        let err = BudgetError::from(server_error("BADARG", "burst an integer 1-1000000"));
        assert_eq!(
            err.to_string(),
            "invalid burst: expected an integer 1-1000000"
        );
        assert!(matches!(
            BudgetError::from(server_error("KEYTYPE", "k hash number")),
            BudgetError::WrongKeyType { key, found } if key == "k" && found == "hash"
        ));
        assert!(matches!(
            BudgetError::from(server_error("WRONGTYPE", "Operation against a key")),
            BudgetError::Redis(_)
        ));
    }
}
