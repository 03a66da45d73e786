//! Worker mode under real faults: SIGKILL, SIGSTOP, Redis paused / restarted empty / script
//! cache flushed, the lease key overwritten by someone else.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::worker::assert_published;

/// One `GET /id` answer of sidecar number `who`.
#[derive(Debug, Clone, Copy)]
struct Sample {
    who: usize,
    sent: Instant,
    recv: Instant,
    status: u16,
    worker_id: Option<u32>,
}

/// Sets the flag on drop, so sampler threads stop even when the test body panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One `GET /id` of `sidecar` (number `who`) with `timeout`.
fn sample_id(who: usize, sidecar: &Sidecar, timeout: Duration) -> Sample {
    let sent = Instant::now();
    let (status, body) = sidecar.http_get_within("/id", None, timeout);
    let recv = Instant::now();
    let worker_id = (status == 200).then(|| {
        serde_json::from_str::<IdReply>(&body)
            .unwrap_or_else(|e| panic!("bad /id body {body:?}: {e}"))
            .worker_id
    });
    Sample {
        who,
        sent,
        recv,
        status,
        worker_id,
    }
}

/// Samples `GET /id` of `sidecar` every 20 ms until `stop` (or 60 s).
fn sample_ids(who: usize, sidecar: &Sidecar, stop: &AtomicBool) -> Vec<Sample> {
    let mut samples = Vec::new();
    let end = Instant::now() + secs(60);
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        let sample = sample_id(who, sidecar, HTTP_TIMEOUT);
        let sent = sample.sent;
        samples.push(sample);
        if let Some(rest) = ms(20).checked_sub(sent.elapsed()) {
            thread::sleep(rest);
        }
    }
    samples
}

/// No two sidecars answered 200 with the same ID in overlapping request intervals.
fn assert_never_published_together(samples: &[Sample]) {
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.status == 200).collect();
    for a in &ok {
        for b in ok
            .iter()
            .filter(|b| b.who != a.who && b.worker_id == a.worker_id)
        {
            assert!(
                a.recv < b.sent || b.recv < a.sent,
                "sidecars {} and {} both answered 200 with ID {:?} at the same time: {a:?} {b:?}",
                a.who,
                b.who,
                a.worker_id
            );
        }
    }
}

/// SIGKILL: the key outlives the process until its TTL; nobody publishes the ID before it
/// expires; then another sidecar claims it.
#[test]
fn sigkill_key_expires_then_id_is_claimed_again() {
    let redis = RedisServer::start();
    let mut old = Sidecar::worker(&redis, "orders")
        .name("old")
        .flag("--max-worker-id", "0")
        .spawn();
    let lease = assert_published(&redis, &old, "orders");
    let key = worker_key("orders", 0);
    old.signal(Signal::SIGKILL);
    old.wait_exit(secs(2)).expect("SIGKILL ends it");
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));
    let pttl = redis.pttl(&key);
    assert!(pttl > 0 && pttl <= 2000, "the key still expires: {pttl}");

    let new = Sidecar::worker(&redis, "orders")
        .name("new")
        .flag("--max-worker-id", "0")
        .spawn();
    let mut saw_wait = false;
    let got = poll_some(secs(10), || {
        let reply = new.id();
        // Read the key after the answer: a 200 while the old key is still there is a violation.
        let old_key_alive = redis.get(&key).as_deref() == Some(lease.owner.as_str());
        assert!(
            !(reply.is_some() && old_key_alive),
            "new sidecar published while the killed one's key was alive"
        );
        saw_wait |= old_key_alive;
        reply
    })
    .expect("new sidecar claims the ID after the TTL");
    assert!(saw_wait, "the test must observe the new sidecar waiting");
    assert_eq!(got.worker_id, 0);
    assert_ne!(got.owner, lease.owner);
    assert_published(&redis, &new, "orders");

    // The killed sidecar's state file tells a reader its ID is stale.
    let state = old.read_state().expect("state file survives SIGKILL");
    assert!(state["valid_until_ms"].as_u64().unwrap() < unix_ms());
}

/// What [`freeze_holder_past_ttl`] leaves behind for the variant's own checks.
struct Freeze {
    redis: RedisServer,
    old: Sidecar,
    new: Sidecar,
    samples: Vec<Sample>,
    /// When the old holder got SIGSTOP (sampling starts after it).
    stopped: Instant,
}

impl Freeze {
    /// Samples of the old holder matching `pred`, with times relative to its SIGSTOP.
    fn old_samples(&self, pred: impl Fn(&Sample) -> bool) -> Vec<String> {
        self.samples
            .iter()
            .filter(|s| s.who == 0 && pred(s))
            .map(|s| {
                format!(
                    "sent +{:?} recv +{:?} status {} id {:?}",
                    s.sent - self.stopped,
                    s.recv - self.stopped,
                    s.status,
                    s.worker_id
                )
            })
            .collect()
    }
}

