//! Faults that could publish one worker ID twice, or stop the sidecar wrongly: a shared output
//! file, data loss under holders, a slow or out-of-memory Redis at start, TLS to a plain port,
//! re-adoption from a stale state file, `exec` draining past the deadline. Each began as a
//! failing reproduction of a defect found by trying to break snowlease. Two stay ignored: limits
//! docs/worker.md states (mixed TTLs, partial data loss); run them with `-- --include-ignored`.

use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::kill;
use nix::unistd::Pid;

use crate::harness::*;

/// True while `pid` exists and is not a zombie.
fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next())
        })
        .is_some_and(|state| state != 'Z')
}

/// SIGKILLs a process on drop (an app left behind by a killed `exec`).
struct KillOnDrop(Option<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Polls `/id` of both sidecars for `how_long`; returns the first ID that `b` answered 200 with
/// while `a` answered 200 with the same ID both just before and just after (so `a` published it
/// all along).
pub(crate) fn both_published(a: &Sidecar, b: &Sidecar, how_long: Duration) -> Option<u32> {
    let end = Instant::now() + how_long;
    while Instant::now() < end {
        let before = a.id().map(|r| r.worker_id);
        let middle = b.id().map(|r| r.worker_id);
        let after = a.id().map(|r| r.worker_id);
        if middle.is_some() && before == middle && after == middle {
            return middle;
        }
        thread::sleep(ms(20));
    }
    None
}

/// Two sidecars given the same `--output-file` (a shared volume, a copy-pasted manifest, a
/// compose file with `replicas: 2`): the second would read the first one's live state file and
/// "re-adopt" its lease with the first one's owner string, so both would publish the same ID.
/// Expected: the second finds `<output-file>.lock` held, exits 1 saying so and never publishes
/// (nor touches the files); the first keeps its key and its ID.
#[test]
fn shared_output_file_never_publishes_one_id_twice() {
    let redis = RedisServer::start();
    let pod = PodDir::new();
    let first = Sidecar::worker(&redis, "orders")
        .name("first")
        .pod(&pod)
        .flag("--max-worker-id", "3")
        .spawn();
    let lease = first.wait_for_lease(secs(10));
    let mut second = Sidecar::worker(&redis, "orders")
        .name("second")
        .pod(&pod)
        .flag("--max-worker-id", "3")
        .spawn();
    let status = second
        .wait_exit(secs(5))
        .expect("the second exits at start");
    assert_eq!(status.code(), Some(1));
    let log = second.log_lines().join("\n");
    assert!(
        log.contains("another snowlease worker is using --output-file"),
        "{log}"
    );
    assert_eq!(second.count_log("lease acquired"), 0, "{log}");
    let key = worker_key("orders", lease.worker_id);
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));
    for other in (0..=3).filter(|&id| id != lease.worker_id) {
        assert!(
            !redis.exists(&worker_key("orders", other)),
            "ID {other} taken"
        );
    }
    assert_eq!(first.id().map(|r| r.worker_id), Some(lease.worker_id));
    assert_eq!(
        first.read_output_file(),
        Some(format!("{}\n", lease.worker_id)),
        "the first one's ID file stays"
    );
}

/// `rediss://` against a plain (non-TLS) port: no panic (rustls has its crypto provider), a TLS
/// error naming the server; the worker exits 3 at `--claim-timeout`, `status` and `pool` exit 1.
#[test]
fn rediss_url_does_not_panic() {
    let redis = RedisServer::start();
    let pod = PodDir::new();
    let url = format!("rediss://127.0.0.1:{}", redis.port());
    let out = pod.worker_id_file().to_string_lossy().into_owned();
    let worker = [
        "worker",
        "--app",
        "orders",
        "--redis-url",
        &url,
        "--listen",
        "127.0.0.1:0",
        "--output-file",
        &out,
        "--ttl",
        "2s",
        "--renew-interval",
        "500ms",
        "--claim-timeout",
        "1s",
    ];
    let status = ["status", "--app", "orders", "--redis-url", &url];
    let pool = ["pool", "status", "--pool", "proxies", "--redis-url", &url];
    for (args, codes) in [
        (&worker[..], &[3][..]),
        (&status[..], &[1][..]),
        (&pool[..], &[1][..]),
    ] {
        let run = run_snowlease(args, &[], secs(20));
        assert!(!run.stderr.contains("panicked"), "{args:?}: {}", run.stderr);
        assert!(
            run.code.is_some_and(|c| codes.contains(&c)),
            "{args:?}: exit code {:?}: {}",
            run.code,
            run.stderr
        );
        assert!(
            run.stderr.contains(&format!("127.0.0.1:{}", redis.port())),
            "{args:?}: names the server: {}",
            run.stderr
        );
    }
}

