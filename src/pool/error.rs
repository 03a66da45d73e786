//! `PoolError`: what a pool operation can fail with, including the error
//! codes the Lua scripts answer (see `common.lua`).

use redis::RedisError;

use crate::connection::ScriptError;

/// Why a pool operation failed. Bad input, wrong key types, duplicate or
/// unknown ids are permanent; for [`PoolError::Redis`] classify the inner
/// error (timeouts and dropped connections are worth a retry).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// An argument out of its range, refused by the Rust checks or by the
    /// script itself. `field` names it (`ttl`, `cooldown_ms`, `ids[3]`,
    /// `pool`, ...); `expected` gives the range.
    #[error("invalid {field}: expected {expected}")]
    BadInput {
        /// The argument, as the Rust API or the script names it.
        field: String,
        /// What would have been accepted, with units and range.
        expected: String,
    },
    /// A key holds another Redis type than the layout says (a pool key, or
    /// a budget key of an acquire with a charge); nothing was written. A
    /// data error: Redis answered, an operator must fix or delete the key.
    #[error("bad key in redis: {key} has type {found}, expected {expected}")]
    WrongKeyType {
        /// The full key name, e.g. `{proxies}:ready`.
        key: String,
        /// The type Redis reports (`string`, `list`, ...).
        found: String,
        /// The type the layout needs (`zset`, `hash`, `set`, `string`,
        /// `integer` for the fence counter, `number` for a budget key).
        expected: String,
    },
    /// `init` on a pool that already has keys.
    #[error(
        "pool {pool} already initialized (some key of it exists; an acquire on a pool without ids writes its node record too): add ids with `pool add`"
    )]
    AlreadyInitialized {
        /// The pool name.
        pool: String,
    },
    /// An id given twice in one call, or (`add`) already in the pool.
    #[error("duplicate id {id}: given twice or already in the pool")]
    DuplicateId {
        /// The id.
        id: String,
    },
    /// `disable`/`enable` of an id the pool does not hold.
    #[error("unknown id {id}: not in the pool")]
    UnknownId {
        /// The id.
        id: String,
    },
    /// `config` of a pool that has no keys: create it with `init` first.
    #[error("pool {pool} does not exist (init it first)")]
    NoPool {
        /// The pool name.
        pool: String,
    },
    /// Redis or the connection failed; the operation may or may not have
    /// run.
    #[error("redis: {}", crate::connection::Readable(.0))]
    Redis(#[source] RedisError),
    /// `init` wrote the pool, but did not see its first record durable (on
    /// every replica and in the primary's snapshot or AOF) within the wait
    /// (60 s): the pool stays closed, and the first acquire that sees the
    /// record durable opens it (docs/pool.md, "First use"); running init
    /// again is refused (the pool exists) and not needed. Exit 3.
    #[error(
        "pool {pool} written, but its first record was not seen durable ({detail}); it stays closed, and the first acquire that sees the record durable opens it: do not run init again (the pool exists)"
    )]
    NotDurable {
        /// The pool name.
        pool: String,
        /// What was not durable in time, or the error of the check.
        detail: String,
    },
    /// A script answered something this version does not understand.
    #[error("unexpected reply from the pool {script} script: {detail}")]
    Reply {
        /// The script name (`acquire`, ...).
        script: &'static str,
        /// What was wrong with the reply.
        detail: String,
    },
}

impl PoolError {
    pub(crate) fn bad(field: &str, expected: impl Into<String>) -> Self {
        Self::BadInput {
            field: field.to_owned(),
            expected: expected.into(),
        }
    }

    /// True when Redis is not serving this client (see
    /// [`crate::connection::is_unavailable`]): what `pool serve`'s readiness
    /// and its 503 follow. A key of the wrong type, or any other answer
    /// Redis gave, is false.
    pub(crate) fn is_redis_unavailable(&self) -> bool {
        matches!(self, Self::Redis(err) if crate::connection::is_unavailable(err))
    }

    /// True for a request the pool refuses as it stands (exit 2): a bad
    /// value, an unknown or duplicate id, no such pool, already set up.
    pub(crate) fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Self::BadInput { .. }
                | Self::DuplicateId { .. }
                | Self::UnknownId { .. }
                | Self::NoPool { .. }
                | Self::AlreadyInitialized { .. }
        )
    }
}

/// Turns the scripts' error replies into their variants (read by the one
/// decoder, `connection::ScriptError`); everything else stays a Redis error.
impl From<RedisError> for PoolError {
    fn from(err: RedisError) -> Self {
        match ScriptError::of(&err) {
            Some(known) => known.into(),
            None => Self::Redis(err),
        }
    }
}

impl From<ScriptError> for PoolError {
    fn from(err: ScriptError) -> Self {
        match err {
            ScriptError::BadArg { field, expected } => Self::BadInput { field, expected },
            ScriptError::KeyType {
                key,
                found,
                expected,
            } => Self::WrongKeyType {
                key,
                found,
                expected,
            },
            ScriptError::PoolExists(pool) => Self::AlreadyInitialized { pool },
            ScriptError::DupId(id) => Self::DuplicateId { id },
            ScriptError::NoId(id) => Self::UnknownId { id },
            ScriptError::NoPool(pool) => Self::NoPool { pool },
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
        let err = PoolError::from(server_error("BADARG", "ttl_ms an integer 1-600000"));
        assert_eq!(
            err.to_string(),
            "invalid ttl_ms: expected an integer 1-600000"
        );
        let err = PoolError::from(server_error("KEYTYPE", "{p}:ready string zset"));
        assert!(
            matches!(&err, PoolError::WrongKeyType { key, found, expected }
                if key == "{p}:ready" && found == "string" && expected == "zset"),
            "{err:?}"
        );
        assert!(matches!(
            PoolError::from(server_error("POOLEXISTS", "p")),
            PoolError::AlreadyInitialized { pool } if pool == "p"
        ));
        assert!(matches!(
            PoolError::from(server_error("DUPID", "a")),
            PoolError::DuplicateId { id } if id == "a"
        ));
        assert!(matches!(
            PoolError::from(server_error("NOID", "a")),
            PoolError::UnknownId { id } if id == "a"
        ));
        assert!(matches!(
            PoolError::from(server_error("NOPOOL", "p")),
            PoolError::NoPool { pool } if pool == "p"
        ));
        assert!(matches!(
            PoolError::from(server_error("WRONGTYPE", "Operation against a key")),
            PoolError::Redis(_)
        ));
    }
}
