//! `cargo bench --bench fleet`: a fleet of real worker sidecars on this machine, on a
//! 3-primary Cluster and on one server. `SNOWLEASE_FLEET_SIDECARS` sidecars (default 512,
//! `--max-worker-id 1023`) start at once, hold their IDs for a while, then go through a
//! rolling restart with surge: `SNOWLEASE_FLEET_BATCH` new ones (default 32) are started, once
//! all of them published their ID as many old ones get SIGTERM, and so on until every old one
//! was replaced. Meanwhile two samplers read every live sidecar's ID file and `GET /id` over
//! and over: no worker ID may be published by two sidecars at once. Printed per topology:
//! spawn to published (p50/p99/max), Redis calls per second and the CPU of each Redis process
//! (`INFO commandstats`, `/proc/<pid>/stat`) in each phase, the slowest call Redis ran
//! (`SLOWLOG`, threshold 0), Redis memory per held ID (`MEMORY USAGE`, `used_memory`), the
//! sidecars' memory (`VmRSS`, `RssAnon`) and threads, the limits that apply (open files,
//! processes) and the load. Other knobs: `SNOWLEASE_FLEET_MAX_WORKER_ID` (default 1023; at
//! sidecars + batch - 1 every batch after the first takes the IDs the one before released, so
//! the samplers see handovers), `SNOWLEASE_FLEET_TTL` (default 10s),
//! `SNOWLEASE_FLEET_RENEW` (1s), `SNOWLEASE_FLEET_HOLD_S` (seconds of the steady phase, 20),
//! `SNOWLEASE_FLEET_TOPOLOGIES` (`cluster,standalone`). Figures and the sizing drawn from
//! them: docs/worker.md, "A fleet on one machine".

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

// The test harness, shared with the integration tests: its modules sit
// under tests/it/harness/, which an inline module with this path finds.
#[path = "../tests/it"]
#[allow(dead_code, unused_imports)]
mod it {
    pub mod harness;
}
use it::harness::{ClusterTopology, RedisServer, guard_open, rss_kib};

const BIN: &str = env!("CARGO_BIN_EXE_snowlease");
const APP: &str = "fleet";
const PREFIX: &str = "snowflake:worker:";
/// The client name of the bench's own Redis connections, so the slow log's entries of the
/// bench (its `SLOWLOG GET`s) are told apart from the sidecars'.
const BENCH_CLIENT: &str = "fleet-bench";
/// Entries the slow log keeps; the drainer reads the new ones every [`DRAIN_EVERY`].
const SLOWLOG_LEN: usize = 200_000;
const DRAIN_EVERY: Duration = Duration::from_millis(250);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

#[derive(Clone)]
struct Config {
    sidecars: usize,
    batch: usize,
    /// `--max-worker-id`.
    max_id: usize,
    ttl: String,
    renew: String,
    hold: Duration,
}

// ---------------------------------------------------------------------------------------------
// Sidecars

/// One sidecar of the fleet. Shared with the samplers; its process is kept apart.
struct Member {
    index: usize,
    pid: u32,
    /// Keeps the pod folder (ID file, state file, log) alive.
    _dir: tempfile::TempDir,
    file: PathBuf,
    log: PathBuf,
    spawned: Instant,
    addr: OnceLock<SocketAddr>,
}

impl Member {
    /// The `--listen 127.0.0.1:0` address, from the "http listening" event of its log.
    fn addr(&self) -> Option<SocketAddr> {
        if let Some(addr) = self.addr.get() {
            return Some(*addr);
        }
        let log = fs::read_to_string(&self.log).ok()?;
        let addr = log.lines().find_map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).ok()?;
            if event["message"].as_str()? != "http listening" {
                return None;
            }
            event["addr"].as_str()?.parse().ok()
        })?;
        Some(*self.addr.get_or_init(|| addr))
    }

    fn published(&self) -> Option<u32> {
        fs::read_to_string(&self.file).ok()?.trim().parse().ok()
    }
}

fn spawn(url: &str, cfg: &Config, index: usize) -> (Child, Arc<Member>) {
    let dir = tempfile::Builder::new()
        .prefix("snowlease-fleet-")
        .tempdir()
        .unwrap();
    let file = dir.path().join("worker-id");
    let log = dir.path().join("log");
    // An address like a pod's, so the owner strings (and so the keys' size) are a pod's.
    let identity = format!("10.244.{}.{}", index / 250, index % 250 + 1);
    let spawned = Instant::now();
    let child = Command::new(BIN)
        .args(["worker", "--app", APP])
        .args(["--max-worker-id", &cfg.max_id.to_string()])
        .args(["--ttl", &cfg.ttl, "--renew-interval", &cfg.renew])
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--identity", &identity, "--redis-url", url])
        .arg("--output-file")
        .arg(&file)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn snowlease");
    let member = Member {
        index,
        pid: child.id(),
        _dir: dir,
        file,
        log,
        spawned,
        addr: OnceLock::new(),
    };
    (child, Arc::new(member))
}

