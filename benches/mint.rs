//! `cargo bench --bench mint`: mint mode's speed (issue 23). Starts its own redis-server on a
//! free loopback port through the test harness (`tests/it/harness`), opens the claim guard
//! with `snowlease guard open`, and runs the bench-profile binary as `snowlease worker --mint
//! --mint-socket <tmp>/mint.sock`. Over the unix socket, keep-alive HTTP/1.1 clients (one
//! thread and one connection each, a minimal client over std's `UnixStream`) measure:
//!
//! - single IDs (`GET /next`) with 1 and 16 connections: IDs per second and p50/p99/p999
//!   latency, beside the same load on `/livez` (the do-nothing handler, same socket, same
//!   server thread) in the same run, alternating; goals: >= 0.8x `/livez`, >= 50k IDs/s,
//!   p999 <= 1 ms (the clients share the machine's cores with the sidecar);
//! - batches (`GET /next?count=4096`, JSON and text): IDs per second against the default
//!   layout's ceiling of 4096 per ms (goal >= 0.9x);
//! - idle RSS of a mint-mode sidecar against a plain worker sidecar with the same flags
//!   (goal: within 0.5 MiB).
//!
//! Beside the single-ID loads, the same clients against a floor in this process (a blocking
//! thread per connection answering a fixed `200 ok`: one read and one write per request),
//! which shows what the machine's scheduler alone allows. Beside each load: the sidecar's
//! CPU per request (`/proc/<pid>/task/*/schedstat`) and the client threads' (`getrusage`).
//! Prints a table and the goals met or missed (docs/worker.md, "Mint mode speed").

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

// The test harness, shared with the integration tests: its modules sit
// under tests/it/harness/, which an inline module with this path finds.
#[path = "../tests/it"]
#[allow(dead_code, unused_imports)]
mod it {
    pub mod harness;
}
use it::harness::{RedisServer, guard_open, poll_some, rss_kib};

const BIN: &str = env!("CARGO_BIN_EXE_snowlease");
/// How long each measured load runs.
const LOAD_TIME: Duration = Duration::from_secs(2);
/// Unmeasured load before the measured ones of each kind.
const WARM_UP: Duration = Duration::from_millis(300);
/// Measured loads of each kind; rates are their median, latencies pooled.
const ROUNDS: usize = 3;
/// IDs per batch request: one ms of the default layout's sequence (and the most `count`
/// may ask for).
const BATCH: u64 = 4096;
/// The default layout's ceiling (41:10:12): 4096 IDs per ms.
const CEILING_PER_SEC: f64 = 4096.0 * 1000.0;
/// RSS samples of each kind of sidecar; the median is reported.
const RSS_RUNS: usize = 3;

/// A keep-alive HTTP/1.1 client on one unix-socket connection, sending one fixed request
/// and reading each answer whole (`Content-Length` framing, as the sidecar answers).
struct Client {
    stream: UnixStream,
    request: Vec<u8>,
    buf: Vec<u8>,
}

/// One answer: its status and where its body sits in the client's buffer.
struct Answer {
    status: u16,
    body: std::ops::Range<usize>,
}

impl Client {
    fn connect(socket: &Path, target: &str, accept: &str) -> Self {
        let stream = UnixStream::connect(socket).expect("connect to the mint socket");
        let request = format!("GET {target} HTTP/1.1\r\nHost: mint\r\nAccept: {accept}\r\n\r\n");
        Self {
            stream,
            request: request.into_bytes(),
            buf: vec![0; 256 * 1024],
        }
    }

    /// Sends the request and reads its answer; the body is `self.buf[answer.body]`.
    fn call(&mut self) -> Answer {
        self.stream.write_all(&self.request).expect("send");
        let mut filled = 0;
        loop {
            filled += self.fill(filled);
            let mut headers = [httparse::EMPTY_HEADER; 16];
            let mut head = httparse::Response::new(&mut headers);
            let httparse::Status::Complete(head_len) =
                head.parse(&self.buf[..filled]).expect("an HTTP/1.1 answer")
            else {
                continue;
            };
            let length: usize = head
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                .expect("a Content-Length");
            let status = head.code.expect("a status");
            let end = head_len + length;
            if end > self.buf.len() {
                self.buf.resize(end, 0);
            }
            while filled < end {
                filled += self.fill(filled);
            }
            assert_eq!(filled, end, "nothing is sent ahead of a request");
            return Answer {
                status,
                body: head_len..end,
            };
        }
    }

