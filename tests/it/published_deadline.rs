//! The deadline the sidecar publishes in its state file for `exec` and `id`:
//! it ends the margin before Redis can expire the key, and `exec` and `id` judge it on
//! the boot clock, so a wall-clock step (NTP) of the app container moves nothing. The wall
//! clock of `exec` or `id` is stepped with libfaketime (boot and monotonic clocks left alone,
//! as an NTP step leaves them).

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use snowlease::boot_clock::BootInstant;

use crate::clock_skew::set_offset;
use crate::exec::{APP as SLEEPING_APP, app_pid, exec_app, wait_app_saw};
use crate::harness::*;

const APP: &str = "stepped";

/// The margin of the harness' TTL of 2 s: 1% of the TTL, at least 100 ms (docs/worker.md,
/// "Validity").
const MARGIN: Duration = Duration::from_millis(100);

/// `exec` of [`SLEEPING_APP`] (poll 100 ms) in `pod` whose wall clock is offset by what
/// `stamp` says.
fn stepped_exec(pod: &PodDir, stamp: &Path) -> SidecarBuilder {
    exec_app(pod, "app", &[], SLEEPING_APP)
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", stamp)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
}

/// `snowlease id --file <pod's ID file>` with its wall clock offset by `offset`.
fn stepped_id(pod: &PodDir, stamp: &Path, offset: &str) -> Run {
    set_offset(stamp, offset);
    let file = pod.worker_id_file();
    let lib = libfaketime();
    let env = [
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("FAKETIME_TIMESTAMP_FILE", stamp.to_str().unwrap()),
        ("FAKETIME_NO_CACHE", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    run_snowlease(&["id", "--file", file.to_str().unwrap()], &env, secs(10))
}

/// A worker of [`APP`] that may hold only ID 0.
fn worker(redis: &RedisServer, name: &str, pod: &PodDir) -> Sidecar {
    Sidecar::worker(redis, APP)
        .name(name)
        .pod(pod)
        .flag("--max-worker-id", "0")
        .spawn()
}

/// True while `pid` runs: a zombie (killed, not yet reaped) no longer does.
fn runs(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state letter follows the command name in parentheses.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X']))
    })
}

/// Wall-clock time of `event` in Unix ms, as the process that logged it saw it.
fn logged_unix_ms(event: &serde_json::Value) -> u64 {
    let text = event["timestamp"].as_str().expect("timestamp");
    let at = humantime::parse_rfc3339(text).expect("RFC 3339 timestamp");
    at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A wall clock stepped back: sidecar A holds ID 0 and freezes (SIGSTOP); the wall
/// clock of A's `exec` steps back 30 s; sidecar B in another pod claims ID 0 once A's key
/// expires. A's app must be gone before B publishes ID 0: `exec` judges the deadline on the
/// boot clock, which the step does not move.
#[test]
fn exec_clock_stepped_back_still_stops_the_app_before_another_pod_publishes() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let stamp = pod.path().join("faketime");
    set_offset(&stamp, "+0");
    let a = worker(&redis, "a", &pod);
    assert_eq!(a.wait_for_lease(secs(10)).worker_id, 0);
    let mut app = stepped_exec(&pod, &stamp).spawn();
    assert_eq!(wait_app_saw(&pod, "app", secs(10)), Some(0));
    let pid = app_pid(&pod, "app");

    a.pause();
    set_offset(&stamp, "-30s");
    let b = worker(&redis, "b", &PodDir::new());
    let mut gone_at = None;
    // The app is checked after each answer of B: running after a 200 is the overlap.
    let overlap = poll_some(secs(15), || {
        let taken = b.id();
        let running = runs(pid);
        if !running && gone_at.is_none() {
            gone_at = Some(Instant::now());
        }
        taken.map(|taken| (taken, running))
    });
    let published_at = Instant::now();
    a.resume();
    let (taken, running) = overlap.expect("B claims ID 0 once A's key expired");
    assert_eq!(taken.worker_id, 0);
    assert!(
        !running,
        "the app under A's exec still runs with WORKER_ID=0 after B published ID 0: {:?}",
        app.log_lines()
    );
    let gone_at = gone_at.expect("seen gone before B's answer");
    eprintln!(
        "app gone {} ms before B published ID 0",
        published_at.duration_since(gone_at).as_millis()
    );
    let status = app.wait_exit(secs(5)).expect("exec exits");
    assert_eq!(status.code(), Some(75));
    // The step reached exec: it logged the stop on a clock 30 s behind.
    let stop = app
        .events_with("worker ID no longer published")
        .pop()
        .expect("stop logged");
    let behind = unix_ms().saturating_sub(logged_unix_ms(&stop));
    assert!(behind >= 25_000, "exec's clock was only {behind} ms behind");
}

