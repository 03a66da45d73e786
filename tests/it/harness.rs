//! Test harness: real `redis-server` processes on free loopback ports and real `snowlease` processes.
//!
//! # Layout
//! - [`poll_until`] / [`poll_some`]: wait for a condition with a deadline (never a fixed sleep).
//! - [`free_port`]: a free loopback port outside the kernel's ephemeral range, never 6379.
//! - [`RedisServer`]: a private `redis-server` (no persistence) killed on drop; prints its log
//!   when the test panics. Fault helpers: `restart` (empty, same port), `pause` / `resume`
//!   (SIGSTOP / SIGCONT), `stop`.
//! - [`PodDir`]: a temporary folder standing for one pod's shared volume (ID file, state file);
//!   clone it into several sidecars to model a sidecar restart inside the same pod.
//! - [`SidecarBuilder`] / [`Sidecar`]: a running `snowlease <subcommand>` in a scrubbed
//!   environment, stderr and stdout captured line by line, HTTP helpers, signals, exit status;
//!   killed with SIGKILL on drop, its log printed when the test panics.
//! - [`run_snowlease`]: run the binary to completion (bad-input tests), with a deadline.
//!
//! A typical worker test:
//! ```ignore
//! let redis = RedisServer::start();
//! let sidecar = Sidecar::worker(&redis, "orders").flag("--max-worker-id", "3").spawn();
//! let lease = sidecar.wait_for_lease(secs(10));
//! assert_eq!(redis.get(&worker_key("orders", lease.worker_id)), Some(lease.owner));
//! ```

// Each test module uses a different part of this API.
#![allow(dead_code)]

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use nix::sys::signal::Signal;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::Value;
use tempfile::TempDir;

/// The `snowlease` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_snowlease");
/// Default key prefix of the worker mode.
pub const PREFIX: &str = "snowflake:worker:";
/// How often [`poll_until`] re-checks its condition.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Timeout of one HTTP request to a sidecar; a stopped (SIGSTOP) sidecar answers nothing.
pub const HTTP_TIMEOUT: Duration = Duration::from_millis(500);
/// Loopback ports handed to Redis servers. Below Linux's ephemeral range (32768-60999) so that
/// neither a `127.0.0.1:0` listener nor an outgoing connection can take the port of a stopped
/// Redis (an outgoing connect to a dead local port can otherwise connect to itself).
const PORT_RANGE: std::ops::Range<u16> = 20_000..32_000;

/// Shorthand for `Duration::from_secs`.
pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Shorthand for `Duration::from_millis`.
pub fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}

/// Calls `cond` every [`POLL_INTERVAL`] until it returns true (-> true) or `timeout` passes
/// (-> false). `cond` is always called at least once, and once more at the deadline.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    poll_some(timeout, || cond().then_some(())).is_some()
}

/// Like [`poll_until`], but returns the first `Some` value `f` produces.
pub fn poll_some<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// Unix time in milliseconds.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// The Redis key of worker ID `id` of `app` under the default prefix.
pub fn worker_key(app: &str, id: u32) -> String {
    format!("{PREFIX}{app}:{id}")
}

/// A loopback port that nothing listens on right now, never 6379, never handed out twice in
/// this test process.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut handed_out = HANDED_OUT.lock().unwrap();
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    for _ in 0..10_000 {
        let port = rand::random_range(PORT_RANGE);
        if port == 6379 || handed_out.contains(&port) {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {PORT_RANGE:?}");
}

fn redis_server_bin() -> &'static str {
    if Path::new("/usr/bin/redis-server").exists() {
        "/usr/bin/redis-server"
    } else {
        "redis-server"
    }
}

