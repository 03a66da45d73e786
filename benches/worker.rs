//! `cargo bench --bench worker`: start-up of 32 sidecars against one (with
//! their claim-round counters), the time a Sentinel failover leaves sidecars
//! without an ID, idle RSS, binary size. Starts its own Redis processes on
//! free loopback ports through the test harness (`tests/it/harness`);
//! prints a table with the goals (docs/worker.md, "Benchmarks"). Claim
//! latency: `cargo bench --bench claims`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// The test harness, shared with the integration tests: its modules sit
// under tests/it/harness/, which an inline module with this path finds.
#[path = "../tests/it"]
#[allow(dead_code, unused_imports)]
mod it {
    pub mod harness;
}
use it::harness::{
    RedisServer, SentinelTopology, free_port, guard_open, holding_sidecars, rss_kib, sample_through,
};

/// The dynamic binary as `cargo build --release` and `cargo install` make it, built by
/// [`shipped_binary`] into its own target folder.
const SHIPPED_DIR: &str = "target/bench-shipped";
/// The statically linked build (`scripts/build-static.sh --release`), the
/// one the image ships and `install` copies; measured when present.
const STATIC_BIN: &str = "target/static/x86_64-unknown-linux-gnu/release/snowlease";
const SIDECARS: usize = 32;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Builds the dynamic binary as users build it and returns its path. Not
/// `CARGO_BIN_EXE_snowlease`: Cargo builds that one with the dev-dependencies' features too
/// (tokio's `rt-multi-thread`, for the other benches), which the shipped binary leaves out and
/// which alone linked libm and kept about 0.3 MiB more resident. Its own target folder, so the
/// two builds do not undo each other (the first build takes minutes).
fn shipped_binary() -> String {
    let root = env!("CARGO_MANIFEST_DIR");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "--bin",
            "snowlease",
            "--target-dir",
        ])
        .arg(SHIPPED_DIR)
        .current_dir(root)
        .status()
        .expect("cargo runs");
    assert!(
        status.success(),
        "cargo build --release of the shipped binary failed"
    );
    format!("{root}/{SHIPPED_DIR}/release/snowlease")
}

struct Spawned {
    child: Child,
    file: PathBuf,
    listen: SocketAddr,
}

fn spawn_sidecar(bin: &str, url: &str, app: &str, dir: &Path, n: usize) -> Spawned {
    let file = dir.join(format!("worker-id-{n}"));
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = Command::new(bin)
        .args(["worker", "--app", app, "--redis-url", url])
        .args(["--listen", &listen.to_string()])
        .args(["--ttl", "4s", "--renew-interval", "200ms"])
        .arg("--output-file")
        .arg(&file)
        .env_clear()
        .env("SNOWLEASE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn snowlease");
    Spawned {
        child,
        file,
        listen,
    }
}

fn stop(sidecars: Vec<Spawned>) {
    for mut s in sidecars {
        let _ = Command::new("kill")
            .args(["-TERM", &s.child.id().to_string()])
            .status();
        let _ = s.child.wait();
    }
}

