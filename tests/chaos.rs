//! The randomized fault run (issue 11): N worker sidecars over 8 worker IDs, each behind its
//! own [`FaultProxy`] to one standalone Redis, under faults drawn from a seeded RNG, while a
//! recorder samples every sidecar's `/id` and ID file; the [`checker`] then proves that no two
//! sidecars published one ID at the same time.
//!
//! - `cargo test --test chaos` runs the short run (`SNOWLEASE_CHAOS_SECS`, default 40 s).
//! - `cargo test --test chaos -- --ignored --nocapture` runs the long run (default 1200 s).
//! - The Sentinel variant (1 primary, 2 replicas, 3 sentinels; sidecars use the Sentinel URL)
//!   adds planned failovers (`SENTINEL FAILOVER`) and killed primaries (brought back empty as
//!   a replica) and drops the per-connection proxy faults. With `--min-replicas-ack` every
//!   overlap fails the run; without it, overlaps that begin within 3 TTLs of a failover are
//!   counted apart (async replication can lose a claim or renew) and only the others fail.
//!   `cargo test --test chaos sentinel` runs its short run without acks (`SNOWLEASE_CHAOS_SENTINEL_SECS`,
//!   default 30 s); the ignored long runs are `chaos_sentinel_long_run_*`.
//!   `SNOWLEASE_CHAOS_REPLICAS=<n>` (1-4, default 2) sets the long runs' replicas and
//!   `SNOWLEASE_CHAOS_MIN_ACKS=<n>` the `--min-replicas-ack` of
//!   `chaos_sentinel_long_run_with_replica_acks_never_publishes_one_id_twice` (default: every
//!   replica). Each overlap is printed with the last fault and the last failover before it.
//! - `SNOWLEASE_CHAOS_SEED=<u64>` replays a run's fault schedule (kinds, targets, durations,
//!   pauses between faults). The timing of the processes is not replayed: the same seed gives
//!   the same faults, not the same interleavings.

#[path = "it"]
mod it_dir {
    #![allow(unused_imports)]
    pub mod harness;
}
#[path = "chaos/checker.rs"]
mod checker;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use checker::{Obs, Sample};
use it_dir::harness::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const APP: &str = "chaos";
/// Sidecars in the run; 4 more than IDs, so some always wait to claim.
const SIDECARS: usize = 12;
/// `--max-worker-id 7`: IDs 0..=7.
const MAX_ID: u32 = 7;
/// `--ttl 2s` of every sidecar (the harness default), in ms.
const TTL_MS: u64 = 2000;
/// How long one `/id` sample may take before it counts as no answer.
const SAMPLE_TIMEOUT: Duration = Duration::from_millis(300);

/// The short run: part of the suite, kept short for CI.
#[test]
fn chaos_short_run_never_publishes_one_id_twice() {
    run(
        Setup::Standalone,
        env_u64("SNOWLEASE_CHAOS_SECS").unwrap_or(40),
    );
}

/// The long run (>= 500 faults at its default length); its figures are in docs/worker.md ("Guarantees").
#[test]
#[ignore]
fn chaos_long_run_never_publishes_one_id_twice() {
    run(
        Setup::Standalone,
        env_u64("SNOWLEASE_CHAOS_SECS").unwrap_or(1200),
    );
}

/// The short Sentinel run, without `--min-replicas-ack`: overlaps after a failover are
/// counted apart, any other fails.
#[test]
fn chaos_sentinel_short_run_never_publishes_one_id_twice_outside_failovers() {
    let secs = env_u64("SNOWLEASE_CHAOS_SENTINEL_SECS").unwrap_or(30);
    let (min_acks, replicas) = (0, 2);
    run(Setup::Sentinel { min_acks, replicas }, secs);
}

