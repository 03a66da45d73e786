//! The Redis connection: URL parsing with redaction, timeouts, and the one
//! place that decides whether a Redis error is worth retrying.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

/// A parsed Redis URL (`redis://` or `rediss://`). Its `Display` and `Debug`
/// never show the password.
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

fn redact(url: &url::Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
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

/// Classifies a redis-rs error by its kind, never by its message.
pub fn classify(err: &RedisError) -> Failure {
    if err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal() {
        return Failure::Transient;
    }
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => Failure::Permanent,
        ErrorKind::AuthenticationFailed => Failure::Permanent,
        ErrorKind::Io => Failure::Transient,
        _ => match err.retry_method() {
            RetryMethod::NoRetry => Failure::Permanent,
            _ => Failure::Transient,
        },
    }
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
    fn bad_urls_are_refused_without_the_password() {
        for url in ["http://h:1", "redis://", "not a url", "redis://:pw@/0"] {
            let err = RedisTarget::parse(url).err().unwrap_or_default();
            assert!(!err.is_empty(), "{url} accepted");
            assert!(!err.contains("pw@"), "{err}");
        }
        assert!(RedisTarget::parse("rediss://h:6379").is_ok());
    }
}
