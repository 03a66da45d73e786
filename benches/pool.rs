//! `cargo bench --bench pool`: acquire+release cycles per second through
//! the Rust API and through `pool serve` over HTTP (1 and 50 clients, 1000
//! ids; HTTP as a ratio to the API), and the client's acquire-only
//! rate at 50 tasks against `redis-benchmark -c 50` running EVALSHA of the
//! same acquire script with the same KEYS and ARGV. Starts its own
//! redis-server on a free loopback port; prints a table with the goal.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use snowlease::connection::{Redis as Handle, RedisTarget};
use snowlease::pool::{AcquireRequest, Acquired, Pool, PoolOptions, PoolScript, Released};

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Redis;

/// How long each cycle measurement runs (after a short warm-up).
const CYCLE_TIME: Duration = Duration::from_secs(3);
/// Acquires per acquire-only run, and ids of its pool (one id each).
const ACQUIRES: u64 = 100_000;
/// Runs of each acquire-only measurement; the median is reported.
const RUNS: usize = 3;
/// Response timeout of the bench's own connection (the longest call is a
/// FLUSHALL of a 100,000-id pool).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// Lease time of the acquire-only runs: long, so nothing expires mid-run.
const LONG_TTL_MS: u64 = 600_000;

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

async fn flush(conn: &mut Handle) {
    let _: () = redis::cmd("FLUSHALL").query_async(conn).await.unwrap();
}

/// A fresh pool `name` of `n` ids.
async fn fresh_pool(conn: &Handle, name: &str, n: u64) -> Pool<Handle> {
    let pool = Pool::new(conn.clone(), name, PoolOptions::default()).unwrap();
    let ids: Vec<String> = (0..n).map(|i| format!("id-{i}")).collect();
    assert_eq!(pool.init(&ids).await.unwrap(), n);
    pool
}

