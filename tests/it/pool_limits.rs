//! The one table of pool limits (`snowlease::pool::limits`) against the
//! scripts on a real redis-server: at each boundary of each range, name
//! and token rule, the Lua side refuses exactly what the Rust side refuses.

use redis::Value;
use snowlease::pool::limits::{self, Range};
use snowlease::pool::{PoolError, PoolKeys, PoolScript};

use crate::harness::RedisServer;
use crate::pool::raw;

/// What a raw script call said about `field`: `true` when it refused it
/// as bad input, `false` when it got past that check. A refusal of another
/// field means the probe itself is wrong.
#[track_caller]
fn refused(result: Result<Value, PoolError>, field: &str) -> bool {
    match result {
        Err(PoolError::BadInput { field: f, .. }) => {
            assert_eq!(f, field, "the probe for {field} broke another argument");
            true
        }
        _ => false,
    }
}

/// Values at and around the boundaries of `range`.
fn around(range: Range) -> Vec<u64> {
    let mut values = vec![range.min, range.max, range.max + 1];
    if range.min > 0 {
        values.push(range.min - 1);
    }
    values
}

/// Lengths at and around 1 and `max`.
fn lengths(max: usize) -> [usize; 4] {
    [0, 1, max, max + 1]
}

struct Probe<'a> {
    redis: &'a RedisServer,
    keys: PoolKeys,
}

impl Probe<'_> {
    fn call(&self, script: PoolScript, args: &[&str]) -> Result<Value, PoolError> {
        raw(self.redis, script, &script.keys(&self.keys), args)
    }

    /// Whether the scripts refuse `value` for the range named `field`.
    fn range(&self, field: &str, value: u64, n: usize) -> bool {
        let v = value.to_string();
        let v = v.as_str();
        let result = match field {
            "ttl_ms" => self.call(PoolScript::Acquire, &["tok", v, "0", "86400000"]),
            "cooldown_ms" => self.call(PoolScript::Release, &["a", "tok", v]),
            "max_lease_ms" => self.call(PoolScript::Extend, &["a", "tok", "1", v]),
            "limit" => self.call(PoolScript::Reap, &[v, "0"]),
            "quarantine_ms" => self.call(PoolScript::Release, &["a", "tok", "0", v, ""]),
            "max_strikes" => self.call(PoolScript::Config, &[v, "1000"]),
            "strike_window_ms" => self.call(PoolScript::Config, &["1", v]),
            "ids" => {
                let ids: Vec<String> = (0..value).map(|i| format!("n{n}-{i}")).collect();
                let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                self.call(PoolScript::Add, &ids)
            }
            other => panic!("no probe for the range {other}: add one"),
        };
        refused(result, field)
    }
}

/// Every range of the table: the scripts refuse a value exactly when
/// `Range::allows` (which the API, CLI and HTTP checks use) does.
#[test]
fn scripts_refuse_exactly_the_ranges_of_the_table() {
    let redis = RedisServer::start();
    let probe = Probe {
        redis: &redis,
        keys: PoolKeys::new("p"),
    };
    assert!(!refused(
        probe.call(PoolScript::Init, &["off", "off", "600000", "a"]),
        "ids"
    ));
    let mut n = 0;
    for range in limits::SCRIPT_RANGES {
        for value in around(range) {
            n += 1;
            assert_eq!(
                probe.range(range.field, value, n),
                !range.allows(value),
                "{} = {value}: Lua and Rust disagree",
                range.field
            );
        }
    }
}

/// Names (pool, id, request id) and tokens: the scripts refuse exactly what
/// `limits::is_name` / `limits::is_token` refuse, at each length boundary
/// and for characters outside the set.
#[test]
fn scripts_refuse_exactly_the_names_and_tokens_of_the_table() {
    let redis = RedisServer::start();
    let probe = Probe {
        redis: &redis,
        keys: PoolKeys::new("p"),
    };
    probe
        .call(PoolScript::Init, &["off", "off", "600000", "a"])
        .unwrap();
    let mut names: Vec<String> = lengths(limits::NAME_MAX)
        .iter()
        .map(|n| "x".repeat(*n))
        .collect();
    names.extend(["a b", "a{b", "a}b", "a:b", "a.b", "é", "a\nb", "A-z_09"].map(String::from));
    for name in &names {
        let rust = !limits::is_name(name);
        let id = refused(probe.call(PoolScript::Release, &[name, "tok", "0"]), "id");
        let request = refused(
            probe.call(PoolScript::Acquire, &["tok", "1", "0", "1", name]),
            "request_id",
        );
        let keys = PoolScript::Status.keys(&PoolKeys::new(name));
        let pool = refused(raw(&redis, PoolScript::Status, &keys, &[]), "pool");
        assert_eq!((id, request, pool), (rust, rust, rust), "name {name:?}");
    }
    let mut tokens: Vec<String> = lengths(limits::TOKEN_MAX)
        .iter()
        .map(|n| "t".repeat(*n))
        .collect();
    tokens.push("é".repeat(limits::TOKEN_MAX / 2)); // bytes, not chars
    tokens.push("é".repeat(limits::TOKEN_MAX / 2 + 1));
    for token in &tokens {
        let lua = refused(probe.call(PoolScript::Release, &["a", token, "0"]), "token");
        assert_eq!(
            lua,
            !limits::is_token(token),
            "token of {} bytes",
            token.len()
        );
    }
}
