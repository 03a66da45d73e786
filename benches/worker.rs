//! `cargo bench --bench worker`: claim latency against a PING round trip,
//! start-up of 32 sidecars against one, idle RSS, binary size. Starts its
//! own redis-server on a free loopback port; prints a table with the goals.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use snowlease::identity::Owner;
use snowlease::worker_id::claim::{ClaimOutcome, LeaseKeys, claim_lowest};

const BIN: &str = env!("CARGO_BIN_EXE_snowlease");
const TRIALS: usize = 300;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Redis;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Median PING round trip and median claim with `taken` of 32 IDs held.
async fn claim_latency(url: &str, taken: &[u16]) -> (Duration, Vec<Duration>) {
    let conn = redis::Client::open(url)
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let mut ping_conn = conn.clone();
    let mut pings = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let start = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut ping_conn)
            .await
            .unwrap();
        pings.push(start.elapsed());
    }
    let keys = LeaseKeys::new("snowflake:worker:", "bench");
    let owner = Owner::generate("bench");
    let ttl = Duration::from_secs(120);
    let mut claim_conn = conn.clone();
    let mut admin = conn;
    let mut results = Vec::new();
    for &n in taken {
        let _: () = redis::cmd("FLUSHDB").query_async(&mut admin).await.unwrap();
        // An established deployment: the claim guard is open.
        let _: () = redis::cmd("SET")
            .arg("snowflake:worker:bench:guard")
            .arg(0)
            .query_async(&mut admin)
            .await
            .unwrap();
        for id in 0..n {
            let _: () = redis::cmd("SET")
                .arg(format!("snowflake:worker:bench:{id}"))
                .arg("other#0")
                .query_async(&mut admin)
                .await
                .unwrap();
        }
        let mut samples = Vec::with_capacity(TRIALS);
        for _ in 0..TRIALS {
            let start = Instant::now();
            let reply = claim_lowest(&mut claim_conn, &keys, 31, &owner, ttl, false)
                .await
                .unwrap();
            samples.push(start.elapsed());
            assert_eq!(
                reply.outcome,
                ClaimOutcome::Claimed(usize::from(n)),
                "lowest free ID"
            );
            let _: () = redis::cmd("DEL")
                .arg(format!("snowflake:worker:bench:{n}"))
                .query_async(&mut admin)
                .await
                .unwrap();
        }
        results.push(median(samples));
    }
    (median(pings), results)
}

struct Sidecar {
    child: Child,
    file: PathBuf,
}

fn spawn_sidecar(url: &str, app: &str, dir: &Path, n: usize) -> Sidecar {
    let file = dir.join(format!("worker-id-{n}"));
    let child = Command::new(BIN)
        .args([
            "worker",
            "--app",
            app,
            "--redis-url",
            url,
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--ttl", "4s", "--renew-interval", "200ms"])
        .arg("--output-file")
        .arg(&file)
        .env_clear()
        .env("SNOWLEASE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn snowlease");
    Sidecar { child, file }
}

fn stop(sidecars: Vec<Sidecar>) {
    for mut s in sidecars {
        let _ = Command::new("kill")
            .args(["-TERM", &s.child.id().to_string()])
            .status();
        let _ = s.child.wait();
    }
}

/// Time from spawning `count` sidecars at once until every ID file exists,
/// and how much of it the bench itself spent spawning them.
fn startup(url: &str, app: &str, count: usize) -> (Duration, Duration) {
    open_claim_guard(url, app);
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let sidecars: Vec<Sidecar> = (0..count)
        .map(|n| spawn_sidecar(url, app, dir.path(), n))
        .collect();
    let spawned = start.elapsed();
    let deadline = start + Duration::from_secs(30);
    while !sidecars.iter().all(|s| s.file.exists()) {
        assert!(Instant::now() < deadline, "sidecars did not publish");
        std::thread::sleep(Duration::from_micros(500));
    }
    let elapsed = start.elapsed();
    stop(sidecars);
    (elapsed, spawned)
}

/// Opens the app's claim guard as an established deployment has it, so the
/// first claim does not wait one TTL.
fn open_claim_guard(url: &str, app: &str) {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("snowflake:worker:{app}:guard"))
        .arg(0)
        .query(&mut conn)
        .unwrap();
}

/// VmRSS of a holding sidecar after at least 10 renewals, in KiB.
fn idle_rss(url: &str) -> u64 {
    open_claim_guard(url, "rss");
    let dir = tempfile::tempdir().unwrap();
    let sidecar = spawn_sidecar(url, "rss", dir.path(), 0);
    // 10 renewals at 200 ms: wait 2.5 s after the ID is published.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sidecar.file.exists() {
        assert!(Instant::now() < deadline, "no ID published");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let status = std::fs::read_to_string(format!("/proc/{}/status", sidecar.child.id())).unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    stop(vec![sidecar]);
    rss
}

fn main() {
    let redis = Redis::start();
    let url = redis.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (ping, claims) = runtime.block_on(claim_latency(&url, &[0, 16, 31]));

    // Median of 5 runs each, apps apart so runs never see each other's keys.
    let one = median(
        (0..5)
            .map(|r| startup(&url, &format!("one{r}"), 1).0)
            .collect(),
    );
    let runs: Vec<(Duration, Duration)> = (0..5)
        .map(|r| startup(&url, &format!("all{r}"), 32))
        .collect();
    let all = median(runs.iter().map(|r| r.0).collect());
    let spawning = median(runs.iter().map(|r| r.1).collect());
    let rss_kib = idle_rss(&url);
    let size = std::fs::metadata(BIN).map(|m| m.len()).unwrap_or(0);

    println!("snowlease worker benchmark (medians; redis-server on loopback)");
    println!(
        "{:<44} {:>12} {:>10} {:>8}",
        "measure", "value", "ratio", "goal"
    );
    println!(
        "{:<44} {:>10.1}us {:>10} {:>8}",
        "PING round trip",
        us(ping),
        "1.00x",
        "-"
    );
    for (taken, claim) in [0, 16, 31].iter().zip(&claims) {
        println!(
            "{:<44} {:>10.1}us {:>9.2}x {:>8}",
            format!("claim with {taken} of 32 IDs taken"),
            us(*claim),
            claim.as_secs_f64() / ping.as_secs_f64(),
            "<= 3x"
        );
    }
    println!(
        "{:<44} {:>10.1}ms {:>10} {:>8}",
        "1 sidecar: spawn to published",
        ms(one),
        "1.00x",
        "-"
    );
    println!(
        "{:<44} {:>10.1}ms {:>9.2}x {:>8}",
        "32 sidecars at once: spawn to all published",
        ms(all),
        all.as_secs_f64() / one.as_secs_f64(),
        "<= 3x"
    );
    println!(
        "{:<44} {:>10.1}ms {:>10} {:>8}",
        "  of which the bench spent spawning them",
        ms(spawning),
        "-",
        "-"
    );
    println!(
        "{:<44} {:>10.2}MiB {:>10} {:>8}",
        "idle RSS after >= 10 renewals",
        rss_kib as f64 / 1024.0,
        "-",
        "<= 8MiB"
    );
    println!(
        "{:<44} {:>10.2}MiB {:>10} {:>8}",
        "binary size (bench profile = release)",
        size as f64 / 1048576.0,
        "-",
        "-"
    );
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
