//! A private `redis-server` per test: free port, no persistence, faults, log on failure.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

use super::{PREFIX, free_port, ms, poll_until, secs, stop_process};

fn redis_server_bin() -> &'static str {
    if Path::new("/usr/bin/redis-server").exists() {
        "/usr/bin/redis-server"
    } else {
        "redis-server"
    }
}

/// A private `redis-server` on a free loopback port, persistence off, killed on drop.
pub struct RedisServer {
    /// The loopback address it listens on (127.0.0.1 unless [`RedisOptions::ip`]).
    ip: String,
    port: u16,
    dir: TempDir,
    child: Option<Child>,
    /// Extra command-line options (e.g. `--replicaof`), kept for restarts.
    args: Vec<String>,
    /// Name shown with the log printed on a panic (e.g. "sentinel 2").
    name: String,
}

/// How to start a [`RedisServer`] beyond the defaults (free port, loopback, no persistence).
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// Written to `redis.conf` in the server's folder on first start and passed first on the
    /// command line; the server may rewrite it (Sentinel does) and a restart reuses it.
    pub config_file: Option<String>,
    /// Extra options, e.g. `["--replicaof", "127.0.0.1", "20001"]` or `["--sentinel"]`.
    pub args: Vec<String>,
    /// Name shown with the log printed on a panic; "redis-server" when empty.
    pub name: String,
    /// The loopback address to listen on; 127.0.0.1 when `None`. Two servers on other
    /// loopback addresses (127.0.0.2, 127.0.0.3) and the same [`RedisOptions::port`] model one
    /// DNS name that moves between hosts (see [`HostsFile`](super::HostsFile)).
    pub ip: Option<String>,
    /// The port; a free one when `None` (then other ports are tried if the server does not
    /// come up). With [`RedisOptions::ip`], use [`free_port_on`](super::free_port_on).
    pub port: Option<u16>,
}

impl RedisServer {
    /// Starts a server on a free port and waits (10 s) until it answers PING; tries other ports
    /// if the server does not come up.
    pub fn start() -> RedisServer {
        RedisServer::start_with(RedisOptions::default())
    }

