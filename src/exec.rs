//! The app side of the lease: `snowlease exec` runs the app only while the
//! sidecar publishes a worker ID, `snowlease id` prints that ID, and
//! `snowlease install` copies this binary into a shared volume.
//!
//! `exec` closes the last gap of the safety property: an app that read ID 7
//! at start and keeps minting after the sidecar lost the lease would mint
//! duplicates. So `exec` never starts the command without a published ID,
//! stops it (SIGTERM to its process group, SIGKILL after `--grace`) the
//! moment the ID disappears or changes, makes sure it is gone by the lease's
//! validity deadline (SIGTERM `--grace` before it, SIGKILL at it; the rules
//! are in `supervise/deadline.rs`), then exits 75 so the kubelet restarts the app
//! container with the sidecar's next ID.
//!
//! It runs on the one-thread tokio runtime every command runs on
//! (src/main.rs): signals come from `crate::shutdown::Signals`, the
//! command's exit from a SIGCHLD stream (`supervise/child.rs`), timers are
//! tokio's.

mod args;
mod judge;
mod limits;
mod source;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use nix::sys::signal::Signal;
use tracing::{error, info, warn};

use self::judge::{Gone, Judged, judge};
use crate::shutdown::Signals;
use crate::supervise::child::{self, Child, Exit};
use crate::supervise::deadline::Deadlines;
use crate::supervise::watch::{self, Phase, WatchStep};
use crate::timing;
pub use args::{ExecArgs, ExecConfig, IdArgs, InstallArgs};
pub use source::Source;
pub(crate) use source::{PublishedId, Reading};

/// Timeout of one `GET /id`: the poll interval within 100-500 ms (signals
/// wait meanwhile, so keep it short; the sidecar is local).
fn http_timeout(poll: Duration) -> Duration {
    poll.clamp(Duration::from_millis(100), Duration::from_millis(500))
}

/// Why `exec` or `id` did not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// No fresh ID within `--wait`; the command was not started (exit 3).
    #[error("no worker ID published at {at} within {}: {reason}", humantime::format_duration(*waited))]
    NoId {
        /// Where we looked (the file or URL).
        at: String,
        /// `--wait`.
        waited: Duration,
        /// What the last read found.
        reason: String,
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
    /// The ID was lost (gone, changed, or stale within the grace) while
    /// the command ran; the command was stopped (exit 75,
    /// `exit::LEASE_LOST`).
    #[error(
        "worker ID {worker_id} was lost while the command ran; the command was stopped ({exit})"
    )]
    Lost {
        /// The ID the command ran with.
        worker_id: u16,
        /// How the stopped command ended, in words ("SIGTERM killed it").
        exit: String,
    },
    /// The sidecar stopped in order (SIGTERM) and released the ID while the
    /// command ran; the command was stopped (exit 75 as for a loss: the ID is
    /// no longer published, but nothing went wrong).
    #[error(
        "worker ID {worker_id} was released by the sidecar (it stopped) while the command ran; the command was stopped ({exit})"
    )]
    Released {
        /// The ID the command ran with.
        worker_id: u16,
        /// How the stopped command ended, in words.
        exit: String,
    },
    /// A stop signal came before any ID was published; the command was
    /// not started (exit 128 + the signal's number).
    #[error("{} before any worker ID was published; the command was not started", crate::shutdown::signal_name(*signal))]
    Signalled {
        /// The signal's number.
        signal: i32,
    },
    /// The sidecar at `at` mints the IDs itself (`worker --mint`): it offers
    /// no worker ID, and a command minting with it would duplicate IDs; the
    /// command was not started, or was stopped (exit 5, `exit::REFUSED`).
    #[error(
        "the sidecar at {at} runs in mint mode (--mint) and offers no worker ID; ask it for IDs with GET /next instead of running under exec or id"
    )]
    MintMode {
        /// Where we looked (the file or URL).
        at: String,
    },
    /// Anything else (signal handlers, ...), exit 1.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Runs `exec`: wait for an ID, run the command with it, watch the ID.
