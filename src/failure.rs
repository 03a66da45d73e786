//! How a failed command ends: its exit code from the [`crate::exit`]
//! table ([`code_of`], the one place that maps an error to its code) and
//! its last line ([`describe`]). It sits above every mode: it knows their
//! error types, and none of them imports it.

use redis::RedisError;

use crate::budget::cli::BudgetDenied;
use crate::cli::ConfigError;
use crate::connection::Readable;
use crate::exec::ExecError;
use crate::exit::{
    BAD_INPUT, BUDGET_DENIED, CANNOT_EXECUTE, FAILURE, LEASE_LOST, NOT_ACQUIRED, NOT_FOUND,
    NOT_HELD, REFUSED, SIGNALLED, UNAVAILABLE,
};
use crate::lock::LockError;
use crate::pool::PoolError;
use crate::pool::cli::PoolCliError;
use crate::worker_id::guard::GuardRefused;
use crate::worker_id::keeper::WorkerError;

/// The exit code of a command that failed with `err` (see [`crate::exit`]).
pub fn code_of(err: &anyhow::Error) -> u8 {
    if err.downcast_ref::<ConfigError>().is_some() {
        return BAD_INPUT;
    }
    if let Some(err) = err.downcast_ref::<WorkerError>() {
        return match err {
            WorkerError::ClaimTimeout { .. } => UNAVAILABLE,
            WorkerError::LeaseLost { .. } => NOT_HELD,
            WorkerError::Redis(_) => FAILURE,
        };
    }
    if err
        .downcast_ref::<crate::persistence::durable::NotDurable>()
        .is_some()
        || err
            .downcast_ref::<crate::worker_id::guard::NotOpened>()
            .is_some()
    {
        return UNAVAILABLE;
    }
    if err.downcast_ref::<BudgetDenied>().is_some() {
        return BUDGET_DENIED;
    }
    if let Some(crate::budget::BudgetError::BadInput { .. }) = err.downcast_ref() {
        return BAD_INPUT;
    }
    if err.downcast_ref::<GuardRefused>().is_some()
        || err
            .downcast_ref::<crate::worker_id::carry::CarryRefused>()
            .is_some()
    {
        return REFUSED;
    }
    if let Some(err) = err.downcast_ref::<ExecError>() {
        return match err {
            ExecError::NoId { .. } => UNAVAILABLE,
            ExecError::Spawn { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
                NOT_FOUND
            }
            ExecError::Spawn { .. } => CANNOT_EXECUTE,
            ExecError::Lost { .. } | ExecError::Released { .. } => LEASE_LOST,
            ExecError::Signalled { signal } => signalled(*signal),
            ExecError::MintMode { .. } => REFUSED,
            ExecError::Other(_) => FAILURE,
        };
    }
    if let Some(err) = err.downcast_ref::<LockError>() {
        return match err {
            LockError::NotAcquired { .. } => NOT_ACQUIRED,
            LockError::Spawn { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
                NOT_FOUND
            }
            LockError::Spawn { .. } => CANNOT_EXECUTE,
            LockError::Lost { .. } => LEASE_LOST,
            LockError::Signalled { signal, .. } => signalled(*signal),
            LockError::Other(_) => FAILURE,
        };
    }
    if let Some(err) = err.downcast_ref::<PoolCliError>() {
        return match err {
            PoolCliError::NothingDue { .. } => UNAVAILABLE,
            PoolCliError::NotOwner { .. } => NOT_HELD,
        };
    }
    match err.downcast_ref::<PoolError>() {
        Some(err) if err.is_bad_input() => BAD_INPUT,
        Some(PoolError::NotDurable { .. }) => UNAVAILABLE,
        _ => FAILURE,
    }
}

/// 128 + N: signal N ended the wait (the shell's code for a command a
/// signal killed).
fn signalled(signal: i32) -> u8 {
    u8::try_from(signal & 0x7f).map_or(FAILURE, |n| SIGNALLED.saturating_add(n))
}

