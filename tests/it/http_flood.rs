//! Idle HTTP connections: a flood of idle connections under a soft
//! open-file limit of 1024 starves neither the renewals, nor the ID and state files, nor
//! `GET /id` (worker) or the pool endpoints (`pool serve`); connections without a complete
//! header are closed after `--http-header-timeout`; the soft limit is raised to the hard one
//! and children get the original back.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nix::sys::resource::{Resource, getrlimit, setrlimit};

use crate::harness::*;

/// Idle connections in a flood: more than the 1024 descriptors the sidecar may open.
const FLOOD: usize = 1100;

/// The header timeout the flood tests set (by the environment twin, which a build without the
/// flag ignores, so the same test runs against it and fails on the flood, not on a flag).
const HEADER_TIMEOUT: Duration = Duration::from_secs(15);

/// Raises this test process's own soft open-file limit (it holds [`FLOOD`] sockets); false
/// when the hard limit is too low to run the test here.
fn room_for_the_flood() -> bool {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let needed = FLOOD as u64 + 256;
    if soft < needed && hard >= needed {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("setrlimit");
    }
    if hard < needed {
        eprintln!("NOTE: skipping: the hard open-file limit {hard} is below {needed}");
        return false;
    }
    true
}

/// Opens up to `n` TCP connections to `addr` (loopback only) that send nothing; 2 s per
/// connect and 60 s in all at most. Returns the connections that were established.
fn flood(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    assert!(addr.ip().is_loopback(), "floods only loopback: {addr}");
    let started = Instant::now();
    let mut conns = Vec::with_capacity(n);
    while conns.len() < n && started.elapsed() < secs(60) {
        match TcpStream::connect_timeout(&addr, secs(2)) {
            Ok(conn) => {
                conn.set_nonblocking(true).unwrap();
                conns.push(conn);
            }
            Err(e) => eprintln!("flood: connect {}: {e}", conns.len()),
        }
    }
    conns
}

/// True once the server closed `conn` (EOF or a reset); drains anything it sent.
fn closed_by_server(conn: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// How many of `conns` the server has closed.
fn count_closed(conns: &mut [TcpStream]) -> usize {
    conns
        .iter_mut()
        .map(closed_by_server)
        .filter(|closed| *closed)
        .count()
}

/// The state file's `valid_until_ms`, 0 when absent.
fn valid_until_ms(sidecar: &Sidecar) -> u64 {
    sidecar
        .read_state()
        .and_then(|s| s["valid_until_ms"].as_u64())
        .unwrap_or(0)
}

/// Worker sidecar with soft and hard open-file limits of 1024 and 1100 idle connections to its
/// port: renewals go on and rewrite the state file, `snowlease id` reads the ID, `GET /id`
/// answers, and with Redis paused the ID file goes at the deadline; the flood is closed by the
/// connection cap and the header timeout. Prints the RSS.
#[test]
fn idle_connection_flood_starves_neither_the_files_nor_id() {
    if !room_for_the_flood() {
        return;
    }
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "flood")
        .wrap(&["prlimit", "--nofile=1024:1024", "--"])
        .env(
            "SNOWLEASE_HTTP_HEADER_TIMEOUT",
            format!("{}s", HEADER_TIMEOUT.as_secs()),
        )
        .spawn();
    let lease = sidecar.wait_for_lease(secs(15));
    let pid = sidecar.spawned_pid();
    let rss_before = rss_kib(pid.as_raw() as u32).0;

    let mut conns = flood(sidecar.http_addr(), FLOOD);
    assert_eq!(conns.len(), FLOOD, "the flood must be established");
    let flooded = Instant::now();
    let rss_flooded = rss_kib(pid.as_raw() as u32).0;

    // Renewals go on and rewrite the state file (every 500 ms): three fresh deadlines.
    let mut seen = valid_until_ms(&sidecar);
    for round in 0..3 {
        let next = poll_some(secs(5), || {
            Some(valid_until_ms(&sidecar)).filter(|v| *v > seen)
        });
        seen = next.unwrap_or_else(|| {
            panic!("state file not rewritten under the flood (round {round}, last {seen})")
        });
    }
    let id = run_snowlease(
        &["id", "--file", sidecar.output_file().to_str().unwrap()],
        &[],
        secs(5),
    );
    assert_eq!(
        (id.code, id.stdout.trim()),
        (Some(0), lease.worker_id.to_string().as_str()),
        "snowlease id under the flood: {id:?}"
    );
    let answered = poll_some(secs(5), || sidecar.id());
    assert_eq!(
        answered.map(|r| r.worker_id),
        Some(lease.worker_id),
        "GET /id under the flood"
    );
    assert!(
        flooded.elapsed() < HEADER_TIMEOUT,
        "the checks must run while the flood is held (took {:?})",
        flooded.elapsed()
    );
    let held = FLOOD - count_closed(&mut conns);
    assert_eq!(
        redis.get(&worker_key("flood", lease.worker_id)).as_deref(),
        Some(lease.owner.as_str()),
        "the lease is still ours"
    );

    // Redis stops answering: the ID file still goes at the validity deadline, flood or not.
    redis.pause();
    let deadline_ms = valid_until_ms(&sidecar);
    let gone = poll_until(
        Duration::from_millis(deadline_ms.saturating_sub(unix_ms()) + 2_000),
        || sidecar.read_output_file().is_none(),
    );
    let late_ms = unix_ms() as i64 - deadline_ms as i64;
    redis.resume();
    assert!(
        gone,
        "ID file still there {late_ms} ms after the deadline under the flood"
    );

    // Every idle connection is closed by the header timeout at the latest.
    assert!(
        poll_until(HEADER_TIMEOUT + secs(15), || count_closed(&mut conns)
            == FLOOD),
        "{} of {FLOOD} idle connections still open {:?} after the flood",
        FLOOD - count_closed(&mut conns),
        flooded.elapsed()
    );
    let rss_after = rss_kib(pid.as_raw() as u32).0;
    eprintln!(
        "FIGURE worker RSS: {rss_before} KiB before, {rss_flooded} KiB with {held} idle \
         connections held (of {FLOOD} opened), {rss_after} KiB after they were closed"
    );
}