    fn fill(&mut self, filled: usize) -> usize {
        if filled == self.buf.len() {
            self.buf.resize(filled * 2, 0);
        }
        let n = self.stream.read(&mut self.buf[filled..]).expect("read");
        assert!(n > 0, "the sidecar closed the connection");
        n
    }
}

/// What one answer carries, checked: how many IDs (or 1 for `/livez`).
#[derive(Clone, Copy)]
enum Expect {
    /// `/livez`: `ok`.
    Live,
    /// `/next`: `{"id":"<decimal>"}`.
    One,
    /// `/next?count=4096` as JSON: `{"ids":["<decimal>",...]}`.
    BatchJson,
    /// `/next?count=4096` as text: one decimal per line.
    BatchText,
}

impl Expect {
    /// The IDs in `body` (every one parsed on a client's `first` answer, else a cheap
    /// check of the framing); panics on a body that is not what the route answers.
    fn count(self, body: &[u8], first: bool) -> u64 {
        let text = std::str::from_utf8(body).expect("UTF-8");
        match self {
            Self::Live => {
                assert_eq!(text, "ok\n");
                1
            }
            Self::One => {
                assert!(
                    text.starts_with(r#"{"id":""#) && text.ends_with(r#""}"#),
                    "{text}"
                );
                1
            }
            Self::BatchJson => {
                assert!(text.starts_with(r#"{"ids":[""#) && text.ends_with(r#""]}"#));
                if first {
                    let json: serde_json::Value = serde_json::from_str(text).unwrap();
                    let ids: Vec<u64> = json["ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|id| id.as_str().unwrap().parse().unwrap())
                        .collect();
                    assert_increasing(&ids);
                }
                BATCH
            }
            Self::BatchText => {
                if first {
                    let ids: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
                    assert_increasing(&ids);
                }
                assert!(text.ends_with('\n') && body.len() >= BATCH as usize * 2);
                BATCH
            }
        }
    }
}

fn assert_increasing(ids: &[u64]) {
    assert_eq!(ids.len() as u64, BATCH);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "not increasing");
}

/// One kind of load: a request and the server it goes to.
#[derive(Clone, Copy)]
struct Kind<'a> {
    socket: &'a Path,
    /// The server's process, for its CPU time; `None` for the in-process [`Floor`].
    server: Option<u32>,
    target: &'a str,
    accept: &'a str,
    expect: Expect,
}

/// One load: `clients` connections, each sending the same request back to back.
#[derive(Default)]
struct Load {
    /// IDs answered (for `/livez`: answers).
    ids: u64,
    requests: u64,
    /// Answers other than 200 (503 `reserving`, ...).
    refused: u64,
    elapsed: Duration,
    /// Every request's, send to answer read.
    latencies: Vec<Duration>,
    /// The server's CPU (user + system), us; NaN when not known.
    server_cpu_us: f64,
    /// The client threads' CPU (user + system), us.
    client_cpu_us: f64,
}

/// Runs `clients` keep-alive connections of `kind` for `time`.
fn load(kind: Kind, clients: usize, time: Duration) -> Load {
    let barrier = Barrier::new(clients + 1);
    let server_cpu = || kind.server.map_or(f64::NAN, process_cpu_us);
    let server_before = server_cpu();
    let runs: Vec<(Load, Instant, Instant)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let barrier = &barrier;
                scope.spawn(move || {
                    let mut client = Client::connect(kind.socket, kind.target, kind.accept);
                    let mut run = Load {
                        latencies: Vec::with_capacity(200_000),
                        ..Load::default()
                    };
                    barrier.wait();
                    let cpu_before = thread_cpu_us();
                    let started = Instant::now();
                    let deadline = started + time;
                    let mut sent = started;
                    while sent < deadline {
                        let answer = client.call();
                        let answered = Instant::now();
                        run.latencies.push(answered - sent);
                        run.requests += 1;
                        if answer.status == 200 {
                            let body = &client.buf[answer.body];
                            run.ids += kind.expect.count(body, run.requests == 1);
                        } else {
                            run.refused += 1;
                        }
                        sent = answered;
                    }
                    run.client_cpu_us = thread_cpu_us() - cpu_before;
                    (run, started, sent)
                })
            })
            .collect();
        barrier.wait();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut total = Load {
        server_cpu_us: server_cpu() - server_before,
        ..Load::default()
    };
    let first = runs.iter().map(|r| r.1).min().unwrap();
    let last = runs.iter().map(|r| r.2).max().unwrap();
    total.elapsed = last - first;
    for (run, _, _) in runs {
        total.ids += run.ids;
        total.requests += run.requests;
        total.refused += run.refused;
        total.client_cpu_us += run.client_cpu_us;
        total.latencies.extend(run.latencies);
    }
    total
}

