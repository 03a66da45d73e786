//! `cargo bench --bench claims`: claims over 32, 256 and 1024 IDs with none, the lower half,
//! and all but the last ID taken, on one server and on a 3-primary Cluster, through the
//! `Claimer` a keeper keeps, a new one with a new owner string per claim: each claim is a
//! sidecar's first (its start window picked by its owner string, its calls built then).
//! Each row is 5 rounds of `redis-benchmark -c 1` of the row's script call (taking a fresh
//! key each call, as a claim does) and 60 claims. Beside each row: calls per claim, Redis'
//! own time per claim and per script call (`INFO commandstats`), calls over 100 us
//! (`SLOWLOG`, threshold 100 us), a PING to one node and a PING to every node at once
//! sampled before each claim, the claim over its round-trip floor, and the claim over the
//! round's redis-benchmark p50; then a no-op `EVAL`'s slow-log count as the machine's
//! control (docs/worker.md, "Benchmarks").

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use snowlease::connection::{Keyspace, Redis, RedisTarget};
use snowlease::identity::Owner;
use snowlease::worker_id::claim::{ClaimOutcome, Claimer, window_of, windows};
use snowlease::worker_id::keys::LeaseKeys;

#[path = "../tests/it"]
#[allow(dead_code, unused_imports)]
mod it {
    pub mod harness;
}
use it::harness::{ClusterTopology, RedisServer};

const TRIALS: usize = 300;
/// Rounds of redis-benchmark, then TRIALS / ROUNDS claims, per row.
const ROUNDS: usize = 5;
/// Claims before the counted ones (a warm connection and script cache).
const WARM_UP: usize = 32;
const PREFIX: &str = "snowflake:worker:";
const TTL: Duration = Duration::from_secs(120);
const HELD: &str = "10.9.9.9#beef";
/// `claim.lua` as the sidecar loads it: the node stamps' prelude first.
const CLAIM_LUA: &str = concat!(
    include_str!("../src/lease/node.lua"),
    include_str!("../src/worker_id/claim.lua")
);
/// Sets KEYS[1] to an open claim guard stamped by the node that runs it.
const OPEN_GUARD_LUA: &str = concat!(
    include_str!("../src/lease/node.lua"),
    "\nredis.call('SET', KEYS[1], stamped(0)) return 1"
);

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Redis' own accounting on the nodes at `ports`, summed.
struct Stats {
    ports: Vec<u16>,
}

impl Stats {
    fn conn(port: u16) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Counters to zero; the slow log takes calls over 100 us.
    fn reset(&self) {
        for port in &self.ports {
            let mut c = Self::conn(*port);
            let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("slowlog-log-slower-than")
                .arg(100)
                .query(&mut c)
                .unwrap();
            let _: () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("slowlog-max-len")
                .arg(100_000)
                .query(&mut c)
                .unwrap();
            let _: () = redis::cmd("SLOWLOG").arg("RESET").query(&mut c).unwrap();
        }
    }

    /// (usec, calls) of `command` summed over the nodes.
    fn command(&self, command: &str) -> (u64, u64) {
        let (mut usec, mut calls) = (0, 0);
        for port in &self.ports {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut Self::conn(*port))
                .unwrap();
            let prefix = format!("cmdstat_{command}:");
            let Some(line) = info.lines().find_map(|l| l.strip_prefix(&prefix)) else {
                continue;
            };
            for kv in line.split(',') {
                match kv.split_once('=') {
                    Some(("usec", v)) => usec += v.parse::<u64>().unwrap(),
                    Some(("calls", v)) => calls += v.parse::<u64>().unwrap(),
                    _ => {}
                }
            }
        }
        (usec, calls)
    }

    /// Calls over the slow-log threshold, summed.
    fn slow(&self) -> u64 {
        self.ports
            .iter()
            .map(|p| {
                redis::cmd("SLOWLOG")
                    .arg("LEN")
                    .query::<u64>(&mut Self::conn(*p))
                    .unwrap()
            })
            .sum()
    }

    /// The counters now, summed over the nodes.
    fn snapshot(&self) -> Counters {
        let (eval_us, eval_calls) = self.command("evalsha");
        let (mget_us, _) = self.command("mget");
        Counters {
            eval_us,
            eval_calls,
            mget_us,
            slow: self.slow(),
        }
    }
}

/// Redis' counters a row reads: `evalsha` and `mget` usec, `evalsha` calls, slow-log
/// entries.
#[derive(Clone, Copy, Default)]
struct Counters {
    eval_us: u64,
    eval_calls: u64,
    mget_us: u64,
    slow: u64,
}

