//! A running `snowlease` process: builder, captured logs, HTTP, files, signals, exit.

use std::ffi::OsString;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::Value;
use tempfile::TempDir;

use super::process::read_lines;
use super::{
    BIN, HTTP_TIMEOUT, RedisServer, child_pids, poll_some, poll_until, secs, stop_process,
};

/// One pod's shared folder (for the ID file and the state file beside it). Cheap to clone;
/// the folder lives while any clone or any sidecar using it lives.
#[derive(Clone)]
pub struct PodDir(Arc<TempDir>);

impl PodDir {
    pub fn new() -> PodDir {
        PodDir(Arc::new(
            tempfile::Builder::new()
                .prefix("snowlease-pod-")
                .tempdir()
                .expect("tempdir"),
        ))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// The worker ID file path used by [`Sidecar::worker`] in this pod.
    pub fn worker_id_file(&self) -> PathBuf {
        self.path().join("worker-id")
    }
}

impl Default for PodDir {
    fn default() -> Self {
        PodDir::new()
    }
}

/// The JSON body of `GET /id` when a lease is held.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct IdReply {
    pub app: String,
    pub worker_id: u32,
    pub owner: String,
    pub lease_expires_in_ms: u64,
}

/// Builds a `snowlease <subcommand>` process. Flags are kept in order; setting a flag again
/// replaces its value.
pub struct SidecarBuilder {
    name: String,
    subcommand: String,
    wrapper: Vec<String>,
    flags: Vec<(String, Option<String>)>,
    env: Vec<(OsString, OsString)>,
    pod: PodDir,
}

impl SidecarBuilder {
    /// `snowlease <subcommand> --listen 127.0.0.1:0 --log-format json`, a fresh [`PodDir`].
    pub fn new(subcommand: &str) -> SidecarBuilder {
        SidecarBuilder {
            name: subcommand.to_string(),
            subcommand: subcommand.to_string(),
            wrapper: Vec::new(),
            flags: Vec::new(),
            env: Vec::new(),
            pod: PodDir::new(),
        }
        .flag("--listen", "127.0.0.1:0")
        .flag("--log-format", "json")
    }

    /// Sets `--name value`, replacing an earlier value of the same flag.
    pub fn flag(mut self, name: &str, value: impl Into<String>) -> Self {
        let value = Some(value.into());
        match self.flags.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = value,
            None => self.flags.push((name.to_string(), value)),
        }
        self
    }

    /// Adds a flag without a value (e.g. `--verbose`).
    pub fn switch(mut self, name: &str) -> Self {
        self.flags.push((name.to_string(), None));
        self
    }

    /// Removes a flag (to test a default or an env twin instead).
    pub fn without(mut self, name: &str) -> Self {
        self.flags.retain(|(n, _)| n != name);
        self
    }

    /// Adds an environment variable (the environment is otherwise only PATH).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Runs the binary under a wrapper command, e.g. `["unshare", "--pid", "--fork"]`.
    /// [`Sidecar::pid`] then resolves to the `snowlease` process (the wrapper's child).
    pub fn wrap(mut self, wrapper: &[&str]) -> Self {
        self.wrapper = wrapper.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Uses `pod` (shared with other sidecars) instead of a fresh folder. Call before flags that
    /// point into the pod folder are derived (the worker `--output-file` is set at spawn).
    pub fn pod(mut self, pod: &PodDir) -> Self {
        self.pod = pod.clone();
        self
    }

    /// A label used in printed logs.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn pod_dir(&self) -> &PodDir {
        &self.pod
    }

    fn value_of(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// The command line, without the wrapper. A subcommand of two words (`pool serve`) is two
    /// arguments.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = self.subcommand.split(' ').map(str::to_string).collect();
        for (name, value) in &self.flags {
            args.push(name.clone());
            args.extend(value.clone());
        }
        args
    }

    /// Starts the process.
    pub fn spawn(mut self) -> Sidecar {
        if self.subcommand == "worker" && self.value_of("--output-file").is_none() {
            let file = self.pod.worker_id_file().to_string_lossy().into_owned();
            self = self.flag("--output-file", file);
        }
        let output_file = self.value_of("--output-file").map(PathBuf::from);
        let args = self.args();
        let mut cmd = match self.wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {BIN} {args:?}: {e}"));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            read_lines(child.stderr.take().unwrap(), stderr.clone()),
            read_lines(child.stdout.take().unwrap(), stdout.clone()),
        ];
        Sidecar {
            name: self.name,
            args,
            wrapped: !self.wrapper.is_empty(),
            child,
            inner_pid: OnceLock::new(),
            exit: None,
            pod: self.pod,
            output_file,
            stderr,
            stdout,
            readers,
            http: ureq::AgentBuilder::new()
                .timeout(HTTP_TIMEOUT)
                .max_idle_connections(0)
                .build(),
            addr: OnceLock::new(),
        }
    }
}

