//! The pool's Lua scripts, each built once with the shared helpers of
//! `common.lua` in front, the key names of a pool, and reply decoding.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::{PoolError, limits};

/// Every script's full source, in the order of [`PoolScript::ALL`]: the
/// generated `LIMITS` table, `node.lua` (node stamps: acquire and init
/// stamp the pool, see acquire.lua), `common.lua`, then the operation.
static SOURCES: LazyLock<Vec<String>> = LazyLock::new(|| {
    let head = limits::lua_table() + crate::lease::node::PRELUDE + include_str!("common.lua");
    PoolScript::ALL
        .iter()
        .map(|s| head.clone() + s.own_source())
        .collect()
});

/// Every script, built once, in the order of [`PoolScript::ALL`].
static SCRIPTS: LazyLock<Vec<Script>> =
    LazyLock::new(|| SOURCES.iter().map(|s| Script::new(s)).collect());

/// One pool operation's Lua script. Each file's header gives its KEYS (in
/// the order of [`PoolScript::keys`]), ARGV (times in ms) and replies.
/// Public for tools that call the scripts themselves (benchmarks, tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolScript {
    /// `init.lua`: create a pool with its first ids.
    Init,
    /// `add.lua`: add new ids.
    Add,
    /// `acquire.lua`: reclaim expired leases, then lease a due id.
    Acquire,
    /// `release.lua`: hand a lease back with a cooldown.
    Release,
    /// `extend.lua`: move a lease's deadline, within the total cap.
    Extend,
    /// `reap.lua`: reclaim expired leases.
    Reap,
    /// `status.lua`: counts by state.
    Status,
    /// `disable.lua`: take ids out of service.
    Disable,
    /// `enable.lua`: put ids back into service.
    Enable,
    /// `config.lua`: read or set the strike setting.
    Config,
}

impl PoolScript {
    /// Every script.
    pub(crate) const ALL: [Self; 10] = [
        Self::Init,
        Self::Add,
        Self::Acquire,
        Self::Release,
        Self::Extend,
        Self::Reap,
        Self::Status,
        Self::Disable,
        Self::Enable,
        Self::Config,
    ];

    /// The script, built once (its SHA1 computed once); invoke it with
    /// `invoke_async` so a Redis that lost its script cache reloads it.
    pub fn script(self) -> &'static Script {
        &SCRIPTS[self as usize]
    }

    /// The Lua source as sent: the `LIMITS` table generated from
    /// [`super::limits`], `node.lua`, the helpers of `common.lua`, then the
    /// operation.
    pub fn source(self) -> &'static str {
        &SOURCES[self as usize]
    }

    fn own_source(self) -> &'static str {
        match self {
            Self::Init => include_str!("init.lua"),
            Self::Add => include_str!("add.lua"),
            Self::Acquire => include_str!("acquire.lua"),
            Self::Release => include_str!("release.lua"),
            Self::Extend => include_str!("extend.lua"),
            Self::Reap => include_str!("reap.lua"),
            Self::Status => include_str!("status.lua"),
            Self::Disable => include_str!("disable.lua"),
            Self::Enable => include_str!("enable.lua"),
            Self::Config => include_str!("config.lua"),
        }
    }

    /// The script's name, as its file and in errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::Add => "add",
            Self::Acquire => "acquire",
            Self::Release => "release",
            Self::Extend => "extend",
            Self::Reap => "reap",
            Self::Status => "status",
            Self::Disable => "disable",
            Self::Enable => "enable",
            Self::Config => "config",
        }
    }

    /// The KEYS the script takes for `pool`, in order.
    pub fn keys(self, keys: &PoolKeys) -> Vec<String> {
        let k = keys;
        let list: &[&String] = match self {
            Self::Init => &[
                &k.ready,
                &k.leases,
                &k.owners,
                &k.fence,
                &k.meta,
                &k.disabled,
                &k.requests,
                &k.parked,
                &k.quarantine,
                &k.reasons,
                &k.strikes,
                &k.autodisabled,
                &k.config,
            ],
            Self::Acquire => &[
                &k.ready,
                &k.leases,
                &k.owners,
                &k.fence,
                &k.meta,
                &k.disabled,
                &k.requests,
                &k.parked,
                &k.quarantine,
                &k.reasons,
            ],
            Self::Release => &[
                &k.ready,
                &k.leases,
                &k.owners,
                &k.meta,
                &k.disabled,
                &k.requests,
                &k.parked,
                &k.quarantine,
                &k.reasons,
                &k.strikes,
                &k.autodisabled,
                &k.config,
            ],
            Self::Reap => &[
                &k.ready,
                &k.leases,
                &k.owners,
                &k.meta,
                &k.disabled,
                &k.requests,
                &k.parked,
                &k.quarantine,
                &k.reasons,
            ],
            Self::Extend => &[&k.leases, &k.owners, &k.meta, &k.requests],
            Self::Add => &[&k.ready, &k.leases, &k.owners, &k.disabled, &k.quarantine],
            Self::Status => &[
                &k.ready,
                &k.leases,
                &k.owners,
                &k.disabled,
                &k.quarantine,
                &k.reasons,
                &k.autodisabled,
                &k.meta,
                &k.fence,
                &k.requests,
            ],
            Self::Disable | Self::Enable => &[
                &k.ready,
                &k.leases,
                &k.owners,
                &k.disabled,
                &k.parked,
                &k.quarantine,
                &k.reasons,
                &k.strikes,
                &k.autodisabled,
            ],
            Self::Config => &[
                &k.ready,
                &k.leases,
                &k.owners,
                &k.fence,
                &k.disabled,
                &k.quarantine,
                &k.config,
            ],
        };
        list.iter().map(|s| (*s).clone()).collect()
    }
}