impl Counters {
    /// Adds what happened between `from` and `to`.
    fn add(&mut self, from: Counters, to: Counters) {
        self.eval_us += to.eval_us - from.eval_us;
        self.eval_calls += to.eval_calls - from.eval_calls;
        self.mget_us += to.mget_us - from.mget_us;
        self.slow += to.slow - from.slow;
    }
}

/// `redis-benchmark -c 1` of `args` against `port`: its p50 latency. `-r` makes each
/// `__rand_int__` in `args` a fresh 12-digit number per call (redis-benchmark's docs).
fn benchmark_p50(port: u16, args: &[String]) -> Duration {
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", "1", "-n", "400", "-r", "2000000000", "--csv"])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("redis-benchmark on PATH");
    let csv = String::from_utf8_lossy(&output.stdout);
    let line = csv.lines().last().unwrap_or_default();
    let fields: Vec<&str> = line.split("\",\"").collect();
    let p50_ms: f64 = fields
        .len()
        .checked_sub(4)
        .and_then(|i| fields[i].trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("cannot read redis-benchmark output:\n{csv}"));
    Duration::from_secs_f64(p50_ms / 1000.0)
}

/// The `EVALSHA` a claim sends when it takes `free`, the lowest free ID of the range:
/// its window (one server) or its (lease key, guard) pair (Cluster), as redis-benchmark's
/// arguments, and a key of the node it must go to. So that every call of the benchmark
/// takes a key, as the claim does (a fixed key would be adopted from the second call on,
/// a cheaper path), the key taken gets a fresh name per call: on one server the key of
/// `free`, on Cluster a key and guard under one hash tag (a pair's keys share a slot).
fn script_call(
    keys: &LeaseKeys,
    ids: usize,
    free: usize,
    keyspace: Keyspace,
) -> (Vec<String>, String) {
    let sha = redis::Script::new(CLAIM_LUA).get_hash().to_owned();
    let mut call = vec!["EVALSHA".to_owned(), sha];
    let (mut k, mut extra) = (Vec::new(), Vec::new());
    let key = |id: usize| keys.id(u16::try_from(id).unwrap());
    let fresh = |name: String| format!("{name}:__rand_int__");
    let guard = format!("{PREFIX}bench{ids}:guard");
    let routed_by = match keyspace {
        Keyspace::Slots => {
            let tag = format!("{{{}}}", key(free));
            k.push(fresh(format!("{PREFIX}bench{ids}:{tag}")));
            k.push(format!("{PREFIX}bench{ids}:guard:{tag}"));
            tag
        }
        Keyspace::Whole => {
            // The claimer's own layout (docs/worker.md, "Claim windows").
            let all = windows(u16::try_from(ids - 1).unwrap());
            let window = &all[window_of(free, all.len())];
            for i in window.ids() {
                k.push(if i == free { fresh(key(i)) } else { key(i) });
                k.push(guard.clone());
            }
            if all.len() > 1 {
                k.push(format!("{PREFIX}bench{ids}:hint"));
                extra.push(window.first.to_string());
                extra.push(window.step.to_string());
            }
            key(free)
        }
    };
    call.push(k.len().to_string());
    call.extend(k);
    call.push("10.8.8.8#bench".into());
    call.push(TTL.as_millis().to_string());
    call.extend(extra);
    (call, routed_by)
}

async fn ping(conn: &mut MultiplexedConnection) -> Duration {
    let start = Instant::now();
    let _: String = redis::cmd("PING").query_async(conn).await.unwrap();
    start.elapsed()
}

/// A PING to each of `conns` at once: the round trip of a read that fans out to every
/// node (a Cluster claim's first step), with the nodes sharing this machine's cores.
async fn ping_all(conns: &mut [MultiplexedConnection]) -> Duration {
    let start = Instant::now();
    futures_util::future::join_all(conns.iter_mut().map(ping)).await;
    start.elapsed()
}

async fn connect(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn set_all(conn: &mut Redis, keys: impl Iterator<Item = String>, value: &str) {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("SET").arg(key).arg(value).ignore();
    }
    if !pipe.is_empty() {
        let _: () = pipe.query_async(conn).await.unwrap();
    }
}

/// Opens each guard in `keys` as this node's (one script call per key, to its node).
async fn open_guards(conn: &mut Redis, keys: impl Iterator<Item = String>) {
    let script = redis::Script::new(OPEN_GUARD_LUA);
    for key in keys {
        let _: i64 = script.key(key).invoke_async(conn).await.unwrap();
    }
}