/// A running `snowlease` process. SIGKILLed on drop; its output printed when the test panics.
pub struct Sidecar {
    name: String,
    args: Vec<String>,
    wrapped: bool,
    child: Child,
    inner_pid: OnceLock<Pid>,
    exit: Option<ExitStatus>,
    pod: PodDir,
    output_file: Option<PathBuf>,
    stderr: Arc<Mutex<Vec<String>>>,
    stdout: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    http: ureq::Agent,
    addr: OnceLock<SocketAddr>,
}

impl Sidecar {
    /// `snowlease worker` for `app` against `redis`, with test defaults: TTL 2 s, renew every
    /// 500 ms, `--output-file <pod>/worker-id`, JSON logs, HTTP on 127.0.0.1:0.
    pub fn worker(redis: &RedisServer, app: &str) -> SidecarBuilder {
        Sidecar::worker_at(&redis.url(), app)
    }

    /// Like [`Sidecar::worker`] with any Redis URL (e.g. one nothing listens on).
    pub fn worker_at(redis_url: &str, app: &str) -> SidecarBuilder {
        SidecarBuilder::new("worker")
            .name(format!("worker {app}"))
            .flag("--app", app)
            .flag("--redis-url", redis_url)
            .flag("--ttl", "2s")
            .flag("--renew-interval", "500ms")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// PID of the `snowlease` process (for a wrapped sidecar: the wrapper's child, found in
    /// `/proc/<pid>/task/<pid>/children` within 5 s).
    pub fn pid(&self) -> Pid {
        if !self.wrapped {
            return self.spawned_pid();
        }
        *self.inner_pid.get_or_init(|| {
            let me = self.spawned_pid();
            poll_some(secs(5), || child_pids(me).into_iter().next())
                .unwrap_or_else(|| panic!("{}: wrapper {me} has no child process", self.name))
        })
    }

    /// PID of the process that was spawned (the wrapper if any).
    pub fn spawned_pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// SIGSTOP the `snowlease` process and return once all its threads are stopped (the
    /// signal alone takes effect asynchronously, and a thread may still answer a request).
    pub fn pause(&self) {
        stop_process(self.pid());
    }

    /// SIGCONT after [`Sidecar::pause`].
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT);
    }

    /// Sends `sig` to the `snowlease` process.
    pub fn signal(&self, sig: Signal) {
        kill(self.pid(), sig).unwrap_or_else(|e| panic!("{}: kill {sig}: {e}", self.name));
    }

    /// Waits up to `timeout` for the spawned process to exit. Once it has, the output readers
    /// are given up to 2 s to drain, so the captured log is complete.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exit.is_none() {
            let child = &mut self.child;
            self.exit = poll_some(timeout, || child.try_wait().ok().flatten());
            if self.exit.is_some() {
                poll_until(secs(2), || self.readers.iter().all(|r| r.is_finished()));
            }
        }
        self.exit
    }

    /// True while the spawned process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.exit.is_none() && matches!(self.child.try_wait(), Ok(None))
    }

    /// Captured stderr lines so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Captured stdout lines so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// Stderr lines that parse as JSON log events.
    pub fn events(&self) -> Vec<Value> {
        self.log_lines()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Events whose `message` contains `substr`.
    pub fn events_with(&self, substr: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| message(e).contains(substr))
            .collect()
    }

    /// Number of stderr lines containing `substr`.
    pub fn count_log(&self, substr: &str) -> usize {
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(substr))
            .count()
    }

    /// True once a stderr line contains `substr`; false if none did within `timeout`.
    pub fn wait_for_log(&self, substr: &str, timeout: Duration) -> bool {
        poll_until(timeout, || self.count_log(substr) > 0)
    }

    /// The first event whose message contains `substr`, waiting up to `timeout`.
    pub fn wait_for_event(&self, substr: &str, timeout: Duration) -> Option<Value> {
        poll_some(timeout, || self.events_with(substr).into_iter().next())
    }

    /// The HTTP address, from the "http listening" log event of `--listen` (not that of a
    /// unix socket; waits up to 10 s).
    pub fn http_addr(&self) -> SocketAddr {
        *self.addr.get_or_init(|| {
            poll_some(secs(10), || {
                self.events_with("http listening")
                    .iter()
                    .find_map(|event| event["addr"].as_str()?.parse().ok())
            })
            .unwrap_or_else(|| panic!("{}: no \"http listening\" log event", self.name))
        })
    }

    /// `GET path` with an optional Accept header -> (status, body). Status 0 means no answer
    /// within [`HTTP_TIMEOUT`] or no connection (the body then holds the error).
    pub fn http_get(&self, path: &str, accept: Option<&str>) -> (u16, String) {
        self.http_get_within(path, accept, HTTP_TIMEOUT)
    }

    /// [`Sidecar::http_get`] with another timeout (e.g. a request left waiting on a paused
    /// sidecar until it resumes).
    pub fn http_get_within(
        &self,
        path: &str,
        accept: Option<&str>,
        timeout: Duration,
    ) -> (u16, String) {
        let url = format!("http://{}{}", self.http_addr(), path);
        let mut req = self.http.get(&url).timeout(timeout);
        if let Some(accept) = accept {
            req = req.set("Accept", accept);
        }
        match req.call() {
            Ok(resp) => (resp.status(), resp.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    }

    /// `GET /id` (JSON) -> (status, body).
    pub fn get_id(&self) -> (u16, String) {
        self.http_get("/id", None)
    }

    /// The parsed `/id` reply when it answers 200, else None.
    pub fn id(&self) -> Option<IdReply> {
        match self.get_id() {
            (200, body) => Some(
                serde_json::from_str(&body)
                    .unwrap_or_else(|e| panic!("{}: bad /id body {body:?}: {e}", self.name)),
            ),
            _ => None,
        }
    }

    /// Waits until `/id` answers 200 and returns the reply; panics after `timeout`.
    pub fn wait_for_lease(&self, timeout: Duration) -> IdReply {
        poll_some(timeout, || self.id()).unwrap_or_else(|| {
            panic!(
                "{}: no lease within {timeout:?}; last /id: {:?}",
                self.name,
                self.get_id()
            )
        })
    }

    /// Status of `GET /readyz` (0: no answer).
    pub fn readyz(&self) -> u16 {
        self.http_get("/readyz", None).0
    }

    /// The `/metrics` body (panics unless 200).
    pub fn metrics(&self) -> String {
        let (status, body) = self.http_get("/metrics", None);
        assert_eq!(status, 200, "{}: /metrics: {body}", self.name);
        body
    }

    /// Value of one series, written as in the exposition, e.g. `snowlease_lease_held` or
    /// `snowlease_renewals_total{outcome="renewed"}`. None when absent.
    pub fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.metrics(), series)
    }

    /// All samples of metric family `name`: (labels text, e.g. `{outcome="renewed"}` or "",
    /// value).
    pub fn metric_samples(&self, name: &str) -> Vec<(String, f64)> {
        metric_samples(&self.metrics(), name)
    }

    /// The pod folder of this sidecar.
    pub fn pod(&self) -> &PodDir {
        &self.pod
    }

    /// The `--output-file` path.
    pub fn output_file(&self) -> &Path {
        self.output_file
            .as_deref()
            .expect("sidecar has an --output-file")
    }

    /// The state file beside the output file (`<output-file>.state.json`).
    pub fn state_file(&self) -> PathBuf {
        let mut p = self.output_file().as_os_str().to_owned();
        p.push(".state.json");
        PathBuf::from(p)
    }

    /// Contents of the output file, None when absent.
    pub fn read_output_file(&self) -> Option<String> {
        fs::read_to_string(self.output_file()).ok()
    }

    /// The parsed state file, None when absent.
    pub fn read_state(&self) -> Option<Value> {
        let text = fs::read_to_string(self.state_file()).ok()?;
        Some(serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("{}: bad state file {text:?}: {e}", self.name);
        }))
    }

    /// The command line (without the wrapper), for messages.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    fn print_output(&self) {
        eprintln!(
            "===== {} (pid {}) {:?} stderr =====",
            self.name,
            self.child.id(),
            self.args
        );
        for line in self.log_lines() {
            eprintln!("{line}");
        }
        let stdout = self.stdout_lines();
        if !stdout.is_empty() {
            eprintln!("===== {} stdout =====", self.name);
            for line in stdout {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if self.exit.is_none() {
            if self.wrapped {
                for pid in child_pids(self.spawned_pid()) {
                    let _ = kill(pid, Signal::SIGKILL);
                }
            }
            let _ = kill(self.spawned_pid(), Signal::SIGKILL);
            let _ = self.child.wait();
        }
        if thread::panicking() {
            self.print_output();
        }
    }
}

/// The `message` of a JSON log event ("" when absent).
pub fn message(event: &Value) -> &str {
    event["message"].as_str().unwrap_or("")
}

/// The level of a JSON log event ("" when absent).
pub fn level(event: &Value) -> &str {
    event["level"].as_str().unwrap_or("")
}

/// Value of one series in a Prometheus text exposition.
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// All samples of family `name` in a Prometheus text exposition: (labels text, value).
pub fn metric_samples(exposition: &str, name: &str) -> Vec<(String, f64)> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            let (labels, value) = rest.rsplit_once(' ')?;
            Some((labels.trim().to_string(), value.parse().ok()?))
        })
        .collect()
}