/// Waits until every one of `members` has written its ID file (2 ms polls, `deadline`); each
/// one's spawn-to-published time.
fn wait_published(members: &[Arc<Member>], deadline: Duration) -> Vec<Duration> {
    let start = Instant::now();
    let mut took: Vec<Option<Duration>> = vec![None; members.len()];
    while took.iter().any(Option::is_none) {
        for (m, t) in members.iter().zip(took.iter_mut()) {
            if t.is_none() && m.file.exists() {
                *t = Some(m.spawned.elapsed());
            }
        }
        if start.elapsed() > deadline {
            let missing: Vec<usize> = members
                .iter()
                .zip(&took)
                .filter(|(_, t)| t.is_none())
                .map(|(m, _)| m.index)
                .collect();
            let last = missing.first().map(|&i| {
                let m = members.iter().find(|m| m.index == i).unwrap();
                fs::read_to_string(&m.log).unwrap_or_default()
            });
            panic!(
                "{} sidecars did not publish within {deadline:?}: {missing:?}; log of the first:\n{}",
                missing.len(),
                last.unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(2));
    }
    took.into_iter().map(Option::unwrap).collect()
}

/// SIGTERM to each, then waits (30 s each) for them to exit: their exit codes.
fn stop(children: Vec<Child>) -> Vec<Option<i32>> {
    for c in &children {
        let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
    }
    children
        .into_iter()
        .map(|mut c| {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(status)) = c.try_wait() {
                    return status.code();
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    return None;
                }
                thread::sleep(Duration::from_millis(5));
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Samplers

/// Runs of one sidecar publishing one ID, from a sampler's point of view.
#[derive(Default)]
struct Tracker {
    /// Per sidecar: the ID of its current run, when its first sample was sent and its last
    /// answer came.
    open: HashMap<usize, (u32, Instant, Instant)>,
    /// Closed runs: (ID, sidecar, first sent, last received).
    runs: Vec<(u32, usize, Instant, Instant)>,
    samples: u64,
    with_id: u64,
}

impl Tracker {
    fn record(&mut self, who: usize, id: Option<u32>, sent: Instant, recv: Instant) {
        self.samples += 1;
        match (self.open.get_mut(&who), id) {
            (Some(run), Some(id)) if run.0 == id => run.2 = recv,
            (_, id) => {
                if let Some((old, first, last)) = self.open.remove(&who) {
                    self.runs.push((old, who, first, last));
                }
                if let Some(id) = id {
                    self.open.insert(who, (id, sent, recv));
                }
            }
        }
        self.with_id += u64::from(id.is_some());
    }

    /// Pairs of runs of one ID by two sidecars whose spans (first request sent to last
    /// answer received) overlap: the ID may have been published twice at once. A sidecar
    /// that hands an ID over stops publishing it before it releases the key, and the next
    /// holder's claim comes at least `--handover-delay` (1 s) later, so correct runs are
    /// apart by far more than a sample's round trip. Also: the number of IDs seen held by
    /// more than one sidecar over the run (handovers).
    fn overlaps(mut self) -> (Vec<String>, usize) {
        for (who, (id, first, last)) in self.open.drain() {
            self.runs.push((id, who, first, last));
        }
        let mut by_id: BTreeMap<u32, Vec<(Instant, Instant, usize)>> = BTreeMap::new();
        for (id, who, first, last) in self.runs {
            by_id.entry(id).or_default().push((first, last, who));
        }
        let mut found = Vec::new();
        let mut handed_over = 0;
        for (id, mut runs) in by_id {
            runs.sort();
            let mut holders: Vec<usize> = runs.iter().map(|r| r.2).collect();
            holders.sort_unstable();
            holders.dedup();
            handed_over += usize::from(holders.len() > 1);
            for (i, a) in runs.iter().enumerate() {
                for b in runs[i + 1..].iter().take_while(|b| b.0 <= a.1) {
                    if b.2 != a.2 {
                        found.push(format!(
                            "ID {id}: sidecar {} and sidecar {} ({:?} apart)",
                            a.2,
                            b.2,
                            b.0 - a.0
                        ));
                    }
                }
            }
        }
        (found, handed_over)
    }
}

/// The sidecars alive now (spawned, not yet seen exited).
type Live = Arc<Mutex<Vec<Arc<Member>>>>;

/// Reads every live sidecar's ID file, over and over until `stop`.
fn sample_files(live: &Live, stop: &AtomicBool) -> Tracker {
    let mut t = Tracker::default();
    while !stop.load(Ordering::Relaxed) {
        let members = live.lock().unwrap().clone();
        for m in &members {
            let sent = Instant::now();
            let id = m.published();
            t.record(m.index, id, sent, Instant::now());
        }
        thread::sleep(Duration::from_millis(5));
    }
    t
}

/// `GET /id` of every live sidecar (kept-alive connections), over and over until `stop`.
fn sample_http(live: &Live, stop: &AtomicBool) -> Tracker {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_millis(500))
        .max_idle_connections(4096)
        .max_idle_connections_per_host(1)
        .build();
    let mut t = Tracker::default();
    while !stop.load(Ordering::Relaxed) {
        let members = live.lock().unwrap().clone();
        for m in &members {
            let Some(addr) = m.addr() else { continue };
            let sent = Instant::now();
            let id = agent
                .get(&format!("http://{addr}/id"))
                .set("Accept", "application/json")
                .call()
                .ok()
                .and_then(|r| r.into_json::<serde_json::Value>().ok())
                .and_then(|body| body["worker_id"].as_u64())
                .map(|id| id as u32);
            t.record(m.index, id, sent, Instant::now());
        }
    }
    t
}

// ---------------------------------------------------------------------------------------------
// Redis' side

/// One Redis process of the topology.
#[derive(Clone, Copy)]
struct Node {
    port: u16,
    pid: u32,
}

fn conn(port: u16) -> redis::Connection {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(BENCH_CLIENT)
        .query(&mut c)
        .unwrap();
    c
}

fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime of `pid` in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    fields
        .get(11)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0)
        + fields
            .get(12)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
}

