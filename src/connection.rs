//! The Redis connection: URL parsing with redaction and the connection
//! settings built from it (`connection/target.rs`), the one connection
//! handle every mode uses over standalone, Sentinel and Cluster
//! (`connection/handle.rs`; opening and topology detection in `open.rs`,
//! Sentinel discovery in `sentinel.rs`, routing of calls in `route.rs`),
//! the one table that decides what a failed call means
//! (`connection/classify.rs`), and the one decoder of the error replies
//! of snowlease's own scripts (`connection/script_error.rs`).

mod classify;
mod handle;
mod open;
mod refusal;
mod route;
mod script_error;
mod sentinel;
mod slots;
mod target;

use std::fmt;
use std::sync::Once;

use redis::{ErrorKind, RedisError};

pub(crate) use classify::{Failure, classify, is_unavailable};
pub(crate) use classify::{is_auth_error, is_certificate_error, is_permission_error};
pub use handle::{Keyspace, Redis};
pub(crate) use script_error::ScriptError;
pub use target::RedisTarget;

/// A connection that can say whether its last write counts: behind Sentinel a demoted
/// primary still takes writes for seconds after a failover (until Sentinel turns it into a
/// replica, about 8-12 s here), and they are lost, so what such a write handed out would be
/// handed out again by the new primary (docs/operations.md, "Sentinel").
pub trait ConfirmPrimary: Send {
    /// Sentinel: whether this clone's last call ran on the node a majority of the Sentinels
    /// name as primary now, and that node still answers `ROLE` as master (asked within the
    /// call timeout; no answer is no). Standalone and Cluster: true, at no cost.
    fn confirm_primary(&mut self) -> impl std::future::Future<Output = bool> + Send;
}

/// The error of `what` (`the acquire`, `the renew`) that [`ConfirmPrimary::confirm_primary`]
/// did not confirm: the Sentinels' failover error (I/O kind), so every caller takes it as a
/// failover (retried; a new connection asks the Sentinels again).
pub(crate) fn unconfirmed(what: &str) -> RedisError {
    sentinel::in_failover(&format!(
        "{what} ran on a node that the Sentinels do not name as the primary now; it does not count, try again"
    ))
}

impl ConfirmPrimary for Redis {
    fn confirm_primary(&mut self) -> impl std::future::Future<Output = bool> + Send {
        Redis::confirm_primary(self)
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

/// Turns connect errors that no retry fixes into configuration errors
/// (`InvalidClientConfig`, classified permanent) that name the cause: an
/// untrusted TLS certificate, a master name no Sentinel knows.
///
/// A certificate error once a connection was opened before (`ran_before`)
/// is a failed connect (I/O kind, transient), retried until the lease's
/// deadline: certificates and CA bundles rotate during a run (cert-manager),
/// and the files are read again at the next attempt (credentials rotate during a run). At the
/// first connect it is a configuration error.
fn explain(target: &RedisTarget, err: RedisError, ran_before: bool) -> RedisError {
    if is_certificate_error(&err) {
        let kind = match ran_before {
            true => ErrorKind::Io,
            false => ErrorKind::InvalidClientConfig,
        };
        return (
            kind,
            "TLS certificate error: trust the server's CA with --redis-ca-file (REDIS_CA_FILE) or the system store (SSL_CERT_FILE); a server that asks for a client certificate needs --redis-cert-file and --redis-key-file",
            format!("{target}: {}", Readable(&err)),
        )
            .into();
    }
    if err.kind() == ErrorKind::MasterNameNotFoundBySentinel {
        return (
            ErrorKind::InvalidClientConfig,
            "no Sentinel knows the master named in the URL",
            target.to_string(),
        )
            .into();
    }
    if err.kind() == ErrorKind::InvalidClientConfig {
        return (
            ErrorKind::InvalidClientConfig,
            "redis connection",
            format!("{target}: {}", Readable(&err)),
        )
            .into();
    }
    err
}

/// The value of `name` in an `INFO` text (`name:value` lines, CRLF-ended;
/// Redis docs, INFO), the one place that reads one; `None` without it.
pub(crate) fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (key, value) = line.trim_end().split_once(':')?;
        (key == name).then_some(value)
    })
}

/// A redis-rs error for people, the one place that renders one: what
/// redis-rs' `Display` says without the kind's debug name (`- InvalidClientConfig`,
/// `NoPerm:`, `Server(NoPerm)`), a server's refusal as Redis wrote it
/// (`NOPERM this user has no permissions to run the 'info' command`), a
/// pipeline's failures by command. Errors this crate builds around another
/// one render the inner one with it too, so no kind name leaks.
pub(crate) struct Readable<'a>(pub &'a RedisError);