/// Redis restarted empty (like FLUSHALL, or a failover to a replica that missed the write) under a
/// holder: a newcomer waits out the claim guard and takes another ID; never two publishers of one.
#[test]
fn redis_data_loss_never_publishes_one_id_twice() {
    let mut redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let worker = |redis: &RedisServer, name: &str| {
        Sidecar::worker(redis, "orders")
            .name(name)
            .flag("--max-worker-id", "3")
            .flag("--ttl", "10s")
            .flag("--renew-interval", "5s")
            .spawn()
    };
    let holder = worker(&redis, "holder");
    let lease = holder.wait_for_lease(secs(10));
    redis.restart();
    let newcomer = worker(&redis, "newcomer");
    // The guard is gone with the data: the newcomer waits one TTL, during
    // which the holder re-creates its key at its next renew.
    let taken = newcomer.wait_for_lease(secs(20));
    assert_ne!(
        taken.worker_id, lease.worker_id,
        "newcomer took the holder's ID"
    );
    let dup = both_published(&holder, &newcomer, secs(2));
    assert_eq!(
        dup, None,
        "holder and newcomer both publish worker ID {dup:?} (holder got {})",
        lease.worker_id
    );
}

/// A loopback TCP proxy to `target` that delays every server-to-client chunk by `delay` (a
/// remote Redis). Threads end when the sockets close; the accept loop ends with `stop`.
fn latency_proxy(target: u16, delay: Duration, stop: Arc<AtomicBool>) -> u16 {
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind proxy");
    listener.set_nonblocking(true).unwrap();
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let Ok((client, _)) = listener.accept() else {
                thread::sleep(ms(5));
                continue;
            };
            client.set_nonblocking(false).unwrap();
            let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                continue;
            };
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = c_read.read(&mut buf) {
                    if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = s_write.shutdown(Shutdown::Write);
            });
            let (mut s_read, mut c_write) = (server, client);
            thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n) = s_read.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    thread::sleep(delay);
                    if c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = c_write.shutdown(Shutdown::Both);
            });
        }
    });
    port
}

/// All 1024 IDs held and Redis 5 ms away: listing the holders after each full claim round must
/// not outlast `--claim-timeout`; exit 3 about at the timeout (1 s here).
#[test]
fn claim_timeout_is_honoured_with_all_1024_ids_held() {
    let redis = RedisServer::start();
    let mut pipe = redis::pipe();
    for id in 0..1024 {
        pipe.cmd("SET")
            .arg(worker_key("orders", id))
            .arg(format!("pod-{}#0000", id % 7))
            .arg("PX")
            .arg(600_000)
            .ignore();
    }
    let _: () = pipe.query(&mut redis.conn()).expect("fill all 1024 IDs");
    let stop = Arc::new(AtomicBool::new(false));
    let proxy = latency_proxy(redis.port(), ms(5), stop.clone());
    let started = Instant::now();
    let mut sidecar = Sidecar::worker_at(&format!("redis://127.0.0.1:{proxy}"), "orders")
        .flag("--max-worker-id", "1023")
        .flag("--ttl", "2s")
        .flag("--renew-interval", "400ms")
        .flag("--claim-timeout", "1s")
        .spawn();
    let status = sidecar.wait_exit(secs(60));
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    assert_eq!(status.and_then(|s| s.code()), Some(3), "exit 3");
    assert!(took < secs(3), "--claim-timeout 1s, exit after {took:?}");
}

