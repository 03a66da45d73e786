//! Test harness: real `redis-server` and real `snowlease` processes, on loopback ports.
//!
//! # Layout
//! Everything is re-exported here; tests `use crate::harness::*`.
//! - this file: [`poll_until`] / [`poll_some`] (wait for a condition with a deadline, never a
//!   fixed sleep), [`free_port`] (outside the kernel's ephemeral range, never 6379), constants,
//!   the harness's own tests.
//! - `harness/redis_server.rs`: [`RedisServer`], a private `redis-server` (no persistence)
//!   killed on drop, its log printed when the test panics; faults: `restart` (empty, same
//!   port), `pause` / `resume` (SIGSTOP / SIGCONT), `stop`; `INFO` fields and command counts.
//! - `harness/sidecar.rs`: [`PodDir`] (one pod's folder for the ID and state files; share it
//!   to model a sidecar restart in the same pod), [`SidecarBuilder`] / [`Sidecar`] (a running
//!   `snowlease <subcommand>` in a scrubbed environment: logs captured, HTTP, files, signals,
//!   exit status; SIGKILLed on drop, its log printed when the test panics), log and
//!   Prometheus parsing.
//! - `harness/proxy.rs`: [`FaultProxy`], a TCP proxy on a free loopback port in front of one
//!   Redis; per connection (numbered in accept order) or for all: [`Mode`] pass, blackhole
//!   (bytes held), delay, drop replies, reset (RST), and `freeze_existing` (old connections
//!   held, new ones pass); held bytes are delivered in order once a connection passes again.
//! - `harness/topology.rs`: [`SentinelTopology`] (primary + replicas + `--sentinel` nodes:
//!   failover, kill the primary, restart as replica; optionally a [`FaultProxy`] announced in
//!   front of each data node, to partition one) and [`ClusterTopology`]
//!   (`redis-cli --cluster create`: slots, key owners, kill a primary, migrate a slot in
//!   steps, a shard restarted empty or from its snapshot, a failover to a lagging replica).
//!   Tested in `harness_selftest`. Costs measured on the 2-core CI machine, start to ready:
//!   Sentinel 1+2+3 ~2.3-3.4 s (sentinels find each other by 2 s hellos), `start_small`
//!   1+1+1 ~0.15 s; Cluster 3+3 ~2.7-3.1 s, 3+0 ~2.2 s (mostly `redis-cli`'s join wait).
//!   A planned failover ~1.2 s, a killed primary replaced in
//!   ~2.3 s (Sentinel) / ~2.0-2.4 s (Cluster). At most 2 topologies run at once
//!   ([`TopologyPermit`], env `SNOWLEASE_MAX_TOPOLOGIES`) so 8 test threads on 2 cores do not
//!   starve nodes into false failovers; a test holds one topology at a time.
//! - `harness/deployment.rs`: [`Topo`] and [`Deployment`], one Redis of any topology for the
//!   worker scenarios written once (`scenarios.rs`): the sidecar's URL, `guard open`, keys
//!   read and overwritten on the node that serves them ([`Keyspace`], also implemented by
//!   [`RedisServer`]), `SCRIPT FLUSH` on every node. Sentinel and Cluster are shared by the
//!   tests running at the same time (one start, killed after the last).
//! - `harness/sampling.rs`: [`published`] (`/id` of many sidecars at once) and
//!   [`sample_through`] (sample them every 20 ms through a fault; no ID twice at once; the
//!   longest stretch each went without an ID); [`sample_ids`] (one thread per sidecar, send
//!   and receive times, for paused sidecars) and [`assert_never_published_together`].
//! - `harness/hosts.rs`: [`HostsFile`], a private `/etc/hosts` bind-mounted over the real one in
//!   a mount namespace of the process under test (`unshare --mount`, via
//!   [`SidecarBuilder::wrap`] or [`HostsFile::run`]); `set` moves a name to another loopback
//!   address in place (glibc reads the file at every lookup): a managed Redis's DNS failover.
//!   With [`RedisOptions::ip`] / [`RedisOptions::port`] and [`free_port_on`], servers on
//!   127.0.0.2 and 127.0.0.3 share a port.
//! - `harness/process.rs`: [`stop_process`] (SIGSTOP that waits until stopped), `/proc`
//!   readers, [`run_snowlease`] (run the binary to completion, with a deadline),
//!   [`pid1_tests_can_run`] (PID 1 tests fail without `unshare --pid`, unless
//!   `SNOWLEASE_SKIP_PID1=1`).
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

