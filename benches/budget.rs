//! `cargo bench --bench budget`: budget checks (take.lua, one key, every
//! check allowed) per second through the Rust API at 1 and 50 tasks,
//! beside `redis-benchmark` running EVALSHA of the same script with the
//! same KEYS and ARGV at `-c 1` and `-c 50` (goal: the API >= 0.9x), and a
//! plain `SET` by redis-benchmark (the anchors publish about 2x a SET per
//! check). 1 task runs on tokio's one-thread runtime (every snowlease
//! command's); 50 tasks run on it and on tokio's default multi-thread
//! runtime, each with the client's CPU per check. Starts its own
//! redis-server on a free loopback port; prints a table.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redis::aio::ConnectionManager;
use snowlease::budget::{Budget, BudgetKey, BudgetScript, budget_key};

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Redis;

/// Checks per measurement at 50 clients (at 1 client a fifth).
const CHECKS: u64 = 100_000;
/// Runs of each measurement; the median is reported.
const RUNS: usize = 3;
/// A limit no run reaches: every check is allowed (and writes), as a
/// crawler's checks mostly are.
const RATE: &str = "1000000/s";
const BURST: u64 = 1_000_000;

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

fn keys() -> Vec<BudgetKey> {
    vec![BudgetKey::new("example.com", RATE.parse().unwrap(), BURST)]
}

/// `n` checks by `tasks` tasks on one multiplexed connection.
async fn client_checks(conn: &ConnectionManager, tasks: u64, n: u64) -> f64 {
    let budget = Budget::new(conn.clone(), "bench").unwrap();
    let left = Arc::new(AtomicU64::new(n));
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (budget, left) = (budget.clone(), left.clone());
            tokio::spawn(async move {
                let keys = keys();
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    assert!(budget.take(&keys, 1).await.unwrap().allowed);
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// `redis-benchmark -c <clients> -n <n> <args...>`: requests per second.
fn redis_benchmark(port: u16, clients: u64, n: u64, args: &[&str]) -> f64 {
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-n", &n.to_string(), "--csv"])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("redis-benchmark on PATH");
    let csv = String::from_utf8_lossy(&output.stdout);
    csv.lines()
        .find(|l| l.starts_with(&format!("\"{}", args[0])))
        .and_then(|l| l.split("\",\"").nth(1))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("cannot read redis-benchmark output:\n{csv}"))
}

/// EVALSHA of take.lua with the KEYS and ARGV [`client_checks`] sends.
fn benchmark_checks(port: u16, sha: &str, clients: u64, n: u64) -> f64 {
    let key = budget_key("bench", "example.com");
    let burst = BURST.to_string();
    let args = ["EVALSHA", sha, "1", &key, "1", "1000000", "1000", &burst];
    redis_benchmark(port, clients, n, &args)
}

/// The client's CPU time so far (user + system, all its threads; not the
/// redis-server or redis-benchmark children), µs.
fn cpu_us() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
    us(usage.user_time()) + us(usage.system_time())
}

/// The runtimes the API runs on: tokio's one-thread runtime, which every
/// snowlease command uses (src/main.rs), and tokio's default multi-thread
/// runtime (`#[tokio::main]`), which a library user with many tasks runs.
fn runtime(multi_thread: bool) -> tokio::runtime::Runtime {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().unwrap()
}

/// One row of the table: the API's rate (median), its CPU per check, and
/// redis-benchmark's rates of the same script and of a SET, same rounds.
struct Row {
    clients: u64,
    multi_thread: bool,
    api: f64,
    cpu_per_check_us: f64,
    bench: f64,
    set: f64,
}

fn measure(redis: &Redis, clients: u64, n: u64, multi_thread: bool) -> Row {
    let runtime = runtime(multi_thread);
    let conn = runtime.block_on(async {
        redis::Client::open(redis.url())
            .unwrap()
            .get_connection_manager()
            .await
            .unwrap()
    });
    let sha = BudgetScript::Take.script().get_hash();
    let (mut api, mut cpu, mut bench, mut set) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let before = cpu_us();
        api.push(runtime.block_on(client_checks(&conn, clients, n)));
        cpu.push((cpu_us() - before) / n as f64);
        bench.push(benchmark_checks(redis.port(), sha, clients, n));
        set.push(redis_benchmark(
            redis.port(),
            clients,
            n,
            &["SET", "k", "v"],
        ));
    }
    Row {
        clients,
        multi_thread,
        api: median(api),
        cpu_per_check_us: median(cpu),
        bench: median(bench),
        set: median(set),
    }
}

fn main() {
    let redis = Redis::start();
    let sha: String = runtime(false).block_on(async {
        let mut conn = redis::Client::open(redis.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(BudgetScript::Take.source())
            .query_async(&mut conn)
            .await
            .unwrap()
    });
    assert_eq!(sha, BudgetScript::Take.script().get_hash());
    let started = Instant::now();
    let rows = [
        measure(&redis, 1, CHECKS / 5, false),
        measure(&redis, 50, CHECKS, false),
        measure(&redis, 50, CHECKS, true),
    ];
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "snowlease budget benchmark (redis-server on loopback, {cpus} CPUs; median of {RUNS} runs; one key, every check allowed)"
    );
    println!(
        "{:<62} {:>10} {:>7} {:>8} {:>12}",
        "measure", "per second", "ratio", "goal", "client us/chk"
    );
    for row in rows {
        let line = |name: String, rate: f64, ratio: String, goal: &str, cpu: String| {
            println!("{name:<62} {rate:>10.0} {ratio:>7} {goal:>8} {cpu:>12}");
        };
        let c = row.clients;
        line(
            format!("SET, redis-benchmark -c {c}"),
            row.set,
            "-".into(),
            "-",
            "-".into(),
        );
        line(
            format!("check, redis-benchmark -c {c} EVALSHA take.lua"),
            row.bench,
            format!("{:.2}x", row.set / row.bench),
            "SET/chk",
            "-".into(),
        );
        let runtime = if row.multi_thread {
            "multi-thread"
        } else {
            "one thread"
        };
        line(
            format!("check, Rust API, {c} task(s), one connection, {runtime}"),
            row.api,
            format!("{:.2}x", row.api / row.bench),
            ">= 0.90x",
            format!("{:.1}", row.cpu_per_check_us),
        );
    }
    println!("total bench time {:.1}s", started.elapsed().as_secs_f64());
}