/// Redis answering OOM at start (maxmemory reached, noeviction) is passing, not a refusal: the
/// claim is retried with warnings naming OOM, and the lease is taken once memory is available.
#[test]
fn redis_oom_at_start_is_retried() {
    let redis = RedisServer::start();
    let _: () = redis.query(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg("noeviction"),
    );
    let _: () = redis.query(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1"));
    let mut sidecar = Sidecar::worker(&redis, "orders")
        .flag("--claim-timeout", "30s")
        .spawn();
    // Two OOM retry warnings: the claim is retried, and again after its pause.
    let retried = poll_some(secs(10), || {
        let oom: Vec<_> = sidecar
            .events_with("redis unavailable; retrying claim")
            .into_iter()
            .filter(|e| e["error"].as_str().unwrap_or("").contains("OOM"))
            .collect();
        (oom.len() >= 2).then(|| oom[1].clone())
    });
    let running = sidecar.is_running();
    let _: () = redis.query(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0"));
    let retried = retried.unwrap_or_else(|| {
        panic!(
            "no two OOM retry warnings within 10 s; last line: {:?}",
            sidecar.log_lines().last()
        )
    });
    assert_eq!(level(&retried), "WARN", "{retried}");
    assert!(
        running,
        "sidecar exited under OOM: {:?}",
        sidecar.log_lines().last()
    );
    sidecar.wait_for_lease(secs(10));
}

/// `exec` with its default `--grace 10s`: when the lease is not renewed (here the sidecar is
/// frozen past its TTL), another sidecar can publish the ID ~100 ms after the deadline (the
/// margin is 1% of the TTL, at least 100 ms), so an app that drains slowly (here: ignores
/// SIGTERM) must be gone by the deadline: `exec` sends SIGTERM the grace before it (capped at a
/// quarter of the 1.9 s validity here) and SIGKILL at the deadline.
#[test]
fn exec_app_is_gone_before_the_id_is_published_elsewhere() {
    let redis = RedisServer::start();
    let pod = PodDir::new();
    let holder = Sidecar::worker(&redis, "orders")
        .name("holder")
        .pod(&pod)
        .flag("--max-worker-id", "0")
        .spawn();
    holder.wait_for_lease(secs(10));
    let pid_file = pod.path().join("app.pid");
    let script = r#"trap '' TERM; echo $$ > "$PIDFILE"; exec sleep 600"#;
    let _app = SidecarBuilder::new("exec")
        .name("exec")
        .pod(&pod)
        .without("--listen")
        .flag("--file", pod.worker_id_file().to_string_lossy())
        .flag("--poll", "100ms")
        .env("PIDFILE", &pid_file)
        .switch("--")
        .switch("sh")
        .switch("-c")
        .switch(script)
        .spawn();
    let pid: i32 = poll_some(secs(10), || {
        fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .expect("app started");
    let _reaper = KillOnDrop(Some(pid));
    holder.pause();
    let other = Sidecar::worker(&redis, "orders")
        .name("other")
        .flag("--max-worker-id", "0")
        .spawn();
    other.wait_for_lease(secs(10));
    let published = Instant::now();
    let gone = poll_until(ms(300), || !alive(pid));
    assert!(
        gone,
        "the app with the old ID still runs {:?} after another sidecar published it",
        published.elapsed()
    );
}

/// The ID file removed while the lease is held (a tmp cleaner, an operator): it is written again
/// within a few renewals, and `/readyz` stays 200.
#[test]
fn removed_id_file_is_restored_while_held() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    assert!(poll_until(secs(2), || sidecar.output_file().exists()));
    fs::remove_file(sidecar.output_file()).unwrap();
    let back = poll_until(secs(3), || {
        sidecar.read_output_file() == Some(format!("{}\n", lease.worker_id))
    });
    assert_eq!(sidecar.readyz(), 200);
    assert!(back, "ID file not re-created within 3 s (6 renewals)");
}

// ---------------------------------------------------------------------------------------------
// Second breaker round (claim guard, re-adoption, output lock, exec).

/// Sidecars of one app with different `--ttl` (a rolling update that changes the TTL, two
/// manifests): after a Redis data loss the guard is set to now + the TTL of the *first
/// claimant*. A newcomer with a short TTL opens the guard long before a long-TTL holder renews,
/// takes the holder's ID, and both publish it until the holder's next renew.
/// Expected: the guard covers the longest TTL any holder may use (or docs/worker.md forbids mixed
/// TTLs and the sidecar refuses them).
#[test]
#[ignore = "known limit (docs/worker.md, Claim guard): sidecars of one app must share --ttl; a short-TTL newcomer can take a long-TTL holder's ID after a data loss"]
fn mixed_ttl_after_data_loss_never_publishes_one_id_twice() {
    let mut redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let holder = Sidecar::worker(&redis, "orders")
        .name("holder")
        .flag("--max-worker-id", "3")
        .flag("--ttl", "20s")
        .flag("--renew-interval", "10s")
        .spawn();
    let lease = holder.wait_for_lease(secs(10));
    redis.restart();
    let newcomer = Sidecar::worker(&redis, "orders")
        .name("newcomer")
        .flag("--max-worker-id", "3")
        .flag("--ttl", "2s")
        .flag("--renew-interval", "500ms")
        .spawn();
    let taken = newcomer.wait_for_lease(secs(20));
    let dup = both_published(&holder, &newcomer, secs(2));
    assert!(
        taken.worker_id != lease.worker_id && dup.is_none(),
        "newcomer took ID {} while the holder still publishes {} (dup {dup:?})",
        taken.worker_id,
        lease.worker_id
    );
}

/// A claim guard far in the future, which no claim sets (Redis' clock stepped back, a typo): it is
/// bounded to one TTL, so a sidecar gets a free ID within a few TTLs, not after an hour.
#[test]
fn guard_far_in_the_future_is_bounded() {
    let redis = RedisServer::start();
    let guard = format!("{PREFIX}orders:guard");
    redis.set_stamped(&guard, unix_ms() + 3_600_000);
    let mut sidecar = Sidecar::worker(&redis, "orders")
        .flag("--max-worker-id", "3")
        .flag("--claim-timeout", "8s")
        .spawn();
    let got = poll_until(secs(10), || sidecar.id().is_some());
    let status = sidecar.wait_exit(secs(1));
    assert!(
        got,
        "no ID within 8 s (4 TTLs) with all IDs free; exit {status:?}; log: {:?}",
        sidecar.events_with("paused").last()
    );
}

/// The first duplicate among the `/id` answers of `sidecars`, sampled every 20 ms for
/// `how_long`: (ID, names of the two publishers).
fn any_duplicate(sidecars: &[&Sidecar], how_long: Duration) -> Option<(u32, String, String)> {
    let end = Instant::now() + how_long;
    while Instant::now() < end {
        let mut seen: Vec<(u32, &str)> = Vec::new();
        for s in sidecars {
            if let Some(r) = s.id() {
                if let Some((_, other)) = seen.iter().find(|(id, _)| *id == r.worker_id) {
                    // Re-check the earlier one: it still publishes the ID now.
                    let earlier = sidecars.iter().find(|x| x.name() == *other).unwrap();
                    if earlier.id().map(|e| e.worker_id) == Some(r.worker_id) {
                        return Some((r.worker_id, other.to_string(), s.name().to_string()));
                    }
                }
                seen.push((r.worker_id, s.name()));
            }
        }
        thread::sleep(ms(20));
    }
    None
}

/// Many sidecars on an empty Redis, then Redis restarted empty while holders run and
/// newcomers start, then FLUSHALL while newcomers wait on the guard: never two publishers of
/// one ID.
#[test]
fn guard_races_with_many_sidecars_never_publish_one_id_twice() {
    let mut redis = RedisServer::start();
    let spawn = |redis: &RedisServer, name: String| {
        Sidecar::worker(redis, "orders")
            .name(name)
            .flag("--max-worker-id", "9")
            .spawn()
    };
    let mut all: Vec<Sidecar> = (0..5).map(|i| spawn(&redis, format!("h{i}"))).collect();
    for s in &all {
        s.wait_for_lease(secs(10));
    }
    redis.restart();
    all.extend((0..3).map(|i| spawn(&redis, format!("n{i}"))));
    let refs: Vec<&Sidecar> = all.iter().collect();
    assert_eq!(any_duplicate(&refs, secs(1)), None);
    let _: () = redis.query(&mut redis::cmd("FLUSHALL"));
    assert_eq!(any_duplicate(&refs, secs(5)), None);
    for s in &all {
        s.wait_for_lease(secs(5));
    }
    assert_eq!(any_duplicate(&refs, secs(1)), None);
}

/// Restarted in the same pod, cut off from Redis, with a state file whose deadline lies beyond one
/// TTL (clock stepped back, edited file): the old ID file goes within one TTL, before another pod
/// can claim and publish that ID.
#[test]
fn readopting_keeps_the_old_id_file_at_most_one_ttl() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let pod = PodDir::new();
    let mut first = Sidecar::worker(&redis, "orders")
        .name("first")
        .pod(&pod)
        .flag("--max-worker-id", "0")
        .spawn();
    let lease = first.wait_for_lease(secs(10));
    // `/id` answers before the publisher has written the files.
    let state_path = format!("{}.state.json", pod.worker_id_file().display());
    assert!(poll_until(secs(5), || Path::new(&state_path).exists()));
    first.signal(Signal::SIGKILL);
    first.wait_exit(secs(5)).expect("killed");
    let state_file = fs::read_to_string(&state_path).expect("state file left behind");
    let mut state: serde_json::Value = serde_json::from_str(&state_file).unwrap();
    // Both deadlines: the wall clock's (older files) and the boot clock's.
    for field in ["valid_until_ms", "valid_until_boot_ms"] {
        let until = state[field].as_u64().unwrap() + 60_000;
        state[field] = until.into();
    }
    fs::write(
        format!("{}.state.json", pod.worker_id_file().display()),
        serde_json::to_vec(&state).unwrap(),
    )
    .unwrap();
    let dead = format!("redis://127.0.0.1:{}", free_port());
    let _restarted = Sidecar::worker_at(&dead, "orders")
        .name("restarted")
        .pod(&pod)
        .flag("--max-worker-id", "0")
        .spawn();
    let other = Sidecar::worker(&redis, "orders")
        .name("other")
        .flag("--max-worker-id", "0")
        .spawn();
    let taken = other.wait_for_lease(secs(10));
    assert_eq!(taken.worker_id, lease.worker_id);
    let file = fs::read_to_string(pod.worker_id_file()).ok();
    assert_eq!(
        file, None,
        "the restarted sidecar still publishes ID file {file:?} while another pod holds ID {}",
        taken.worker_id
    );
}

/// `exec` while its sidecar is SIGKILLed and restarted in the same pod (same ID re-adopted):
/// the app must keep running, with `--file` and with `--url` (fixed port).
#[test]
fn exec_survives_a_sidecar_restart_that_keeps_the_id() {
    for use_url in [false, true] {
        let redis = RedisServer::start();
        redis.open_claim_guard("orders");
        let pod = PodDir::new();
        let port = free_port();
        let worker = |name: &str| {
            Sidecar::worker(&redis, "orders")
                .name(name)
                .pod(&pod)
                .flag("--listen", format!("127.0.0.1:{port}"))
                .flag("--max-worker-id", "3")
                .spawn()
        };
        let mut first = worker("first");
        let lease = first.wait_for_lease(secs(10));
        let source = if use_url {
            ("--url", format!("http://127.0.0.1:{port}"))
        } else {
            (
                "--file",
                pod.worker_id_file().to_string_lossy().into_owned(),
            )
        };
        let mut exec = SidecarBuilder::new("exec")
            .name("exec")
            .pod(&pod)
            .without("--listen")
            .flag(source.0, source.1.clone())
            .flag("--poll", "20ms")
            .switch("--")
            .switch("sleep")
            .switch("600")
            .spawn();
        assert!(exec.wait_for_log("command started", secs(5)));
        first.signal(Signal::SIGKILL);
        first.wait_exit(secs(5)).expect("killed");
        thread::sleep(ms(200));
        let second = worker("second");
        let again = second.wait_for_lease(secs(10));
        assert_eq!(again.worker_id, lease.worker_id, "same ID re-adopted");
        let exited = exec.wait_exit(secs(2));
        assert_eq!(
            exited,
            None,
            "exec ({}) stopped the app though the ID stayed: {:?}",
            source.0,
            exec.events_with("stopping").last()
        );
    }
}