/// Call on a tokio runtime. Returns the command's exit code (128 + signal
/// when a signal killed it).
///
/// Errors: [`ExecError`]: no ID came, a signal ended the wait, the command
/// cannot start, or the ID was lost while it ran (exit codes: `failure.rs`).
pub async fn run_exec(config: &ExecConfig) -> Result<u8, ExecError> {
    // Handlers first: a SIGTERM during the wait must not be lost.
    let mut signals = Signals::install().context("cannot install signal handlers")?;
    let published =
        match wait_for_id(&config.source, config.wait, config.poll, Some(&mut signals)).await? {
            Waited::Id(published) => published,
            Waited::Signal(signal) => {
                info!(
                    signal,
                    "signal before any worker ID was published; not starting the command"
                );
                return Err(ExecError::Signalled { signal });
            }
        };
    let worker_id = published.worker_id;
    let env = [(config.env.as_str(), worker_id.to_string())];
    let mut child = Child::spawn(&config.command, &env).map_err(|error| ExecError::Spawn {
        program: config.command[0].clone(),
        error,
    })?;
    info!(worker_id, pid = child.pid(), env = %config.env, "worker ID published; command started");
    let (exit, gone) = supervise(config, &mut signals, &mut child, published).await;
    // Whatever the command left behind carries the ID too.
    child.kill_all().await;
    match gone {
        Some(Gone::Lost) => {
            error!(worker_id, exit = ?exit, "command stopped after the worker ID was lost; exiting 75");
            return Err(ExecError::Lost {
                worker_id,
                exit: exit.to_string(),
            });
        }
        Some(Gone::Released) => {
            info!(worker_id, exit = ?exit, "command stopped after the sidecar released the worker ID; exiting 75");
            return Err(ExecError::Released {
                worker_id,
                exit: exit.to_string(),
            });
        }
        None => {}
    }
    info!(worker_id, exit = ?exit, "command exited");
    Ok(exit.code())
}

/// Watches the ID while the child runs; returns its exit and why it was
/// stopped, when the ID went. When to stop: `deadline.rs`; the loop's
/// phases and steps, shared with `lock`: `watch.rs`.
async fn supervise(
    config: &ExecConfig,
    signals: &mut Signals,
    child: &mut Child,
    mut current: PublishedId,
) -> (Exit, Option<Gone>) {
    let worker_id = current.worker_id;
    // The published deadline is on the boot clock; timers run on the
    // monotonic one, so it is mapped anew at each use (closer after a suspend).
    let until = |p: &PublishedId, now: Instant| p.valid_until.map(|t| t.on_monotonic(now));
    let mut rules = Deadlines::new(config.grace);
    let mut warned_cap = rules.observe(until(&current, Instant::now()), Instant::now());
    let mut next_read = Instant::now() + config.poll;
    let mut phase = Phase::Watching;
    let mut unreachable_logged = false;
    let mut gone = None;
    loop {
        if warned_cap {
            warn!(
                worker_id,
                grace_ms = timing::ms(config.grace),
                used_ms = timing::ms(rules.grace()),
                validity_ms = timing::ms(rules.longest().unwrap_or_default()),
                "--grace is more than a quarter of the lease's validity; using a quarter, \
                 so the command is gone by the lease's deadline (set --grace well below \
                 TTL - renew interval)"
            );
            warned_cap = false;
        }
        if let Some(exit) = child.reap() {
            return (exit, gone);
        }
        let now = Instant::now();
        match watch::next(phase, &rules, until(&current, now), next_read, now) {
            WatchStep::Kill => {
                warn!(
                    worker_id,
                    grace_ms = timing::ms(rules.grace()),
                    "command still running after the grace (or at the lease's deadline); SIGKILL"
                );
                child.signal_all(Signal::SIGKILL);
                phase = Phase::Killed;
            }
            // Read on schedule, and again when the deadline comes within
            // the grace: the sidecar may have renewed meanwhile.
            WatchStep::Check | WatchStep::Expiring { .. } => {
                next_read = now + config.poll;
                let read = config.source.read(http_timeout(config.poll));
                let now = Instant::now();
                let (judged, capped) = judge(read, &mut current, &mut rules, now);
                warned_cap |= capped;
                match judged {
                    Judged::Ours => unreachable_logged = false,
                    Judged::Unreachable(reason) => {
                        if !unreachable_logged {
                            warn!(worker_id, reason = %reason, "cannot read the worker ID; keeping it until the last reading nears its deadline");
                            unreachable_logged = true;
                        }
                    }
                    Judged::Gone(why, reason) => {
                        // The lease may be someone else's already: SIGKILL after
                        // the grace, never after the last fresh reading's deadline.
                        phase = watch::stopping(&rules, now, until(&current, now));
                        let kill_in_ms = timing::ms(phase.kill_in(now));
                        match why {
                            Gone::Lost => error!(
                                worker_id,
                                reason = %reason,
                                kill_in_ms,
                                "worker ID no longer published; stopping the command (SIGTERM)"
                            ),
                            Gone::Released => info!(
                                worker_id,
                                reason = %reason,
                                kill_in_ms,
                                "the sidecar released the worker ID; stopping the command (SIGTERM)"
                            ),
                        }
                        gone = Some(why);
                        child.signal_all(Signal::SIGTERM);
                    }
                }
            }
            WatchStep::Sleep(wake) => child.sleep_forwarding(wake, signals).await,
        }
    }
}