/// Shared body of the SIGSTOP tests: freeze the holder of ID 0 past its TTL, let a sidecar
/// with `max-worker-id 0` claim ID 0, resume; sample both `/id` all along.
fn freeze_holder_past_ttl(old_max_id: &str) -> Freeze {
    let redis = RedisServer::start();
    let old = Sidecar::worker(&redis, "orders")
        .name("old")
        .flag("--identity", "10.0.0.1")
        .flag("--max-worker-id", old_max_id)
        .spawn();
    let old_lease = assert_published(&redis, &old, "orders");
    assert_eq!(old_lease.worker_id, 0);
    let key = worker_key("orders", 0);

    old.pause();
    let stopped = Instant::now();
    // Same identity on purpose: only the nonce tells the two apart.
    let new = Sidecar::worker(&redis, "orders")
        .name("new")
        .flag("--identity", "10.0.0.1")
        .flag("--max-worker-id", "0")
        // Long enough that its key outlives the freeze below even on a loaded machine
        // (with 3 s it expired once while frozen for 4.9 s, and the test blamed the old one).
        .flag("--ttl", "10s")
        .spawn();
    let stop = AtomicBool::new(false);
    let samples = thread::scope(|scope| {
        let a = scope.spawn(|| sample_ids(0, &old, &stop));
        let b = scope.spawn(|| sample_ids(1, &new, &stop));
        let guard = StopOnDrop(&stop);

        let new_lease = new.wait_for_lease(secs(10));
        assert_eq!(new_lease.worker_id, 0);
        assert_ne!(new_lease.owner, old_lease.owner);
        assert_eq!(redis.get(&key).as_deref(), Some(new_lease.owner.as_str()));

        // Freeze the new holder too, so any PTTL increase can only come from the old one.
        new.pause();
        // Requests queued on the frozen sidecar are served the moment it resumes, racing its
        // renew loop: they too must see the lease as expired.
        let backlog = || accept_queue_len(old.http_addr()).expect("old sidecar listens");
        let before = backlog();
        let queued: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| sample_id(0, &old, secs(3))))
            .collect();
        assert!(
            poll_until(secs(2), || backlog() >= before + 8),
            "requests queued on the frozen sidecar"
        );
        old.resume();
        let resumed = Instant::now();
        eprintln!("old resumed at +{:?}", resumed - stopped);
        let mut last_pttl = redis.pttl(&key);
        while resumed.elapsed() < ms(1200) {
            assert_eq!(
                redis.get(&key).as_deref(),
                Some(new_lease.owner.as_str()),
                "the resumed sidecar must not touch the new holder's key"
            );
            let pttl = redis.pttl(&key);
            assert!(
                pttl <= last_pttl,
                "PTTL of the new holder's key went up from {last_pttl} to {pttl}: extended by \
                 the resumed sidecar"
            );
            last_pttl = pttl;
            thread::sleep(ms(20));
        }
        let lost = old
            .wait_for_event("lease lost", ms(100))
            .expect("the resumed sidecar reports the loss within 1.2 s");
        assert_eq!(level(&lost), "ERROR");
        new.resume();

        // Keep sampling while both run.
        thread::sleep(secs(2));
        drop(guard);
        let mut samples = a.join().unwrap();
        samples.extend(b.join().unwrap());
        let queued: Vec<Sample> = queued.into_iter().map(|q| q.join().unwrap()).collect();
        assert!(
            queued.iter().all(|q| q.status != 0),
            "queued requests are answered after the resume: {queued:?}"
        );
        samples.extend(queued);
        samples
    });
    assert_never_published_together(&samples);
    let new_lease = new.id().expect("new holder keeps ID 0");
    assert_eq!(redis.get(&key), Some(new_lease.owner));
    assert_eq!(new.count_log("lease lost"), 0);
    // The samples must have seen both sides, or the test proves nothing.
    let seen = |who: usize, status: u16| {
        samples
            .iter()
            .filter(|s| s.who == who && s.status == status)
            .count()
    };
    assert!(seen(1, 200) > 10, "new holder sampled publishing");
    assert!(
        seen(0, 503) + seen(0, 200) > 10,
        "old holder sampled after resume"
    );
    Freeze {
        redis,
        old,
        new,
        samples,
        stopped,
    }
}

/// SIGSTOP a holder past its TTL, another claims the ID, SIGCONT (single ID): never both
/// publish ID 0, the resumed one reports the loss, never extends the new key, stays unpublished.
#[test]
fn stopped_holder_never_publishes_alongside_new_holder() {
    let f = freeze_holder_past_ttl("0");
    let bad = f.old_samples(|s| s.status == 200);
    assert!(
        bad.is_empty(),
        "the resumed sidecar must never answer 200 while the only ID is held by another: {bad:#?}"
    );
    assert_eq!(f.old.readyz(), 503);
    assert!(
        !f.old.output_file().exists(),
        "the resumed sidecar removes its ID file"
    );
    assert!(f.new.id().is_some());
}

