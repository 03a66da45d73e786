//! The budget's Lua scripts, each built once with the generated limits and
//! the GCRA helpers of `common.lua` in front, and reply decoding.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::{BudgetError, limits};

/// The helpers every budget script starts with: the generated
/// `BUDGET_LIMITS` table, then `common.lua`.
pub(crate) fn head() -> String {
    limits::lua_table() + include_str!("common.lua")
}

static SOURCES: LazyLock<[String; 2]> =
    LazyLock::new(|| BudgetScript::ALL.map(|s| head() + s.own_source()));

static SCRIPTS: LazyLock<[Script; 2]> = LazyLock::new(|| {
    let [take, penalize] = &*SOURCES;
    [Script::new(take), Script::new(penalize)]
});

/// One budget operation's Lua script; each file's header gives its KEYS,
/// ARGV (times in ms) and replies. Public for tools that call the scripts
/// themselves (benchmarks, tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetScript {
    /// `take.lua`: charge every key, or none.
    Take,
    /// `penalize.lua`: push keys back after a 429/503 of the target.
    Penalize,
}

impl BudgetScript {
    /// Every script.
    pub const ALL: [Self; 2] = [Self::Take, Self::Penalize];

    /// The script, built once (its SHA1 computed once); invoke it with
    /// `invoke_async` so a Redis that lost its script cache reloads it.
    pub fn script(self) -> &'static Script {
        &SCRIPTS[self as usize]
    }

    /// The Lua source as sent.
    pub fn source(self) -> &'static str {
        &SOURCES[self as usize]
    }

    fn own_source(self) -> &'static str {
        match self {
            Self::Take => include_str!("take.lua"),
            Self::Penalize => include_str!("penalize.lua"),
        }
    }

    /// The script's name, as its file and in errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Take => "take",
            Self::Penalize => "penalize",
        }
    }
}

/// The Redis key of `key` in budget `name`: `snowlease:budget:{<name>}:<key>`
/// (every key of one budget in one hash tag, so a take charges several at
/// once on Cluster too). Not checked here.
pub fn budget_key(name: &str, key: &str) -> String {
    format!("snowlease:budget:{{{name}}}:{key}")
}

/// The integers of a script's array reply, in order.
pub(crate) fn ints(script: BudgetScript, value: Value, n: usize) -> Result<Vec<u64>, BudgetError> {
    let bad = |detail: String| BudgetError::Reply {
        script: script.name(),
        detail,
    };
    let items = match value {
        Value::Array(items) => items,
        // An error reply handed back as a value reads as one returned as an error.
        Value::ServerError(err) => return Err(redis::RedisError::from(err).into()),
        value => return Err(bad(format!("expected an array, got {value:?}"))),
    };
    if items.len() != n {
        return Err(bad(format!("expected {n} items, got {items:?}")));
    }
    items
        .into_iter()
        .map(|item| match item {
            Value::Int(i) if i >= 0 => Ok(i as u64),
            other => Err(bad(format!("expected a count, got {other:?}"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_has_the_helpers_and_its_contract() {
        for s in BudgetScript::ALL {
            let src = s.source();
            assert!(
                src.starts_with("-- BUDGET_LIMITS: generated"),
                "{}",
                s.name()
            );
            assert!(src.contains("\n-- common.lua (budget)"), "{}", s.name());
            assert!(src.contains(&format!("-- {}: ", s.name())), "{}", s.name());
            assert!(src.contains("-- KEYS:") && src.contains("-- ARGV:"));
        }
        assert_eq!(
            budget_key("api", "example.com"),
            "snowlease:budget:{api}:example.com"
        );
    }

    /// A script's refusal handed back as a value reads as the same error as
    /// one returned as an error.
    #[test]
    fn an_error_reply_as_a_value_is_the_scripts_refusal() {
        let value = redis::parse_redis_value(b"-KEYTYPE k hash number\r\n").unwrap();
        let err = ints(BudgetScript::Take, value, 5).unwrap_err();
        assert!(
            matches!(&err, BudgetError::WrongKeyType { key, found } if key == "k" && found == "hash"),
            "{err:?}"
        );
    }

    /// The scripts take every range from the generated table: no script's
    /// code (comments aside) writes a bound itself.
    #[test]
    fn scripts_hard_code_no_limit() {
        let mut bounds: Vec<u64> = limits::SCRIPT_RANGES.iter().map(|r| r.max).collect();
        bounds.push(limits::KEY_MAX as u64);
        bounds.retain(|b| *b != 1000 && *b != 1_000_000);
        for s in BudgetScript::ALL {
            let code: String = s.source()[limits::lua_table().len()..]
                .lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect();
            for bound in &bounds {
                assert!(
                    !code.contains(&bound.to_string()),
                    "{} writes {bound}",
                    s.name()
                );
            }
        }
    }
}