/// The long Sentinel run with `--min-replicas-ack` from `SNOWLEASE_CHAOS_MIN_ACKS` (default:
/// every replica, the setting docs/worker.md asks for) over `SNOWLEASE_CHAOS_REPLICAS` replicas
/// (default 2); its figures are in docs/worker.md ("Guarantees").
#[test]
#[ignore]
fn chaos_sentinel_long_run_with_replica_acks_never_publishes_one_id_twice() {
    let secs = env_u64("SNOWLEASE_CHAOS_SECS").unwrap_or(1200);
    let replicas = replicas();
    let min_acks = env_u64("SNOWLEASE_CHAOS_MIN_ACKS").unwrap_or(replicas as u64);
    let min_acks = u32::try_from(min_acks).expect("SNOWLEASE_CHAOS_MIN_ACKS fits in a u32");
    run(Setup::Sentinel { min_acks, replicas }, secs);
}

/// Replicas of the Sentinel runs: `SNOWLEASE_CHAOS_REPLICAS`, default 2 (1 to 4).
fn replicas() -> usize {
    let replicas = env_u64("SNOWLEASE_CHAOS_REPLICAS").unwrap_or(2);
    assert!(
        (1..=4).contains(&replicas),
        "SNOWLEASE_CHAOS_REPLICAS: 1 to 4, not {replicas}"
    );
    replicas as usize
}

/// The long Sentinel run without `--min-replicas-ack`: overlaps after failovers are counted
/// apart and explained; any other overlap fails.
#[test]
#[ignore]
fn chaos_sentinel_long_run_without_replica_acks() {
    let (secs, replicas) = (env_u64("SNOWLEASE_CHAOS_SECS").unwrap_or(1200), replicas());
    run(
        Setup::Sentinel {
            min_acks: 0,
            replicas,
        },
        secs,
    );
}

/// Which Redis the sidecars use.
#[derive(Clone, Copy, Debug)]
enum Setup {
    /// One server; each sidecar behind its own [`FaultProxy`].
    Standalone,
    /// [`SentinelTopology`] with `replicas` replicas and 3 sentinels; sidecars with
    /// `--min-replicas-ack min_acks`.
    Sentinel { min_acks: u32, replicas: usize },
}

impl Setup {
    fn kinds(self) -> &'static [Kind] {
        match self {
            Setup::Standalone => &KINDS,
            Setup::Sentinel { .. } => &SENTINEL_KINDS,
        }
    }
}

/// The Redis of a run.
enum Backend {
    Standalone(RedisServer),
    Sentinel(SentinelTopology),
}

impl Backend {
    /// The node that takes writes now.
    fn primary(&self) -> &RedisServer {
        match self {
            Backend::Standalone(redis) => redis,
            Backend::Sentinel(topo) => topo.primary(),
        }
    }

    fn topology(&mut self) -> &mut SentinelTopology {
        match self {
            Backend::Sentinel(topo) => topo,
            Backend::Standalone(_) => panic!("a Sentinel fault on standalone Redis"),
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: not a u64: {e}")),
    )
}

/// The faults the run draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// SIGSTOP a sidecar past its TTL, then SIGCONT.
    Pause,
    /// SIGKILL a sidecar and restart it in the same pod folder.
    Kill,
    /// SIGTERM a sidecar (it releases its ID) and restart it.
    Term,
    /// Restart Redis empty (same port).
    RedisRestart,
    /// SCRIPT FLUSH.
    ScriptFlush,
    /// Hold every byte of one sidecar's connections, then deliver them.
    Blackhole,
    /// Delay one sidecar's connections in both directions.
    Delay,
    /// Drop the replies to one sidecar, then reset its connections (a reply lost on the wire
    /// ends the TCP connection in real life).
    DropReplies,
    /// Overwrite a held key by hand with a foreign value (PX one TTL).
    Overwrite,
    /// Sentinel: planned failover (`SENTINEL FAILOVER`).
    Failover,
    /// Sentinel: SIGKILL the primary; once a replica is promoted, bring it back empty as a
    /// replica (Sentinel's "restart Redis empty").
    KillPrimary,
}

const KINDS: [Kind; 9] = [
    Kind::Pause,
    Kind::Kill,
    Kind::Term,
    Kind::RedisRestart,
    Kind::ScriptFlush,
    Kind::Blackhole,
    Kind::Delay,
    Kind::DropReplies,
    Kind::Overwrite,
];

/// The Sentinel run: no per-connection proxy (the Sentinels hand out the nodes' own
/// addresses), and Redis restarts become killed primaries.
const SENTINEL_KINDS: [Kind; 7] = [
    Kind::Pause,
    Kind::Kill,
    Kind::Term,
    Kind::ScriptFlush,
    Kind::Overwrite,
    Kind::Failover,
    Kind::KillPrimary,
];