/// The first claim of a new keeper's `Claimer` over `0..=max` with a new owner string,
/// timed, and the key it took deleted again: (latency, calls).
async fn claim_and_free(conn: &mut Redis, keys: &LeaseKeys, max: u16) -> (Duration, u32) {
    let (owner, mut claimer) = (Owner::generate("bench"), Claimer::new(keys, max));
    let start = Instant::now();
    let reply = claimer.claim(conn, &owner, TTL).await.unwrap();
    let took = start.elapsed();
    let ClaimOutcome::Claimed(id) = reply.outcome else {
        panic!("{reply:?}")
    };
    let _: () = redis::cmd("DEL")
        .arg(keys.id(id as u16))
        .query_async(conn)
        .await
        .unwrap();
    (took, reply.calls)
}

/// One row's measurements.
struct Row {
    ids: usize,
    taken: &'static str,
    ping: Duration,
    /// A PING to every node at once.
    ping_all: Duration,
    claim: Duration,
    calls: f64,
    /// Redis' own time per claim (script calls and reads), and per script call.
    redis_per_claim: f64,
    redis_per_call: f64,
    slow: u64,
    benchmark: Duration,
    /// The median over rounds of (claim median / redis-benchmark p50) in one round.
    to_rb: f64,
}

/// The node holding most of `keys` (the one a claim waits on longest).
fn busiest(keys: &[String], node_of: &dyn Fn(&str) -> u16) -> u16 {
    let mut count = std::collections::BTreeMap::<u16, usize>::new();
    for key in keys {
        *count.entry(node_of(key)).or_default() += 1;
    }
    count.into_iter().max_by_key(|(_, n)| *n).unwrap().0
}

