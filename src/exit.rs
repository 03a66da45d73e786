//! Exit codes of every command, in one table (docs/operations.md, "Exit codes"): a code
//! means the same in every command. [`code_of`] is the one place that maps
//! an error to its code; `main` calls it.
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done; for `exec` and `lock` the command's own code passes through |
//! | 1 | anything else (Redis refused, I/O error, TLS certificate error, a topology that does not match the URL, ...) |
//! | 2 | bad input: a flag, env var or argument outside its range; nothing was written |
//! | 3 | unavailable in time: no worker ID claimed (`worker`) or published (`exec`, `id`), no pool id due (`pool acquire`) |
//! | 4 | not held: lease lost with `--on-loss exit` (`worker`), not owner or expired (`pool release`/`extend`) |
//! | 5 | refused as unsafe: `guard open` found lease keys of the app without a guard, or a closed guard (without `--force`); nothing written |
//! | 6 | denied by a rate budget within `--wait` (`budget take`, `pool acquire --budget`); the JSON on stdout gives `retry_after_ms` |
//! | 69 | `lock`: not acquired within `--wait`; the command never started (EX_UNAVAILABLE; not 3, which a command's own code could be) |
//! | 75 | `exec`: the ID was lost while the command ran; `lock`: the lock was lost or not renewed in time while the command ran; the command was stopped (EX_TEMPFAIL) |
//! | 126, 127 | `exec`, `lock`: the command cannot be executed, or was not found (shell convention) |
//! | 128+N | a signal N ended the wait or the command |
//! | 130 | `worker`, `pool serve`: a second stop signal during the stop aborted it without cleanup ([`crate::shutdown`]) |

use redis::RedisError;

use crate::budget::cli::BudgetDenied;
use crate::cli::ConfigError;
use crate::connection::Readable;
use crate::exec::ExecError;
use crate::lock::LockError;
use crate::pool::PoolError;
use crate::pool::cli::PoolCliError;
use crate::worker_id::guard::GuardRefused;
use crate::worker_id::keeper::WorkerError;

/// The table for `--help` of the long-running commands, with the log
/// filter variable.
pub const HELP: &str = "\
Logging: SNOWLEASE_LOG sets the filter (a level and/or target=level pairs, e.g. snowlease=debug,warn; default info).

Exit codes (the same meaning in every command):
  0   done; clean stop on SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2
  1   anything else (Redis refused, cannot listen, output file in use, ...)
  2   bad input; the message names the flag and its range; nothing written
  3   unavailable in time: no ID claimed (worker) or published (exec, id), no pool id due
  4   not held: lease lost with --on-loss exit, pool lease not ours or expired
  5   refused as unsafe: guard open found lease keys without a guard, or a closed guard; nothing written
  6   denied by a rate budget within --wait (budget take, pool acquire --budget); stdout says retry_after_ms
  69  lock: not acquired within --wait; the command never started
  75  exec, lock: the ID or lock was lost while the command ran; the command was stopped
  126 exec, lock: the command cannot be executed; 127: not found; 128+N: signal N
  130 a second stop signal during the stop: aborted without cleanup";

/// Anything not listed below.
pub const FAILURE: u8 = 1;
/// Bad input; nothing was written.
pub const BAD_INPUT: u8 = 2;
/// What was asked for could not be had in time.
pub const UNAVAILABLE: u8 = 3;
/// The lease is not (or no longer) ours.
pub const NOT_HELD: u8 = 4;
/// Refused because it could break the safety property; nothing written.
pub const REFUSED: u8 = 5;
/// A rate budget denied the take within `--wait` (nothing charged).
pub const BUDGET_DENIED: u8 = 6;
/// `lock`: not acquired within `--wait` (EX_UNAVAILABLE, sysexits.h). Not
/// [`UNAVAILABLE`]: `lock` passes its command's code through, and 3 is a
/// code a command may well use itself; 69 rarely is.
pub const NOT_ACQUIRED: u8 = 69;
/// `exec`: the ID was lost while the command ran; `lock`: the lock was lost
/// or not renewed in time while the command ran (EX_TEMPFAIL, sysexits.h).
pub const LEASE_LOST: u8 = 75;
/// `exec`: the command exists but cannot be executed (shell convention).
pub const CANNOT_EXECUTE: u8 = 126;
/// `exec`: the command was not found (shell convention).
pub const NOT_FOUND: u8 = 127;

/// The exit code of a command that failed with `err` (see the table above).
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
    if err.downcast_ref::<BudgetDenied>().is_some() {
        return BUDGET_DENIED;
    }
    if let Some(crate::budget::BudgetError::BadInput { .. }) = err.downcast_ref() {
        return BAD_INPUT;
    }
    if err.downcast_ref::<GuardRefused>().is_some() {
        return REFUSED;
    }
    if let Some(err) = err.downcast_ref::<ExecError>() {
        return match err {
            ExecError::NoId { .. } => UNAVAILABLE,
            ExecError::Spawn { error, .. } if error.kind() == std::io::ErrorKind::NotFound => {
                NOT_FOUND
            }
            ExecError::Spawn { .. } => CANNOT_EXECUTE,
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
        Some(
            PoolError::BadInput { .. }
            | PoolError::DuplicateId { .. }
            | PoolError::UnknownId { .. }
            | PoolError::NoPool { .. }
            | PoolError::AlreadyInitialized { .. },
        ) => BAD_INPUT,
        _ => FAILURE,
    }
}

/// The last line of a failed command: `err` with its causes, each said
/// once. A redis-rs error is rendered by [`Readable`] (no kind names) and
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

    /// `--help`, this module and docs/operations.md list the same codes.
    #[test]
    fn help_and_docs_list_every_code() {
        let doc = include_str!("../docs/operations.md");
        let table = &doc[doc
            .find("## Exit codes")
            .expect("docs/operations.md has the table")..];
        for code in [
            FAILURE,
            BAD_INPUT,
            UNAVAILABLE,
            NOT_HELD,
            NOT_ACQUIRED,
            LEASE_LOST,
            CANNOT_EXECUTE,
        ] {
            assert!(
                HELP.contains(&format!("\n  {code} ")),
                "--help lacks {code}"
            );
            let row = |sep| table.contains(&format!("\n| {code}{sep}"));
            assert!(row(" |") || row(", "), "docs/operations.md lacks {code}");
        }
    }

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
