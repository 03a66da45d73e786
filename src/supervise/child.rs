//! The wrapped command as a child process: the child in its own process
//! group, `exec` a child subreaper (so descendants that left the group with
//! `setsid` are still ours to find and stop), signals forwarded (they come
//! from [`crate::shutdown::Signals`], whose handlers are explicit, so this
//! works as PID 1), exits reaped (orphans too) when SIGCHLD says so.
//!
//! Not `tokio::process`: as PID 1 or subreaper we must reap orphans of the
//! command with `waitpid(-1)`, which would take the statuses of tokio's own
//! children from its reaper (tokio waits for each of them by PID). So the
//! child is a std spawn, SIGCHLD a tokio signal stream that wakes the loop,
//! and [`Child::reap`] reaps everything that exited.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use nix::errno::Errno;
use nix::libc::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tracing::debug;

/// Signals that end `exec`'s or `lock`'s wait while no child runs yet
/// (SIGUSR1 and SIGUSR2 do not).
pub(crate) fn ends_wait(signal: i32) -> bool {
    matches!(signal, SIGTERM | SIGINT | SIGHUP | SIGQUIT)
}

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Code(code) => write!(f, "it exited with code {code}"),
            Self::Signal(signal) => match Signal::try_from(*signal) {
                Ok(name) => write!(f, "{name} killed it"),
                Err(_) => write!(f, "signal {signal} killed it"),
            },
        }
    }
}

impl Exit {
    /// Shell convention: the code, or 128 + signal number.
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Code(code) => u8::try_from(code & 0xff).unwrap_or(1),
            Self::Signal(signal) => {
                u8::try_from(i32::from(crate::exit::SIGNALLED) + (signal & 0x7f)).unwrap_or(255)
            }
        }
    }
}

/// A running child in its own process group (its PID is the group ID),
/// so a stop reaches whatever it started, too.
pub(crate) struct Child {
    pid: Pid,
    /// SIGCHLD: some child of ours changed state.
    exited: tokio::signal::unix::Signal,
}

impl Child {
    /// Starts `command` with `env` (name, value) added to our environment
    /// (`WORKER_ID=7` for `exec`) and the open-file limit we were started
    /// with,
    /// after making this process a child subreaper (`PR_SET_CHILD_SUBREAPER`,
    /// prctl(2)): orphans of the command are re-parented to us, not to init.
    ///
    /// Call inside a tokio runtime (SIGCHLD is a tokio signal stream).
    ///
    /// Errors: the spawn error (not found, not executable, ...), the
    /// prctl error, or SIGCHLD's handler cannot be registered.
    pub(crate) fn spawn(command: &[OsString], env: &[(&str, String)]) -> std::io::Result<Self> {
        // Before the spawn: an exit right after it still wakes `changed`.
        let exited = signal(SignalKind::child())?;
        nix::sys::prctl::set_child_subreaper(true)?;
        let (program, args) = command
            .split_first()
            .ok_or_else(|| std::io::Error::other("empty command"))?;
        let mut command = std::process::Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(name, value)| (name, value)))
            .process_group(0);
        let child = crate::open_files::with_inherited_limit(|| command.spawn())?;
        let pid = Pid::from_raw(i32::try_from(child.id()).map_err(std::io::Error::other)?);
        // Reaped with waitpid below, not through `child`.
        drop(child);
        Ok(Self { pid, exited })
    }

    /// Waits for the next SIGCHLD (a child of ours, orphans included,
    /// changed state); [`Child::reap`] then says whether ours exited.
    /// Cancel-safe.
    pub(crate) async fn changed(&mut self) {
        self.exited.recv().await;
    }

    /// Sleeps until `wake`, passing each signal of `signals` on to the command meanwhile
    /// (exec and lock forward what they get); returns at `wake`, after one signal, or when
    /// the child changed state, whichever comes first. Cancel-safe.
    pub(crate) async fn sleep_forwarding(
        &mut self,
        wake: std::time::Instant,
        signals: &mut crate::shutdown::Signals,
    ) {
        tokio::select! {
            () = tokio::time::sleep_until(wake.into()) => {}
            Some(signal) = signals.recv() => {
                tracing::debug!(signal, "forwarding signal to the command");
                self.signal(signal);
            }
            () = self.changed() => {}
        }
    }

    /// Process ID (and process group ID) of the child.
    pub(crate) fn pid(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    /// Reaps every exited child without blocking (as PID 1 that includes
    /// orphans handed to us); returns our child's exit once it happened.
    pub(crate) fn reap(&self) -> Option<Exit> {
        let mut ours = None;
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == self.pid => {
                    ours = Some(Exit::Code(code));
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) if pid == self.pid => {
                    ours = Some(Exit::Signal(signal as i32));
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return ours,
                Ok(other) => debug!(status = ?other, "reaped another process"),
                Err(Errno::EINTR) => {}
                Err(err) => {
                    debug!(error = %err, "waitpid failed");
                    return ours;
                }
            }
        }
    }

    /// Sends `signal` to the child only (as a signal from the kubelet would
    /// reach the command if it ran without us).
    pub(crate) fn signal(&self, signal: i32) {
        if let Ok(signal) = Signal::try_from(signal) {
            let _ = kill(self.pid, signal);
        }
    }

    /// Sends `signal` to the child's whole process group and to every other
    /// descendant of this process (one that called `setsid` left the group
    /// but still carries the worker ID in its environment).
    pub(crate) fn signal_all(&self, signal: Signal) {
        let _ = killpg(self.pid, signal);
        for pid in descendants(Pid::this()) {
            let _ = kill(pid, signal);
        }
    }

    /// SIGKILLs and reaps every descendant until none is left (bounded:
    /// 2 s; a process in uninterruptible sleep may outlast it).
    pub(crate) async fn kill_all(&self) {
        for _ in 0..200 {
            self.signal_all(Signal::SIGKILL);
            self.reap();
            if descendants(Pid::this()).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Every descendant of this process, from `/proc/<pid>/task/<tid>/children`
/// (proc(5)); processes that end meanwhile are simply missed. Empty when
/// this is PID 1 (the kernel kills the whole PID namespace when we exit)
/// or when `/proc` belongs to another PID namespace (`unshare --pid`
/// without a new `/proc`): its numbers would name other processes.
fn descendants(pid: Pid) -> Vec<Pid> {
    if pid.as_raw() == 1 || !proc_is_ours(pid) {
        return Vec::new();
    }
    let mut found = Vec::new();
    let mut todo = vec![pid];
    while let Some(parent) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|p| p.parse().ok()) {
                let child = Pid::from_raw(child);
                found.push(child);
                todo.push(child);
            }
        }
    }
    found
}

/// True when `/proc/self` names `pid`: the mounted `/proc` shows our own
/// PID namespace.
fn proc_is_ours(pid: Pid) -> bool {
    std::fs::read_link("/proc/self")
        .ok()
        .and_then(|link| link.to_str()?.parse::<i32>().ok())
        == Some(pid.as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(Exit::Code(0).code(), 0);
        assert_eq!(Exit::Code(42).code(), 42);
        assert_eq!(Exit::Signal(SIGTERM).code(), 143);
        assert_eq!(Exit::Signal(9).code(), 137);
        assert_eq!(Exit::Code(7).to_string(), "it exited with code 7");
        assert_eq!(Exit::Signal(SIGTERM).to_string(), "SIGTERM killed it");
    }
}
