//! Worker mode under real Redis faults on a standalone server: restarted empty, paused past
//! the TTL, down at SIGTERM; a blocked stderr; `--on-loss exit`. The sidecar faults that run
//! on every topology (SIGKILL, SIGSTOP, overwritten key, SCRIPT FLUSH) are in `scenarios`.

use std::sync::atomic::AtomicBool;
use std::thread;
use std::time::Instant;

use crate::harness::*;
use crate::worker::assert_published;

/// Redis restarted empty on the same port while a lease is held: the sidecar re-creates its own
/// key with the same owner and keeps publishing the same ID without a loss.
#[test]
fn redis_restart_empty_recreates_own_key() {
    let mut redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "3s")
        .spawn();
    let lease = assert_published(&redis, &sidecar, "orders");
    let key = worker_key("orders", lease.worker_id);

    let stop = AtomicBool::new(false);
    let samples = thread::scope(|scope| {
        let sampler = scope.spawn(|| sample_ids(0, &sidecar, &stop));
        let guard = StopOnDrop(&stop);
        redis.restart();
        assert!(
            poll_until(secs(5), || redis.get(&key).as_deref()
                == Some(lease.owner.as_str())),
            "the sidecar re-creates its key with its own owner string"
        );
        drop(guard);
        sampler.join().unwrap()
    });
    assert!(
        samples.iter().all(|s| s.status != 503),
        "the lease stays published through a short Redis restart: {:?}",
        samples.iter().find(|s| s.status == 503)
    );
    let warning = sidecar
        .wait_for_event("re-created", secs(1))
        .expect("re-creation is logged");
    assert_eq!(level(&warning), "WARN");
    assert_eq!(sidecar.count_log("lease lost"), 0);
    assert!(
        sidecar
            .metric("snowlease_reacquisitions_total")
            .unwrap_or(0.0)
            >= 1.0
    );
    let pttl = redis.pttl(&key);
    assert!(pttl > 0 && pttl <= 3000, "re-created with a PX TTL: {pttl}");
    let again = assert_published(&redis, &sidecar, "orders");
    assert_eq!(
        (again.worker_id, again.owner),
        (lease.worker_id, lease.owner)
    );
}

/// With `--on-loss exit`, an overwritten key makes the sidecar unpublish and exit 4, leaving
/// the foreign key alone.
#[test]
fn overwritten_key_with_on_loss_exit_exits_4() {
    let redis = RedisServer::start();
    let mut sidecar = Sidecar::worker(&redis, "orders")
        .flag("--on-loss", "exit")
        .spawn();
    let lease = assert_published(&redis, &sidecar, "orders");
    let key = worker_key("orders", lease.worker_id);
    let _: () = redis.query(redis::cmd("SET").arg(&key).arg("other").arg("KEEPTTL"));
    let status = sidecar.wait_exit(secs(3)).expect("exit after the loss");
    assert_eq!(status.code(), Some(4));
    assert!(!sidecar.output_file().exists());
    assert_eq!(redis.get(&key).as_deref(), Some("other"));
    assert!(sidecar.count_log("lease lost") > 0);
}

/// Redis paused longer than the TTL: the sidecar unpublishes by its local validity deadline
/// (before Redis could let anyone else in), then claims again once Redis answers.
#[test]
fn redis_paused_past_ttl_unpublishes_by_deadline_then_reclaims() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--max-worker-id", "0")
        .spawn();
    assert_published(&redis, &sidecar, "orders");
    assert!(poll_until(secs(5), || sidecar
        .metric("snowlease_renewals_total{outcome=\"renewed\"}")
        .unwrap_or(0.0)
        >= 1.0));

    redis.pause();
    let paused = Instant::now();
    // The last renew was sent before the pause, so the deadline is at most TTL (2 s) minus the
    // margin (>= 100 ms) after it; allow one poll and one HTTP round for observing it.
    let unpublished = poll_until(secs(3), || sidecar.get_id().0 == 503);
    let after = paused.elapsed();
    assert!(unpublished, "unpublished while Redis is paused");
    assert!(
        after < ms(2000),
        "unpublished {after:?} after the pause: later than the TTL"
    );
    // HTTP judges the deadline at request time, the file publisher on its own timer: both by
    // the deadline, which lies at least the margin (100 ms) before Redis' expiry.
    assert!(poll_until(ms(100), || !sidecar.output_file().exists()));
    assert!(sidecar.wait_for_log("lease lost", secs(1)));
    // Hold the fault past the TTL, so Redis too lets the key expire.
    thread::sleep(secs(3).saturating_sub(paused.elapsed()));
    redis.resume();
    let lease = sidecar.wait_for_lease(secs(10));
    assert_eq!(lease.worker_id, 0);
    assert_published(&redis, &sidecar, "orders");
}