impl Kind {
    fn is_failover(self) -> bool {
        matches!(self, Kind::Failover | Kind::KillPrimary)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One fault as applied: which sidecar (None: all, a Redis-wide fault), when (µs).
#[derive(Clone, Copy, Debug)]
struct Fault {
    kind: Kind,
    target: Option<usize>,
    start_us: u64,
    end_us: u64,
}

/// What the recorder of one slot needs to know about its current process.
#[derive(Clone, Copy)]
struct SlotView {
    generation: u32,
    addr: Option<SocketAddr>,
}

/// One sidecar slot: its pod folder, proxy (standalone only) and current process.
struct Slot {
    pod: PodDir,
    proxy: Option<FaultProxy>,
    url: String,
    min_acks: u32,
    sidecar: Option<Sidecar>,
    view: Arc<Mutex<SlotView>>,
}

impl Slot {
    fn spawn(&mut self, index: usize) {
        let sidecar = Sidecar::worker_at(&self.url, APP)
            .flag("--min-replicas-ack", self.min_acks.to_string())
            .pod(&self.pod)
            .name(format!("sidecar {index}"))
            .flag("--max-worker-id", MAX_ID.to_string())
            // A spare may wait long for an ID; it must not give up (exit 3) mid-run.
            .flag("--claim-timeout", "24h")
            .spawn();
        let addr = sidecar.http_addr();
        let mut view = self.view.lock().unwrap();
        view.generation += 1;
        view.addr = Some(addr);
        drop(view);
        self.sidecar = Some(sidecar);
    }

    /// Marks the process gone (the recorder stops asking it) and returns it.
    fn take(&mut self) -> Sidecar {
        self.view.lock().unwrap().addr = None;
        self.sidecar.take().expect("a running sidecar")
    }

    fn sidecar(&self) -> &Sidecar {
        self.sidecar.as_ref().expect("a running sidecar")
    }

    fn proxy(&self) -> &FaultProxy {
        self.proxy
            .as_ref()
            .expect("proxy faults run on standalone Redis only")
    }
}

fn run(setup: Setup, run_secs: u64) {
    let seed = env_u64("SNOWLEASE_CHAOS_SEED").unwrap_or_else(rand::random);
    eprintln!(
        "chaos: {setup:?}, seed {seed} (replay with SNOWLEASE_CHAOS_SEED={seed}), {run_secs} s"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut redis, min_acks) = match setup {
        Setup::Standalone => (Backend::Standalone(RedisServer::start()), 0),
        Setup::Sentinel { min_acks, replicas } => (
            Backend::Sentinel(SentinelTopology::start_with(SentinelOptions {
                replicas,
                ..SentinelOptions::default()
            })),
            min_acks,
        ),
    };
    redis.primary().open_claim_guard(APP);
    let mut slots: Vec<Slot> = (0..SIDECARS)
        .map(|_| {
            let proxy = match &redis {
                Backend::Standalone(server) => Some(FaultProxy::for_redis(server)),
                Backend::Sentinel(_) => None,
            };
            let url = match (&proxy, &redis) {
                (Some(proxy), _) => proxy.url(),
                (None, Backend::Sentinel(topo)) => topo.url(),
                (None, Backend::Standalone(_)) => unreachable!("standalone slots have proxies"),
            };
            (proxy, url)
        })
        .map(|(proxy, url)| Slot {
            pod: PodDir::new(),
            proxy,
            url,
            min_acks,
            sidecar: None,
            view: Arc::new(Mutex::new(SlotView {
                generation: 0,
                addr: None,
            })),
        })
        .collect();
    for (i, slot) in slots.iter_mut().enumerate() {
        slot.spawn(i);
    }
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let recorders: Vec<_> = slots
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            let file = slot.pod.worker_id_file();
            record(i, slot.view.clone(), file, start, stop.clone(), seed)
        })
        .collect();