/// One node's counters at one instant.
#[derive(Clone, Default)]
struct NodeCounters {
    /// (calls, usec) by command name (lower case, as INFO commandstats names them).
    calls: BTreeMap<String, (u64, u64)>,
    total: u64,
    cpu_ticks: u64,
}

/// Commands only the bench sends while a phase runs (`INFO commandstats` names a subcommand
/// `command|sub`); its `INFO`s are subtracted from the sidecars' by count.
const BENCH_COMMANDS: [&str; 4] = ["slowlog|get", "memory|usage", "dbsize", "scan"];

fn counters(node: Node, c: &mut redis::Connection) -> NodeCounters {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    let mut calls = BTreeMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |f: &str| -> u64 {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix(f))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        calls.insert(name.to_owned(), (field("calls="), field("usec=")));
    }
    let stats: String = redis::cmd("INFO").arg("stats").query(c).unwrap();
    let total = stats
        .lines()
        .find_map(|l| l.trim().strip_prefix("total_commands_processed:"))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    NodeCounters {
        calls,
        total,
        cpu_ticks: cpu_ticks(node.pid),
    }
}

/// The Redis side of one phase: calls per second by command (the sidecars', summed over
/// the nodes; commands run inside scripts count too, as in `INFO commandstats`), calls per
/// second and CPU per node.
struct PhaseRedis {
    seconds: f64,
    /// (calls/s, Redis usec/s) by command.
    by_command: BTreeMap<String, (f64, f64)>,
    /// Per node: (sidecars' calls/s, total_commands_processed/s, CPU in % of one core).
    per_node: Vec<(f64, f64, f64)>,
}

/// Counters of every node, read at phase boundaries.
struct Meter {
    nodes: Vec<Node>,
    conns: Vec<redis::Connection>,
    ticks: f64,
}

impl Meter {
    fn snapshot(&mut self) -> (Instant, Vec<NodeCounters>) {
        let at = Instant::now();
        let c = self
            .nodes
            .iter()
            .zip(self.conns.iter_mut())
            .map(|(n, c)| counters(*n, c))
            .collect();
        (at, c)
    }