/// `snowlease_claim_attempts_total` of one sidecar, by outcome.
fn claim_attempts(listen: SocketAddr) -> BTreeMap<String, u64> {
    let text = ureq::get(&format!("http://{listen}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("snowlease_claim_attempts_total{outcome=\""))
        .filter_map(|l| {
            let (outcome, rest) = l.split_once("\"}")?;
            Some((outcome.to_owned(), rest.trim().parse().ok()?))
        })
        .collect()
}

/// One start-up run of `count` sidecars spawned at once.
struct Startup {
    /// Spawn of the first to every ID file written.
    all: Duration,
    /// Of which the bench spent spawning them.
    spawning: Duration,
    /// Claim attempts of all of them, by outcome.
    attempts: BTreeMap<String, u64>,
}

fn startup(bin: &str, url: &str, app: &str, count: usize) -> Startup {
    open_claim_guard(url, app);
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let sidecars: Vec<Spawned> = (0..count)
        .map(|n| spawn_sidecar(bin, url, app, dir.path(), n))
        .collect();
    let spawning = start.elapsed();
    let deadline = start + Duration::from_secs(30);
    while !sidecars.iter().all(|s| s.file.exists()) {
        assert!(Instant::now() < deadline, "sidecars did not publish");
        std::thread::sleep(Duration::from_micros(500));
    }
    let all = start.elapsed();
    let mut attempts = BTreeMap::new();
    for s in &sidecars {
        for (outcome, n) in claim_attempts(s.listen) {
            *attempts.entry(outcome).or_default() += n;
        }
    }
    stop(sidecars);
    Startup {
        all,
        spawning,
        attempts,
    }
}

/// Opens the app's claim guard(s) with the binary, as a new deployment does.
fn open_claim_guard(url: &str, app: &str) {
    let run = guard_open(url, app, &[]);
    assert_eq!(run.code, Some(0), "guard open: {run:?}");
}

/// Memory of a holding sidecar after >= 10 renewals: (VmRSS, RssAnon) in KiB.
fn idle_rss(bin: &str, url: &str, app: &str) -> (u64, u64) {
    open_claim_guard(url, app);
    let dir = tempfile::tempdir().unwrap();
    let sidecar = spawn_sidecar(bin, url, app, dir.path(), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sidecar.file.exists() {
        assert!(Instant::now() < deadline, "no ID published");
        std::thread::sleep(Duration::from_millis(10));
    }
    // 10 renewals at 200 ms.
    std::thread::sleep(Duration::from_millis(2500));
    let rss = rss_kib(sidecar.child.id());
    stop(vec![sidecar]);
    rss
}

/// Longest time any of 8 sidecars went without a published ID through a
/// planned Sentinel failover and through a killed primary.
fn sentinel_failover_gaps() -> (Duration, Duration) {
    let mut topo = SentinelTopology::start();
    let url = topo.url();
    open_claim_guard(&url, "failover");
    let (_sidecars, addrs) = holding_sidecars(&url, "failover", 8);
    let ((), planned) = sample_through(&addrs, || {
        topo.failover();
    });
    let ((), killed) = sample_through(&addrs, || {
        topo.kill_primary();
    });
    let longest = |gaps: Vec<Duration>| gaps.into_iter().max().unwrap_or_default();
    (longest(planned), longest(killed))
}

fn row(measure: &str, value: String, ratio: String, goal: &str) {
    println!("{measure:<52} {value:>12} {ratio:>10} {goal:>8}");
}

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
}

fn main() {
    let started = Instant::now();
    let redis = RedisServer::start();
    let url = redis.url();

    let shipped = shipped_binary();
    let bins: Vec<(&str, &str)> = [("dynamic", shipped.as_str()), ("static", STATIC_BIN)]
        .into_iter()
        .filter(|(_, bin)| Path::new(bin).exists())
        .collect();
    let mut startups = Vec::new();
    for (name, bin) in &bins {
        // Medians of 5 runs each, apps apart so runs never see each other's keys.
        let one = median(
            (0..5)
                .map(|r| startup(bin, &url, &format!("one{name}{r}"), 1).all)
                .collect(),
        );
        let runs: Vec<Startup> = (0..5)
            .map(|r| startup(bin, &url, &format!("all{name}{r}"), SIDECARS))
            .collect();
        let rss = idle_rss(bin, &url, &format!("rss{name}"));
        let size = std::fs::metadata(bin).map(|m| m.len()).unwrap_or(0);
        startups.push((name, one, runs, rss, size));
    }
    let (planned, killed) = sentinel_failover_gaps();

    println!("snowlease worker benchmark (medians; redis-server on loopback)");
    row("measure", "value".into(), "ratio".into(), "goal");
    let ms = |d: Duration| format!("{:.1}ms", d.as_secs_f64() * 1e3);
    for (name, one, runs, (rss, anon), size) in &startups {
        let all = median(runs.iter().map(|r| r.all).collect());
        let spawning = median(runs.iter().map(|r| r.spawning).collect());
        let after_spawn = median(runs.iter().map(|r| r.all - r.spawning).collect());
        row(
            &format!("{name}: 1 sidecar, spawn to published"),
            ms(*one),
            "1.00x".into(),
            "-",
        );
        row(
            &format!("{name}: {SIDECARS} sidecars at once, spawn to all published"),
            ms(all),
            ratio(all, *one),
            "-",
        );
        row(
            &format!("{name}:   last spawn to all published"),
            ms(after_spawn),
            ratio(after_spawn, *one),
            "<= 3x",
        );
        row(
            &format!("{name}:   of which the bench spent spawning"),
            ms(spawning),
            "-".into(),
            "-",
        );
        for (r, run) in runs.iter().enumerate() {
            let counts: Vec<String> = run
                .attempts
                .iter()
                .filter(|(_, n)| **n > 0)
                .map(|(o, n)| format!("{o}={n}"))
                .collect();
            println!(
                "  {name} run {r}: claim rounds of {SIDECARS} sidecars: {}",
                counts.join(" ")
            );
        }
        row(
            &format!("{name}: idle RSS after >= 10 renewals"),
            format!("{:.2}MiB", *rss as f64 / 1024.0),
            "-".into(),
            "<= 4MiB",
        );
        row(
            &format!("{name}:   of which anonymous (heap, stacks)"),
            format!("{:.2}MiB", *anon as f64 / 1024.0),
            "-".into(),
            "-",
        );
        row(
            &format!("{name}: binary size"),
            format!("{:.2}MiB", *size as f64 / 1048576.0),
            "-".into(),
            "-",
        );
    }
    row(
        "sentinel: 8 sidecars, longest without ID, planned failover",
        ms(planned),
        "-".into(),
        "-",
    );
    row(
        "sentinel: 8 sidecars, longest without ID, killed primary",
        ms(killed),
        "-".into(),
        "-",
    );

    println!("total bench time {:.1}s", started.elapsed().as_secs_f64());
}