/// `pool serve` with open-file limits of 1024 and 1100 idle connections: acquire, status,
/// `/readyz` and `/metrics` answer; the flood is closed by the cap and the header timeout.
#[test]
fn idle_connection_flood_leaves_pool_serve_answering() {
    if !room_for_the_flood() {
        return;
    }
    let redis = RedisServer::start();
    let init = run_snowlease(
        &[
            "pool",
            "init",
            "--pool",
            "gpus",
            "--ids",
            "a,b",
            "--redis-url",
            &redis.url(),
        ],
        &[],
        secs(10),
    );
    assert_eq!(init.code, Some(0), "pool init: {init:?}");
    let serve = SidecarBuilder::new("pool serve")
        .name("pool serve")
        .flag("--pool", "gpus")
        .flag("--redis-url", redis.url())
        .wrap(&["prlimit", "--nofile=1024:1024", "--"])
        .env(
            "SNOWLEASE_HTTP_HEADER_TIMEOUT",
            format!("{}s", HEADER_TIMEOUT.as_secs()),
        )
        .spawn();
    assert!(
        poll_until(secs(10), || serve.readyz() == 200),
        "pool serve ready"
    );

    let mut conns = flood(serve.http_addr(), FLOOD);
    assert_eq!(conns.len(), FLOOD, "the flood must be established");
    let flooded = Instant::now();
    let agent = ureq::AgentBuilder::new().timeout(secs(2)).build();
    let url = |path: &str| format!("http://{}{path}", serve.http_addr());
    let acquired = poll_some(secs(5), || {
        agent
            .post(&url("/pools/gpus/leases"))
            .send_json(serde_json::json!({"ttl_ms": 60_000}))
            .ok()
            .filter(|r| r.status() == 201)
    });
    assert!(acquired.is_some(), "acquire under the flood");
    let status = poll_some(secs(5), || agent.get(&url("/pools/gpus")).call().ok());
    assert_eq!(
        status.map(|r| r.status()),
        Some(200),
        "status under the flood"
    );
    assert!(
        poll_until(secs(5), || serve.readyz() == 200),
        "/readyz under the flood"
    );
    assert!(
        serve.metrics().contains("snowlease_build_info"),
        "/metrics under the flood"
    );
    assert!(
        flooded.elapsed() < HEADER_TIMEOUT,
        "the checks must run while the flood is held (took {:?})",
        flooded.elapsed()
    );
    assert!(
        poll_until(HEADER_TIMEOUT + secs(15), || count_closed(&mut conns)
            == FLOOD),
        "{} of {FLOOD} idle connections still open after the flood",
        FLOOD - count_closed(&mut conns)
    );
}