/// A private `redis-server` on a free loopback port, persistence off, killed on drop.
pub struct RedisServer {
    port: u16,
    dir: TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server on a free port and waits (10 s) until it answers PING; tries other ports
    /// if the server does not come up.
    pub fn start() -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("snowlease-redis-")
            .tempdir()
            .expect("tempdir");
        let mut errors = Vec::new();
        for _ in 0..5 {
            let port = free_port();
            match spawn_redis(port, dir.path()) {
                Ok(child) => {
                    return RedisServer {
                        port,
                        dir,
                        child: Some(child),
                    };
                }
                Err(e) => errors.push(format!("port {port}: {e}")),
            }
        }
        panic!(
            "redis-server did not start: {errors:?}\nlog:\n{}",
            read_to_string_lossy(&dir.path().join("redis.log"))
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Process ID of the running server.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("redis-server is running").id() as i32)
    }

    /// A new synchronous connection with 2 s read and write timeouts (so a test never hangs on
    /// a paused server).
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("redis url");
        let conn = client
            .get_connection_with_timeout(secs(2))
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url()));
        conn.set_read_timeout(Some(secs(2))).unwrap();
        conn.set_write_timeout(Some(secs(2))).unwrap();
        conn
    }

    /// Runs one command on a fresh connection, e.g. `redis.query(redis::cmd("DBSIZE"))`.
    pub fn query<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        cmd.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("redis command failed: {e}"))
    }

    /// GET as a string (None when missing).
    pub fn get(&self, key: &str) -> Option<String> {
        self.query(redis::cmd("GET").arg(key))
    }

    /// PTTL in ms (-2 missing, -1 no expiry).
    pub fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key))
    }

    /// GET and PTTL of one key, read atomically (MULTI/EXEC).
    pub fn get_with_pttl(&self, key: &str) -> (Option<String>, i64) {
        redis::pipe()
            .atomic()
            .cmd("GET")
            .arg(key)
            .cmd("PTTL")
            .arg(key)
            .query(&mut self.conn())
            .unwrap_or_else(|e| panic!("GET/PTTL {key}: {e}"))
    }

    pub fn exists(&self, key: &str) -> bool {
        self.query::<i64>(redis::cmd("EXISTS").arg(key)) == 1
    }

    pub fn key_type(&self, key: &str) -> String {
        self.query(redis::cmd("TYPE").arg(key))
    }

    pub fn dbsize(&self) -> i64 {
        self.query(&mut redis::cmd("DBSIZE"))
    }

    /// All keys matching `pattern`, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self.query(redis::cmd("KEYS").arg(pattern));
        keys.sort();
        keys
    }

    /// SIGKILL the server and start an empty one on the same port (10 s deadline).
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + secs(10);
        let mut last_err = String::new();
        while Instant::now() < deadline {
            match spawn_redis(self.port, self.dir.path()) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) => last_err = e,
            }
            thread::sleep(ms(100));
        }
        panic!(
            "redis-server did not restart on port {}: {last_err}\nlog:\n{}",
            self.port,
            self.log()
        );
    }

    /// SIGKILL the server (no-op when already stopped). Its data is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGCONT first: a paused server would otherwise stay a zombie-to-be until resumed.
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGKILL);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = child.wait();
        }
    }

    /// SIGSTOP, returning once the server is stopped: it keeps its sockets and data but
    /// answers nothing (the kernel still accepts connections and buffers requests).
    pub fn pause(&self) {
        stop_process(self.pid());
    }

    /// SIGCONT after [`RedisServer::pause`].
    pub fn resume(&self) {
        kill(self.pid(), Signal::SIGCONT).expect("SIGCONT redis-server");
    }

    /// The server's log file (all runs on this port, including restarts).
    pub fn log(&self) -> String {
        read_to_string_lossy(&self.dir.path().join("redis.log"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        if thread::panicking() {
            eprintln!(
                "===== redis-server :{} log =====\n{}",
                self.port,
                self.log()
            );
        }
    }
}

/// Starts redis-server on `port` and waits until it answers PING; kills it on failure.
fn spawn_redis(port: u16, dir: &Path) -> Result<Child, String> {
    let mut child = Command::new(redis_server_bin())
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", redis_server_bin()))?;
    let url = format!("redis://127.0.0.1:{port}");
    let up = poll_until(secs(10), || {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return true;
        }
        ping(&url)
    });
    match child.try_wait() {
        Ok(None) if up => Ok(child),
        Ok(Some(status)) => Err(format!("redis-server exited: {status}")),
        _ => {
            let _ = child.kill();
            let _ = child.wait();
            Err("redis-server did not answer PING within 10 s".into())
        }
    }
}

fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(ms(200)) else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(ms(500)));
    redis::cmd("PING")
        .query::<String>(&mut conn)
        .is_ok_and(|r| r == "PONG")
}

fn read_to_string_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| format!("<cannot read {}: {e}>", path.display()))
}

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

    /// The command line, without the wrapper.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![self.subcommand.clone()];
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

fn read_lines(pipe: impl Read + Send + 'static, sink: Arc<Mutex<Vec<String>>>) -> JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(pipe).split(b'\n') {
            let Ok(line) = line else { break };
            sink.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&line).into_owned());
        }
    })
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

    /// Events whose `fields.message` contains `substr`.
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

    /// The HTTP address, from the "http listening" log event (waits up to 10 s).
    pub fn http_addr(&self) -> SocketAddr {
        *self.addr.get_or_init(|| {
            let event = self
                .wait_for_event("http listening", secs(10))
                .unwrap_or_else(|| panic!("{}: no \"http listening\" log event", self.name));
            event["fields"]["addr"]
                .as_str()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("{}: bad addr in {event}", self.name))
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

/// The fields.message of a JSON log event ("" when absent).
pub fn message(event: &Value) -> &str {
    event["fields"]["message"].as_str().unwrap_or("")
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
    let mut child = Command::new(BIN)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {BIN}: {e}"));
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

/// The harness itself: a Redis server starts, restarts empty on the same port, pauses, stops.
#[test]
fn harness_redis_server_lifecycle() {
    let mut redis = RedisServer::start();
    let port = redis.port();
    assert_ne!(port, 6379);
    let _: () = redis.query(redis::cmd("SET").arg("k").arg("v"));
    assert_eq!(redis.get("k").as_deref(), Some("v"));
    assert_eq!(redis.dbsize(), 1);

    redis.restart();
    assert_eq!(redis.port(), port);
    assert_eq!(redis.dbsize(), 0, "restart must come back empty");

    let mut conn = redis.conn();
    redis.pause();
    conn.set_read_timeout(Some(ms(300))).unwrap();
    assert!(
        redis::cmd("PING").query::<String>(&mut conn).is_err(),
        "a paused server must not answer"
    );
    redis.resume();
    assert!(poll_until(secs(5), || ping(&redis.url())));

    let url = redis.url();
    redis.stop();
    assert!(!ping(&url), "a stopped server must not answer");
    assert!(redis.log().contains("Ready to accept connections"));
}

/// The harness itself: run_snowlease captures output and exit code of the real binary.
#[test]
fn harness_runs_binary() {
    let run = run_snowlease(&["--help"], &[], secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("worker"), "{run:?}");
}