/// SIGSTOP a holder past its TTL, another claims its ID, SIGCONT (two IDs, on-loss reclaim):
/// the resumed one drops ID 0 and publishes ID 1 instead.
#[test]
fn stopped_holder_reclaims_another_id_after_resume() {
    let f = freeze_holder_past_ttl("1");
    let bad = f.old_samples(|s| s.worker_id == Some(0));
    assert!(
        bad.is_empty(),
        "after the freeze the old sidecar must never answer 200 with ID 0: {bad:#?}\nall: {:#?}",
        f.old_samples(|_| true)
    );
    let lease = f.old.wait_for_lease(secs(10));
    assert_eq!(lease.worker_id, 1);
    let lease = assert_published(&f.redis, &f.old, "orders");
    assert_eq!(lease.worker_id, 1);
    assert!(f.old.metric("snowlease_leases_lost_total").unwrap_or(0.0) >= 1.0);
}

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

/// `SCRIPT FLUSH` alone causes no loss and no error: renewals go on with the same ID.
#[test]
fn script_flush_causes_no_loss() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders").spawn();
    let lease = assert_published(&redis, &sidecar, "orders");
    let renewed = |s: &Sidecar| {
        s.metric("snowlease_renewals_total{outcome=\"renewed\"}")
            .unwrap_or(0.0)
    };
    let others = |s: &Sidecar| -> f64 {
        s.metric_samples("snowlease_renewals_total")
            .iter()
            .filter(|(labels, _)| !labels.contains("\"renewed\""))
            .map(|(_, v)| v)
            .sum()
    };
    assert!(poll_until(secs(5), || renewed(&sidecar) >= 1.0));
    let (before, others_before) = (renewed(&sidecar), others(&sidecar));
    let errors_before = sidecar
        .events()
        .iter()
        .filter(|e| level(e) == "ERROR")
        .count();

    let _: () = redis.query(redis::cmd("SCRIPT").arg("FLUSH"));
    assert!(
        poll_until(secs(5), || renewed(&sidecar) >= before + 3.0),
        "renewals continue after SCRIPT FLUSH: {}",
        sidecar.metrics()
    );
    assert_eq!(others(&sidecar), others_before, "only successful renewals");
    assert_eq!(sidecar.count_log("lease lost"), 0);
    let errors = sidecar
        .events()
        .iter()
        .filter(|e| level(e) == "ERROR")
        .count();
    assert_eq!(errors, errors_before, "no error logged");
    let again = assert_published(&redis, &sidecar, "orders");
    assert_eq!(
        (again.worker_id, again.owner),
        (lease.worker_id, lease.owner)
    );
}

/// Someone else overwrites the key (`SET key other KEEPTTL`): the sidecar unpublishes at its
/// next renew and never extends that key.
#[test]
fn overwritten_key_is_unpublished_and_never_extended() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--max-worker-id", "0")
        .flag("--ttl", "3s")
        .spawn();
    let lease = assert_published(&redis, &sidecar, "orders");
    let key = worker_key("orders", lease.worker_id);
    let _: () = redis.query(redis::cmd("SET").arg(&key).arg("other").arg("KEEPTTL"));
    let overwritten = Instant::now();

    assert!(
        poll_until(secs(2), || sidecar.get_id().0 == 503
            && !sidecar.output_file().exists()),
        "unpublished at the next renew (renew interval 500 ms)"
    );
    assert!(overwritten.elapsed() < ms(1500));
    assert_eq!(sidecar.readyz(), 503);
    let lost = sidecar
        .wait_for_event("lease lost", secs(1))
        .expect("loss logged");
    assert_eq!(level(&lost), "ERROR");
    assert_eq!(sidecar.metric("snowlease_lease_held"), Some(0.0));
    assert_eq!(sidecar.metric("snowlease_worker_id"), Some(-1.0));
    assert_eq!(sidecar.metric("snowlease_leases_lost_total"), Some(1.0));

    // Until the foreign key expires: its value and TTL are never touched, nothing published.
    let mut last_pttl = i64::MAX;
    let mut expires_at = None;
    let mut checks = 0;
    let end = Instant::now() + secs(5);
    loop {
        assert!(Instant::now() < end, "the foreign key never expired");
        // /id first: a 200 followed by "other" still in the key is a violation.
        let status = sidecar.get_id().0;
        let (value, pttl) = redis.get_with_pttl(&key);
        if value.as_deref() == Some("other") {
            assert!(
                pttl <= last_pttl,
                "PTTL went up from {last_pttl} to {pttl}: someone else's key was extended"
            );
            assert_ne!(status, 200, "published while the key holds another owner");
            last_pttl = pttl;
            expires_at = Some(Instant::now() + ms(pttl as u64));
            checks += 1;
        } else {
            // Gone, or claimed again by the sidecar: only once it had expired.
            if let Some(value) = value {
                assert_eq!(value, lease.owner, "only the sidecar may claim it again");
            }
            let expires_at = expires_at.expect("saw the foreign key");
            assert!(
                Instant::now() + ms(50) >= expires_at,
                "the foreign key was replaced {:?} before it expired",
                expires_at - Instant::now()
            );
            break;
        }
        thread::sleep(ms(20));
    }
    assert!(
        checks > 20,
        "observed the foreign key for a while ({checks} checks)"
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

/// SIGTERM while Redis is down (paused): exit 0 is still bounded, files are removed, and the
/// key is gone once Redis is back and the TTL has passed.
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
    assert!(!sidecar.state_file().exists());
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
