//! The one decoder of the error replies snowlease's own Lua scripts answer
//! (`{err = 'CODE detail'}`, codes listed in `pool/common.lua` and
//! `budget/common.lua`): pool and budget errors are both built from it. An
//! error reply redis-rs hands back as a value (`Value::ServerError`) is
//! read as the `RedisError` it converts into (the pool's and the budget's
//! reply decoders do so), so both forms meet the same decoder.

use redis::RedisError;

/// A script's own refusal: nothing was written. Anything else a script
/// call fails with (a Redis error, a reply of Redis itself such as
/// `WRONGTYPE`) is not one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ScriptError {
    /// `BADARG <field> <expected>`: an argument or key name out of range.
    BadArg {
        /// The argument as the script names it (`ttl_ms`, `keys[1]`, ...).
        field: String,
        /// What would have been accepted.
        expected: String,
    },
    /// `KEYTYPE <key> <found> <expected>`: a key holds another Redis type
    /// (or a value the script never writes) than its layout says. A data
    /// error: Redis answered, the key needs an operator, a retry will not
    /// help.
    KeyType {
        /// The full key name.
        key: String,
        /// What it holds: a Redis type (`string`, `hash`, ...).
        found: String,
        /// What the layout needs (`zset`, `hash`, `integer`, `number`, ...).
        expected: String,
    },
    /// `POOLEXISTS <pool>`: init on a pool that has keys.
    PoolExists(String),
    /// `DUPID <id>`: an id twice in one call, or already in the pool.
    DupId(String),
    /// `NOID <id>`: an id the pool does not know.
    NoId(String),
    /// `NOPOOL <pool>`: a pool that has no keys.
    NoPool(String),
}

impl ScriptError {
    /// The script's refusal in `err`, or `None` for any other error.
    pub(crate) fn of(err: &RedisError) -> Option<Self> {
        decode(err.code()?, err.detail()?)
    }
}

/// `code` and the words of `detail`, as the scripts write them. A detail
/// that does not have the words its code needs is not a script's refusal.
fn decode(code: &str, detail: &str) -> Option<ScriptError> {
    let one = || Some(detail.to_owned()).filter(|d| !d.is_empty() && !d.contains(' '));
    Some(match code {
        "BADARG" => {
            let (field, expected) = detail.split_once(' ')?;
            ScriptError::BadArg {
                field: field.to_owned(),
                expected: expected.to_owned(),
            }
        }
        "KEYTYPE" => {
            let mut words = detail.splitn(3, ' ');
            let (key, found, expected) = (words.next()?, words.next()?, words.next()?);
            ScriptError::KeyType {
                key: key.to_owned(),
                found: found.to_owned(),
                expected: expected.to_owned(),
            }
        }
        "POOLEXISTS" => ScriptError::PoolExists(one()?),
        "DUPID" => ScriptError::DupId(one()?),
        "NOID" => ScriptError::NoId(one()?),
        "NOPOOL" => ScriptError::NoPool(one()?),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::classify::server_error;

    #[test]
    fn every_code_of_the_scripts_is_read() {
        let of = |code: &str, detail: &str| ScriptError::of(&server_error(code, detail));
        assert_eq!(
            of("BADARG", "ttl_ms an integer 1-600000"),
            Some(ScriptError::BadArg {
                field: "ttl_ms".into(),
                expected: "an integer 1-600000".into()
            })
        );
        // The pool's keys and the budget's keys, in one form.
        for (detail, key, found, expected) in [
            ("{p}:ready string zset", "{p}:ready", "string", "zset"),
            ("{p}:fence string integer", "{p}:fence", "string", "integer"),
            (
                "{p}:budget:d:example.com hash number",
                "{p}:budget:d:example.com",
                "hash",
                "number",
            ),
        ] {
            assert_eq!(
                of("KEYTYPE", detail),
                Some(ScriptError::KeyType {
                    key: key.into(),
                    found: found.into(),
                    expected: expected.into()
                }),
                "{detail}"
            );
        }
        assert_eq!(
            of("POOLEXISTS", "p"),
            Some(ScriptError::PoolExists("p".into()))
        );
        assert_eq!(of("DUPID", "a"), Some(ScriptError::DupId("a".into())));
        assert_eq!(of("NOID", "a"), Some(ScriptError::NoId("a".into())));
        assert_eq!(of("NOPOOL", "p"), Some(ScriptError::NoPool("p".into())));
    }

    #[test]
    fn other_errors_are_not_a_scripts_refusal() {
        let of = |code: &str, detail: &str| ScriptError::of(&server_error(code, detail));
        assert_eq!(
            of(
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value"
            ),
            None
        );
        assert_eq!(of("ERR", "syntax error"), None);
        assert_eq!(of("KEYTYPE", "k hash"), None, "too few words");
        assert_eq!(of("BADARG", "ttl_ms"), None);
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        assert_eq!(ScriptError::of(&io), None);
    }

    /// An error reply handed back inside `Ok` reads as the same refusal once
    /// converted, as the reply decoders do.
    #[test]
    fn an_error_reply_as_a_value_reads_the_same() {
        let value = redis::parse_redis_value(b"-KEYTYPE {p}:requests string hash\r\n").unwrap();
        let redis::Value::ServerError(err) = value else {
            panic!("{value:?}")
        };
        assert_eq!(
            ScriptError::of(&err.into()),
            Some(ScriptError::KeyType {
                key: "{p}:requests".into(),
                found: "string".into(),
                expected: "hash".into()
            })
        );
    }
}
