//! The Redis connection: URL parsing with redaction, timeouts, and the one
//! place that decides whether a Redis error is worth retrying.

use std::fmt;
use std::sync::Once;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

/// A parsed Redis URL (`redis://` or `rediss://`). Its `Display` and `Debug`
/// never show the password, nor a user name given without one (that is
/// `redis://PASSWORD@host` mistyped).
#[derive(Clone)]
pub struct RedisTarget {
    url: String,
    redacted: String,
}

impl RedisTarget {
    /// Parses and checks a URL the way redis-rs will use it.
    ///
    /// Errors: a message (without the password) when the URL does not parse,
    /// its scheme is not `redis`/`rediss`, or it names no host.
    pub fn parse(url: &str) -> Result<Self, String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("cannot parse URL: {e}"))?;
        let redacted = redact(&parsed);
        if !matches!(parsed.scheme(), "redis" | "rediss") {
            return Err(format!(
                "{redacted}: scheme must be redis:// or rediss:// (TLS)"
            ));
        }
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("{redacted}: no host"));
        }
        redis::Client::open(url).map_err(|e| format!("{redacted}: {e}"))?;
        Ok(Self {
            url: url.to_owned(),
            redacted,
        })
    }

    /// Opens a connection manager that connects lazily and reconnects on its
    /// own; every command times out after `timeout`.
    ///
    /// Errors only on an invalid client configuration; an unreachable server
    /// shows up as errors of the first commands instead.
    pub fn connect(&self, timeout: Duration) -> redis::RedisResult<ConnectionManager> {
        install_crypto_provider();
        let client = redis::Client::open(self.url.as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            // Callers own the retry policy; the manager only reconnects.
            .set_number_of_retries(1)
            .set_max_delay(timeout);
        ConnectionManager::new_lazy_with_config(client, config)
    }
}

/// Installs ring as rustls's process-wide crypto provider; without one the
/// first `rediss://` connection panics. Harmless when already installed.
fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

fn redact(url: &url::Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    } else if !shown.username().is_empty() {
        let _ = shown.set_username("***");
    }
    shown.to_string()
}

impl fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisTarget({})", self.redacted)
    }
}

/// How the caller should treat a failed Redis call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Connection trouble, timeouts, loading, failover: the same call may
    /// succeed later. The command may or may not have run.
    Transient,
    /// Permissions, wrong types, bad scripts: retrying will not help.
    Permanent,
}

/// Classifies a redis-rs error by its kind and error code, never by its
/// message.
pub fn classify(err: &RedisError) -> Failure {
    if err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal() {
        return Failure::Transient;
    }
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => Failure::Permanent,
        ErrorKind::AuthenticationFailed => Failure::Permanent,
        ErrorKind::Io => Failure::Transient,
        // Server states that pass: loading a dump, failover, a replica, a
        // cluster resharding.
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => Failure::Transient,
        // Codes redis-rs has no kind for: out of memory (maxmemory with
        // noeviction), a long script running, a failed RDB save, too few
        // replicas for min-replicas-to-write. An operator or time fixes them.
        ErrorKind::Extension => match err.code() {
            Some("OOM" | "BUSY" | "MISCONF" | "NOREPLICAS") => Failure::Transient,
            _ => Failure::Permanent,
        },
        _ => match err.retry_method() {
            RetryMethod::NoRetry => Failure::Permanent,
            _ => Failure::Transient,
        },
    }
}

/// True when Redis refused a command to this user: `NOPERM`, or an ACL
/// refusal inside a script (which Redis reports as `ERR`).
pub(crate) fn is_permission_error(err: &RedisError) -> bool {
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => true,
        ErrorKind::Server(ServerErrorKind::ResponseError) => {
            err.detail().is_some_and(is_script_acl_message)
        }
        _ => false,
    }
}

/// True when the login failed: wrong user name or password (`WRONGPASS`).
pub(crate) fn is_auth_error(err: &RedisError) -> bool {
    err.kind() == ErrorKind::AuthenticationFailed || err.code() == Some("WRONGPASS")
}

/// The one test on message text: Redis reports an ACL refusal of a command
/// called by a script with the generic code `ERR`, so only the text tells it
/// apart. Redis 7.0 says "The user executing the script can't run this
/// command or subcommand"; 7.2 and later say "ACL failure in script: ...".
fn is_script_acl_message(detail: &str) -> bool {
    detail.starts_with("The user executing the script can't run")
        || detail.starts_with("ACL failure in script")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_never_shown() {
        let target = RedisTarget::parse("redis://user:s3cret@redis.example:6380/2").unwrap();
        let shown = format!("{target} {target:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("redis.example:6380"), "{shown}");
    }

    #[test]
    fn user_name_without_password_is_hidden() {
        // `redis://PASSWORD@host`: url parses the secret as the user name.
        let target = RedisTarget::parse("redis://s3cret@redis.example:6380").unwrap();
        let shown = format!("{target} {target:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("***@redis.example:6380"), "{shown}");
        let plain = RedisTarget::parse("redis://redis.example:6380/1").unwrap();
        assert_eq!(plain.to_string(), "redis://redis.example:6380/1");
    }

    #[test]
    fn server_states_that_pass_are_transient() {
        for (code, detail) in [
            ("OOM", "command not allowed when used memory > 'maxmemory'."),
            ("BUSY", "Redis is busy running a script."),
            ("LOADING", "Redis is loading the dataset in memory"),
            ("READONLY", "You can't write against a read only replica."),
            ("MASTERDOWN", "Link with MASTER is down"),
            ("TRYAGAIN", "Multiple keys request during rehashing of slot"),
            ("CLUSTERDOWN", "The cluster is down"),
        ] {
            let err = server_error(code, detail);
            assert_eq!(classify(&err), Failure::Transient, "{code}: {err}");
            assert!(!is_permission_error(&err), "{code}");
        }
    }

    #[test]
    fn refusals_are_permanent_and_named() {
        let noperm = server_error(
            "NOPERM",
            "this user has no permissions to run the 'del' command",
        );
        let script_acl = server_error(
            "ERR",
            "The user executing the script can't run this command or subcommand script: 49, on @user_script:1.",
        );
        let wrongpass = server_error("WRONGPASS", "invalid username-password pair");
        let syntax = server_error("ERR", "syntax error");
        for err in [&noperm, &script_acl, &wrongpass, &syntax] {
            assert_eq!(classify(err), Failure::Permanent, "{err}");
        }
        assert!(is_permission_error(&noperm) && is_permission_error(&script_acl));
        assert!(!is_permission_error(&wrongpass) && !is_permission_error(&syntax));
        assert!(is_auth_error(&wrongpass) && !is_auth_error(&noperm));
        let auth: RedisError = (
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )
            .into();
        assert!(is_auth_error(&auth) && !is_permission_error(&auth));
    }

    /// A server error as redis-rs parses it from the reply `-CODE detail`.
    fn server_error(code: &str, detail: &str) -> RedisError {
        let reply = format!("-{code} {detail}\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(redis::Value::ServerError(err)) => err.into(),
            other => panic!("not a server error: {other:?}"),
        }
    }

    #[test]
    fn bad_urls_are_refused_without_the_password() {
        for url in ["http://h:1", "redis://", "not a url", "redis://:pw@/0"] {
            let err = RedisTarget::parse(url).err().unwrap_or_default();
            assert!(!err.is_empty(), "{url} accepted");
            assert!(!err.contains("pw@"), "{err}");
        }
        assert!(RedisTarget::parse("rediss://h:6379").is_ok());
    }
}
