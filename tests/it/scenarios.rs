//! Worker scenarios written once and run on every topology: each scenario is a function of a
//! [`Deployment`], and [`scenarios!`] makes one test per (topology, scenario), named
//! `scenarios::<topology>::<scenario>`.
//!
//! Sentinel and Cluster are shared by the tests running at the same time (see
//! `harness/deployment.rs`); every scenario uses its own app name and opens its claim guard
//! with `snowlease guard open`, so none waits one TTL for a first claim.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::thread;
use std::time::Instant;

use crate::harness::*;
use crate::worker::{assert_owner_format, assert_published};

/// One `#[test]` per scenario on the topology `$variant` of [`Topo`], in module `$module`.
macro_rules! on_topology {
    ($module:ident, $variant:ident, $($scenario:ident),+) => {
        mod $module {
            $(
                #[test]
                fn $scenario() {
                    let deployment =
                        crate::harness::Deployment::start(crate::harness::Topo::$variant);
                    super::$scenario(&deployment);
                }
            )+
        }
    };
}

/// Every scenario on standalone, Sentinel and Cluster.
macro_rules! scenarios {
    ($($scenario:ident),+ $(,)?) => {
        on_topology!(standalone, Standalone, $($scenario),+);
        on_topology!(sentinel, Sentinel, $($scenario),+);
        on_topology!(cluster, Cluster, $($scenario),+);
    };
}

scenarios!(
    thirty_three_sidecars_share_thirty_two_ids,
    sigterm_releases_key_and_files,
    sigterm_leaves_a_key_that_is_no_longer_ours,
    sigkill_key_expires_then_id_is_claimed_again,
    stopped_holder_never_publishes_alongside_new_holder,
    stopped_holder_reclaims_another_id_after_resume,
    overwritten_key_is_unpublished_and_never_extended,
    script_flush_causes_no_loss,
    restart_in_same_pod_readopts_other_pod_does_not,
    restart_does_not_readopt_a_key_taken_by_someone_else,
    password_rotation_loses_no_id_and_a_restart_readopts,
    wrong_password_at_start_exits_1,
    refused_renewals_end_in_exit_1_at_the_deadline,
);

/// Two sidecars hold the two IDs of the app (TTL 30 s) as an ACL user whose password is then
/// rotated: both keep their IDs published after the failure; stopped and
/// restarted with the new password on the same output files, both publish their old IDs (same
/// owner strings) within 5 s, well under the TTL, since the state files outlive a stop whose
/// release Redis did not confirm.
fn password_rotation_loses_no_id_and_a_restart_readopts(redis: &Deployment) {
    let app = "rotation";
    redis.open_guard(app, 1);
    let url = redis.acl_user("rotation", "pw");
    let worker = |url: &str, pod: &PodDir| {
        Sidecar::worker_at(url, app)
            .pod(pod)
            .flag("--max-worker-id", "1")
            .flag("--ttl", "30s")
            .flag("--renew-interval", "1s")
    };
    let pods = [PodDir::new(), PodDir::new()];
    let mut first: Vec<Sidecar> = pods.iter().map(|p| worker(&url, p).spawn()).collect();
    let leases: Vec<IdReply> = first.iter().map(|s| s.wait_for_lease(secs(15))).collect();
    assert_ne!(leases[0].worker_id, leases[1].worker_id);

    redis.rotate_password("rotation", "pw2");
    for sidecar in &mut first {
        assert!(
            poll_until(secs(10), || sidecar.count_log("renew refused by redis")
                + sidecar.count_log("renew failed")
                > 0),
            "a failed renewal is logged"
        );
        assert!(sidecar.id().is_some(), "still published after the failure");
        sidecar.signal(Signal::SIGTERM);
        let status = sidecar.wait_exit(secs(5)).expect("stopped within 5 s");
        assert_eq!(status.code(), Some(0));
        assert!(!sidecar.output_file().exists(), "the ID is not published");
    }
    let new_url = url.replacen(":pw@", ":pw2@", 1);
    let restarted = Instant::now();
    let second: Vec<Sidecar> = pods.iter().map(|p| worker(&new_url, p).spawn()).collect();
    for (sidecar, lease) in second.iter().zip(&leases) {
        let again = poll_some(secs(5), || sidecar.id()).unwrap_or_else(|| {
            panic!(
                "{redis}: ID {} not re-adopted within 5 s of the restart (TTL 30 s)",
                lease.worker_id
            )
        });
        assert_eq!(again.worker_id, lease.worker_id);
        assert_eq!(
            again.owner, lease.owner,
            "the recorded owner string is kept"
        );
    }
    println!(
        "{redis}: both old IDs published again {} ms after the restart",
        restarted.elapsed().as_millis()
    );
}