mod deployment;
mod hosts;
mod process;
mod proxy;
mod redis_server;
mod sampling;
mod sidecar;
mod topology;

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use deployment::*;
pub use hosts::*;
pub use nix::sys::signal::Signal;
pub use process::*;
pub use proxy::*;
pub use redis_server::*;
pub use sampling::*;
pub use sidecar::*;
pub use topology::*;

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
/// Says that `what` (a test, or part of one) did not run, and why: on stderr (past cargo's
/// capture only with `--nocapture`) and as a line `<what>: <why>` appended to the file named
/// by `SNOWLEASE_SKIPPED_FILE`, which scripts/test.sh sets and reads, so its summary counts
/// the test as skipped, by name, instead of passed.
pub fn skip(what: &str, why: &str) {
    use std::io::Write;
    eprintln!("SKIPPED {what}: {why}");
    if let Some(path) = std::env::var_os("SNOWLEASE_SKIPPED_FILE") {
        let line = format!("{what}: {}\n", why.replace('\n', " "));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path);
        let _ = file.and_then(|mut f| f.write_all(line.as_bytes()));
    }
}

/// An `EVAL` that sets `key` to `value` stamped by the node that runs it
/// (`src/lease/node.lua`), as the scripts write claim guards: routed by its key on Cluster,
/// so a pipeline of them opens every per-ID guard on its own node.
pub fn stamp_cmd(key: &str, value: u64) -> redis::Cmd {
    let script = format!(
        "{}\nredis.call('SET', KEYS[1], stamped(tonumber(ARGV[1]))) return 1",
        include_str!("../../src/lease/node.lua")
    );
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(1).arg(key).arg(value);
    cmd
}

/// The integer part of a value the scripts stamp (`"<integer>.<node stamp>"`, guards and
/// mint marks) or of a plain integer.
pub fn stamped_int(value: &str) -> u64 {
    value
        .split('.')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|e| panic!("{value:?}: {e}"))
}

pub fn worker_key(app: &str, id: u32) -> String {
    format!("{PREFIX}{app}:{id}")
}

/// A loopback port that nothing listens on right now, never 6379, never handed out twice in
/// this test process.
pub fn free_port() -> u16 {
    free_port_on(&["127.0.0.1"])
}

/// Like [`free_port`], a port free on each of the loopback addresses `ips` (e.g. 127.0.0.2 and
/// 127.0.0.3 for two servers behind one moving DNS name, see [`HostsFile`]).
pub fn free_port_on(ips: &[&str]) -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut handed_out = HANDED_OUT.lock().unwrap();
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    for _ in 0..10_000 {
        let port = rand::random_range(PORT_RANGE);
        if port == 6379 || handed_out.contains(&port) {
            continue;
        }
        if ips.iter().all(|ip| TcpListener::bind((*ip, port)).is_ok()) {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {PORT_RANGE:?}");
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
    assert!(poll_until(secs(5), || redis_server::ping(&redis.url())));

    let url = redis.url();
    redis.stop();
    assert!(
        !redis_server::ping(&url),
        "a stopped server must not answer"
    );
    assert!(redis.log().contains("Ready to accept connections"));
}

/// The harness itself: run_snowlease captures output and exit code of the real binary.
#[test]
fn harness_runs_binary() {
    let run = run_snowlease(&["--help"], &[], secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains("worker"), "{run:?}");
}