/// The last line of a failed command: `err` with its causes, each said
/// once. A redis-rs error is rendered by `Readable` (no kind names) and
/// ends the walk (its sources repeat it); a part of a cause (between `": "`)
/// already in the line is not said again, e.g. the URL a context named.
pub fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let shown = |e: &(dyn std::error::Error + 'static)| match e.downcast_ref::<RedisError>() {
        Some(redis) => (Readable(redis).to_string(), true),
        None => (e.to_string(), false),
    };
    let (mut text, mut last) = shown(err);
    let mut source = err.source();
    while let (false, Some(cause)) = (last, source) {
        let cause_text;
        (cause_text, last) = shown(cause);
        let new: Vec<&str> = cause_text
            .split(": ")
            .filter(|part| part.len() < 4 || !text.contains(part))
            .collect();
        if !new.is_empty() {
            text = format!("{text}: {}", new.join(": "));
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pool::LostReason;

    #[test]
    fn each_error_has_its_code() {
        let code = |e: anyhow::Error| code_of(&e);
        assert_eq!(code(ConfigError::new("--ttl", "0s").into()), BAD_INPUT);
        assert_eq!(code(PoolError::bad("ttl", "1-2").into()), BAD_INPUT);
        assert_eq!(
            code(anyhow::Error::from(PoolError::DuplicateId { id: "a".into() }).context("redis x")),
            BAD_INPUT
        );
        let timeout = WorkerError::ClaimTimeout {
            timeout: Duration::from_secs(1),
            detail: String::new(),
        };
        assert_eq!(code(timeout.into()), UNAVAILABLE);
        assert_eq!(
            code(WorkerError::LeaseLost { worker_id: 1 }.into()),
            NOT_HELD
        );
        let no_id = ExecError::NoId {
            at: "f".into(),
            waited: Duration::ZERO,
            reason: String::new(),
        };
        assert_eq!(code(no_id.into()), UNAVAILABLE);
        let lost = PoolCliError::NotOwner {
            pool: "p".into(),
            id: "a".into(),
            reason: LostReason::Expired,
        };
        assert_eq!(code(lost.into()), NOT_HELD);
        let due = PoolCliError::NothingDue {
            pool: "p".into(),
            wait: "1s".into(),
            hint: String::new(),
        };
        assert_eq!(code(due.into()), UNAVAILABLE);
        let not_acquired = LockError::NotAcquired {
            name: "n".into(),
            waited: Duration::ZERO,
            reason: String::new(),
            held: true,
        };
        assert_eq!(code(not_acquired.into()), NOT_ACQUIRED);
        let lost = LockError::Lost {
            name: "n".into(),
            reason: String::new(),
            exit: String::new(),
        };
        assert_eq!(code(lost.into()), LEASE_LOST);
        let lost = ExecError::Lost {
            worker_id: 7,
            exit: String::new(),
        };
        assert_eq!(code(lost.into()), LEASE_LOST);
        let signalled = LockError::Signalled {
            name: "n".into(),
            signal: 15,
        };
        assert_eq!(code(signalled.into()), 143);
        assert_eq!(code(ExecError::Signalled { signal: 2 }.into()), 130);
        assert_eq!(code(anyhow::anyhow!("redis down")), FAILURE);
    }

    /// The last line names no redis-rs kind and says the URL a context
    /// gave once (it said "... from URL: no Sentinel knows the master named
    /// in the URL - InvalidClientConfig: URL").
    #[test]
    fn describe_says_a_redis_error_once_without_kind_names() {
        let url = "redis+sentinel://127.0.0.1:1/nomaster/0";
        let unknown: redis::RedisError = (
            redis::ErrorKind::InvalidClientConfig,
            "no Sentinel knows the master named in the URL",
            url.to_owned(),
        )
            .into();
        let err =
            anyhow::Error::new(unknown).context(format!("cannot read the leases of a from {url}"));
        assert_eq!(
            describe(err.as_ref()),
            format!(
                "cannot read the leases of a from {url}: no Sentinel knows the master named in the URL"
            )
        );
        let reply = b"-NOPERM this user has no permissions to run the 'time' command\r\n";
        let Ok(redis::Value::ServerError(noperm)) = redis::parse_redis_value(reply) else {
            panic!("not a server error")
        };
        let err = anyhow::Error::new(PoolError::from(redis::RedisError::from(noperm)))
            .context("redis redis://127.0.0.1:1/0");
        assert_eq!(
            describe(err.as_ref()),
            "redis redis://127.0.0.1:1/0: NOPERM this user has no permissions to run the 'time' command"
        );
    }
}