/// The floor of a request on this machine: a blocking thread per connection in this
/// process that answers each request (sent whole, as [`Client`] sends it) with a fixed
/// `200 ok`, no HTTP parsing, no event loop: one read and one write per request.
struct Floor {
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Floor {
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n";

    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("floor.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                std::thread::spawn(move || {
                    let mut buf = [0; 4096];
                    let mut filled = 0;
                    loop {
                        match stream.read(&mut buf[filled..]) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => filled += n,
                        }
                        if buf[..filled].ends_with(b"\r\n\r\n") {
                            filled = 0;
                            if stream.write_all(Self::ANSWER).is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self { socket, _dir: dir }
    }
}

/// The measured loads of one kind, pooled.
struct Measured {
    /// Median over the rounds, IDs (or answers) per second.
    rate: f64,
    requests: u64,
    refused: u64,
    latencies: Vec<Duration>,
    /// NaN when not known.
    server_cpu_us: f64,
    client_cpu_us: f64,
}

impl Measured {
    fn new(loads: Vec<Load>) -> Self {
        let mut rates: Vec<f64> = loads
            .iter()
            .map(|l| l.ids as f64 / l.elapsed.as_secs_f64())
            .collect();
        rates.sort_by(f64::total_cmp);
        let mut latencies: Vec<Duration> = loads.iter().flat_map(|l| l.latencies.clone()).collect();
        latencies.sort();
        Self {
            rate: rates[rates.len() / 2],
            requests: loads.iter().map(|l| l.requests).sum(),
            refused: loads.iter().map(|l| l.refused).sum(),
            latencies,
            server_cpu_us: loads.iter().map(|l| l.server_cpu_us).sum(),
            client_cpu_us: loads.iter().map(|l| l.client_cpu_us).sum(),
        }
    }

    /// The latency at quantile `q` (0-1).
    fn quantile(&self, q: f64) -> Duration {
        let i = ((self.latencies.len() as f64 * q) as usize).min(self.latencies.len() - 1);
        self.latencies[i]
    }
}

/// `ROUNDS` loads of each of `kinds` after a warm-up of each, alternating kinds (first
/// kind first in even rounds, last first in odd ones), so a change of the machine's state
/// moves all kinds alike.
fn measure(clients: usize, kinds: &[Kind]) -> Vec<Measured> {
    for kind in kinds {
        load(*kind, clients, WARM_UP);
    }
    let mut loads: Vec<Vec<Load>> = kinds.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        let mut order: Vec<usize> = (0..kinds.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for k in order {
            loads[k].push(load(kinds[k], clients, LOAD_TIME));
        }
    }
    loads.into_iter().map(Measured::new).collect()
}

/// The sidecar `snowlease worker --mint --mint-socket ...` under load, with the default
/// TTL, renewals and mint window.
struct MintSidecar {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl MintSidecar {
    fn start(url: &str, app: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("mint.sock");
        let child = sidecar_command(url, app, dir.path())
            .arg("--mint")
            .arg("--mint-socket")
            .arg(&socket)
            .spawn()
            .expect("spawn snowlease");
        let sidecar = Self {
            child,
            socket,
            _dir: dir,
        };
        sidecar.wait_minting();
        sidecar
    }

    /// Waits until `/next` answers 200 on the socket.
    fn wait_minting(&self) {
        let minting = poll_some(Duration::from_secs(15), || {
            UnixStream::connect(&self.socket).ok()?;
            let mut client = Client::connect(&self.socket, "/next", "*/*");
            (client.call().status == 200).then_some(())
        });
        assert!(minting.is_some(), "the mint sidecar did not mint");
    }

    /// A load of `target` on the socket.
    fn kind<'a>(&'a self, target: &'a str, accept: &'a str, expect: Expect) -> Kind<'a> {
        Kind {
            socket: &self.socket,
            server: Some(self.child.id()),
            target,
            accept,
            expect,
        }
    }
}

impl Drop for MintSidecar {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// `snowlease worker` for `app` with the bench's common flags; output to `dir`.
fn sidecar_command(url: &str, app: &str, dir: &Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["worker", "--app", app, "--redis-url", url])
        .args(["--listen", "127.0.0.1:0"])
        .arg("--output-file")
        .arg(dir.join("worker-id"))
        .env_clear()
        .env("SNOWLEASE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

fn stop(child: &mut Child) {
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let _ = child.wait();
}

/// Opens the app's claim guard with the binary, as a new deployment does.
fn open_claim_guard(url: &str, app: &str) {
    let run = guard_open(url, app, &[]);
    assert_eq!(run.code, Some(0), "guard open: {run:?}");
}

/// CPU time of process `pid` so far, all its threads (the first field of each
/// `/proc/<pid>/task/<tid>/schedstat`, ns), us.
fn process_cpu_us(pid: u32) -> f64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    let ns: u64 = tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split(' ').next()?.parse::<u64>().ok())
        .sum();
    ns as f64 / 1e3
}

/// The calling thread's CPU time so far (user + system), us.
fn thread_cpu_us() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_THREAD).unwrap();
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
    us(usage.user_time()) + us(usage.system_time())
}