impl fmt::Display for Readable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let err = self.0;
        let text = err.to_string();
        if let Some(items) = err.clone().into_server_errors() {
            let several = text.starts_with("Pipeline failure") || items.len() > 1;
            if text.starts_with("Transaction aborted") {
                f.write_str("transaction aborted: ")?;
            }
            for (n, (index, item)) in items.iter().enumerate() {
                if n > 0 {
                    f.write_str("; ")?;
                }
                if several {
                    write!(f, "command {} of the pipeline: ", index + 1)?;
                }
                match item.details() {
                    Some(detail) => write!(f, "{} {detail}", item.code())?,
                    None => f.write_str(item.code())?,
                }
            }
            return Ok(());
        }
        // `General`: "<description> - <Kind:?>[: <detail>]"; a detail that
        // is another error's text (Cluster: "Failed to create initial
        // connections") ends with that one's kind.
        let marker = format!(" - {:?}", err.kind());
        let text = match text.find(&marker) {
            Some(at) => format!("{}{}", &text[..at], &text[at + marker.len()..]),
            None => text,
        };
        let inner = format!(" - {:?}", ErrorKind::AuthenticationFailed);
        f.write_str(text.strip_suffix(&inner).unwrap_or(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `INFO` fields are read by name, whole: `rdb_saves` is not `rdb_saves_x`, a value keeps
    /// its colons, CR is dropped.
    #[test]
    fn info_fields_are_read_by_whole_name() {
        let text = "# Persistence\r\nrdb_saves_x:9\r\nrdb_saves:3\r\nslave0:ip=::1,port=1\r\n";
        assert_eq!(info_field(text, "rdb_saves"), Some("3"));
        assert_eq!(info_field(text, "slave0"), Some("ip=::1,port=1"));
        assert_eq!(info_field(text, "rdb"), None);
    }
    use classify::server_error;

    /// redis-rs' `Display` names its kinds ("Server(NoPerm): NoPerm: ...",
    /// "Password authentication failed - AuthenticationFailed"); people get
    /// the text without them.
    #[test]
    fn errors_read_without_kind_names() {
        let noperm = server_error(
            "NOPERM",
            "this user has no permissions to run the 'info' command",
        );
        assert_eq!(
            Readable(&noperm).to_string(),
            "NOPERM this user has no permissions to run the 'info' command"
        );
        let auth: RedisError = (
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )
            .into();
        assert_eq!(
            Readable(&auth).to_string(),
            "Password authentication failed"
        );
        let target =
            RedisTarget::parse("redis+sentinel://u:s3cret@127.0.0.1:1/nomaster/0").unwrap();
        let unknown: RedisError = (
            ErrorKind::MasterNameNotFoundBySentinel,
            "the Sentinel does not know the master",
        )
            .into();
        let shown = Readable(&explain(&target, unknown, false)).to_string();
        assert_eq!(
            shown,
            "no Sentinel knows the master named in the URL: redis+sentinel://127.0.0.1:1/nomaster/0"
        );
        let mismatch: RedisError = (
            ErrorKind::InvalidClientConfig,
            "not a Cluster node",
            "127.0.0.1:1".to_owned(),
        )
            .into();
        let shown = Readable(&explain(&target, mismatch, false)).to_string();
        assert_eq!(
            shown,
            "redis connection: redis+sentinel://127.0.0.1:1/nomaster/0: not a Cluster node: 127.0.0.1:1"
        );
        let cluster: RedisError = (
            ErrorKind::Io,
            "Failed to create initial connections",
            auth.to_string(),
        )
            .into();
        assert_eq!(
            Readable(&cluster).to_string(),
            "Failed to create initial connections: Password authentication failed"
        );
        // A step named around a refusal (lease::step) renders the refusal too.
        let stepped: RedisError = (
            noperm.kind(),
            "INFO failed (needs +info)",
            Readable(&noperm).to_string(),
        )
            .into();
        assert_eq!(
            Readable(&stepped).to_string(),
            "INFO failed (needs +info): NOPERM this user has no permissions to run the 'info' command"
        );
        for err in [&noperm, &auth, &stepped, &cluster] {
            let shown = Readable(err).to_string();
            for kind in [
                "NoPerm",
                "Server(",
                "AuthenticationFailed",
                "InvalidClientConfig",
            ] {
                assert!(!shown.contains(kind), "{shown}");
            }
        }
    }
}