    /// Like [`RedisServer::start`], with a config file and extra options.
    pub fn start_with(opts: RedisOptions) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("snowlease-redis-")
            .tempdir()
            .expect("tempdir");
        if let Some(conf) = &opts.config_file {
            fs::write(dir.path().join("redis.conf"), conf).expect("write redis.conf");
        }
        let name = if opts.name.is_empty() {
            "redis-server".to_owned()
        } else {
            opts.name
        };
        let ip = opts.ip.unwrap_or_else(|| "127.0.0.1".to_owned());
        let mut errors = Vec::new();
        for _ in 0..5 {
            let port = opts.port.unwrap_or_else(free_port);
            match spawn_redis(&ip, port, dir.path(), &opts.args) {
                Ok(child) => {
                    return RedisServer {
                        ip,
                        port,
                        dir,
                        child: Some(child),
                        args: opts.args,
                        name,
                    };
                }
                Err(e) => errors.push(format!("port {port}: {e}")),
            }
        }
        panic!(
            "{name} did not start: {errors:?}\nlog:\n{}",
            read_to_string_lossy(&dir.path().join("redis.log"))
        );
    }

    /// The server's name in logs and panics.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True while the process runs (not stopped by [`RedisServer::stop`]).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The server's folder (its `redis.conf`, log, `nodes.conf`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The loopback address it listens on (e.g. "127.0.0.1").
    pub fn ip(&self) -> &str {
        &self.ip
    }

    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.ip, self.port)
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

    /// Opens the claim guard of `app` (default prefix) as an established
    /// deployment has it, so a first claim does not wait one TTL.
    pub fn open_claim_guard(&self, app: &str) {
        self.set_stamped(&format!("{PREFIX}{app}:guard"), 0);
    }

    /// Sets `key` to `value` stamped with this server's node stamp (`src/lease/node.lua`), as
    /// the scripts write guards and marks: a value this node wrote in this life.
    pub fn set_stamped(&self, key: &str, value: u64) {
        let script = format!(
            "{}\nredis.call('SET', KEYS[1], stamped(tonumber(ARGV[1]))) return 1",
            include_str!("../../../src/lease/node.lua")
        );
        let _: i64 = self.query(redis::cmd("EVAL").arg(script).arg(1).arg(key).arg(value));
    }

    /// This server's node stamp (`src/lease/node.lua`): changes when it restarts or is promoted.
    pub fn node_stamp(&self) -> String {
        let script = format!(
            "{}\nreturn node_stamp()",
            include_str!("../../../src/lease/node.lua")
        );
        self.query(redis::cmd("EVAL").arg(script).arg(0))
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

    /// Makes every snapshot of this server take about `keys` x `per_key` (as one of a large
    /// data set): writes `keys` filler keys (`filler:<i>`) and sets `rdb-key-save-delay`
    /// (Redis sleeps that long per key it saves). `per_key` zero makes them quick again.
    pub fn slow_snapshots(&self, keys: usize, per_key: Duration) {
        if keys > 0 {
            let mut pipe = redis::pipe();
            for i in 0..keys {
                pipe.cmd("SET").arg(format!("filler:{i}")).arg(i).ignore();
            }
            let _: () = pipe.query(&mut self.conn()).expect("write filler keys");
        }
        let delay_us = per_key.as_micros().to_string();
        let _: () = self.query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("rdb-key-save-delay")
                .arg(delay_us),
        );
    }

    /// The value of `field` in `INFO section` (on a fresh connection, which the server counts
    /// in `total_connections_received` before it answers), e.g.
    /// `info_field("stats", "total_connections_received")` -> `Some("12")`, or
    /// `info_field("commandstats", "cmdstat_evalsha")` -> `Some("calls=3,usec=...")`. None when
    /// the section has no such field (a command never called has no `cmdstat_` line).
    /// `None` too when the reply does not come: a node that changes role closes its clients,
    /// and callers poll this through failovers.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut self.conn())
            .ok()?;
        info.lines().find_map(|line| {
            let (name, value) = line.trim_end().split_once(':')?;
            (name == field).then(|| value.to_owned())
        })
    }

    /// Polls [`RedisServer::info_field`] until `field` of `INFO section` reads `value`; false
    /// when it did not within `within`.
    pub fn wait_info(&self, section: &str, field: &str, value: &str, within: Duration) -> bool {
        poll_until(within, || {
            self.info_field(section, field).as_deref() == Some(value)
        })
    }

    /// One counter of `command` (lower case, e.g. "evalsha") in `INFO commandstats`: "calls",
    /// or "failed_calls" (calls answered with an error, e.g. NOSCRIPT; part of "calls"). 0
    /// before the command's first call.
    pub fn command_stat(&self, command: &str, stat: &str) -> u64 {
        let Some(stats) = self.info_field("commandstats", &format!("cmdstat_{command}")) else {
            return 0;
        };
        stats
            .split(',')
            .find_map(|kv| kv.strip_prefix(stat)?.strip_prefix('='))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {stat}= in cmdstat_{command}:{stats}"))
    }

    /// Calls of `command` (lower case, e.g. "evalsha") the server has counted so far, errors
    /// included; 0 before the first.
    pub fn command_calls(&self, command: &str) -> u64 {
        self.command_stat(command, "calls")
    }

    /// All keys matching `pattern`, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self.query(redis::cmd("KEYS").arg(pattern));
        keys.sort();
        keys
    }

    /// SIGKILL the server and start it again on the same port (10 s deadline), with the
    /// same options and folder (a cluster node keeps its `nodes.conf`, a sentinel its state).
    /// It comes back empty, or, when a `SAVE` left a `dump.rdb` in its folder, with that
    /// snapshot (a crash-restart from the last snapshot: a rollback).
    pub fn restart(&mut self) {
        let args = self.args.clone();
        self.restart_with(args);
    }

    /// Like [`RedisServer::restart`], with other extra options (kept for later restarts).
    pub fn restart_with(&mut self, args: Vec<String>) {
        self.stop();
        self.args = args;
        let deadline = Instant::now() + secs(10);
        let mut last_err = String::new();
        while Instant::now() < deadline {
            match spawn_redis(&self.ip, self.port, self.dir.path(), &self.args) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) => last_err = e,
            }
            thread::sleep(ms(100));
        }
        panic!(
            "{} did not restart on port {}: {last_err}\nlog:\n{}",
            self.name,
            self.port,
            self.log()
        );
    }

    /// SIGKILL the server (no-op when already stopped). Its data is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL ends a paused (SIGSTOPped) server too; the SIGCONT after it is only a
            // harmless extra.
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
                "===== {} :{} log =====\n{}",
                self.name,
                self.port,
                self.log()
            );
        }
    }
}

/// Starts redis-server on `ip:port` (with `dir/redis.conf` first when it exists, then `args`)
/// and waits until it answers PING; kills it on failure.
fn spawn_redis(ip: &str, port: u16, dir: &Path, args: &[String]) -> Result<Child, String> {
    let conf = dir.join("redis.conf");
    let mut cmd = Command::new(redis_server_bin());
    if conf.exists() {
        cmd.arg(&conf);
    }
    let mut child = cmd
        .args(["--port", &port.to_string()])
        .args(["--bind", ip])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", redis_server_bin()))?;
    let url = format!("redis://{ip}:{port}");
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

pub(super) fn ping(url: &str) -> bool {
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
