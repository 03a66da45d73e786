//! `snowlease lock --name N -- CMD`: a distributed mutex around a command,
//! built on the lease core (docs/lock.md).
//!
//! The lock is one lease key `<prefix>{<name>}` holding our owner string
//! (identity + nonce, as in worker mode), taken with `SET NX PX` by
//! `lock/acquire.lua`, which also counts the fence `<prefix>{<name>}:fence`
//! up and hands the new value to the command as `SNOWLEASE_FENCE`. While
//! the command runs, `lock/hold.rs` renews the lease every ttl/3 with the
//! lease core's owner-checked renew (never re-creating a missing key) and
//! stops the command the way `exec` does when the lease is lost or cannot be
//! confirmed before its validity deadline. When the command exits the lease
//! is released (compare-and-delete) and `lock` exits with its code.
//!
//! The command is supervised with the pieces `exec` uses too (`crate::supervise`): its own process group,
//! signals passed on, SIGTERM then SIGKILL by the deadline. Like every
//! command it runs on the one-thread tokio runtime of src/main.rs, its
//! signals from `crate::shutdown::Signals`.

mod acquire;
mod args;
mod hold;
pub(crate) mod limits;
mod session;
mod wait;

use std::ffi::OsString;
use std::time::Duration;

use anyhow::Context;
use tracing::{error, info};

pub use args::{LockArgs, LockConfig, LockKeys};
use session::Session;
use wait::LockWaited;

use crate::eviction::Eviction;
use crate::identity::{Owner, resolve_identity};
use crate::shutdown::Signals;
use crate::supervise::child::Child;

/// Env var that carries the fencing token (decimal, >= 1) to the command.
pub(crate) const ENV_FENCE: &str = "SNOWLEASE_FENCE";
/// Env var that carries the owner string (the lock key's value) to the command.
pub(crate) const ENV_OWNER: &str = "SNOWLEASE_LOCK_OWNER";

/// Why `lock` did not run the command to its end.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Not acquired within `--wait` (exit 69, `exit::NOT_ACQUIRED`).
    #[error("lock {name:?} not acquired within {}: {reason}", humantime::format_duration(*waited))]
    NotAcquired {
        /// `--name`.
        name: String,
        /// `--wait`.
        waited: Duration,
        /// What the last attempt found.
        reason: String,
        /// The last attempt found the lock held by another owner (not
        /// Redis unavailable): the outcome `--quiet` keeps silent.
        held: bool,
    },
    /// The command could not be started (exit 127 not found, 126 other).
    #[error("cannot start {program:?}: {error}")]
    Spawn {
        /// The program as given.
        program: OsString,
        /// The OS error.
        #[source]
        error: std::io::Error,
    },
    /// The lock was lost, or not renewed in time, while the command ran;
    /// the command was stopped (exit 75, `exit::LEASE_LOST`).
    #[error(
        "lock {name:?} was lost while the command ran ({reason}); the command was stopped ({exit})"
    )]
    Lost {
        /// `--name`.
        name: String,
        /// Why the command was stopped.
        reason: String,
        /// How the stopped command ended, in words ("SIGTERM killed it").
        exit: String,
    },
    /// A stop signal came while waiting for the lock; the command was not
    /// started (exit 128 + the signal's number).
    #[error("{} while waiting for lock {name:?}; the command was not started", crate::shutdown::signal_name(*signal))]
    Signalled {
        /// `--name`.
        name: String,
        /// The signal's number.
        signal: i32,
    },
    /// Redis refused a script (ACL, a key of the wrong type), or anything
    /// else (exit 1).
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// True for the one failure `lock --quiet` does not report: the lock was
/// held by another owner for all of `--wait` (exit 69 still says so). A
/// Redis that did not answer is reported: then no host runs the command.
pub fn held_elsewhere(err: &anyhow::Error) -> bool {
    matches!(
        err.downcast_ref::<LockError>(),
        Some(LockError::NotAcquired { held: true, .. })
    )
}

/// Runs `lock`: acquire, run the command with the fence, hold, release.
/// Call on a tokio runtime. Returns the command's exit code (128 + signal
/// when a signal killed it).
///
/// Errors: [`LockError`]: not acquired, a signal ended the wait, the
/// command cannot start, the lock was lost while it ran, Redis refused
/// (exit codes: `failure.rs`); whatever may be ours in Redis is released
/// first.
pub async fn run(config: &LockConfig) -> Result<u8, LockError> {
    // Handlers first: a SIGTERM during the wait must not be lost.
    let mut signals = Signals::install().context("cannot install signal handlers")?;
    let (identity, _) = resolve_identity(None);
    let owner = Owner::generate(&identity);
    let mut session = Session::open(
        &config.redis,
        config.keys.clone(),
        owner,
        config.ttl,
        config.setup_timeout(),
    )
    .context("cannot set up the redis client")?;
    let limit = config.setup_timeout();
    if !config.allow_evicting_redis {
        // Checked once before the first attempt; an unreachable Redis is
        // left to the wait below.
        match session.eviction(limit).await {
            Ok(Eviction::Evicting(evicting)) => {
                return Err(LockError::Other(anyhow::Error::new(evicting)));
            }
            Err(err) if !crate::connection::classify(&err).retried_at_start() => {
                return Err(LockError::Other(anyhow::Error::new(err)));
            }
            _ => {}
        }
    }
    let (waited, maybe_held) = wait::wait(&mut session, config.wait, limit, &mut signals).await;
    // An attempt whose reply was lost may have taken the key after all.
    if maybe_held && !matches!(waited, Ok(LockWaited::Acquired { .. })) {
        session.release(limit).await;
    }
    let (fence, sent) = match waited {
        Ok(LockWaited::Acquired { fence, sent }) => (fence, sent),
        Ok(LockWaited::Signal(signal)) => {
            info!(
                signal,
                "signal before the lock was acquired; not starting the command"
            );
            return Err(LockError::Signalled {
                name: config.keys.name().to_owned(),
                signal,
            });
        }
        Ok(LockWaited::NotAcquired(reason, held)) => {
            return Err(LockError::NotAcquired {
                name: config.keys.name().to_owned(),
                waited: config.wait,
                reason,
                held,
            });
        }
        Err(err) => {
            let err = anyhow::Error::new(err).context("redis refused the acquire script");
            return Err(err.into());
        }
    };
    let env = [
        (ENV_FENCE, fence.to_string()),
        (ENV_OWNER, session.owner().as_str().to_owned()),
    ];
    let mut child = match Child::spawn(&config.command, &env) {
        Ok(child) => child,
        Err(error) => {
            session.release(limit).await;
            return Err(LockError::Spawn {
                program: config.command[0].clone(),
                error,
            });
        }
    };
    let lock = config.keys.name();
    info!(lock, fence, owner = %session.owner().redacted(), pid = child.pid(), redis = %config.redis, "lock acquired; command started");
    let end = hold::hold(&mut session, config, &mut signals, &mut child, sent).await;
    // Whatever the command left behind acts under the lock too.
    child.kill_all().await;
    session.release(limit).await;
    match end.lost {
        Some(reason) => {
            error!(lock, reason = %reason, exit = ?end.exit, "command stopped after the lock was lost; exiting 75");
            Err(LockError::Lost {
                name: lock.to_owned(),
                reason,
                exit: end.exit.to_string(),
            })
        }
        None => {
            info!(lock, exit = ?end.exit, "command exited");
            Ok(end.exit.code())
        }
    }
}