    let mut faults = Vec::new();
    let deadline = start + secs(run_secs);
    let mut harness_failure = None;
    while Instant::now() < deadline {
        let kinds = setup.kinds();
        let kind = kinds[rng.random_range(0..kinds.len())];
        let target = rng.random_range(0..SIDECARS);
        let start_us = elapsed_us(start);
        // A harness wait that times out (e.g. Sentinels that never agree) ends the faults but
        // not the run: the history so far is still checked and printed, then the run fails.
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            apply(kind, target, &mut slots, &mut redis, &mut rng)
        }));
        let target = match applied {
            Ok(target) => target,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                harness_failure = Some(format!("{kind} fault #{}: {why}", faults.len()));
                break;
            }
        };
        faults.push(Fault {
            kind,
            target,
            start_us,
            end_us: elapsed_us(start),
        });
        thread::sleep(ms(rng.random_range(200..1200)));
    }
    // Let the last fault settle, so its gap can end.
    thread::sleep(ms(3 * TTL_MS));
    stop.store(true, Ordering::SeqCst);
    let samples: Vec<Sample> = recorders
        .into_iter()
        .flat_map(|r| r.join().expect("recorder"))
        .collect();
    let verdict = report(seed, min_acks, &samples, &faults, elapsed_us(start));
    drop(slots);
    verdict.unwrap_or_else(|why| panic!("chaos (seed {seed}): {why}"));
    if let Some(failure) = harness_failure {
        panic!(
            "chaos (seed {seed}): the harness failed during the {failure}; history up to it checked above"
        );
    }
}

fn elapsed_us(start: Instant) -> u64 {
    start.elapsed().as_micros() as u64
}

/// Applies one fault and undoes it; returns the sidecar it hit (None: Redis-wide).
fn apply(
    kind: Kind,
    target: usize,
    slots: &mut [Slot],
    redis: &mut Backend,
    rng: &mut StdRng,
) -> Option<usize> {
    let slot = &mut slots[target];
    match kind {
        Kind::Pause => {
            slot.sidecar().pause();
            thread::sleep(ms(TTL_MS + rng.random_range(100..1500)));
            slot.sidecar().resume();
        }
        Kind::Kill | Kind::Term => {
            let sig = if kind == Kind::Kill {
                Signal::SIGKILL
            } else {
                Signal::SIGTERM
            };
            let mut old = slot.take();
            old.signal(sig);
            assert!(
                old.wait_exit(secs(15)).is_some(),
                "{} did not exit on {sig}",
                old.name()
            );
            thread::sleep(ms(rng.random_range(0..1500)));
            slot.spawn(target);
        }
        Kind::RedisRestart => {
            match redis {
                Backend::Standalone(server) => server.restart(),
                Backend::Sentinel(_) => unreachable!("Sentinel runs use KillPrimary"),
            }
            return None;
        }
        Kind::ScriptFlush => {
            let _: () = redis.primary().query(redis::cmd("SCRIPT").arg("FLUSH"));
            return None;
        }
        Kind::Failover => {
            let topo = redis.topology();
            topo.failover();
            // The old primary turns replica some 8 s later; a failover asked for before that
            // finds the Sentinels mid-reconfiguration. Let the topology settle first.
            topo.wait_replicas_in_sync();
            settle(topo);
            return None;
        }
        Kind::KillPrimary => {
            let topo = redis.topology();
            let (old, _) = topo.kill_primary();
            thread::sleep(ms(rng.random_range(0..1500)));
            topo.restart_as_replica(old);
            settle(topo);
            return None;
        }
        Kind::Blackhole => hold(slot, Mode::Blackhole, rng.random_range(300..4000)),
        Kind::Delay => {
            let delay = ms(rng.random_range(50..1500));
            hold(slot, Mode::delay(delay), rng.random_range(500..4000))
        }
        Kind::DropReplies => {
            slot.proxy().set_mode(Mode::DropReplies);
            thread::sleep(ms(rng.random_range(200..3000)));
            slot.proxy().set_mode(Mode::Reset);
            slot.proxy().set_mode(Mode::Pass);
        }
        Kind::Overwrite => {
            let id = rng.random_range(0..=MAX_ID);
            let _: () = redis.primary().query(
                redis::cmd("SET")
                    .arg(worker_key(APP, id))
                    .arg("intruder#chaos")
                    .arg("PX")
                    .arg(TTL_MS),
            );
            return None;
        }
    }
    Some(target)
}