/// Memory of a holding sidecar, plain or `--mint` (with `--mint-socket`, answering one
/// `/next`), both with TTL 4 s and renewals every 200 ms, after >= 10 renewals: (VmRSS,
/// RssAnon) in KiB.
fn idle_rss(url: &str, app: &str, mint: bool) -> (u64, u64) {
    open_claim_guard(url, app);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mint.sock");
    let mut cmd = sidecar_command(url, app, dir.path());
    cmd.args(["--ttl", "4s", "--renew-interval", "200ms"]);
    if mint {
        cmd.arg("--mint").arg("--mint-socket").arg(&socket);
    }
    let mut child = cmd.spawn().expect("spawn snowlease");
    let file = dir.path().join("worker-id");
    let ready = poll_some(Duration::from_secs(10), || {
        if !mint {
            return file.exists().then_some(());
        }
        UnixStream::connect(&socket).ok()?;
        let mut client = Client::connect(&socket, "/next", "*/*");
        (client.call().status == 200).then_some(())
    });
    assert!(ready.is_some(), "the sidecar did not publish or mint");
    // 10 renewals at 200 ms.
    std::thread::sleep(Duration::from_millis(2500));
    let rss = rss_kib(child.id());
    stop(&mut child);
    rss
}

fn median_u64(mut values: Vec<u64>) -> u64 {
    values.sort();
    values[values.len() / 2]
}

fn us(d: Duration) -> String {
    format!("{:.0}us", d.as_secs_f64() * 1e6)
}

fn header() {
    println!(
        "{:<44} {:>11} {:>7} {:>9} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7}",
        "measure",
        "per second",
        "ratio",
        "goal",
        "p50",
        "p99",
        "p999",
        "srv us/r",
        "cli us/r",
        "refused"
    );
}

fn row(name: &str, m: &Measured, ratio: String, goal: &str) {
    let per = |cpu: f64| match cpu.is_nan() {
        true => "-".to_owned(),
        false => format!("{:.1}", cpu / m.requests as f64),
    };
    println!(
        "{name:<44} {:>11.0} {ratio:>7} {goal:>9} {:>7} {:>7} {:>7} {:>8} {:>8} {:>7}",
        m.rate,
        us(m.quantile(0.5)),
        us(m.quantile(0.99)),
        us(m.quantile(0.999)),
        per(m.server_cpu_us),
        per(m.client_cpu_us),
        m.refused
    );
}

/// One line of the summary: a goal, the figure, met or missed.
fn verdict(goal: &str, figure: String, met: bool) -> String {
    let word = if met { "met" } else { "MISSED" };
    format!("  {goal:<52} {figure:>14}  {word}")
}

