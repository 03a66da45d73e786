//! Process-level helpers: SIGSTOP that waits, /proc readers, running the binary to completion.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::{BIN, poll_some, poll_until, secs};

/// Connections waiting in the accept queue of the IPv4 TCP listener on `addr` (from
/// `/proc/net/tcp`, where a listener's rx_queue is its accept backlog). None when no listener.
pub fn accept_queue_len(addr: SocketAddr) -> Option<u32> {
    let SocketAddr::V4(v4) = addr else {
        return None;
    };
    let local = format!(
        "{:08X}:{:04X}",
        u32::from_le_bytes(v4.ip().octets()),
        v4.port()
    );
    let table = fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // f[1] local address, f[3] state (0A = LISTEN), f[4] tx_queue:rx_queue.
        if f.len() > 4 && f[1] == local && f[3] == "0A" {
            u32::from_str_radix(f[4].split_once(':')?.1, 16).ok()
        } else {
            None
        }
    })
}

/// SIGSTOP `pid` and wait (5 s) until every thread of it is stopped.
pub fn stop_process(pid: Pid) {
    kill(pid, Signal::SIGSTOP).unwrap_or_else(|e| panic!("SIGSTOP {pid}: {e}"));
    assert!(
        poll_until(secs(5), || process_stopped(pid)),
        "process {pid} did not stop"
    );
}

/// Resident memory of process `pid` in KiB: (`VmRSS`, `RssAnon`) of /proc/<pid>/status.
pub fn rss_kib(pid: u32) -> (u64, u64) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("RssAnon:"))
}

/// True when every thread of `pid` is in the stopped state (`T` in `/proc/<pid>/task/*/stat`).
pub fn process_stopped(pid: Pid) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut threads = 0;
    for task in tasks.flatten() {
        let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The state follows the parenthesised command name, which may contain spaces.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.trim_start().chars().next());
        if !matches!(state, Some('T' | 't')) {
            return false;
        }
        threads += 1;
    }
    threads > 0
}

/// Child PIDs of `pid` (from `/proc/<pid>/task/<pid>/children`).
pub fn child_pids(pid: Pid) -> Vec<Pid> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .map(Pid::from_raw)
        .collect()
}

/// Set to `1` to let the PID 1 tests pass without running where `unshare --pid --fork` fails
/// (no user namespaces, a restricted container); they fail there otherwise.
pub const SKIP_PID1_ENV: &str = "SNOWLEASE_SKIP_PID1";

/// Whether a PID 1 test can run: true when `unshare --pid --fork --kill-child true` works. When
/// it does not: false (the test returns) if `SNOWLEASE_SKIP_PID1=1`, else a panic saying why.
pub fn pid1_tests_can_run() -> bool {
    let probe = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "true"])
        .stdin(Stdio::null())
        .output();
    if probe.as_ref().is_ok_and(|o| o.status.success()) {
        return true;
    }
    let why = match &probe {
        Ok(o) => format!(
            "{}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => e.to_string(),
    };
    if std::env::var_os(SKIP_PID1_ENV).is_some_and(|v| v == "1") {
        eprintln!(
            "NOTE: skipping a PID 1 test ({SKIP_PID1_ENV}=1): `unshare --pid --fork` failed: {why}"
        );
        return false;
    }
    panic!(
        "`unshare --pid --fork` failed: {why}; the PID 1 tests need it (set {SKIP_PID1_ENV}=1 to \
         skip them where PID namespaces are not available)"
    );
}

/// Result of [`run_snowlease`].
#[derive(Debug)]
pub struct Run {
    /// Exit code; None when killed by a signal or by the deadline.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// True when the process had to be killed at the deadline.
    pub timed_out: bool,
}

/// Runs `snowlease args...` in a scrubbed environment (PATH plus `env`) to completion; kills it
/// after `timeout`.
pub fn run_snowlease(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied());
    run_command(cmd, timeout)
}

/// Runs `snowlease guard open --app app --redis-url url extra...` (30 s at most).
pub fn guard_open(url: &str, app: &str, extra: &[&str]) -> Run {
    let mut args = vec!["guard", "open", "--app", app, "--redis-url", url];
    args.extend_from_slice(extra);
    run_snowlease(&args, &[], Duration::from_secs(30))
}

/// Collects the lines of `pipe` into `sink` on a background thread.
pub(super) fn read_lines(
    pipe: impl Read + Send + 'static,
    sink: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(pipe).split(b'\n') {
            let Ok(line) = line else { break };
            sink.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&line).into_owned());
        }
    })
}

/// Runs `cmd` (stdin closed, output captured) to completion; kills it after `timeout`.
pub fn run_command(mut cmd: Command, timeout: Duration) -> Run {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let readers = [
        read_lines(child.stdout.take().unwrap(), out.clone()),
        read_lines(child.stderr.take().unwrap(), err.clone()),
    ];
    let status = poll_some(timeout, || child.try_wait().ok().flatten());
    let timed_out = status.is_none();
    if timed_out {
        let _ = child.kill();
        let _ = child.wait();
    }
    for r in readers {
        let _ = r.join();
    }
    let join = |v: Arc<Mutex<Vec<String>>>| v.lock().unwrap().join("\n");
    Run {
        code: status.and_then(|s| s.code()),
        stdout: join(out),
        stderr: join(err),
        timed_out,
    }
}

/// libfaketime's preload library (Debian package `faketime`; `.ci/run` installs it), for a
/// process whose wall clock a test offsets: `LD_PRELOAD` it with `FAKETIME_TIMESTAMP_FILE`
/// naming a file that holds the offset (e.g. `+2s`, `-30`) and `FAKETIME_DONT_FAKE_MONOTONIC=1`
/// (CLOCK_MONOTONIC and CLOCK_BOOTTIME then stay real).
pub fn libfaketime() -> PathBuf {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("libfaketime not found: apt-get install faketime (.ci/run does)")
}