/// A wall-clock step of +30 s under a healthy sidecar does not stop the app: the state file's
/// wall-clock deadline looks 28 s past, its boot-clock one is renewed as before. Once the
/// sidecar stops, `exec` stops the app as usual.
#[test]
fn exec_clock_stepped_ahead_keeps_a_healthy_app_running() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let stamp = pod.path().join("faketime");
    set_offset(&stamp, "+0");
    let mut sidecar = worker(&redis, "sidecar", &pod);
    sidecar.wait_for_lease(secs(10));
    let mut app = stepped_exec(&pod, &stamp).spawn();
    assert_eq!(wait_app_saw(&pod, "app", secs(10)), Some(0));
    let pid = app_pid(&pod, "app");

    set_offset(&stamp, "+30s");
    // Longer than the TTL (2 s): several renewals and re-reads (every 100 ms).
    for _ in 0..30 {
        assert!(
            runs(pid) && app.is_running(),
            "a forward step stopped a healthy app: {:?}",
            app.log_lines()
        );
        std::thread::sleep(ms(100));
    }

    sidecar.signal(Signal::SIGTERM);
    sidecar.wait_exit(secs(5)).expect("sidecar exits");
    let status = app.wait_exit(secs(5)).expect("exec stops the app");
    assert_eq!(status.code(), Some(75));
    // The sidecar stopped in order: exec says it released the ID.
    let stop = app
        .events_with("the sidecar released the worker ID")
        .pop()
        .expect("stop logged");
    let ahead = logged_unix_ms(&stop).saturating_sub(unix_ms());
    assert!(ahead >= 25_000, "exec's clock was only {ahead} ms ahead");
}

/// `snowlease id` answers by the boot-clock deadline: with its clock 30 s ahead it prints the ID
/// of a healthy sidecar; with its clock 30 s behind it refuses (exit 3, stale) the ID of a frozen
/// sidecar whose key Redis has let expire.
#[test]
fn id_under_a_stepped_clock_answers_by_the_boot_deadline() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let stamp = pod.path().join("faketime");
    let sidecar = worker(&redis, "sidecar", &pod);
    let lease = sidecar.wait_for_lease(secs(10));
    assert!(poll_until(secs(5), || sidecar.read_state().is_some()));

    let run = stepped_id(&pod, &stamp, "+30s");
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stdout.trim(), "0");

    sidecar.pause();
    let key = worker_key(APP, lease.worker_id);
    assert!(
        poll_until(secs(5), || redis.get(&key).is_none()),
        "the frozen sidecar's key expires"
    );
    let run = stepped_id(&pod, &stamp, "-30s");
    sidecar.resume();
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(run.stderr.contains("stale"), "{run:?}");
}