/// A wrong password at start is refused, not retried (docs/operations.md "Which errors end
/// what"): exit 1 within 10 s naming the cause without redis-rs' kind names, nothing
/// published.
fn wrong_password_at_start_exits_1(redis: &Deployment) {
    let url = redis
        .acl_user("wrongpass", "pw")
        .replacen(":pw@", ":not-pw@", 1);
    let mut sidecar = Sidecar::worker_at(&url, "wrongpass")
        .flag("--claim-timeout", "30s")
        .spawn();
    let status = sidecar.wait_exit(secs(10)).expect("exit within 10 s");
    let log = sidecar.log_lines().join("\n");
    assert_eq!(status.code(), Some(1), "{redis}: {log}");
    assert!(
        log.contains("wrong user name or password: the user of --redis-url"),
        "{redis}: {log}"
    );
    crate::acl::assert_no_kind_names(&log);
    assert!(!sidecar.output_file().exists());
}

/// A password rotated under a holder (TTL 4 s): the refused renewals are retried until the
/// validity deadline, then the ID is unpublished and the sidecar exits 1 (the refused row of
/// docs/operations.md), keeping its state file for a restart. On Cluster redis-rs reports the
/// refused reconnect as an I/O error ("Failed to create initial connections: Password
/// authentication failed"); taken for transient, the sidecar claimed again and retried until
/// `--claim-timeout` (exit 3).
fn refused_renewals_end_in_exit_1_at_the_deadline(redis: &Deployment) {
    let app = "refused-until-deadline";
    redis.open_guard(app, 31);
    let url = redis.acl_user("refused", "pw");
    let mut sidecar = Sidecar::worker_at(&url, app)
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .flag("--claim-timeout", "60s")
        .spawn();
    let lease = sidecar.wait_for_lease(secs(15));
    redis.rotate_password("refused", "pw2");
    let status = sidecar.wait_exit(secs(15)).expect("exit by the deadline");
    let log = sidecar.log_lines().join("\n");
    assert_eq!(status.code(), Some(1), "{redis}: {log}");
    assert!(
        log.contains("Password authentication failed"),
        "{redis}: {log}"
    );
    // redis-rs' own warnings (Cluster: "Failed to connect to node") are its words.
    let ours: Vec<String> = sidecar
        .log_lines()
        .into_iter()
        .filter(|l| !l.contains(r#""target":"redis::"#))
        .collect();
    crate::acl::assert_no_kind_names(&ours.join("\n"));
    assert!(!sidecar.output_file().exists());
    let state = sidecar.read_state().expect("state file kept");
    assert_eq!(state["release_unconfirmed"], true, "{state}");
    assert_eq!(state["owner"], lease.owner.as_str());
}

/// 33 sidecars on 32 IDs: 32 distinct IDs agreeing with Redis; the 33rd stays unready and
/// unpublished, says all 32 are held, and takes the ID freed by a SIGTERM: the release leaves
/// a tombstone (`released:<owner>`, the 1 s handover delay) and the 33rd publishes only once
/// it is gone.
fn thirty_three_sidecars_share_thirty_two_ids(redis: &Deployment) {
    let app = "crowd";
    redis.open_guard(app, 31);
    let spawn = |i: usize| {
        redis
            .worker(app)
            .name(format!("sidecar {i}"))
            .flag("--identity", format!("10.1.0.{i}"))
            .flag("--ttl", "3s")
            .flag("--renew-interval", "1s")
            .flag("--max-worker-id", "31")
            .spawn()
    };
    let mut holders: Vec<Sidecar> = (0..32).map(spawn).collect();
    let mut ids = BTreeSet::new();
    let mut leases = Vec::new();
    for (i, s) in holders.iter().enumerate() {
        let lease = assert_published(redis, s, app);
        assert_owner_format(&lease.owner, &format!("10.1.0.{i}"));
        assert!(ids.insert(lease.worker_id), "ID {} twice", lease.worker_id);
        leases.push(lease);
    }
    assert_eq!(ids, (0..=31).collect::<BTreeSet<u32>>());
    assert_eq!(redis.lease_keys(app).len(), 32, "32 lease keys");

    let mut last = spawn(32);
    let full = last
        .wait_for_event("all worker IDs are held", secs(15))
        .expect("the 33rd sidecar logs that all IDs are held");
    assert_eq!(full["count"], 32, "count field of {full}: 32 IDs exist");
    assert!(
        !full["holders"].as_str().unwrap_or_default().is_empty(),
        "holders named in {full}"
    );
    // It stays unpublished through several claim rounds (each counted as `full`).
    let full_rounds = || {
        last.metric(r#"snowlease_claim_attempts_total{outcome="full"}"#)
            .unwrap_or(0.0)
    };
    let before = full_rounds();
    assert!(
        poll_until(secs(30), || {
            assert_eq!(last.readyz(), 503);
            assert_eq!(last.get_id().0, 503);
            assert!(!last.output_file().exists(), "33rd must publish no file");
            full_rounds() >= before + 3.0
        }),
        "three more claim rounds found every ID held"
    );

    // SIGTERM the holder of ID 17: a tombstone for the handover delay, then the 33rd takes
    // exactly that ID.
    let idx = leases.iter().position(|l| l.worker_id == 17).unwrap();
    let key = worker_key(app, 17);
    holders[idx].signal(Signal::SIGTERM);
    let status = holders[idx].wait_exit(secs(2)).expect("exit within 2 s");
    assert_eq!(status.code(), Some(0));
    let exited = Instant::now();
    let (value, pttl) = redis.get_with_pttl(&key);
    assert_eq!(value, Some(format!("released:{}", leases[idx].owner)));
    assert!((1..=1000).contains(&pttl), "tombstone PTTL {pttl}");
    // Sample the 33rd first, then the key: published while the tombstone still stands
    // afterwards means it claimed over the tombstone.
    let lease = poll_some(secs(20), || {
        let id = last.id();
        let tombstone = redis.get(&key).is_some_and(|v| v.starts_with("released:"));
        assert!(
            !(id.is_some() && tombstone),
            "claimed over a tombstone: {id:?}"
        );
        id
    })
    .expect("the 33rd claims the ID once the tombstone expired");
    assert_eq!(lease.worker_id, 17);
    assert!(
        exited.elapsed() >= ms(pttl as u64).saturating_sub(ms(50)),
        "published {:?} after the release, tombstone had {pttl} ms left",
        exited.elapsed()
    );
    let lease = assert_published(redis, &last, app);
    assert_eq!(lease.worker_id, 17);
    // Everybody else still holds their own ID.
    for (s, l) in holders
        .iter()
        .zip(&leases)
        .filter(|(_, l)| l.worker_id != 17)
    {
        assert_eq!(
            s.id().map(|r| r.worker_id),
            Some(l.worker_id),
            "{}",
            s.name()
        );
    }
    assert!(last.is_running());
}

/// SIGTERM: key left as a tombstone that expires after the handover delay, files removed,
/// exit 0 within 2 s.
fn sigterm_releases_key_and_files(redis: &Deployment) {
    clean_stop(redis, "sigterm", Signal::SIGTERM);
}

/// Shared body of the clean-stop tests: `sig` turns our key into a tombstone (expiring after
/// the default 1 s handover delay, then gone), removes both files, exits 0 within 2 s.
pub fn clean_stop(redis: &Deployment, app: &str, sig: Signal) {
    redis.open_guard(app, 31);
    let mut sidecar = redis.worker(app).spawn();
    let lease = assert_published(redis, &sidecar, app);
    let key = worker_key(app, lease.worker_id);

    sidecar.signal(sig);
    let t = Instant::now();
    let status = sidecar.wait_exit(secs(2)).expect("exit within 2 s");
    assert_eq!(status.code(), Some(0), "clean stop after {:?}", t.elapsed());
    let (value, pttl) = redis.get_with_pttl(&key);
    assert_eq!(
        value,
        Some(format!("released:{}", lease.owner)),
        "key {key} must be a tombstone after {sig}"
    );
    assert!((1..=1000).contains(&pttl), "tombstone PTTL {pttl}");
    assert!(!sidecar.output_file().exists(), "ID file must be removed");
    assert!(!sidecar.state_file().exists(), "state file must be removed");
    assert!(sidecar.count_log("released") > 0, "release is logged");
    assert!(
        poll_until(secs(2), || !redis.exists(&key)),
        "the tombstone expires after the handover delay"
    );
}

/// A holder of the only ID of `app` (TTL 3 s, renewed every 500 ms) whose key someone else
/// has just overwritten (`SET key other KEEPTTL`): the sidecar, its lease, the key.
fn holder_of_an_overwritten_key(redis: &Deployment, app: &str) -> (Sidecar, IdReply, String) {
    redis.open_guard(app, 0);
    let sidecar = redis
        .worker(app)
        .flag("--max-worker-id", "0")
        .flag("--ttl", "3s")
        .spawn();
    let lease = assert_published(redis, &sidecar, app);
    let key = worker_key(app, lease.worker_id);
    redis.overwrite(&key, "other");
    (sidecar, lease, key)
}

/// SIGTERM after someone else overwrote the key: the key is left alone (compare-and-delete),
/// the files are removed, exit 0 within 2 s.
fn sigterm_leaves_a_key_that_is_no_longer_ours(redis: &Deployment) {
    let (mut sidecar, _, key) = holder_of_an_overwritten_key(redis, "overwritten-then-sigterm");
    sidecar.signal(Signal::SIGTERM);
    let status = sidecar.wait_exit(secs(2)).expect("exit within 2 s");
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        redis.get(&key).as_deref(),
        Some("other"),
        "someone else's key must survive our release"
    );
    assert!(!sidecar.output_file().exists());
    assert!(!sidecar.state_file().exists());
}

/// SIGKILL: the key outlives the process until its TTL; nobody publishes the ID before it
/// expires; then another sidecar claims it.
fn sigkill_key_expires_then_id_is_claimed_again(redis: &Deployment) {
    let app = "sigkill";
    redis.open_guard(app, 0);
    let worker = |name: &str| {
        redis
            .worker(app)
            .name(name)
            .flag("--max-worker-id", "0")
            .spawn()
    };
    let mut old = worker("old");
    let lease = assert_published(redis, &old, app);
    let key = worker_key(app, 0);
    old.signal(Signal::SIGKILL);
    old.wait_exit(secs(2)).expect("SIGKILL ends it");
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));
    let pttl = redis.pttl(&key);
    assert!(pttl > 0 && pttl <= 2000, "the key still expires: {pttl}");

    let new = worker("new");
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
    assert_published(redis, &new, app);

    // The killed sidecar's state file tells a reader its ID is stale.
    let state = old.read_state().expect("state file survives SIGKILL");
    assert!(state["valid_until_ms"].as_u64().unwrap() < unix_ms());
}