/// After a failover: every Sentinel sees the nodes again, and the Sentinels' own pause
/// between failovers of one master (twice `failover-timeout`, 4 s) has passed, so the next
/// failover fault starts on a settled topology (the long run once timed out in the harness
/// when a primary was killed 6 s after the previous failover).
fn settle(topo: &SentinelTopology) {
    topo.wait_sentinels_ready();
    thread::sleep(ms(4000));
}

fn hold(slot: &Slot, mode: Mode, for_ms: u64) {
    slot.proxy().set_mode(mode);
    thread::sleep(ms(for_ms));
    slot.proxy().set_mode(Mode::Pass);
}

/// Samples slot `index` every 10-20 ms until `stop`: `/id`, then the ID file.
fn record(
    index: usize,
    view: Arc<Mutex<SlotView>>,
    file: PathBuf,
    start: Instant,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> thread::JoinHandle<Vec<Sample>> {
    thread::spawn(move || {
        let http = ureq::AgentBuilder::new()
            .timeout(SAMPLE_TIMEOUT)
            .max_idle_connections(0)
            .build();
        let mut rng = StdRng::seed_from_u64(seed ^ index as u64);
        let mut samples = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let v = *view.lock().unwrap();
            let sent_us = elapsed_us(start);
            let obs = v.addr.map_or(Obs::NoAnswer, |a| ask(&http, a));
            let recv_us = elapsed_us(start);
            let file = std::fs::read_to_string(&file)
                .ok()
                .and_then(|t| t.trim().parse().ok());
            samples.push(Sample {
                sidecar: index,
                generation: v.generation,
                sent_us,
                recv_us,
                obs,
                file,
            });
            thread::sleep(ms(rng.random_range(10..=20)));
        }
        samples
    })
}

/// One `GET /id`.
fn ask(http: &ureq::Agent, addr: SocketAddr) -> Obs {
    let body = |r: ureq::Response| r.into_json::<serde_json::Value>().ok();
    match http.get(&format!("http://{addr}/id")).call() {
        Ok(r) => body(r)
            .and_then(|b| b["worker_id"].as_u64())
            .map_or(Obs::NoAnswer, |id| Obs::Published(id as u32)),
        Err(ureq::Error::Status(503, r)) => Obs::NotPublished {
            readopting: body(r).is_some_and(|b| b["state"] == "readopting"),
        },
        Err(_) => Obs::NoAnswer,
    }
}