/// One sample of the published deadlines against the key's expiry, taken while the sidecar is
/// frozen (so no renewal falls between the reads): (key's PEXPIRETIME - `valid_until_ms`,
/// PEXPIRETIME - `valid_until_boot_ms` put on the wall clock), in ms.
fn margins(redis: &RedisServer, sidecar: &Sidecar, key: &str) -> (i64, f64) {
    sidecar.pause();
    let state = sidecar.read_state().expect("state file");
    let expires: i64 = redis.query(redis::cmd("PEXPIRETIME").arg(key));
    let (boot_now, wall_now) = (BootInstant::now(), SystemTime::now());
    sidecar.resume();
    let wall_ms = state["valid_until_ms"].as_u64().expect("valid_until_ms");
    let boot_ms = state["valid_until_boot_ms"]
        .as_u64()
        .expect("valid_until_boot_ms");
    let boot_left = BootInstant::from_millis(boot_ms).saturating_duration_since(boot_now);
    let boot_on_wall = (wall_now + boot_left).duration_since(UNIX_EPOCH).unwrap();
    (
        expires - wall_ms as i64,
        expires as f64 - boot_on_wall.as_secs_f64() * 1000.0,
    )
}

/// Both published deadlines (wall and boot clock) end at least the margin
/// before Redis can expire the key (its `PEXPIRETIME`), at several renewals. A deadline written
/// as send + TTL fails this.
#[test]
fn published_deadlines_end_the_margin_before_the_key_expires() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let sidecar = worker(&redis, "sidecar", &PodDir::new());
    let lease = sidecar.wait_for_lease(secs(10));
    let key = worker_key(APP, lease.worker_id);
    let margin = MARGIN.as_millis() as i64;
    let mut last = None;
    for _ in 0..5 {
        // A new renewal's record each time.
        let state = poll_some(secs(5), || {
            let state = sidecar.read_state()?;
            (Some(&state) != last.as_ref()).then_some(state)
        })
        .expect("the sidecar renews");
        last = Some(state);
        let (wall, boot) = margins(&redis, &sidecar, &key);
        assert!(wall >= margin, "PEXPIRETIME - valid_until_ms = {wall} ms");
        // The boot deadline is put on the wall clock by this process: allow 2 ms for that.
        assert!(
            boot >= margin as f64 - 2.0,
            "PEXPIRETIME - valid_until_boot_ms (on the wall clock) = {boot:.1} ms"
        );
    }
}

/// A sidecar SIGKILLed and restarted in the same pod after the node's wall clock stepped 30 s
/// ahead (the restarted one runs under libfaketime; `--max-clock-skew 60s` lets it publish):
/// its record's wall-clock deadline looks past, its boot-clock one does not, so the ID file
/// stays while the lease is re-adopted and the app under `exec` keeps running.
#[test]
fn restart_after_a_clock_step_ahead_readopts_without_dropping_the_id_file() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let stamp = pod.path().join("faketime");
    set_offset(&stamp, "+30s");
    let mut first = Sidecar::worker(&redis, APP)
        .name("first")
        .pod(&pod)
        .flag("--max-worker-id", "0")
        .flag("--ttl", "10s")
        .spawn();
    assert_eq!(first.wait_for_lease(secs(10)).worker_id, 0);
    let mut app = exec_app(&pod, "app", &[("--poll", "20ms")], SLEEPING_APP).spawn();
    assert_eq!(wait_app_saw(&pod, "app", secs(10)), Some(0));

    first.signal(Signal::SIGKILL);
    first.wait_exit(secs(5)).expect("killed");
    let second = Sidecar::worker(&redis, APP)
        .name("second")
        .pod(&pod)
        .flag("--max-worker-id", "0")
        // As the first one: long enough that a restart on a loaded machine
        // comes before the recorded deadline.
        .flag("--ttl", "10s")
        .flag("--max-clock-skew", "60s")
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", &stamp)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .spawn();
    // The ID file never goes: sampled until the restarted sidecar publishes.
    let again = poll_some(secs(10), || {
        assert!(
            pod.worker_id_file().exists(),
            "the ID file went while the lease was re-adopted: {:?}",
            second.log_lines()
        );
        second.id()
    })
    .expect("the restarted sidecar publishes");
    assert_eq!(again.worker_id, 0);
    assert!(
        second.count_log("re-adopted") > 0,
        "{:?}",
        second.log_lines()
    );
    assert_eq!(
        app.wait_exit(secs(1)),
        None,
        "exec stopped the app though the ID stayed: {:?}",
        app.events_with("stopping").last()
    );
}