/// SIGTERM while Redis is down (paused): exit 0 is still bounded, the ID file is removed, the
/// state file stays marked `release_unconfirmed` (the key may still be ours: a restart
/// re-adopts it), and the key is gone once Redis is back and the TTL has passed.
#[test]
fn sigterm_with_redis_down_exits_bounded() {
    let redis = RedisServer::start();
    let mut sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "3s")
        .flag("--renew-interval", "1s")
        .spawn();
    let lease = assert_published(&redis, &sidecar, "orders");
    let key = worker_key("orders", lease.worker_id);

    redis.pause();
    let paused = Instant::now();
    sidecar.signal(Signal::SIGTERM);
    let t = Instant::now();
    let status = sidecar
        .wait_exit(secs(3))
        .expect("exit within 3 s with Redis down");
    assert_eq!(status.code(), Some(0), "exit after {:?}", t.elapsed());
    assert!(!sidecar.output_file().exists());
    let state = sidecar
        .read_state()
        .expect("the unreleased lease stays recorded");
    assert_eq!(state["release_unconfirmed"], true, "{state}");
    assert_eq!(state["owner"], lease.owner.as_str());
    redis.resume();
    assert!(
        poll_until(secs(3) + ms(500), || !redis.exists(&key)),
        "key gone within the TTL ({:?} after the pause)",
        paused.elapsed()
    );
}

/// stderr on a 4 KiB pipe that nobody reads (a stuck log shipper), with trace logging: the lease
/// is taken, `/livez` keeps answering, and SIGTERM still releases the key and ends the process
/// within 3 s; logging never blocks the lease logic or the shutdown.
#[test]
fn blocked_stderr_never_blocks_the_lease_or_the_shutdown() {
    use std::os::fd::AsRawFd;
    use std::process::{Command, Stdio};
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let pod = PodDir::new();
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    nix::fcntl::fcntl(
        read_end.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096),
    )
    .unwrap();
    let port = free_port();
    let mut child = Command::new(BIN)
        .args(["worker", "--app", "orders", "--redis-url", &redis.url()])
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--max-worker-id",
            "0",
        ])
        .args(["--ttl", "2s", "--renew-interval", "200ms"])
        .arg("--output-file")
        .arg(pod.worker_id_file())
        .env_clear()
        .env("SNOWLEASE_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(write_end))
        .spawn()
        .unwrap();
    let key = worker_key("orders", 0);
    assert!(
        poll_until(secs(10), || redis.get(&key).is_some()),
        "lease taken"
    );
    // Many renewals and requests later the pipe is long full.
    for _ in 0..20 {
        let livez = ureq::get(&format!("http://127.0.0.1:{port}/livez"))
            .timeout(HTTP_TIMEOUT)
            .call()
            .map(|r| r.status());
        assert_eq!(livez.ok(), Some(200), "/livez answers with stderr blocked");
        std::thread::sleep(ms(50));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
    let stopped = poll_some(secs(3), || child.try_wait().unwrap());
    let _ = child.kill();
    drop(read_end);
    assert!(stopped.is_some(), "still running 3 s after SIGTERM");
    assert_eq!(redis.get(&key), None, "the key was released");
}