/// Prints the figures; Err when the history breaks a rule.
fn report(
    seed: u64,
    min_acks: u32,
    samples: &[Sample],
    faults: &[Fault],
    end_us: u64,
) -> Result<(), String> {
    let intervals = checker::intervals(samples);
    let all_overlaps = checker::overlaps(&intervals);
    let failovers: Vec<(u64, u64)> = faults
        .iter()
        .filter(|f| f.kind.is_failover())
        .map(|f| (f.start_us, f.end_us))
        .collect();
    // Without replica acks a failover may lose a claim or renew: such overlaps are explained.
    let (explained, overlaps): (Vec<_>, Vec<_>) = all_overlaps.into_iter().partition(|o| {
        min_acks == 0 && checker::follows_failover(o, &failovers, 3 * TTL_MS * 1000)
    });
    let stale = checker::stale_files(samples);
    let published_s: f64 = intervals
        .iter()
        .map(|i| (i.end_us - i.start_us) as f64 / 1e6)
        .sum();
    let runs = checker::per_sidecar(samples);
    let mut by_kind: BTreeMap<Kind, (usize, usize, u64, usize)> = BTreeMap::new();
    for (n, f) in faults.iter().enumerate() {
        // A gap is this fault's when it begins before the next fault (or 2 TTLs after this one).
        let until = faults
            .get(n + 1)
            .map_or(f.end_us + 2 * TTL_MS * 1000, |next| next.start_us);
        let hit: Vec<usize> = f.target.map_or((0..SIDECARS).collect(), |t| vec![t]);
        let entry = by_kind.entry(f.kind).or_default();
        entry.0 += 1;
        for s in hit {
            let run = runs.get(&s).map_or(&[][..], Vec::as_slice);
            if let Some(gap) = checker::gap_after(run, f.start_us, until) {
                entry.1 += 1;
                entry.2 = entry.2.max(gap.us);
                entry.3 += usize::from(!gap.ended);
            }
        }
    }
    eprintln!("chaos: seed {seed}");
    eprintln!(
        "chaos: {} trials (faults) in {:.0} s, {} samples, {} publish intervals ({published_s:.0} sidecar-s published)",
        faults.len(),
        end_us as f64 / 1e6,
        samples.len(),
        intervals.len()
    );
    eprintln!("chaos: kind          faults  IDs lost  longest gap without an ID");
    for (kind, (n, lost, gap, open)) in &by_kind {
        let open = if *open > 0 {
            format!(" ({open} still without an ID at the end)")
        } else {
            String::new()
        };
        eprintln!(
            "chaos: {:<13} {n:>6}  {lost:>8}  {:.2} s{open}",
            kind.to_string(),
            *gap as f64 / 1e6
        );
    }
    eprintln!("chaos: --min-replicas-ack {min_acks}");
    if min_acks > 0 && !failovers.is_empty() {
        let after = overlaps
            .iter()
            .filter(|o| checker::follows_failover(o, &failovers, 3 * TTL_MS * 1000))
            .count();
        eprintln!(
            "chaos: of the overlaps, {after} began within 3 TTLs after a failover (they count)"
        );
    }
    eprintln!("chaos: overlaps {} (must be 0)", overlaps.len());
    if min_acks == 0 && !failovers.is_empty() {
        eprintln!(
            "chaos: overlaps within 3 TTLs after a failover, without --min-replicas-ack: {} (async replication: the new primary may lack the last claim or renew; not failing the run)",
            explained.len()
        );
        for o in &explained {
            eprintln!("chaos: overlap after a failover {o:?}");
            eprintln!("chaos:   {}", before_overlap(o, faults));
        }
    }
    eprintln!("chaos: stale ID files {} (must be 0)", stale.len());
    for o in &overlaps {
        eprintln!("chaos: OVERLAP {o:?}");
        eprintln!("chaos:   {}", before_overlap(o, faults));
    }
    for s in &stale {
        eprintln!("chaos: STALE FILE {s:?}");
    }
    if intervals.len() < SIDECARS.min(MAX_ID as usize + 1) {
        return Err(format!(
            "only {} publish intervals: vacuous run",
            intervals.len()
        ));
    }
    if overlaps.is_empty() && stale.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} overlaps, {} stale ID files",
            overlaps.len(),
            stale.len()
        ))
    }
}

/// One line on an overlap: its ID, the two sidecars, when it began, the last fault that
/// started before it and the last failover (`Failover` or `KillPrimary`) before it.
fn before_overlap(o: &checker::Overlap, faults: &[Fault]) -> String {
    let began = o.began_us();
    let starts: Vec<u64> = faults.iter().map(|f| f.start_us).collect();
    let describe = |f: Option<&Fault>| match f {
        None => "none".to_string(),
        Some(f) => format!(
            "{} on {} at {:.3}-{:.3} s ({:.3} s before)",
            f.kind,
            f.target
                .map_or("Redis".to_string(), |t| format!("sidecar {t}")),
            f.start_us as f64 / 1e6,
            f.end_us as f64 / 1e6,
            began.saturating_sub(f.start_us) as f64 / 1e6
        ),
    };
    let last = checker::last_at_or_before(&starts, began).map(|i| &faults[i]);
    let failover = faults
        .iter()
        .rev()
        .find(|f| f.start_us <= began && f.kind.is_failover());
    format!(
        "ID {} held by sidecar {} (gen {}) and sidecar {} (gen {}) from {:.3} s for {:.3} s; last fault before: {}; last failover before: {}",
        o.id,
        o.a.sidecar,
        o.a.generation,
        o.b.sidecar,
        o.b.generation,
        began as f64 / 1e6,
        o.a.end_us.min(o.b.end_us).saturating_sub(began) as f64 / 1e6,
        describe(last),
        describe(failover)
    )
}