/// The rows of one deployment: for each range and taken set, the latency of first claims
/// (a new owner string and `Claimer` each), with the held keys in place and guards open;
/// PING to the node holding most of the range's keys.
async fn rows(url: &str, node_of: &dyn Fn(&str) -> u16, stat_ports: Vec<u16>) -> Vec<Row> {
    let mut conn = RedisTarget::parse(url).unwrap().connect(secs(5)).unwrap();
    let keyspace = conn.keyspace().await.unwrap();
    let stats = Stats { ports: stat_ports };
    // redis-benchmark sends EVALSHA before any claim loaded the script.
    for port in &stats.ports {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(CLAIM_LUA)
            .query(&mut Stats::conn(*port))
            .unwrap();
    }
    let mut rows = Vec::new();
    for ids in [32usize, 256, 1024] {
        let max = u16::try_from(ids - 1).unwrap();
        let names = LeaseKeys::new(PREFIX, &format!("bench{ids}"));
        let range_keys: Vec<String> = (0..=max).map(|id| names.id(id)).collect();
        let ping_port = busiest(&range_keys, node_of);
        let mut pinger = connect(ping_port).await;
        let mut all = Vec::new();
        for port in &stats.ports {
            all.push(connect(*port).await);
        }
        for (taken, held) in [
            ("none", 0..0),
            ("half", 0..ids / 2),
            ("all but 1", 0..ids - 1),
        ] {
            // A fresh app per row, so no row sees another's keys or hint.
            let app = format!("bench{ids}");
            let keys = LeaseKeys::new(PREFIX, &app);
            let mut wipe = redis::pipe();
            for id in 0..=max {
                wipe.cmd("DEL").arg(keys.id(id)).ignore();
            }
            wipe.cmd("DEL").arg(format!("{PREFIX}{app}:hint")).ignore();
            let _: () = wipe.query_async(&mut conn).await.unwrap();
            let mut guards = keys.guards(
                snowlease::worker_id::range::WorkerRange::up_to(max),
                keyspace,
            );
            guards.dedup();
            open_guards(&mut conn, guards.into_iter()).await;
            set_all(&mut conn, held.clone().map(|id| keys.id(id as u16)), HELD).await;
            let first_free = held.end;
            let (call, routed_by) = script_call(&keys, ids, first_free, keyspace);
            if keyspace == Keyspace::Slots {
                open_guards(&mut conn, [call[4].clone()].into_iter()).await;
            }
            // Warm up, then rounds of redis-benchmark and claims in
            // turn: this VM's round trip drifts within seconds, so each round's claims are
            // set against its own redis-benchmark p50, and Redis' counters count only the
            // claims.
            for _ in 0..WARM_UP {
                claim_and_free(&mut conn, &keys, max).await;
            }
            stats.reset();
            let (mut pings, mut pings_all) = (Vec::new(), Vec::new());
            let (mut claims, mut calls) = (Vec::new(), 0u64);
            let (mut benchmarks, mut to_rb, mut counted) =
                (Vec::new(), Vec::new(), Counters::default());
            for _ in 0..ROUNDS {
                let benchmark = benchmark_p50(node_of(&routed_by), &call);
                let before = stats.snapshot();
                let mut round_claims = Vec::new();
                for _ in 0..TRIALS / ROUNDS {
                    pings.push(ping(&mut pinger).await);
                    pings_all.push(ping_all(&mut all).await);
                    let (took, reply_calls) = claim_and_free(&mut conn, &keys, max).await;
                    round_claims.push(took);
                    calls += u64::from(reply_calls);
                }
                counted.add(before, stats.snapshot());
                to_rb.push(median(round_claims.clone()).as_secs_f64() / benchmark.as_secs_f64());
                claims.extend(round_claims);
                benchmarks.push(benchmark);
            }
            to_rb.sort_by(f64::total_cmp);
            rows.push(Row {
                ids,
                taken,
                ping: median(pings),
                ping_all: median(pings_all),
                claim: median(claims),
                calls: calls as f64 / TRIALS as f64,
                redis_per_claim: (counted.eval_us + counted.mget_us) as f64 / TRIALS as f64,
                redis_per_call: counted.eval_us as f64 / counted.eval_calls.max(1) as f64,
                slow: counted.slow,
                benchmark: median(benchmarks),
                to_rb: to_rb[ROUNDS / 2],
            });
        }
    }
    rows
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn print(name: &str, rows: &[Row]) {
    println!(
        "{:<28} {:>8} {:>6} {:>8} {:>8} {:>6} {:>6} {:>9} {:>9} {:>6} {:>8} {:>7}",
        name,
        "claim",
        "/PING",
        "PING",
        "PING all",
        "/floor",
        "calls",
        "redis/cl",
        "redis/call",
        ">100us",
        "rb p50",
        "/rb"
    );
    for r in rows {
        // A claim of n calls waits at least one read to every node at once, then n - 1
        // round trips to one node (one server: n round trips).
        let floor = r.ping_all.as_secs_f64() + (r.calls - 1.0) * r.ping.as_secs_f64();
        println!(
            "{:<28} {:>6.1}us {:>5.2}x {:>6.1}us {:>6.1}us {:>5.2}x {:>6.2} {:>7.1}us {:>8.1}us {:>6} {:>6.1}us {:>6.2}x",
            format!("{} IDs, {} taken", r.ids, r.taken),
            us(r.claim),
            r.claim.as_secs_f64() / r.ping.as_secs_f64(),
            us(r.ping),
            us(r.ping_all),
            r.claim.as_secs_f64() / floor,
            r.calls,
            r.redis_per_claim,
            r.redis_per_call,
            r.slow,
            us(r.benchmark),
            r.to_rb,
        );
    }
}

fn main() {
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "snowlease claim benchmark ({cpus} CPUs, load {}; medians of {TRIALS} claims; redis/cl: Redis' own usec per claim, evalsha + mget; redis/call: per evalsha; >100us: SLOWLOG entries; PING all: a PING to every node at once; /floor: claim / (PING all + (calls - 1) x PING); rb p50: redis-benchmark -c 1 of the row's script call, taking a key each call)",
        load.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    let redis = RedisServer::start();
    let port = redis.port();
    let standalone = runtime.block_on(rows(&redis.url(), &|_| port, vec![port]));
    let rb_ping = benchmark_p50(redis.port(), &["PING".to_owned()]);
    print("one server", &standalone);
    println!("  redis-benchmark PING p50: {:.1}us", us(rb_ping));
    let stats = Stats { ports: vec![port] };
    let noop = ["EVAL", "return 1", "0"].map(String::from);
    stats.reset();
    for _ in 0..ROUNDS {
        benchmark_p50(port, &noop);
    }
    println!(
        "  control: {} of {} EVAL \"return 1\" 0 calls over 100us (SLOWLOG): the machine's own tail",
        stats.slow(),
        ROUNDS * 400
    );
    let topo = ClusterTopology::start_primaries_only();
    let ports: Vec<u16> = topo.primaries().iter().map(|p| p.port).collect();
    let node_of = |key: &str| topo.owner_of_key(key).port;
    let cluster = runtime.block_on(rows(&topo.url(), &node_of, ports));
    print("cluster, 3 primaries", &cluster);
    println!("  (PING to the node holding most of the range's keys)");
    println!("total bench time {:.1}s", started.elapsed().as_secs_f64());
}