fn main() {
    let started = Instant::now();
    let redis = RedisServer::start();
    let url = redis.url();
    open_claim_guard(&url, "mint");
    let sidecar = MintSidecar::start(&url, "mint");

    let floor = Floor::start();
    let single = [
        Kind {
            socket: &floor.socket,
            server: None,
            target: "/livez",
            accept: "*/*",
            expect: Expect::Live,
        },
        sidecar.kind("/livez", "*/*", Expect::Live),
        sidecar.kind("/next", "*/*", Expect::One),
    ];
    let mut singles = Vec::new();
    for clients in [1, 16] {
        let mut m = measure(clients, &single).into_iter();
        let mut next = || m.next().unwrap();
        singles.push((clients, next(), next(), next()));
    }
    let target = format!("/next?count={BATCH}");
    let mut batches = Vec::new();
    for (clients, accept, expect, name) in [
        (1, "*/*", Expect::BatchJson, "JSON"),
        (4, "*/*", Expect::BatchJson, "JSON"),
        (1, "text/plain", Expect::BatchText, "text"),
    ] {
        let m = measure(clients, &[sidecar.kind(&target, accept, expect)]);
        batches.push((clients, name, m.into_iter().next().unwrap()));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let after_load = rss_kib(sidecar.child.id());
    drop(sidecar);

    let (mut plain, mut mint) = (Vec::new(), Vec::new());
    for r in 0..RSS_RUNS {
        plain.push(idle_rss(&url, &format!("rssplain{r}"), false));
        mint.push(idle_rss(&url, &format!("rssmint{r}"), true));
    }
    let rss = |runs: &[(u64, u64)]| {
        (
            median_u64(runs.iter().map(|r| r.0).collect()),
            median_u64(runs.iter().map(|r| r.1).collect()),
        )
    };
    let (plain, mint) = (rss(&plain), rss(&mint));

    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "snowlease mint benchmark (unix socket, keep-alive HTTP/1.1, clients on the same {cpus} CPUs; \
         {ROUNDS} loads of {:.0}s each, rates their median, latencies pooled)",
        LOAD_TIME.as_secs_f64()
    );
    header();
    let mut summary = Vec::new();
    for (clients, floor, livez, next) in &singles {
        let ratio = next.rate / livez.rate;
        let conns = format!(
            "{clients} connection{}",
            if *clients == 1 { "" } else { "s" }
        );
        row(
            &format!("floor (fixed answer), {conns}"),
            floor,
            "-".into(),
            "-",
        );
        row(&format!("GET /livez, {conns}"), livez, "1.00x".into(), "-");
        row(
            &format!("GET /next, {conns}"),
            next,
            format!("{ratio:.2}x"),
            ">= 0.80x",
        );
        let p999 = next.quantile(0.999);
        summary.push(verdict(
            &format!("/next {conns}: >= 0.80x /livez"),
            format!("{ratio:.2}x"),
            ratio >= 0.8,
        ));
        summary.push(verdict(
            &format!("/next {conns}: >= 50k IDs/s"),
            format!("{:.0}", next.rate),
            next.rate >= 50_000.0,
        ));
        summary.push(verdict(
            &format!("/next {conns}: p999 <= 1 ms"),
            us(p999),
            p999 <= Duration::from_millis(1),
        ));
    }
    for (clients, format, m) in &batches {
        let ratio = m.rate / CEILING_PER_SEC;
        let conns = format!(
            "{clients} connection{}",
            if *clients == 1 { "" } else { "s" }
        );
        row(
            &format!("GET /next?count={BATCH}, {format}, {conns}"),
            m,
            format!("{ratio:.2}x"),
            ">= 0.90x",
        );
        summary.push(verdict(
            &format!("count={BATCH} {format} {conns}: >= 0.90x of 4.096M/s"),
            format!("{ratio:.2}x"),
            ratio >= 0.9,
        ));
    }
    let mib = |kib: u64| format!("{:.2}MiB", kib as f64 / 1024.0);
    println!(
        "idle RSS after >= 10 renewals (median of {RSS_RUNS}): plain worker {} ({} anonymous), \
         mint mode {} ({} anonymous); mint sidecar 2.5s after the loads {} ({} anonymous)",
        mib(plain.0),
        mib(plain.1),
        mib(mint.0),
        mib(mint.1),
        mib(after_load.0),
        mib(after_load.1)
    );
    let grown = mint.0 as f64 - plain.0 as f64;
    summary.push(verdict(
        "idle RSS, mint mode - plain worker: within 0.5 MiB",
        format!("{:+.2}MiB", grown / 1024.0),
        grown.abs() <= 512.0,
    ));
    println!("goals:");
    for line in summary {
        println!("{line}");
    }
    println!("total bench time {:.1}s", started.elapsed().as_secs_f64());
}