    fn phase(
        &self,
        from: &(Instant, Vec<NodeCounters>),
        to: &(Instant, Vec<NodeCounters>),
    ) -> PhaseRedis {
        let seconds = (to.0 - from.0).as_secs_f64();
        let mut by_command = BTreeMap::new();
        let mut per_node = Vec::new();
        for (a, b) in from.1.iter().zip(&to.1) {
            let mut sidecars = 0u64;
            for (name, &(n, usec)) in &b.calls {
                if BENCH_COMMANDS.contains(&name.as_str()) {
                    continue;
                }
                let (n0, usec0) = a.calls.get(name).copied().unwrap_or_default();
                let mut d = n - n0;
                if name == "info" {
                    // The bench's own: INFO commandstats and INFO stats at each snapshot
                    // (the later snapshot's are not counted yet when it reads).
                    d = d.saturating_sub(2);
                }
                sidecars += d;
                let slot = by_command.entry(name.clone()).or_insert((0.0, 0.0));
                slot.0 += d as f64 / seconds;
                slot.1 += (usec - usec0) as f64 / seconds;
            }
            per_node.push((
                sidecars as f64 / seconds,
                (b.total - a.total) as f64 / seconds,
                (b.cpu_ticks - a.cpu_ticks) as f64 / self.ticks / seconds * 100.0,
            ));
        }
        by_command.retain(|_, v| v.0 > 0.0);
        PhaseRedis {
            seconds,
            by_command,
            per_node,
        }
    }
}

/// The slowest calls the slow log saw (threshold 0: every call), by command or script.
#[derive(Default)]
struct Slowest {
    /// (command or script) -> (slowest usec, calls seen).
    by_name: BTreeMap<String, (u64, u64)>,
    seen: u64,
    /// Entries that were gone before the drainer read them.
    missed: u64,
}

/// Names of the scripts the sidecar runs, by SHA1 (`EVALSHA`'s first argument).
fn script_names() -> HashMap<String, &'static str> {
    let node = include_str!("../src/lease/node.lua");
    [
        (
            format!("{node}{}", include_str!("../src/worker_id/claim.lua")),
            "claim.lua",
        ),
        (
            include_str!("../src/lease/renew.lua").to_owned(),
            "renew.lua",
        ),
        (
            include_str!("../src/lease/release.lua").to_owned(),
            "release.lua",
        ),
        (
            format!("{node}{}", include_str!("../src/worker_id/guard_open.lua")),
            "guard_open.lua",
        ),
    ]
    .into_iter()
    .map(|(src, name)| (redis::Script::new(&src).get_hash().to_owned(), name))
    .collect()
}

fn text(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(i) => i.to_string(),
        _ => String::new(),
    }
}

fn int(v: &redis::Value) -> u64 {
    match v {
        redis::Value::Int(i) => *i as u64,
        other => text(other).parse().unwrap_or(0),
    }
}

/// Reads the slow log entries of `c` newer than `*last` (ids rise by one per entry).
fn drain_slowlog(
    c: &mut redis::Connection,
    last: &mut Option<u64>,
    names: &HashMap<String, &'static str>,
    out: &mut Slowest,
) {
    let mut count = 1024;
    let entries = loop {
        let entries: Vec<redis::Value> = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(count)
            .query(c)
            .unwrap();
        let oldest = entries.last().and_then(|e| match e {
            redis::Value::Array(f) => f.first().map(int),
            _ => None,
        });
        let reaches = match (oldest, *last) {
            (Some(oldest), Some(last)) => oldest <= last + 1,
            (_, None) | (None, _) => entries.len() < count,
        };
        if reaches || count >= SLOWLOG_LEN {
            break entries;
        }
        count *= 4;
    };
    let mut newest = *last;
    let mut oldest_new = None;
    for entry in &entries {
        let redis::Value::Array(f) = entry else {
            continue;
        };
        let id = f.first().map(int).unwrap_or(0);
        if last.is_some_and(|l| id <= l) {
            continue;
        }
        newest = newest.max(Some(id));
        oldest_new = Some(oldest_new.map_or(id, |o: u64| o.min(id)));
        if f.get(5).map(text).as_deref() == Some(BENCH_CLIENT) {
            continue;
        }
        let usec = f.get(2).map(int).unwrap_or(0);
        let args = match f.get(3) {
            Some(redis::Value::Array(a)) => a.iter().map(text).collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        let command = args.first().map(|a| a.to_lowercase()).unwrap_or_default();
        let name = match command.as_str() {
            "evalsha" => {
                let sha = args.get(1).cloned().unwrap_or_default();
                match names.get(&sha) {
                    Some(n) => format!("evalsha {n}"),
                    None => format!("evalsha {}", &sha[..sha.len().min(8)]),
                }
            }
            "info" => format!("info {}", args.get(1).cloned().unwrap_or_default()),
            _ => command,
        };
        let slot = out.by_name.entry(name).or_default();
        slot.0 = slot.0.max(usec);
        slot.1 += 1;
        out.seen += 1;
    }
    if let (Some(l), Some(o)) = (*last, oldest_new) {
        out.missed += o.saturating_sub(l + 1);
    }
    *last = newest;
}

/// Reads the slow log of each of `conns` every [`DRAIN_EVERY`] until `stop`, then once more.
fn drain_slowlogs(mut conns: Vec<redis::Connection>, stop: &AtomicBool) -> Slowest {
    let names = script_names();
    let mut last: Vec<Option<u64>> = vec![None; conns.len()];
    let mut out = Slowest::default();
    loop {
        let done = stop.load(Ordering::Relaxed);
        for (c, l) in conns.iter_mut().zip(last.iter_mut()) {
            drain_slowlog(c, l, &names, &mut out);
        }
        if done {
            return out;
        }
        thread::sleep(DRAIN_EVERY);
    }
}

fn config_set(c: &mut redis::Connection, name: &str, value: impl redis::ToRedisArgs) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(c)
        .unwrap();
}

