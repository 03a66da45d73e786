//! The one table that decides what a failed Redis call means: how the
//! caller treats it ([`Failure`]) and whether the connection it failed on is
//! left ([`Verdict::new_connection`]). Errors come as redis-rs errors or as
//! error replies inside an `Ok` reply (`Value::ServerError`, see
//! `route.rs`); both are read by [`classify`].

use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind, Value};

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
pub(crate) enum Failure {
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
    pub(crate) fn retried_at_start(self) -> bool {
        self == Self::Transient
    }

    /// Whether a renewal that failed so is tried again while a lease is
    /// held, until its validity deadline: all but [`Failure::Permanent`].
    pub(crate) fn retried_while_held(self) -> bool {
        self != Self::Permanent
    }

    /// Its name in logs (`failure` fields): `transient`, `refused`, `permanent`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Refused => "refused",
            Self::Permanent => "permanent",
        }
    }
}

/// What one failed call means: how the caller treats it, and whether the
/// connection it failed on is left. Compares equal to its [`Failure`], so
/// `classify(&err) == Failure::Refused` reads as it says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// How the caller treats the failure (retry, refusal, give up).
    pub failure: Failure,
    /// True when the connection the call failed on is not to be used again
    /// (the next call opens a new one, which resolves the host name again,
    /// or asks the Sentinels): connection trouble, and a node that is not
    /// (or no longer) a usable primary: `READONLY` (a replica), `MASTERDOWN`
    /// (a replica without its primary), `LOADING` (a restarted node, or a
    /// replica after a full sync). A managed Redis fails over by moving a
    /// DNS name; only a new connection follows it.
    pub new_connection: bool,
}

impl Verdict {
    /// See [`Failure::retried_at_start`].
    pub(crate) fn retried_at_start(self) -> bool {
        self.failure.retried_at_start()
    }
}

impl PartialEq<Failure> for Verdict {
    fn eq(&self, failure: &Failure) -> bool {
        self.failure == *failure
    }
}

/// Classifies a redis-rs error by its kind and error code, never by its
/// message (except the two texts that have no code: an ACL refusal inside
/// a script, `is_permission_error`, and a TLS certificate error,
/// `is_certificate_error`): the one table, for callers (the failure) and
/// for the connection (whether to leave it). Error replies that redis-rs
/// hands back inside an `Ok` reply are read by `leaves_connection` with
/// the same table.
pub(crate) fn classify(err: &RedisError) -> Verdict {
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

/// True when a failed call says Redis is not serving this client: no
/// answer, not a usable primary, or a refusal of this client (the
/// transient and refused rows of the table). False for an answer about the
/// data or the call (`WRONGTYPE`, a syntax error, a script's refusal):
/// Redis answered. Readiness and the HTTP 503 "redis unavailable" follow
/// this, so a key of the wrong type never reads as Redis down.
pub(crate) fn is_unavailable(err: &RedisError) -> bool {
    classify(err).failure != Failure::Permanent
}

/// Whether a call's outcome leaves its connection (the next call opens a
/// new one, resolving the host name again, or asking the Sentinels): an
/// error, or a server error inside an `Ok` reply (redis-rs returns those as
/// [`Value::ServerError`], also inside pipeline and `EXEC` replies), whose
/// [`classify`] verdict says [`Verdict::new_connection`].
pub(super) fn leaves_connection(result: Result<&[Value], &RedisError>) -> bool {
    let leaves = |err: &RedisError| classify(err).new_connection;
    match result {
        Err(err) => {
            leaves(err)
                || err
                    .clone()
                    .into_server_errors()
                    .is_some_and(|items| items.iter().any(|(_, e)| leaves(&e.clone().into())))
        }
        Ok(values) => values.iter().any(value_leaves),
    }
}

fn value_leaves(value: &Value) -> bool {
    match value {
        Value::ServerError(err) => classify(&err.clone().into()).new_connection,
        Value::Array(items) | Value::Set(items) => items.iter().any(value_leaves),
        _ => false,
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

/// A server error as redis-rs parses it from the reply `-CODE detail`.
#[cfg(test)]
pub(super) fn server_error(code: &str, detail: &str) -> RedisError {
    let reply = format!("-{code} {detail}\r\n");
    match redis::parse_redis_value(reply.as_bytes()) {
        Ok(redis::Value::ServerError(err)) => err.into(),
        other => panic!("not a server error: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::{Readable, RedisTarget, explain};

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
            assert!(failure.retried_at_start() && failure.failure.retried_while_held());
        }
        for err in &refused {
            let failure = classify(err);
            assert!(!failure.retried_at_start() && failure.failure.retried_while_held());
        }
        for err in &permanent {
            let failure = classify(err);
            assert!(!failure.retried_at_start() && !failure.failure.retried_while_held());
        }
    }

    /// A node that is not a usable primary is left: the next
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
            assert_eq!(classify(&err).new_connection, leave, "{code}");
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

    /// An untrusted certificate is a configuration error at the
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

    fn reply_error(code: &str) -> Value {
        let reply = format!("-{code} detail\r\n");
        redis::parse_redis_value(reply.as_bytes()).expect("a server error")
    }

    /// redis-rs hands error replies back inside `Ok` (one command, a pipeline,
    /// an `EXEC` array); those that say the node is not a usable primary condemn the
    /// connection wherever they sit, the others do not.
    #[test]
    fn error_replies_inside_ok_condemn_the_connection() {
        for (code, leave) in [
            ("READONLY", true),
            ("MASTERDOWN", true),
            ("LOADING", true),
            ("OOM", false),
            ("NOPERM", false),
        ] {
            let one = [reply_error(code)];
            assert_eq!(leaves_connection(Ok(&one)), leave, "{code} alone");
            let nested = [
                Value::Okay,
                Value::Array(vec![Value::Int(1), reply_error(code)]),
            ];
            assert_eq!(
                leaves_connection(Ok(&nested)),
                leave,
                "{code} in an EXEC reply"
            );
        }
        assert!(!leaves_connection(Ok(&[Value::Okay, Value::Nil])));
    }
}