/// `--http-header-timeout 1s`: a connection that sends nothing, one that sends half a header,
/// and one kept alive after a response are all closed about 1 s later; one that keeps asking
/// is served throughout.
#[test]
fn connections_without_a_complete_header_are_closed() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "slow")
        .env("SNOWLEASE_HTTP_HEADER_TIMEOUT", "1s")
        .spawn();
    sidecar.wait_for_lease(secs(15));
    let addr = sidecar.http_addr();
    let mut silent = TcpStream::connect(addr).unwrap();
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET /id HTTP/1.1\r\nHost: x\r\n").unwrap();
    let mut kept = TcpStream::connect(addr).unwrap();
    kept.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    kept.set_read_timeout(Some(secs(5))).unwrap();
    let mut reply = [0u8; 256];
    let n = kept.read(&mut reply).unwrap();
    assert!(
        reply[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&reply[..n])
    );
    let opened = Instant::now();
    for conn in [&mut silent, &mut half, &mut kept] {
        conn.set_nonblocking(true).unwrap();
    }
    let mut conns = [silent, half, kept];
    assert!(
        poll_until(secs(10), || count_closed(&mut conns) == 3),
        "{} of 3 connections still open after {:?}",
        3 - count_closed(&mut conns),
        opened.elapsed()
    );
    assert!(
        opened.elapsed() >= ms(500),
        "closed by the header timeout, not at once ({:?})",
        opened.elapsed()
    );
    assert_eq!(sidecar.get_id().0, 200, "new requests are still served");
}

/// `pool serve --http-header-timeout 1s`: a request whose body trickles is answered 408 and
/// closed about 1 s later (it does not hold its place until the client gives up); a body over
/// 16 KiB is answered 413.
#[test]
fn pool_serve_bounds_request_bodies_in_time_and_size() {
    let redis = RedisServer::start();
    let serve = SidecarBuilder::new("pool serve")
        .name("pool serve")
        .flag("--pool", "gpus")
        .flag("--redis-url", redis.url())
        .env("SNOWLEASE_HTTP_HEADER_TIMEOUT", "1s")
        .spawn();
    let addr = serve.http_addr();
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(
        b"POST /pools/gpus/leases HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"ttl",
    )
    .unwrap();
    let sent = Instant::now();
    slow.set_read_timeout(Some(secs(10))).unwrap();
    let mut reply = Vec::new();
    let _ = slow.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.starts_with("HTTP/1.1 408"),
        "a trickling body is answered 408 and closed within 10 s: {reply:?} after {:?}",
        sent.elapsed()
    );
    assert!(
        sent.elapsed() >= ms(500),
        "not at once: {:?}",
        sent.elapsed()
    );

    let big = format!(
        "{{\"ttl_ms\":1000,\"request_id\":\"{}\"}}",
        "x".repeat(17 * 1024)
    );
    let status = match ureq::post(&format!("http://{addr}/pools/gpus/leases"))
        .timeout(secs(10))
        .send_string(&big)
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("oversized body: {e}"),
    };
    assert_eq!(status, 413, "a body over 16 KiB");
}

/// The soft open-file limit is raised to the hard one at start (worker: /proc/<pid>/limits),
/// and the command under `lock` gets the soft limit snowlease was started with.
#[test]
fn soft_open_file_limit_is_raised_and_children_get_the_original() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "limits")
        .wrap(&["prlimit", "--nofile=1024:4096", "--"])
        .spawn();
    sidecar.wait_for_lease(secs(15));
    let limits =
        std::fs::read_to_string(format!("/proc/{}/limits", sidecar.spawned_pid())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect::<Vec<_>>();
    assert_eq!(open_files, ["4096", "4096"], "worker's soft limit raised");

    let mut cmd = std::process::Command::new("prlimit");
    cmd.args(["--nofile=1024:4096", "--", BIN, "lock", "--name", "limits"])
        .args(["--redis-url", &redis.url(), "--log-format", "json"])
        .args(["--", "sh", "-c", "ulimit -Sn; ulimit -Hn"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    let run = run_command(cmd, secs(30));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(
        run.stdout.split_whitespace().collect::<Vec<_>>(),
        ["1024", "4096"],
        "the command under lock gets the original soft limit: {run:?}"
    );
    assert!(
        run.stderr.contains("open-file soft limit raised"),
        "lock logs the raise: {}",
        run.stderr
    );
}