/// The key names of one pool; all share the hash tag `{<pool>}`.
///
/// The first three are the layout every worker knows (docs/pool.md, "Keys and compatibility"); the
/// others are snowlease's own and may be missing on a pool that plain
/// workers created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKeys {
    /// `{P}:ready`, zset: ids that may be leased once Redis time (ms) >= score.
    pub ready: String,
    /// `{P}:leases`, zset: leased ids; score = deadline (ms, Redis time).
    pub leases: String,
    /// `{P}:owners`, hash: id -> token of the current lease.
    pub owners: String,
    /// `{P}:fence`, string: the per-pool fence counter (INCR); set to 0 by
    /// init.
    pub fence: String,
    /// `{P}:meta`, hash: id -> `"<first_acquired_ms> <cap_ms> <fence>
    /// <request_id or .> <token>"` of the current lease: the extend cap
    /// (fixed at acquire), and whose lease it is.
    pub meta: String,
    /// `{P}:disabled`, set: ids out of service until enabled.
    pub disabled: String,
    /// `{P}:requests`, hash: request id -> `"<fence> <id> <token>"`, the
    /// lease an idempotent acquire got, kept while that lease lasts.
    pub requests: String,
    /// `{P}:parked`, hash: disabled id -> the ms it is due (a cooldown
    /// still running when it was disabled), for enable.
    pub parked: String,
    /// `{P}:quarantine`, zset: quarantined ids; score = the ms the
    /// quarantine ends (Redis time). Such ids are in neither ready nor
    /// leases until then.
    pub quarantine: String,
    /// `{P}:reasons`, hash: quarantined id -> the reason given (free text,
    /// may be empty).
    pub reasons: String,
    /// `{P}:strikes`, hash: id -> its quarantine times (ms, space
    /// separated) within the strike window.
    pub strikes: String,
    /// `{P}:autodisabled`, hash: id disabled by strikes -> `"<at_ms>
    /// <what happened>"`; cleared by enable.
    pub autodisabled: String,
    /// `{P}:config`, hash: the pool's settings (`max_strikes`,
    /// `strike_window_ms`; both absent when strikes are off).
    pub config: String,
}

impl PoolKeys {
    /// The keys of pool `pool` (not checked here; [`super::Pool::new`]
    /// checks the name).
    pub fn new(pool: &str) -> Self {
        let prefix = format!("{{{pool}}}:");
        let key = |suffix: &str| format!("{prefix}{suffix}");
        Self {
            ready: key("ready"),
            leases: key("leases"),
            owners: key("owners"),
            fence: key("fence"),
            meta: key("meta"),
            disabled: key("disabled"),
            requests: key("requests"),
            parked: key("parked"),
            quarantine: key("quarantine"),
            reasons: key("reasons"),
            strikes: key("strikes"),
            autodisabled: key("autodisabled"),
            config: key("config"),
        }
    }
}