/// `MEMORY USAGE key` on whichever node holds it (the others answer MOVED).
fn memory_usage(conns: &mut [redis::Connection], key: &str) -> Option<u64> {
    conns.iter_mut().find_map(|c| {
        redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(key)
            .query::<Option<u64>>(c)
            .ok()
            .flatten()
    })
}

/// The first key matching `pattern` on any node (`SCAN`).
fn some_key(conns: &mut [redis::Connection], pattern: &str) -> Option<String> {
    conns.iter_mut().find_map(|c| {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query(c)
                .ok()?;
            if let Some(k) = keys.into_iter().next() {
                return Some(k);
            }
            if next == 0 {
                return None;
            }
            cursor = next;
        }
    })
}

// ---------------------------------------------------------------------------------------------
// One fleet run

struct Memory {
    vm_rss: Vec<u64>,
    rss_anon: Vec<u64>,
    threads: Vec<u64>,
}

fn threads_of(pid: u32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

struct Report {
    name: String,
    started_together: usize,
    all_published: Duration,
    start_publish: Vec<Duration>,
    rolling_publish: Vec<Duration>,
    rolling_took: Duration,
    start: PhaseRedis,
    hold: PhaseRedis,
    rolling: PhaseRedis,
    file_samples: (u64, u64),
    http_samples: (u64, u64),
    overlaps: Vec<String>,
    handed_over: usize,
    bad_exits: Vec<(usize, Option<i32>)>,
    slowest: Slowest,
    memory: Memory,
    /// Keys after the hold; MEMORY USAGE of a lease key, a guard key and the hint.
    keys: u64,
    /// connected_clients of each node after the hold (3 of them the bench's).
    clients: Vec<u64>,
    lease_key_bytes: Option<u64>,
    guard_key_bytes: Option<u64>,
    hint_bytes: Option<u64>,
    loads: Vec<String>,
}

fn loadavg() -> String {
    fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split(' ')
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn fleet(name: &str, url: &str, nodes: Vec<Node>, cfg: &Config) -> Report {
    let mut loads = vec![loadavg()];
    let mut conns: Vec<redis::Connection> = nodes.iter().map(|n| conn(n.port)).collect();
    // As a deployment does before its first sidecars (docs/worker.md, "Claim guard"); its
    // keys count in the key count, its calls in none.
    let run = guard_open(url, APP, &["--max-worker-id", &cfg.max_id.to_string()]);
    assert_eq!(run.code, Some(0), "guard open: {run:?}");
    for c in &mut conns {
        config_set(c, "slowlog-log-slower-than", 0);
        config_set(c, "slowlog-max-len", SLOWLOG_LEN);
        let _: () = redis::cmd("SLOWLOG").arg("RESET").query(c).unwrap();
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(c).unwrap();
    }
    let drain_conns: Vec<redis::Connection> = nodes.iter().map(|n| conn(n.port)).collect();

    let mut meter = Meter {
        nodes: nodes.clone(),
        conns: nodes.iter().map(|n| conn(n.port)).collect(),
        ticks: clock_ticks(),
    };
    let live: Live = Arc::new(Mutex::new(Vec::new()));
    let stop_sampling = AtomicBool::new(false);
    let stop_draining = AtomicBool::new(false);
    thread::scope(|s| {
        let files = s.spawn(|| sample_files(&live, &stop_sampling));
        let http = s.spawn(|| sample_http(&live, &stop_sampling));
        let drainer = s.spawn(|| drain_slowlogs(drain_conns, &stop_draining));

        // Phase 1: the whole fleet at once.
        let t0 = meter.snapshot();
        let mut next = 0;
        let mut fleet: Vec<(Child, Arc<Member>)> = (0..cfg.sidecars)
            .map(|_| {
                next += 1;
                spawn(url, cfg, next - 1)
            })
            .collect();
        live.lock()
            .unwrap()
            .extend(fleet.iter().map(|(_, m)| m.clone()));
        let members: Vec<Arc<Member>> = fleet.iter().map(|(_, m)| m.clone()).collect();
        let start_publish = wait_published(&members, Duration::from_secs(300));
        let all_published = members[0].spawned.elapsed();
        let t1 = meter.snapshot();
        loads.push(loadavg());

        // Phase 2: holding.
        thread::sleep(cfg.hold);
        let held = meter.snapshot();
        loads.push(loadavg());
        let mut memory = Memory {
            vm_rss: Vec::new(),
            rss_anon: Vec::new(),
            threads: Vec::new(),
        };
        for (_, m) in &fleet {
            let (rss, anon) = rss_kib(m.pid);
            memory.vm_rss.push(rss);
            memory.rss_anon.push(anon);
            memory.threads.push(threads_of(m.pid));
        }
        // Not used_memory: the slow log's entries (every call) are in it.
        let mut keys = 0;
        let mut clients = Vec::new();
        for c in &mut conns {
            keys += redis::cmd("DBSIZE").query::<u64>(c).unwrap();
            let info: String = redis::cmd("INFO").arg("clients").query(c).unwrap();
            clients.push(
                info.lines()
                    .find_map(|l| l.trim().strip_prefix("connected_clients:"))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0),
            );
        }
        let lease_key = fleet[0]
            .1
            .published()
            .map(|id| format!("{PREFIX}{APP}:{id}"));
        let lease_key_bytes = lease_key.and_then(|k| memory_usage(&mut conns, &k));
        let guard_key_bytes = some_key(&mut conns, &format!("{PREFIX}{APP}:guard*"))
            .and_then(|k| memory_usage(&mut conns, &k));
        let hint_bytes = memory_usage(&mut conns, &format!("{PREFIX}{APP}:hint"));

        // Phase 3: rolling restart with surge; counted from here, without the reads above.
        let t2 = meter.snapshot();
        let rolling_began = Instant::now();
        let mut rolling_publish = Vec::new();
        let mut bad_exits = Vec::new();
        let mut old: Vec<(Child, Arc<Member>)> = std::mem::take(&mut fleet);
        old.reverse();
        while !old.is_empty() {
            let n = cfg.batch.min(old.len());
            let new: Vec<(Child, Arc<Member>)> = (0..n)
                .map(|_| {
                    next += 1;
                    spawn(url, cfg, next - 1)
                })
                .collect();
            live.lock()
                .unwrap()
                .extend(new.iter().map(|(_, m)| m.clone()));
            let new_members: Vec<Arc<Member>> = new.iter().map(|(_, m)| m.clone()).collect();
            rolling_publish.extend(wait_published(&new_members, Duration::from_secs(120)));
            fleet.extend(new);
            let (children, gone): (Vec<Child>, Vec<Arc<Member>>) =
                old.split_off(old.len() - n).into_iter().unzip();
            for (m, code) in gone.iter().zip(stop(children)) {
                if code != Some(0) {
                    bad_exits.push((m.index, code));
                }
            }
            live.lock()
                .unwrap()
                .retain(|m| !gone.iter().any(|g| g.index == m.index));
        }
        let rolling_took = rolling_began.elapsed();
        let t3 = meter.snapshot();
        loads.push(loadavg());

        // The end: everyone stops; the samplers see them go.
        let (children, members): (Vec<Child>, Vec<Arc<Member>>) = fleet.into_iter().unzip();
        for (m, code) in members.iter().zip(stop(children)) {
            if code != Some(0) {
                bad_exits.push((m.index, code));
            }
        }
        live.lock().unwrap().clear();
        stop_sampling.store(true, Ordering::Relaxed);
        stop_draining.store(true, Ordering::Relaxed);
        let files = files.join().unwrap();
        let http = http.join().unwrap();
        let slowest = drainer.join().unwrap();
        let file_samples = (files.samples, files.with_id);
        let http_samples = (http.samples, http.with_id);
        let (mut overlaps, handed_over) = files.overlaps();
        let (http_overlaps, _) = http.overlaps();
        overlaps.extend(http_overlaps.into_iter().map(|o| format!("/id: {o}")));
        Report {
            name: name.to_owned(),
            started_together: cfg.sidecars,
            all_published,
            start_publish,
            rolling_publish,
            rolling_took,
            start: meter.phase(&t0, &t1),
            hold: meter.phase(&t1, &held),
            rolling: meter.phase(&t2, &t3),
            file_samples,
            http_samples,
            overlaps,
            handed_over,
            bad_exits,
            slowest,
            memory,
            keys,
            clients,
            lease_key_bytes,
            guard_key_bytes,
            hint_bytes,
            loads,
        }
    })
}

// ---------------------------------------------------------------------------------------------
// Limits and printing

/// The limits a fleet of `sidecars` runs into on this machine; raises the soft open-file
/// limit of the bench to the hard one when it is below what the bench needs (one kept-alive
/// `/id` connection per sidecar, the Redis connections, files read in passing).
fn limits(sidecars: usize, batch: usize) {
    let need = (sidecars + batch) as u64 + 256;
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let raised = if soft < need && hard > soft {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
        format!(", raised to {hard} for this process")
    } else {
        String::new()
    };
    let (nproc, _) = getrlimit(Resource::RLIMIT_NPROC).unwrap();
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default().trim().to_owned();
    println!(
        "limits: open files (RLIMIT_NOFILE) soft {soft} hard {hard}{raised}; the bench needs about {need} \
         (one /id connection per sidecar), each Redis one per client connection (maxclients 10000, \
         capped by its own open-file limit, inherited from the bench); processes+threads of this \
         user (RLIMIT_NPROC) {nproc}; kernel pid_max {}, threads-max {}",
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max")
    );
    if soft < need && hard < need {
        println!("  the hard open-file limit {hard} is below {need}: expect failures");
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.0}ms", d.as_secs_f64() * 1e3)
}

fn spread(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "p50 {} p99 {} max {} (n={})",
        ms(pct(&v, 0.5)),
        ms(pct(&v, 0.99)),
        ms(pct(&v, 1.0)),
        v.len()
    )
}