/// Acquire+release cycles per second with `tasks` concurrent tasks for
/// [`CYCLE_TIME`], on a pool of 1000 ids.
async fn cycles(conn: &Handle, tasks: usize) -> f64 {
    let mut admin = conn.clone();
    flush(&mut admin).await;
    let pool = fresh_pool(conn, "cycles", 1000).await;
    let done = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_at = Instant::now() + CYCLE_TIME + Duration::from_millis(300);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (pool, done, counting) = (pool.clone(), done.clone(), counting.clone());
            tokio::spawn(async move {
                let req = AcquireRequest::new(Duration::from_secs(30));
                while Instant::now() < stop_at {
                    let Acquired::Leased(lease) = pool.acquire(&req).await.unwrap() else {
                        panic!("1000 ids and at most 50 leases: never empty");
                    };
                    let released = lease.release(Duration::ZERO).await.unwrap();
                    assert!(matches!(released, Released::Released { .. }));
                    if counting.load(Ordering::Relaxed) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // 300 ms warm-up (connection, script cache), then count.
    tokio::time::sleep(Duration::from_millis(300)).await;
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    for h in handles {
        h.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// The client's acquire-only rate: [`ACQUIRES`] acquires by 50 tasks on
/// one multiplexed connection, on a fresh pool of as many ids.
async fn client_acquires(conn: &Handle) -> f64 {
    let mut admin = conn.clone();
    flush(&mut admin).await;
    let pool = fresh_pool(conn, "bench", ACQUIRES).await;
    let left = Arc::new(AtomicU64::new(ACQUIRES));
    let started = Instant::now();
    let handles: Vec<_> = (0..50)
        .map(|_| {
            let (pool, left) = (pool.clone(), left.clone());
            tokio::spawn(async move {
                let req = AcquireRequest::new(Duration::from_millis(LONG_TTL_MS));
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let acquired = pool.acquire(&req).await.unwrap();
                    assert!(matches!(acquired, Acquired::Leased(_)), "pool ran empty");
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    ACQUIRES as f64 / started.elapsed().as_secs_f64()
}

/// `redis-benchmark -c 50 -n ACQUIRES EVALSHA <acquire sha> ...` with the
/// KEYS and ARGV the client sends (a 32-hex token, ttl, cooldown 0), on a
/// fresh pool of as many ids as calls.
///
/// Why this shape: redis-benchmark repeats one fixed command, and acquire
/// reads TIME, so every call leases another id until the pool is empty;
/// after that each call would take the cheap "nothing due" path and the
/// rate would say nothing about a real acquire. With one id per call and a
/// ttl far longer than the run, every call of both sides does the same
/// work: a reclaim step that finds nothing expired, then a real lease
/// (ZRANGEBYSCORE, ZREM, INCR, HSET x2, ZADD). The client's run above uses
/// the same pool size, call count, concurrency and argument lengths.
async fn benchmark_acquires(conn: &Handle, port: u16) -> f64 {
    let mut admin = conn.clone();
    flush(&mut admin).await;
    let pool = fresh_pool(conn, "bench", ACQUIRES).await;
    let source = PoolScript::Acquire.source();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(source)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(sha, PoolScript::Acquire.script().get_hash());
    let keys = PoolScript::Acquire.keys(pool.keys());
    let token = format!("{:032x}", u128::MAX / 3);
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", "50", "-n", &ACQUIRES.to_string(), "--csv"])
        .args(["EVALSHA", &sha, &keys.len().to_string()])
        .args(&keys)
        .args([token.as_str(), &LONG_TTL_MS.to_string(), "0", "600000"])
        .stderr(Stdio::null())
        .output()
        .expect("redis-benchmark on PATH");
    let csv = String::from_utf8_lossy(&output.stdout);
    let rps = csv
        .lines()
        .find(|l| l.starts_with("\"EVALSHA"))
        .and_then(|l| l.split("\",\"").nth(1))
        .and_then(|v| v.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("cannot read redis-benchmark output:\n{csv}"));
    // Every call must have leased: the pool holds exactly as many leases.
    let leased: u64 = redis::cmd("ZCARD")
        .arg(&pool.keys().leases)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(leased, ACQUIRES, "redis-benchmark calls did not all lease");
    rps
}

const BIN: &str = env!("CARGO_BIN_EXE_snowlease");

/// `snowlease pool serve` for pool `http` on a free loopback port, ready.
struct Serve {
    child: std::process::Child,
    base: String,
}

impl Serve {
    fn start(redis_url: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(BIN)
            .args(["pool", "serve", "--pool", "http", "--redis-url", redis_url])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("SNOWLEASE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn pool serve");
        let base = format!("http://127.0.0.1:{port}");
        let ready = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(25));
            ureq::get(&format!("{base}/readyz")).call().is_ok()
        });
        assert!(ready, "pool serve did not become ready");
        Self { child, base }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Acquire+release cycles per second through `pool serve` over HTTP with
/// `clients` threads (one keep-alive connection each) for [`CYCLE_TIME`].
fn http_cycles(serve: &Serve, clients: usize) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_at = Instant::now() + CYCLE_TIME + Duration::from_millis(300);
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (done, counting) = (done.clone(), counting.clone());
            let base = serve.base.clone();
            std::thread::spawn(move || {
                let agent = ureq::Agent::new();
                while Instant::now() < stop_at {
                    let lease: serde_json::Value = agent
                        .post(&format!("{base}/pools/http/leases"))
                        .send_string(r#"{"ttl_ms":30000}"#)
                        .expect("acquire")
                        .into_json()
                        .unwrap();
                    let (id, token) = (
                        lease["id"].as_str().unwrap(),
                        lease["token"].as_str().unwrap(),
                    );
                    agent
                        .post(&format!("{base}/pools/http/leases/{id}/release"))
                        .send_string(&format!(r#"{{"token":"{token}"}}"#))
                        .expect("release");
                    if counting.load(Ordering::Relaxed) {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    counting.store(true, Ordering::Relaxed);
    let started = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = runtime.block_on(async {
        // FLUSHALL of a 100,000-id pool can outlast the default 500 ms
        // response timeout on a loaded machine.
        RedisTarget::parse(&redis.url())
            .unwrap()
            .connect(FLUSH_TIMEOUT)
            .unwrap()
    });
    let started = Instant::now();
    let one = runtime.block_on(cycles(&conn, 1));
    let fifty = runtime.block_on(cycles(&conn, 50));
    let (http_one, http_fifty) = {
        let mut admin = conn.clone();
        runtime.block_on(flush(&mut admin));
        runtime.block_on(fresh_pool(&conn, "http", 1000));
        let serve = Serve::start(&redis.url());
        (http_cycles(&serve, 1), http_cycles(&serve, 50))
    };
    let (mut bench, mut client) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        bench.push(runtime.block_on(benchmark_acquires(&conn, redis.port())));
        client.push(runtime.block_on(client_acquires(&conn)));
    }
    let (bench, client) = (median(bench), median(client));
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());

    println!(
        "snowlease pool benchmark (redis-server on loopback, {cpus} CPUs; acquire-only: median of {RUNS} runs of {ACQUIRES} calls)"
    );
    println!(
        "{:<58} {:>10} {:>7} {:>8}",
        "measure", "per second", "ratio", "goal"
    );
    let row = |name: &str, rate: f64, ratio: &str, goal: &str| {
        println!("{name:<58} {rate:>10.0} {ratio:>7} {goal:>8}");
    };
    row(
        "acquire+release cycles, Rust API, 1 task, 1000 ids",
        one,
        "-",
        "-",
    );
    row(
        "acquire+release cycles, Rust API, 50 tasks, 1000 ids",
        fifty,
        "-",
        "-",
    );
    row(
        "acquire+release cycles, pool serve HTTP, 1 client",
        http_one,
        &format!("{:.2}x", http_one / one),
        "-",
    );
    row(
        "acquire+release cycles, pool serve HTTP, 50 clients",
        http_fifty,
        &format!("{:.2}x", http_fifty / fifty),
        ">= 0.50x",
    );
    row(
        "acquire, redis-benchmark -c 50 EVALSHA acquire.lua",
        bench,
        "1.00x",
        "-",
    );
    row(
        "acquire, Rust API, 50 tasks, one connection",
        client,
        &format!("{:.2}x", client / bench),
        ">= 0.80x",
    );
    println!("total bench time {:.1}s", started.elapsed().as_secs_f64());
}