/// Decodes a script's array reply.
pub(crate) struct Reply {
    script: &'static str,
    items: std::vec::IntoIter<Value>,
}

impl Reply {
    pub(crate) fn new(script: PoolScript, value: Value) -> Result<Self, PoolError> {
        match value {
            Value::Array(items) => Ok(Self {
                script: script.name(),
                items: items.into_iter(),
            }),
            // An error reply handed back as a value reads as one returned as an error.
            Value::ServerError(err) => Err(redis::RedisError::from(err).into()),
            other => Err(PoolError::Reply {
                script: script.name(),
                detail: format!("expected an array, got {other:?}"),
            }),
        }
    }

    fn error(&self, detail: String) -> PoolError {
        PoolError::Reply {
            script: self.script,
            detail,
        }
    }

    pub(crate) fn int(&mut self) -> Result<i64, PoolError> {
        match self.items.next() {
            Some(Value::Int(n)) => Ok(n),
            other => Err(self.error(format!("expected an integer, got {other:?}"))),
        }
    }

    pub(crate) fn uint(&mut self) -> Result<u64, PoolError> {
        let n = self.int()?;
        u64::try_from(n)
            .map_err(|_| self.error(format!("expected a non-negative integer, got {n}")))
    }

    pub(crate) fn string(&mut self) -> Result<String, PoolError> {
        match self.items.next() {
            Some(Value::BulkString(bytes)) => {
                String::from_utf8(bytes).map_err(|e| self.error(format!("not UTF-8: {e}")))
            }
            Some(Value::SimpleString(s)) => Ok(s),
            other => Err(self.error(format!("expected a string, got {other:?}"))),
        }
    }

    /// A string that is shown to people only: not UTF-8 is replaced, not
    /// refused (a worker writing raw may have stored any bytes).
    pub(crate) fn text(&mut self) -> Result<String, PoolError> {
        match self.items.next() {
            Some(Value::BulkString(bytes)) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            other => Err(self.error(format!("expected a string, got {other:?}"))),
        }
    }

    pub(crate) fn rest_strings(&mut self) -> Result<Vec<String>, PoolError> {
        let mut out = Vec::with_capacity(self.items.len());
        while self.items.len() > 0 {
            out.push(self.string()?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_hash_tag() {
        let keys = PoolKeys::new("proxies");
        assert_eq!(keys.ready, "{proxies}:ready");
        assert_eq!(keys.leases, "{proxies}:leases");
        assert_eq!(keys.owners, "{proxies}:owners");
        assert_eq!(keys.requests, "{proxies}:requests");
        assert_eq!(
            PoolScript::Extend.keys(&keys),
            [
                "{proxies}:leases",
                "{proxies}:owners",
                "{proxies}:meta",
                "{proxies}:requests"
            ]
        );
    }

    /// A script's refusal handed back as a value reads as the same error as
    /// one returned as an error: the key is named, never "unexpected reply".
    #[test]
    fn an_error_reply_as_a_value_is_the_scripts_refusal() {
        let value = redis::parse_redis_value(b"-KEYTYPE {p}:meta set hash\r\n").unwrap();
        let err = Reply::new(PoolScript::Extend, value).err().unwrap();
        assert!(
            matches!(&err, PoolError::WrongKeyType { key, found, expected }
                if key == "{p}:meta" && found == "set" && expected == "hash"),
            "{err:?}"
        );
    }

    #[test]
    fn every_script_has_the_helpers_and_its_contract() {
        for s in PoolScript::ALL {
            let src = s.source();
            assert!(src.starts_with("-- LIMITS: generated"), "{}", s.name());
            assert!(src.contains("\n-- common.lua"), "{}", s.name());
            assert!(src.contains(&format!("-- {}: ", s.name())), "{}", s.name());
            assert!(src.contains("-- KEYS:") && src.contains("-- ARGV:"));
            assert_eq!(s.script().get_hash().len(), 40);
        }
    }
}
