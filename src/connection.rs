//! The Redis connection: URL parsing with redaction (`connection/target.rs`), the one
//! connection handle every mode uses over standalone, Sentinel and Cluster
//! (`connection/handle.rs`), and the one place that decides whether a Redis error is
//! worth retrying.

mod handle;
mod refusal;
mod slots;
mod target;

use std::fmt;
use std::sync::Once;

use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

pub use handle::{Reconnects, Redis};
pub use target::{FileRefused, RedisTarget, Topology};

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
/// untrusted TLS certificate (issue 9.2), a master name no Sentinel knows.
///
/// A certificate error once a connection was opened before (`ran_before`)
/// is a failed connect (I/O kind, transient), retried until the lease's
/// deadline: certificates and CA bundles rotate during a run (cert-manager),
/// and the files are read again at the next attempt (issue 20.4). At the
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

/// A redis-rs error for people, the one place that renders one: what
/// redis-rs' `Display` says without the kind's debug name (`- InvalidClientConfig`,
/// `NoPerm:`, `Server(NoPerm)`), a server's refusal as Redis wrote it
/// (`NOPERM this user has no permissions to run the 'info' command`), a
/// pipeline's failures by command. Errors this crate builds around another
/// one render the inner one with it too, so no kind name leaks.
pub struct Readable<'a>(pub &'a RedisError);

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

/// True for a TLS certificate the client or the server refused. rustls's
/// error is boxed inside an I/O error that redis-rs keeps private, so only
/// its text (rustls's `Display`, stable across 0.23) tells it apart.
pub(crate) fn is_certificate_error(err: &RedisError) -> bool {
    let text = err.to_string();
    text.contains("invalid peer certificate")
        || (text.contains("received fatal alert")
            && ["Certificate", "UnknownCA"]
                .iter()
                .any(|a| text.contains(a)))
        || text.contains("no client certificate")
}

/// How the caller should treat a failed Redis call: the one table
/// (docs/operations.md, "Which errors end what") that the worker keeper and
/// `lock` follow, at start and while a lease is held. That the key is
/// someone else's is never an error: only a script's answer says so
/// ([`crate::lease::RenewOutcome::Lost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Connection trouble, timeouts, loading, failover: the same call may
    /// succeed later. The command may or may not have run. Retried at start
    /// (until `--claim-timeout`, `--wait`) and while a lease is held (until
    /// its validity deadline).
    Transient,
    /// Redis or its TLS peer refused this client: a wrong user name or
    /// password (`WRONGPASS`), an ACL refusal (`NOPERM`, or one inside a
    /// script), a certificate either side does not trust. Permanent at
    /// start (a configuration to fix: exit 1). While a lease is held it says
    /// nothing about the key, which stays ours until Redis expires it (no
    /// write of ours ran): retried until the validity deadline, so a
    /// password or CA rotation done in the wrong order costs no ID.
    Refused,
    /// Wrong types, bad scripts, a topology that does not match the URL:
    /// retrying will not help, at start or while held.
    Permanent,
}

impl Failure {
    /// Whether a call that failed so is tried again before anything is
    /// held (start-up probe, claim, acquire): only when transient.
    pub fn retried_at_start(self) -> bool {
        self == Self::Transient
    }

    /// Whether a renewal that failed so is tried again while a lease is
    /// held, until its validity deadline: all but [`Failure::Permanent`].
    pub fn retried_while_held(self) -> bool {
        self != Self::Permanent
    }
}

/// Classifies a redis-rs error by its kind and error code, never by its
/// message (except the two texts that have no code: an ACL refusal inside
/// a script, `is_permission_error`, and a TLS certificate error,
/// `is_certificate_error`).
pub fn classify(err: &RedisError) -> Failure {
    verdict(err).failure
}

/// True when the connection a call failed on is not to be used again (the
/// next call opens a new one, which resolves the host name again, or asks
/// the Sentinels): connection trouble, and a node that is not (or no longer)
/// a usable primary: `READONLY` (a replica), `MASTERDOWN` (a replica without
/// its primary), `LOADING` (a restarted node, or a replica after a full
/// sync). A managed Redis fails over by moving a DNS name; only a new
/// connection follows it. Read from the same table as [`classify`].
pub(crate) fn needs_new_connection(err: &RedisError) -> bool {
    verdict(err).new_connection
}

/// The one table behind [`classify`] and [`needs_new_connection`].
struct Verdict {
    failure: Failure,
    new_connection: bool,
}