fn kib_spread(mut v: Vec<u64>) -> String {
    v.sort_unstable();
    let mib = |k: u64| format!("{:.2}MiB", k as f64 / 1024.0);
    if v.is_empty() {
        return "-".into();
    }
    format!(
        "median {} max {} sum {}",
        mib(v[v.len() / 2]),
        mib(*v.last().unwrap()),
        mib(v.iter().sum())
    )
}

fn print_phase(label: &str, p: &PhaseRedis) {
    let nodes: Vec<String> = p
        .per_node
        .iter()
        .map(|(calls, total, cpu)| format!("{calls:.0}/s ({total:.0} all) cpu {cpu:.1}%"))
        .collect();
    let sum: f64 = p.per_node.iter().map(|n| n.0).sum();
    println!(
        "  {label:<28} {:>6.1}s  sidecars' calls {sum:.0}/s; per node: {}",
        p.seconds,
        nodes.join(" | ")
    );
    let commands: Vec<String> = p
        .by_command
        .iter()
        .map(|(c, (calls, usec))| format!("{c} {calls:.1} ({usec:.0}us)"))
        .collect();
    println!(
        "  {:<28}          by command, calls/s (Redis usec/s): {}",
        "",
        commands.join(", ")
    );
}

fn print(r: &Report, cfg: &Config) {
    println!(
        "{}: {} sidecars (--max-worker-id {} --ttl {} --renew-interval {}), rolling restart in batches of {}; load (1/5/15 min) at start, after start, after hold, after rolling restart: {}",
        r.name,
        r.started_together,
        cfg.max_id,
        cfg.ttl,
        cfg.renew,
        cfg.batch,
        r.loads.join(" | ")
    );
    println!(
        "  {} started at once: first spawn to all published {}; each spawn to published {}",
        r.started_together,
        ms(r.all_published),
        spread(r.start_publish.clone())
    );
    println!(
        "  rolling restart: {} new in {:.1}s; each spawn to published {}",
        r.rolling_publish.len(),
        r.rolling_took.as_secs_f64(),
        spread(r.rolling_publish.clone())
    );
    println!(
        "  Redis (sidecars' calls: INFO commandstats deltas less the bench's own; all: total_commands_processed; cpu: utime+stime of the process, % of one core):"
    );
    print_phase("start (all at once)", &r.start);
    print_phase(&format!("hold ({} sidecars)", r.started_together), &r.hold);
    print_phase("rolling restart", &r.rolling);
    println!(
        "  overlaps: {} (ID files: {} samples, {} with an ID; GET /id: {} samples, {} with an ID; {} IDs changed holder)",
        r.overlaps.len(),
        r.file_samples.0,
        r.file_samples.1,
        r.http_samples.0,
        r.http_samples.1,
        r.handed_over
    );
    for o in r.overlaps.iter().take(10) {
        println!("    OVERLAP {o}");
    }
    if !r.bad_exits.is_empty() {
        println!("  exits other than 0 at SIGTERM: {:?}", r.bad_exits);
    }
    let mut slow: Vec<(&String, &(u64, u64))> = r.slowest.by_name.iter().collect();
    slow.sort_by_key(|(_, (usec, _))| std::cmp::Reverse(*usec));
    let slow: Vec<String> = slow
        .iter()
        .map(|(n, (usec, calls))| format!("{n} {usec}us ({calls} calls)"))
        .collect();
    println!(
        "  slowest call by command (SLOWLOG, threshold 0; {} entries read, {} gone before read): {}",
        r.slowest.seen,
        r.slowest.missed,
        slow.join(", ")
    );
    println!(
        "  sidecar memory after the hold: VmRSS {}; RssAnon {}; threads per sidecar {:?}",
        kib_spread(r.memory.vm_rss.clone()),
        kib_spread(r.memory.rss_anon.clone()),
        {
            let mut t = r.memory.threads.clone();
            t.sort_unstable();
            t.dedup();
            t
        }
    );
    println!(
        "  connected clients per node after the hold: {:?} (3 of each the bench's)",
        r.clients
    );
    let opt = |b: Option<u64>| b.map_or("-".to_owned(), |b| format!("{b} B"));
    println!(
        "  Redis after the hold: {} keys (lease keys, claim guards, hint); MEMORY USAGE of a lease key {}, a guard key {}, the hint {}",
        r.keys,
        opt(r.lease_key_bytes),
        opt(r.guard_key_bytes),
        opt(r.hint_bytes)
    );
}