/// What [`freeze_holder_past_ttl`] leaves behind for the variant's own checks.
struct Freeze {
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
fn freeze_holder_past_ttl(redis: &Deployment, app: &str, old_max_id: u32) -> Freeze {
    redis.open_guard(app, old_max_id);
    let old = redis
        .worker(app)
        .name("old")
        .flag("--identity", "10.0.0.1")
        .flag("--max-worker-id", old_max_id.to_string())
        .spawn();
    let old_lease = assert_published(redis, &old, app);
    assert_eq!(old_lease.worker_id, 0);
    let key = worker_key(app, 0);

    old.pause();
    let stopped = Instant::now();
    // Same identity on purpose: only the nonce tells the two apart.
    let new = redis
        .worker(app)
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
        let queuing = Instant::now();
        let queued: Vec<_> = (0..8)
            .map(|_| scope.spawn(|| sample_id(0, &old, secs(5))))
            .collect();
        assert!(
            poll_until(secs(5), || backlog() >= before + 8),
            "requests queued on the frozen sidecar: {before} before, {} now",
            backlog()
        );
        let queued_in = queuing.elapsed();
        old.resume();
        let resumed = Instant::now();
        eprintln!(
            "old resumed at +{:?} (8 requests queued in {queued_in:?})",
            resumed - stopped
        );
        // The new holder is frozen, so its key's expiry stays where it is; a renewal by the
        // resumed sidecar would move it (up, or down to that sidecar's shorter TTL). Judged
        // at the local time each PTTL reply arrives: off by that read's delay, up to 300 ms.
        let expiry = || Instant::now() + ms(redis.pttl(&key).max(0) as u64);
        let first = expiry();
        while resumed.elapsed() < ms(1200) {
            assert_eq!(
                redis.get(&key).as_deref(),
                Some(new_lease.owner.as_str()),
                "the resumed sidecar must not touch the new holder's key"
            );
            let now = expiry();
            let moved = now.max(first) - now.min(first);
            assert!(
                moved <= ms(300),
                "the new holder's key expiry moved by {moved:?} (later: {}): renewed by the \
                 resumed sidecar",
                now > first
            );
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
        old,
        new,
        samples,
        stopped,
    }
}

/// SIGSTOP a holder past its TTL, another claims the ID, SIGCONT (single ID): never both
/// publish ID 0, the resumed one reports the loss, never extends the new key, stays
/// unpublished and removes its ID file.
fn stopped_holder_never_publishes_alongside_new_holder(redis: &Deployment) {
    let f = freeze_holder_past_ttl(redis, "frozen-one-id", 0);
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
fn stopped_holder_reclaims_another_id_after_resume(redis: &Deployment) {
    let app = "frozen-two-ids";
    let f = freeze_holder_past_ttl(redis, app, 1);
    let bad = f.old_samples(|s| s.worker_id == Some(0));
    assert!(
        bad.is_empty(),
        "after the freeze the old sidecar must never answer 200 with ID 0: {bad:#?}\nall: {:#?}",
        f.old_samples(|_| true)
    );
    let lease = f.old.wait_for_lease(secs(10));
    assert_eq!(lease.worker_id, 1);
    let lease = assert_published(redis, &f.old, app);
    assert_eq!(lease.worker_id, 1);
    assert!(f.old.metric("snowlease_leases_lost_total").unwrap_or(0.0) >= 1.0);
}

/// Someone else overwrites the key (`SET key other KEEPTTL`): the sidecar unpublishes at its
/// next renew and never extends that key.
fn overwritten_key_is_unpublished_and_never_extended(redis: &Deployment) {
    let (sidecar, lease, key) = holder_of_an_overwritten_key(redis, "overwritten");
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

/// `SCRIPT FLUSH` on every data node causes no loss and no error: renewals go on with the
/// same ID.
fn script_flush_causes_no_loss(redis: &Deployment) {
    let app = "script-flush";
    redis.open_guard(app, 31);
    let sidecar = redis.worker(app).spawn();
    let lease = assert_published(redis, &sidecar, app);
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

    redis.script_flush();
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
    let again = assert_published(redis, &sidecar, app);
    assert_eq!(
        (again.worker_id, again.owner),
        (lease.worker_id, lease.owner)
    );
}

/// A worker of the restart scenarios: identity 10.0.0.9, IDs 0-3, and a long TTL
/// (re-adoption must not depend on the old key expiring).
fn restart_worker(redis: &Deployment, app: &str, pod: &PodDir, name: &str) -> Sidecar {
    redis
        .worker(app)
        .name(name)
        .pod(pod)
        .flag("--identity", "10.0.0.9")
        .flag("--max-worker-id", "3")
        .flag("--ttl", "10s")
        .flag("--renew-interval", "1s")
        .spawn()
}

/// Sidecar restarted in the same pod re-adopts its ID and owner string; a process with the
/// same identity in another pod folder does not take over that key.
fn restart_in_same_pod_readopts_other_pod_does_not(redis: &Deployment) {
    let app = "restart";
    redis.open_guard(app, 3);
    let pod = PodDir::new();
    let worker = |pod: &PodDir, name: &str| restart_worker(redis, app, pod, name);
    let mut first = worker(&pod, "first");
    let lease = assert_published(redis, &first, app);
    first.signal(Signal::SIGKILL);
    first.wait_exit(secs(2)).expect("SIGKILL ends it");
    let key = worker_key(app, lease.worker_id);
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));

    // Same identity, other pod folder: a new nonce, so the orphaned key is someone else's.
    let stranger = worker(&PodDir::new(), "stranger");
    let other = assert_published(redis, &stranger, app);
    assert_ne!(other.worker_id, lease.worker_id);
    assert_ne!(other.owner, lease.owner);
    assert_owner_format(&other.owner, "10.0.0.9");
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));

    // Same pod folder: the state file leads back to the same ID and owner string.
    let second = worker(&pod, "second");
    let again = assert_published(redis, &second, app);
    assert_eq!(again.worker_id, lease.worker_id, "same ID after restart");
    assert_eq!(again.owner, lease.owner, "same owner string after restart");
    assert!(
        second.wait_for_log("re-adopt", secs(2)),
        "re-adoption is logged"
    );
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));
    assert_eq!(redis.lease_keys(app).len(), 2, "no third lease key");
}

/// A state file is no proof: when the recorded key holds another value, the restarted sidecar
/// claims another ID and leaves that key alone.
fn restart_does_not_readopt_a_key_taken_by_someone_else(redis: &Deployment) {
    let app = "restart-taken";
    redis.open_guard(app, 3);
    let pod = PodDir::new();
    let worker = |name: &str| restart_worker(redis, app, &pod, name);
    let mut first = worker("first");
    let lease = assert_published(redis, &first, app);
    first.signal(Signal::SIGKILL);
    first.wait_exit(secs(2)).expect("SIGKILL ends it");
    let key = worker_key(app, lease.worker_id);
    redis.overwrite(&key, "other");

    let second = worker("second");
    let again = assert_published(redis, &second, app);
    assert_ne!(again.worker_id, lease.worker_id);
    assert_ne!(
        again.owner, lease.owner,
        "the recorded owner string is dropped"
    );
    assert_eq!(redis.get(&key).as_deref(), Some("other"));
}