fn verdict(err: &RedisError) -> Verdict {
    let (transient, permanent) = (Failure::Transient, Failure::Permanent);
    let verdict = |failure, new_connection| Verdict {
        failure,
        new_connection,
    };
    // A certificate error on a reconnect during a run was made an I/O error
    // by `explain` (a rotation in progress: transient); at the first connect
    // it is a configuration error, refused.
    let refused_certificate = is_certificate_error(err) && err.kind() != ErrorKind::Io;
    if is_auth_error(err) || is_permission_error(err) || refused_certificate {
        return verdict(Failure::Refused, false);
    }
    if err.is_timeout() || err.is_connection_dropped() || err.is_connection_refusal() {
        return verdict(transient, true);
    }
    match err.kind() {
        ErrorKind::Io => verdict(transient, true),
        // Not (or no longer) a primary: a replica, one without its primary,
        // one loading a dump. Another node (or this one later) serves.
        ErrorKind::Server(
            ServerErrorKind::BusyLoading | ServerErrorKind::MasterDown | ServerErrorKind::ReadOnly,
        ) => verdict(transient, true),
        // Server states that pass on the same node: failover of a slot, a
        // cluster resharding.
        ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
            verdict(transient, false)
        }
        // Codes redis-rs has no kind for: out of memory (maxmemory with
        // noeviction), a long script running, a failed RDB save, too few
        // replicas for min-replicas-to-write. An operator or time fixes them.
        ErrorKind::Extension => match err.code() {
            Some("OOM" | "BUSY" | "MISCONF" | "NOREPLICAS") => verdict(transient, false),
            _ => verdict(permanent, false),
        },
        _ => match err.retry_method() {
            RetryMethod::NoRetry => verdict(permanent, false),
            _ => verdict(transient, false),
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

/// True when the login failed: wrong user name or password (`WRONGPASS`),
/// or a password the server requires and this client did not send
/// (`NOAUTH`: `requirepass` set before the client has it).
/// redis-rs' Cluster client returns a login that failed on every seed node
/// as an I/O error ("Failed to create initial connections") whose detail is
/// the inner error's text ("Password authentication failed -
/// AuthenticationFailed"); only that text is left to tell it apart.
pub(crate) fn is_auth_error(err: &RedisError) -> bool {
    let wrapped = format!(" - {:?}", ErrorKind::AuthenticationFailed);
    err.kind() == ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH"))
        || (err.kind() == ErrorKind::Io && err.detail().is_some_and(|d| d.ends_with(&wrapped)))
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

    /// Every row of docs/operations.md "Which errors end what", as redis-rs hands the
    /// error over: server replies parsed from the wire, I/O errors as the connection
    /// reports them, certificate errors as rustls words them (raw and after [`explain`]).
    #[test]
    fn every_row_of_the_error_table() {
        let target = RedisTarget::parse("rediss://u:s3cret@127.0.0.1:1").unwrap();
        let io = |kind: std::io::ErrorKind| RedisError::from(std::io::Error::from(kind));
        let untrusted = || -> RedisError {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            )
            .into()
        };
        let alert = |alert: rustls::AlertDescription| -> RedisError {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::AlertReceived(alert),
            )
            .into()
        };
        let transient = [
            io(std::io::ErrorKind::ConnectionRefused),
            io(std::io::ErrorKind::ConnectionReset),
            io(std::io::ErrorKind::BrokenPipe),
            io(std::io::ErrorKind::UnexpectedEof),
            io(std::io::ErrorKind::TimedOut),
            std::io::Error::other("no Sentinel answers (127.0.0.1:1)").into(),
            server_error("OOM", "command not allowed when used memory > 'maxmemory'."),
            server_error("BUSY", "Redis is busy running a script."),
            server_error("LOADING", "Redis is loading the dataset in memory"),
            server_error("READONLY", "You can't write against a read only replica."),
            server_error("MASTERDOWN", "Link with MASTER is down"),
            server_error("MISCONF", "Redis is configured to save RDB snapshots"),
            server_error("NOREPLICAS", "Not enough good replicas to write."),
            server_error("TRYAGAIN", "Multiple keys request during rehashing of slot"),
            server_error("CLUSTERDOWN", "The cluster is down"),
            server_error("MOVED", "3999 127.0.0.1:6381"),
            // On a reconnect during a run (a rotation in progress), and as
            // redis-rs' own Cluster reconnects report it (I/O kind).
            explain(&target, untrusted(), true),
            untrusted(),
            alert(rustls::AlertDescription::UnknownCA),
        ];
        let refused = [
            server_error("NOAUTH", "Authentication required."),
            server_error(
                "WRONGPASS",
                "invalid username-password pair or user is disabled.",
            ),
            (
                ErrorKind::AuthenticationFailed,
                "Password authentication failed",
            )
                .into(),
            server_error(
                "NOPERM",
                "this user has no permissions to run the 'evalsha' command",
            ),
            server_error(
                "ERR",
                "The user executing the script can't run this command or subcommand script: 49, on @user_script:1.",
            ),
            server_error(
                "ERR",
                "ACL failure in script: this user has no permissions to run the 'pexpire' command",
            ),
            // redis-rs' Cluster client: no seed node let it log in.
            (
                ErrorKind::Io,
                "Failed to create initial connections",
                RedisError::from((
                    ErrorKind::AuthenticationFailed,
                    "Password authentication failed",
                ))
                .to_string(),
            )
                .into(),
            // At the first connect: a configuration error.
            explain(&target, untrusted(), false),
            explain(&target, alert(rustls::AlertDescription::UnknownCA), false),
            explain(
                &target,
                alert(rustls::AlertDescription::BadCertificate),
                false,
            ),
            explain(
                &target,
                alert(rustls::AlertDescription::CertificateRequired),
                false,
            ),
        ];
        let permanent = [
            server_error("ERR", "syntax error"),
            server_error(
                "ERR",
                "unknown command 'EVALSHA', with args beginning with: ",
            ),
            server_error(
                "ERR",
                "renew: ttl must be an integer >= 1 ms script: 1f0e, on @user_script:23.",
            ),
            server_error(
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value",
            ),
            explain(
                &target,
                (
                    ErrorKind::MasterNameNotFoundBySentinel,
                    "the Sentinel does not know the master",
                )
                    .into(),
                false,
            ),
            explain(
                &target,
                (
                    ErrorKind::InvalidClientConfig,
                    "not a Cluster node",
                    "127.0.0.1:1".to_owned(),
                )
                    .into(),
                false,
            ),
            (ErrorKind::UnexpectedReturnType, "reply is not an array").into(),
        ];
        for (want, errors) in [
            (Failure::Transient, &transient[..]),
            (Failure::Refused, &refused[..]),
            (Failure::Permanent, &permanent[..]),
        ] {
            for err in errors {
                assert_eq!(classify(err), want, "{}", Readable(err));
            }
        }
        for err in &transient {
            let failure = classify(err);
            assert!(failure.retried_at_start() && failure.retried_while_held());
        }
        for err in &refused {
            let failure = classify(err);
            assert!(!failure.retried_at_start() && failure.retried_while_held());
        }
        for err in &permanent {
            let failure = classify(err);
            assert!(!failure.retried_at_start() && !failure.retried_while_held());
        }
    }

    /// Issue 20.2: a node that is not a usable primary is left: the next
    /// call opens a new connection (resolving the name, or asking the
    /// Sentinels, again).
    #[test]
    fn nodes_that_are_not_a_usable_primary_are_left() {
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
            let leave = matches!(code, "LOADING" | "READONLY" | "MASTERDOWN");
            assert_eq!(needs_new_connection(&err), leave, "{code}");
        }
    }

    #[test]
    fn refusals_are_named() {
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

    /// Issue 20.4: an untrusted certificate is a configuration error at the
    /// first connect, a failed attempt (retried) at a reconnect during a
    /// run, when a CA or certificate may be in the middle of a rotation.
    #[test]
    fn certificate_errors_are_permanent_only_at_the_first_connect() {
        let target = RedisTarget::parse("rediss://u:s3cret@127.0.0.1:1").unwrap();
        let refused = || {
            RedisError::from(std::io::Error::other(
                "invalid peer certificate: UnknownIssuer",
            ))
        };
        let at_start = explain(&target, refused(), false);
        assert_eq!(classify(&at_start), Failure::Refused);
        let in_run = explain(&target, refused(), true);
        assert_eq!(classify(&in_run), Failure::Transient);
        for err in [&at_start, &in_run] {
            let shown = Readable(err).to_string();
            assert!(shown.starts_with("TLS certificate error"), "{shown}");
            assert!(
                shown.contains("UnknownIssuer") && !shown.contains("s3cret"),
                "{shown}"
            );
        }
    }

    /// A server error as redis-rs parses it from the reply `-CODE detail`.
    fn server_error(code: &str, detail: &str) -> RedisError {
        let reply = format!("-{code} {detail}\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(redis::Value::ServerError(err)) => err.into(),
            other => panic!("not a server error: {other:?}"),
        }
    }
}