enum Waited {
    Id(PublishedId),
    Signal(i32),
}

/// Re-reads `source` every `poll` until a fresh ID appears or `wait` ends,
/// or one of `signals` that ends a wait ([`child::ends_wait`]) comes.
async fn wait_for_id(
    source: &Source,
    wait: Duration,
    poll: Duration,
    mut signals: Option<&mut Signals>,
) -> Result<Waited, ExecError> {
    let deadline = Instant::now() + wait;
    let mut logged = false;
    loop {
        let reason = match source.read(http_timeout(poll)) {
            Reading::Published(published) if published.is_fresh() => {
                return Ok(Waited::Id(published));
            }
            Reading::Published(_) => "stale".to_owned(),
            Reading::Absent(reason) | Reading::Released(reason) | Reading::Unreachable(reason) => {
                reason
            }
            Reading::Minting => {
                return Err(ExecError::MintMode {
                    at: source.to_string(),
                });
            }
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(ExecError::NoId {
                at: source.to_string(),
                waited: wait,
                reason,
            });
        }
        if !logged {
            info!(source = %source, reason = %reason, "waiting for a worker ID");
            logged = true;
        }
        let pause = poll.min(deadline - now);
        let signal = async {
            match signals.as_deref_mut() {
                Some(signals) => signals.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            Some(signal) = signal => if child::ends_wait(signal) {
                return Ok(Waited::Signal(signal));
            },
        }
    }
}

/// Runs `id`: the published worker ID, waiting up to `wait` for one.
/// Call on a tokio runtime.
///
/// Errors: [`ExecError::NoId`] (exit 3).
pub async fn run_id(source: &Source, wait: Duration) -> Result<u16, ExecError> {
    match wait_for_id(source, wait, Duration::from_millis(100), None).await? {
        Waited::Id(published) => Ok(published.worker_id),
        Waited::Signal(_) => unreachable!("no signal handlers installed"),
    }
}

/// Copies the running binary to `<dir>/snowlease` atomically, so an init
/// container can hand `snowlease exec` to an app image through a volume
/// (the runtime image has no shell and no `cp`).
///
/// Errors: I/O errors, with the path.
pub fn install(dir: &Path) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot locate the running binary")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dest = dir.join("snowlease");
    let mut input =
        std::fs::File::open(&exe).with_context(|| format!("cannot read {}", exe.display()))?;
    crate::atomic_file::write_atomic_from(&dest, 0o755, &mut input)
        .with_context(|| format!("cannot create {}", dest.display()))?;
    Ok(dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_errors_map_to_shell_codes() {
        let spawn = |kind| ExecError::Spawn {
            program: "x".into(),
            error: std::io::Error::from(kind),
        };
        let code = |kind| crate::failure::code_of(&spawn(kind).into());
        assert_eq!(code(std::io::ErrorKind::NotFound), crate::exit::NOT_FOUND);
        assert_eq!(
            code(std::io::ErrorKind::PermissionDenied),
            crate::exit::CANNOT_EXECUTE
        );
    }
}