fn main() {
    let started = Instant::now();
    let cfg = Config {
        sidecars: env_or("SNOWLEASE_FLEET_SIDECARS", 512),
        batch: env_or("SNOWLEASE_FLEET_BATCH", 32),
        max_id: env_or("SNOWLEASE_FLEET_MAX_WORKER_ID", 1023),
        ttl: env_or("SNOWLEASE_FLEET_TTL", "10s".to_owned()),
        renew: env_or("SNOWLEASE_FLEET_RENEW", "1s".to_owned()),
        hold: Duration::from_secs(env_or("SNOWLEASE_FLEET_HOLD_S", 20)),
    };
    assert!(
        (1..=1024).contains(&cfg.sidecars) && cfg.batch >= 1,
        "SNOWLEASE_FLEET_SIDECARS must be 1-1024 and SNOWLEASE_FLEET_BATCH at least 1"
    );
    assert!(
        cfg.max_id <= 1023 && cfg.sidecars + cfg.batch <= cfg.max_id + 1,
        "SNOWLEASE_FLEET_MAX_WORKER_ID must be at most 1023, and sidecars + batch fit its IDs \
         (the surge holds both at once)"
    );
    let topologies: String = env_or(
        "SNOWLEASE_FLEET_TOPOLOGIES",
        "cluster,standalone".to_owned(),
    );
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "snowlease fleet benchmark ({cpus} CPUs, load {}; binary {BIN})",
        loadavg()
    );
    limits(cfg.sidecars, cfg.batch);
    let mut reports = Vec::new();
    for topology in topologies.split(',') {
        match topology.trim() {
            "cluster" => {
                let topo = ClusterTopology::start_primaries_only();
                let nodes = topo
                    .servers()
                    .iter()
                    .map(|s| Node {
                        port: s.port(),
                        pid: s.pid().as_raw() as u32,
                    })
                    .collect();
                reports.push(fleet("cluster, 3 primaries", &topo.url(), nodes, &cfg));
            }
            "standalone" => {
                let redis = RedisServer::start();
                let nodes = vec![Node {
                    port: redis.port(),
                    pid: redis.pid().as_raw() as u32,
                }];
                reports.push(fleet("one server", &redis.url(), nodes, &cfg));
            }
            other => panic!(
                "SNOWLEASE_FLEET_TOPOLOGIES: unknown topology {other:?} (cluster, standalone)"
            ),
        }
        print(reports.last().unwrap(), &cfg);
    }
    println!(
        "total bench time {:.1}s, load at the end {}",
        started.elapsed().as_secs_f64(),
        loadavg()
    );
    let overlaps: usize = reports.iter().map(|r| r.overlaps.len()).sum();
    assert_eq!(overlaps, 0, "worker IDs were published twice at once");
}
