//! Worker mode on a healthy standalone Redis: what a holder publishes, files, logs, `guard
//! open`, bad input. Scenarios that run on every topology (33 sidecars on 32 IDs, SIGTERM,
//! SIGKILL, SIGSTOP, overwritten key, SCRIPT FLUSH, restart re-adoption) are in `scenarios`.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;

/// Checks everything a holding sidecar publishes against Redis: `/id`, the ID file, the state
/// file and the lease key agree. Returns the `/id` reply.
pub fn assert_published(redis: &impl Keyspace, sidecar: &Sidecar, app: &str) -> IdReply {
    let lease = sidecar.wait_for_lease(secs(15));
    assert_eq!(lease.app, app);
    let key = worker_key(app, lease.worker_id);
    assert_eq!(
        redis.get(&key).as_deref(),
        Some(lease.owner.as_str()),
        "{}: key {key} must hold the owner from /id",
        sidecar.name()
    );
    assert!(
        poll_until(secs(2), || sidecar.read_output_file()
            == Some(format!("{}\n", lease.worker_id))),
        "{}: ID file {:?} must hold {}",
        sidecar.name(),
        sidecar.read_output_file(),
        lease.worker_id
    );
    let state = sidecar.read_state().expect("state file beside the ID file");
    assert_eq!(state["app"], app);
    assert_eq!(state["worker_id"], lease.worker_id);
    assert_eq!(state["owner"], lease.owner.as_str());
    lease
}

/// Asserts the owner string is `<identity>#<16 hex digits>`.
pub fn assert_owner_format(owner: &str, identity: &str) {
    let nonce = owner
        .strip_prefix(identity)
        .and_then(|r| r.strip_prefix('#'))
        .unwrap_or_else(|| panic!("owner {owner:?} must start with {identity:?}#"));
    assert_eq!(nonce.len(), 16, "nonce of {owner:?}");
    assert!(
        nonce.chars().all(|c| c.is_ascii_hexdigit()),
        "nonce of {owner:?} must be hex"
    );
}

/// A holder publishes its ID consistently: /id JSON and text, file, state file, Redis key with
/// a PX TTL, readiness, liveness and metrics.
#[test]
fn holder_publishes_id_everywhere() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--identity", "10.0.0.7")
        .spawn();
    let lease = assert_published(&redis, &sidecar, "orders");
    assert_eq!(lease.worker_id, 0, "lowest free ID first");
    assert_owner_format(&lease.owner, "10.0.0.7");
    assert!(lease.lease_expires_in_ms > 0 && lease.lease_expires_in_ms <= 2000);

    let pttl = redis.pttl(&worker_key("orders", 0));
    assert!(pttl > 0 && pttl <= 2000, "PX TTL of the key: {pttl}");

    let (status, body) = sidecar.http_get("/id", Some("text/plain"));
    assert_eq!((status, body.as_str()), (200, "0\n"));
    assert_eq!(sidecar.readyz(), 200);
    assert_eq!(sidecar.http_get("/livez", None).0, 200);
    assert_eq!(sidecar.http_get("/healthz", None).0, 200);

    let state = sidecar.read_state().unwrap();
    let valid_until = state["valid_until_ms"].as_u64().expect("valid_until_ms");
    let now = unix_ms();
    assert!(
        valid_until > now - 2000 && valid_until <= now + 2000,
        "valid_until_ms {valid_until} vs now {now}"
    );

    assert_eq!(sidecar.metric("snowlease_lease_held"), Some(1.0));
    assert_eq!(sidecar.metric("snowlease_worker_id"), Some(0.0));
    assert_eq!(sidecar.metric("snowlease_leases_lost_total"), Some(0.0));
    // --max-worker-id 31 (the default): 32 IDs, for exhaustion ratios.
    assert_eq!(sidecar.metric("snowlease_worker_ids"), Some(32.0));
    let build = sidecar.metric_samples("snowlease_build_info");
    assert!(
        build.len() == 1 && build[0].0.contains("commit=") && build[0].1 == 1.0,
        "{build:?}"
    );
    let claims: f64 = sidecar
        .metric_samples("snowlease_claim_attempts_total")
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert!(
        claims >= 1.0,
        "claim attempts counted: {}",
        sidecar.metrics()
    );
    assert!(
        poll_until(secs(5), || sidecar
            .metric("snowlease_renewals_total{outcome=\"renewed\"}")
            .unwrap_or(0.0)
            >= 2.0),
        "renewals must be counted: {}",
        sidecar.metrics()
    );
    // Renewals keep the key alive past its first TTL.
    assert_eq!(
        redis.get(&worker_key("orders", 0)).as_deref(),
        Some(lease.owner.as_str())
    );
    // The ranges record is written beside the lease, by a task of its own: once, soon.
    let ranges = format!("{PREFIX}orders:ranges");
    assert!(poll_until(secs(5), || redis.exists(&ranges)), "no {ranges}");
    assert_eq!(
        redis.keys("*"),
        vec![
            worker_key("orders", 0),
            format!("{PREFIX}orders:guard"),
            ranges
        ],
        "only the lease key, the app's claim guard and the ranges record"
    );
}

/// `--key-prefix` and env twins are honoured: the key lives under the given prefix.
#[test]
fn key_prefix_and_env_twins() {
    let redis = RedisServer::start();
    let sidecar = SidecarBuilder::new("worker")
        .env("SNOWLEASE_APP", "billing")
        .env("REDIS_URL", redis.url())
        .env("SNOWLEASE_KEY_PREFIX", "custom:ids:")
        .env("SNOWLEASE_TTL", "2s")
        .env("SNOWLEASE_RENEW_INTERVAL", "500ms")
        .env("SNOWLEASE_IDENTITY", "pod-x")
        .env("SNOWLEASE_MAX_WORKER_ID", "3")
        .spawn();
    let lease = sidecar.wait_for_lease(secs(15));
    assert_eq!(lease.app, "billing");
    assert_owner_format(&lease.owner, "pod-x");
    assert!(poll_until(secs(5), || redis.exists("custom:ids:billing:ranges")));
    assert_eq!(
        redis.keys("*"),
        vec![
            format!("custom:ids:billing:{}", lease.worker_id),
            "custom:ids:billing:guard".to_owned(),
            "custom:ids:billing:ranges".to_owned()
        ]
    );
    assert_eq!(
        redis.get(&format!("custom:ids:billing:{}", lease.worker_id)),
        Some(lease.owner)
    );
}

/// SIGINT: key left as a tombstone, files removed, exit 0 within 2 s (SIGTERM, the same on
/// every topology: `scenarios::*::sigterm_releases_key_and_files`).
#[test]
fn sigint_releases_key_and_files() {
    let redis = Deployment::start(Topo::Standalone);
    crate::scenarios::clean_stop(&redis, "sigint", Signal::SIGINT);
}

/// SIGTERM to the sidecar running as PID 1 of its own PID namespace: clean release, exit 0
/// within 2 s. Needs `unshare --pid` (see [`pid1_tests_can_run`]).
#[test]
fn sigterm_as_pid_1_releases() {
    if !pid1_tests_can_run() {
        return;
    }
    let redis = RedisServer::start();
    let mut sidecar = Sidecar::worker(&redis, "orders")
        .wrap(&["unshare", "--pid", "--fork", "--kill-child"])
        .spawn();
    let lease = assert_published(&redis, &sidecar, "orders");
    let pid = sidecar.pid();
    assert_ne!(pid, sidecar.spawned_pid());
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .expect("NSpid line");
    assert_eq!(
        nspid.split_whitespace().last(),
        Some("1"),
        "sidecar must be PID 1 in its namespace: {nspid}"
    );

    sidecar.signal(Signal::SIGTERM);
    let status = sidecar
        .wait_exit(secs(2))
        .expect("exit within 2 s as PID 1");
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        redis.get(&worker_key("orders", lease.worker_id)),
        Some(format!("released:{}", lease.owner)),
        "released as a tombstone"
    );
    assert!(!sidecar.output_file().exists());
}

/// `atomic_file::write_atomic`: a reader in a tight loop during 1000 rewrites never sees a
/// missing, empty or partial ID file (the file exists before the first rewrite).
#[test]
fn id_file_rewrites_are_atomic() {
    /// Reads the reader must do while the rewrites run, so that they really overlap.
    const MIN_READS: usize = 300;
    let dir = PodDir::new();
    let path = dir.worker_id_file();
    snowlease::atomic_file::write_atomic(&path, b"7\n").unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let reader = {
        let (path, done, reads) = (path.clone(), done.clone(), reads.clone());
        thread::spawn(move || {
            let mut bad = Vec::new();
            while !done.load(Ordering::Relaxed) {
                match fs::read(&path) {
                    Ok(bytes) => {
                        if bytes != b"7\n" && bytes != b"1023\n" {
                            bad.push(format!("{:?}", String::from_utf8_lossy(&bytes)));
                        }
                    }
                    // The file always exists: a rename replaces it, never removes it first.
                    Err(e) => bad.push(e.to_string()),
                }
                reads.fetch_add(1, Ordering::Relaxed);
            }
            bad
        })
    };
    assert!(
        poll_until(secs(5), || reads.load(Ordering::Relaxed) > 0),
        "the reader never started"
    );
    let reads_before = reads.load(Ordering::Relaxed);
    for i in 0..1000 {
        let contents: &[u8] = if i % 2 == 0 { b"1023\n" } else { b"7\n" };
        snowlease::atomic_file::write_atomic(&path, contents).unwrap();
    }
    let reads_during = reads.load(Ordering::Relaxed) - reads_before;
    done.store(true, Ordering::Relaxed);
    let bad = reader.join().unwrap();
    let reads = reads.load(Ordering::Relaxed);
    assert!(reads > 0, "the reader must have read the file");
    assert!(
        reads_during >= MIN_READS,
        "only {reads_during} reads overlapped the 1000 rewrites (want {MIN_READS})"
    );
    assert!(
        bad.is_empty(),
        "{} bad reads of {reads}, first ones: {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
    assert_eq!(fs::read(&path).unwrap(), b"7\n");
    let leftovers: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "worker-id")
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// Total connections `redis` has accepted, counting the one this call opens.
fn connections_received(redis: &RedisServer) -> u64 {
    redis
        .info_field("stats", "total_connections_received")
        .and_then(|v| v.parse().ok())
        .expect("total_connections_received in INFO stats")
}

/// One bad-configuration case: flag overrides, environment, words the message must contain.
struct BadInput<'a> {
    over: &'a [(&'a str, &'a str)],
    env: &'a [(&'a str, &'a str)],
    words: &'a [&'a str],
}

fn bad<'a>(
    over: &'a [(&'a str, &'a str)],
    env: &'a [(&'a str, &'a str)],
    words: &'a [&'a str],
) -> BadInput<'a> {
    BadInput { over, env, words }
}

/// Each invalid flag or env value exits 2 naming the flag, before touching Redis (no connection,
/// no key, no file).
#[test]
fn bad_configuration_exits_2_before_touching_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let pod = PodDir::new();
    let out = pod.worker_id_file();
    let out = out.to_str().unwrap();
    let base = |over: &[(&str, &str)]| -> Vec<String> {
        let mut flags = vec![
            ("--app", "orders"),
            ("--redis-url", url.as_str()),
            ("--ttl", "3s"),
            ("--renew-interval", "1s"),
            ("--output-file", out),
            ("--listen", "127.0.0.1:0"),
            ("--claim-timeout", "2s"),
        ];
        for (k, v) in over {
            match flags.iter_mut().find(|(n, _)| n == k) {
                Some(slot) => slot.1 = v,
                None => flags.push((k, v)),
            }
        }
        let mut args = vec!["worker".to_string()];
        for (k, v) in flags {
            args.push(k.to_string());
            args.push(v.to_string());
        }
        args
    };
    let long_app = "x".repeat(65);
    let long_app = [("--app", long_app.as_str())];
    let cases = [
        bad(&[("--ttl", "0")], &[], &["--ttl"]),
        bad(&[("--ttl", "0s")], &[], &["--ttl"]),
        bad(&[("--ttl", "soon")], &[], &["--ttl"]),
        bad(
            &[("--ttl", "3s"), ("--renew-interval", "2s")],
            &[],
            &["--renew-interval"],
        ),
        bad(
            &[("--max-worker-id", "1024")],
            &[],
            &["--max-worker-id", "1023"],
        ),
        bad(&[("--app", "a:b")], &[], &["--app"]),
        bad(&[("--app", "a b")], &[], &["--app"]),
        bad(&[("--app", "")], &[], &["--app"]),
        bad(&long_app, &[], &["--app"]),
        bad(&[("--redis-url", "not a url")], &[], &["--redis-url"]),
        bad(&[("--on-loss", "panic")], &[], &["--on-loss"]),
        bad(
            &[("--handover-delay", "50ms")],
            &[],
            &["--handover-delay", "100ms"],
        ),
        bad(
            &[("--handover-delay", "61s")],
            &[],
            &["--handover-delay", "1m"],
        ),
        bad(
            &[],
            &[("SNOWLEASE_HANDOVER_DELAY", "0s")],
            &["--handover-delay"],
        ),
        bad(
            &[],
            &[("SNOWLEASE_MAX_WORKER_ID", "5000")],
            &["max-worker-id", "1023"],
        ),
    ];
    let before = connections_received(&redis);
    for BadInput { over, env, words } in &cases {
        let args = base(over);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = run_snowlease(&args, env, secs(10));
        let case = format!("{over:?} {env:?}: {run:?}");
        assert_eq!(run.code, Some(2), "{case}");
        for word in words.iter() {
            assert!(
                run.stderr.to_lowercase().contains(&word.to_lowercase()),
                "message must name {word}: {case}"
            );
        }
        assert!(!run.stderr.contains("panicked"), "{case}");
        assert_eq!(redis.dbsize(), 0, "no key after {case}");
        assert!(!Path::new(out).exists(), "no ID file after {case}");
    }
    // `redis.dbsize()` opens a connection per call, and so does reading `after`; the sidecar
    // must have opened none.
    let after = connections_received(&redis);
    assert_eq!(
        after - before,
        cases.len() as u64 + 1,
        "only the test's own DBSIZE and INFO connections may reach Redis"
    );
}

/// Redis unreachable at start: readiness stays off, the claim is retried with warnings, and
/// the sidecar exits 3 with a clear error at --claim-timeout.
#[test]
fn unreachable_redis_exits_3_at_claim_timeout() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let started = Instant::now();
    let mut sidecar = Sidecar::worker_at(&url, "orders")
        .flag("--claim-timeout", "2s")
        .spawn();
    sidecar.http_addr();
    assert_eq!(sidecar.readyz(), 503);
    assert_eq!(sidecar.get_id().0, 503);
    assert!(
        sidecar.http_get("/livez", None).0 == 200,
        "liveness never depends on Redis"
    );
    let status = sidecar.wait_exit(secs(10)).expect("exit at claim timeout");
    let elapsed = started.elapsed();
    assert_eq!(status.code(), Some(3));
    assert!(
        elapsed >= ms(1900) && elapsed < secs(6),
        "exit at --claim-timeout 2s, took {elapsed:?}"
    );
    assert!(
        sidecar.count_log("redis unavailable") >= 2,
        "retries are logged"
    );
    let last = sidecar
        .log_lines()
        .last()
        .cloned()
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        last.contains("claim") && last.contains("redis"),
        "the final error says what failed: {last}"
    );
    assert!(
        last.contains("2s") && !last.contains("retrying"),
        "the final line is the exit error naming --claim-timeout, not a retry warning: {last}"
    );
    assert!(
        last.contains(&url),
        "the final line names the Redis: {last}"
    );
    assert!(!sidecar.output_file().exists());
}

/// A fresh Redis without a claim guard and a claim timeout shorter than the TTL: the exit error
/// says until when claims were paused as a time of day (it said "paused for 30000 ms", the
/// full TTL, though 2 s of it had passed).
#[test]
fn claim_timeout_behind_a_closed_guard_says_when_it_opens() {
    let redis = RedisServer::start();
    let mut sidecar = Sidecar::worker(&redis, "fresh")
        .flag("--ttl", "30s")
        .flag("--renew-interval", "10s")
        .flag("--claim-timeout", "2s")
        .spawn();
    let status = sidecar.wait_exit(secs(10)).expect("exit at claim timeout");
    assert_eq!(status.code(), Some(3));
    let last = sidecar.log_lines().last().cloned().unwrap_or_default();
    let (_, until) = last
        .split_once("closed until ")
        .unwrap_or_else(|| panic!("no time of day in {last}"));
    // RFC 3339 to the second: 2026-12-01T10:40:11Z.
    let until = until.get(..20).unwrap_or(until);
    let opens = humantime::parse_rfc3339(until).expect("RFC 3339 time");
    let left = opens.duration_since(std::time::SystemTime::now()).unwrap();
    // One TTL (30 s) from the first claim round, 2 s before the exit.
    assert!(left > secs(25) && left <= secs(30), "{left:?}: {last}");
}

/// All IDs held until --claim-timeout: exit 3 with an error saying how many IDs exist and that
/// they are held.
#[test]
fn all_ids_held_exits_3_at_claim_timeout() {
    let redis = RedisServer::start();
    let holder = Sidecar::worker(&redis, "orders")
        .flag("--identity", "10.9.0.1")
        .flag("--max-worker-id", "1")
        .spawn();
    let other = Sidecar::worker(&redis, "orders")
        .flag("--identity", "10.9.0.2")
        .flag("--max-worker-id", "1")
        .spawn();
    holder.wait_for_lease(secs(15));
    other.wait_for_lease(secs(15));
    let started = Instant::now();
    let mut late = Sidecar::worker(&redis, "orders")
        .flag("--max-worker-id", "1")
        .flag("--claim-timeout", "2s")
        .spawn();
    let status = late.wait_exit(secs(10)).expect("exit at claim timeout");
    assert_eq!(status.code(), Some(3));
    assert!(started.elapsed() >= ms(1900), "not before --claim-timeout");
    let stderr = late.log_lines().join("\n");
    let last = late.log_lines().last().cloned().unwrap_or_default();
    let says_two = last
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| word == "2");
    assert!(
        says_two && last.contains("held") && last.contains("10.9.0.1") && last.contains("10.9.0.2"),
        "final error says how many IDs exist (2) and who holds them: {last}"
    );
    assert!(!stderr.contains("lease acquired"));
    assert!(!late.output_file().exists());
    assert!(holder.id().is_some() && other.id().is_some());
}

/// A WRONGTYPE key in the ID range is skipped with a warning and never deleted; keys of other
/// apps and outside the prefix are never touched.
#[test]
fn wrong_type_key_is_skipped_and_kept() {
    let redis = RedisServer::start();
    let hash = worker_key("orders", 0);
    let _: () = redis.query(redis::cmd("HSET").arg(&hash).arg("f").arg("v"));
    let _: () = redis.query(redis::cmd("SET").arg(worker_key("payments", 1)).arg("x"));
    let _: () = redis.query(redis::cmd("SET").arg("unrelated").arg("y"));
    let mut sidecar = Sidecar::worker(&redis, "orders")
        .flag("--max-worker-id", "3")
        .spawn();
    let lease = assert_published(&redis, &sidecar, "orders");
    assert_eq!(lease.worker_id, 1, "ID 0 is a hash; next is 1");
    let warning = sidecar
        .wait_for_event("wrong type", secs(2))
        .expect("wrong type warning");
    assert_eq!(level(&warning), "WARN");
    assert!(
        warning.to_string().contains(&hash),
        "names the key: {warning}"
    );
    assert!(poll_until(secs(5), || sidecar
        .metric("snowlease_renewals_total{outcome=\"renewed\"}")
        .unwrap_or(0.0)
        >= 2.0));
    sidecar.signal(Signal::SIGTERM);
    assert_eq!(sidecar.wait_exit(secs(2)).and_then(|s| s.code()), Some(0));

    assert_eq!(redis.key_type(&hash), "hash");
    let v: Option<String> = redis.query(redis::cmd("HGET").arg(&hash).arg("f"));
    assert_eq!(v.as_deref(), Some("v"));
    assert_eq!(redis.pttl(&hash), -1, "no TTL added to the hash");
    assert_eq!(redis.get(&worker_key("payments", 1)).as_deref(), Some("x"));
    assert_eq!(redis.pttl(&worker_key("payments", 1)), -1);
    assert_eq!(redis.get("unrelated").as_deref(), Some("y"));
    crate::handover::assert_tombstone(&redis, &worker_key("orders", 1));
}

/// A closed stderr (the log pipe's reader is gone) does not stop the sidecar from working
/// or from releasing its key on SIGTERM with exit 0.
#[test]
fn closed_stderr_still_releases_on_sigterm() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker-id");
    let mut child = std::process::Command::new(BIN)
        .args(["worker", "--app", "pipes", "--redis-url", &redis.url()])
        .args([
            "--ttl",
            "2s",
            "--renew-interval",
            "500ms",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--output-file")
        .arg(&file)
        .env_clear()
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    assert!(
        poll_until(secs(5), || file.exists()),
        "publishes with stderr closed"
    );
    // Renewals write log lines into the broken pipe as well: wait for two of them, seen as
    // the key's PTTL rising (it only falls between renewals).
    let key = worker_key("pipes", 0);
    let mut last_pttl = redis.pttl(&key);
    let mut renewals = 0;
    assert!(
        poll_until(secs(5), || {
            let pttl = redis.pttl(&key);
            if last_pttl > 0 && pttl > last_pttl {
                renewals += 1;
            }
            last_pttl = pttl;
            renewals >= 2
        }),
        "the lease is renewed with stderr closed: {renewals} renewals seen, PTTL {last_pttl}"
    );
    assert!(redis.exists(&key));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "exit code with a closed stderr");
    crate::handover::assert_tombstone(&redis, &key);
    assert!(!file.exists());
}

/// `--listen [::]:PORT` (the default's form) answers on IPv4 and IPv6 loopback alike, so the
/// kubelet's probes reach the sidecar in IPv4-only, IPv6-only and dual-stack pods.
#[test]
fn listen_on_any_ipv6_answers_both_families() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--listen", "[::]:0")
        .spawn();
    let port = sidecar.http_addr().port();
    for host in ["127.0.0.1", "[::1]"] {
        let url = format!("http://{host}:{port}/livez");
        let status = ureq::get(&url)
            .timeout(HTTP_TIMEOUT)
            .call()
            .map(|r| r.status());
        assert_eq!(status.ok(), Some(200), "{url}");
    }
}

/// Under `umask 077` the folder the sidecar creates is still 0755 and the ID and state files
/// 0644, so an app container running as another user can read them (docs/worker.md: "0644").
#[test]
fn files_are_readable_by_other_users_whatever_the_umask() {
    use std::os::unix::fs::PermissionsExt;
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let pod = PodDir::new();
    let file = pod.path().join("made-by-sidecar").join("worker-id");
    let sidecar = Sidecar::worker(&redis, "orders")
        .pod(&pod)
        .flag("--output-file", file.to_str().unwrap())
        .wrap(&["sh", "-c", "umask 077 && exec \"$0\" \"$@\""])
        .spawn();
    sidecar.wait_for_lease(secs(10));
    let state = file.with_file_name("worker-id.state.json");
    assert!(poll_until(secs(5), || file.exists() && state.exists()));
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(file.parent().unwrap()), 0o755, "folder");
    assert_eq!(mode(&file), 0o644, "ID file");
    assert_eq!(mode(&state), 0o644, "state file");
}

/// First use: `guard open` on a Redis without any lease key of the app opens claims at once, so
/// a sidecar with a 30 s TTL publishes its ID in its first claim round (no round paused behind
/// the guard) and under 1 s after it was spawned, not after one TTL. The 1 s bound is
/// 30x below the TTL it replaces; `cargo bench --bench worker` measures the real figure
/// ("1 sidecar, spawn to published", a few ms).
#[test]
fn guard_open_lets_the_first_sidecar_claim_at_once() {
    let redis = RedisServer::start();
    let url = redis.url();
    let run = guard_open(&url, "orders", &[]);
    assert_eq!(run.code, Some(0), "{run:?}");
    let reply: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(reply["lease_keys"], 0, "{reply}");
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "30s")
        .flag("--renew-interval", "10s")
        .spawn();
    let spawned = Instant::now();
    sidecar.wait_for_lease(secs(5));
    let published = spawned.elapsed();
    let rounds = sidecar.metric_samples("snowlease_claim_attempts_total");
    let count = |outcome: &str| {
        rounds
            .iter()
            .find(|(labels, _)| labels.contains(&format!("\"{outcome}\"")))
            .map_or(0.0, |(_, n)| *n)
    };
    assert_eq!(
        (count("claimed"), count("paused")),
        (1.0, 0.0),
        "one claim round, none behind the guard: {rounds:?}"
    );
    assert!(
        published < Duration::from_secs(1),
        "published {published:?} after spawn; guard open must spare the wait"
    );
}

/// `guard open` run again (a deploy hook on every deploy) while sidecars hold IDs under the
/// guard it opened: exit 0 with `"already_open": true`, the guard untouched (it was refused with
/// exit 5, failing such hooks). Also beyond `--max-worker-id` on one server.
#[test]
fn guard_open_again_under_an_open_guard_succeeds_and_writes_nothing() {
    let redis = RedisServer::start();
    let url = redis.url();
    let guard = format!("{PREFIX}orders:guard");
    let first = guard_open(&url, "orders", &[]);
    assert_eq!(first.code, Some(0), "{first:?}");
    let sidecars: Vec<Sidecar> = (0..2)
        .map(|_| Sidecar::worker(&redis, "orders").spawn())
        .collect();
    let mut ids: Vec<u32> = sidecars
        .iter()
        .map(|s| s.wait_for_lease(secs(10)).worker_id)
        .collect();
    ids.sort();
    assert_eq!(ids, [0, 1]);
    let opened_at = redis.get(&guard);
    // With --max-worker-id 0 the key of ID 1 is one the SCAN finds beyond the range.
    for extra in [&[][..], &["--max-worker-id", "0"][..]] {
        let again = guard_open(&url, "orders", extra);
        assert_eq!(again.code, Some(0), "{again:?}");
        let reply: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
        assert_eq!(reply["already_open"], true, "{reply}");
        assert_eq!(reply["lease_keys"], 2, "{reply}");
        assert_eq!(redis.get(&guard), opened_at, "guard untouched");
    }
    // Without a guard, the same keys are refused (the guard was lost; holders may publish).
    let _: () = redis.query(redis::cmd("DEL").arg(&guard));
    let refused = guard_open(&url, "orders", &[]);
    assert_eq!(refused.code, Some(5), "{refused:?}");
    assert!(refused.stderr.contains("missing"), "{refused:?}");
    assert!(!redis.exists(&guard), "nothing written");
}

/// `guard open` run twice before any sidecar (no lease key of the app): the second run is a no-op,
/// `"already_open": true` and the guard's time untouched (it rewrote the guard and said
/// `false`), as README and docs/worker.md promise.
#[test]
fn guard_open_twice_without_lease_keys_is_a_no_op() {
    let redis = RedisServer::start();
    let url = redis.url();
    let guard = format!("{PREFIX}orders:guard");
    let first = guard_open(&url, "orders", &[]);
    assert_eq!(first.code, Some(0), "{first:?}");
    let reply: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
    assert_eq!(reply["already_open"], false, "{reply}");
    let opened_at = redis.get(&guard).expect("guard written");
    // Redis' TIME moves on in ms: a rewrite would store a later time.
    assert!(poll_until(secs(2), || redis_time_ms(&redis)
        > opened_at.split('.').next().unwrap().parse::<u64>().unwrap()));
    let again = guard_open(&url, "orders", &[]);
    assert_eq!(again.code, Some(0), "{again:?}");
    let reply: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(reply["already_open"], true, "{reply}");
    assert_eq!(reply["lease_keys"], 0, "{reply}");
    assert_eq!(
        redis.get(&guard).as_deref(),
        Some(opened_at.as_str()),
        "guard untouched"
    );
}

/// Redis' `TIME` in ms.
fn redis_time_ms(redis: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = redis.query(&mut redis::cmd("TIME"));
    secs * 1000 + micros / 1000
}

/// `guard open` refuses while any lease key of the app exists (exit 5) and writes nothing: the
/// guard stays missing and the keys untouched; `--force` opens it anyway.
#[test]
fn guard_open_refuses_while_a_lease_key_exists() {
    let redis = RedisServer::start();
    let url = redis.url();
    let key = worker_key("orders", 7);
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(&key)
            .arg("10.0.0.9#beef")
            .arg("PX")
            .arg(60_000),
    );
    let open = |extra: &[&str]| guard_open(&url, "orders", extra);
    let refused = open(&[]);
    assert_eq!(refused.code, Some(5), "{refused:?}");
    assert!(refused.stderr.contains("--force"), "{refused:?}");
    assert!(
        !redis.exists(&format!("{PREFIX}orders:guard")),
        "nothing written"
    );
    assert_eq!(redis.get(&key).as_deref(), Some("10.0.0.9#beef"));
    let forced = open(&["--force"]);
    assert_eq!(forced.code, Some(0), "{forced:?}");
    assert!(forced.stdout.contains(r#""lease_keys":1"#), "{forced:?}");
    assert!(redis.exists(&format!("{PREFIX}orders:guard")));
    let bad = open(&["--max-worker-id", "2000"]);
    assert_eq!(bad.code, Some(2), "{bad:?}");
}

/// On one server the app guard covers every ID: `guard open` refuses for a lease key above its
/// own `--max-worker-id` (sidecars may use a larger range), but not for a key of another type
/// (no lease: sidecars never touch it, it never expires).
#[test]
fn guard_open_counts_every_lease_key_of_the_app_and_only_lease_keys() {
    let redis = RedisServer::start();
    let url = redis.url();
    let guard = format!("{PREFIX}orders:guard");
    let open = |extra: &[&str]| guard_open(&url, "orders", extra);
    let _: () = redis.query(redis::cmd("RPUSH").arg(worker_key("orders", 1)).arg("x"));
    let opened = open(&["--max-worker-id", "2"]);
    assert_eq!(opened.code, Some(0), "{opened:?}");
    let _: () = redis.query(redis::cmd("DEL").arg(&guard));
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(worker_key("orders", 700))
            .arg("10.0.0.9#beef"),
    );
    let refused = open(&["--max-worker-id", "2"]);
    assert_eq!(refused.code, Some(5), "{refused:?}");
    assert!(!redis.exists(&guard), "nothing written");
}

/// A guard that a sidecar closed (it found none: first use with sidecars started first, or a
/// data loss whose earlier holders may still publish) is opened only with `--force`; without it
/// `guard open` exits 5, names the danger and writes nothing.
#[test]
fn guard_open_refuses_a_guard_a_sidecar_closed() {
    let redis = RedisServer::start();
    let url = redis.url();
    let guard = format!("{PREFIX}orders:guard");
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "30s")
        .flag("--renew-interval", "10s")
        .spawn();
    assert!(poll_until(secs(5), || redis.exists(&guard)));
    let closed_at = redis.get(&guard);
    let open = |extra: &[&str]| guard_open(&url, "orders", extra);
    let refused = open(&[]);
    assert_eq!(refused.code, Some(5), "{refused:?}");
    assert!(
        refused.stderr.contains("closed") && refused.stderr.contains("--force"),
        "{refused:?}"
    );
    assert_eq!(redis.get(&guard), closed_at, "nothing written");
    let forced = open(&["--force"]);
    assert_eq!(forced.code, Some(0), "{forced:?}");
    assert_ne!(redis.get(&guard), closed_at);
    // The waiting sidecar looks again within 5 s, not after its 30 s TTL.
    sidecar.wait_for_lease(secs(8));
}

/// `--log-format json` writes one flat object per line: `timestamp`, `level`, `message`,
/// `target` and the event's fields at the top level (what log platforms ingest as they are).
#[test]
fn json_logs_are_flat_objects() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let mut sidecar = Sidecar::worker(&redis, "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    let event = sidecar
        .wait_for_event("lease acquired", secs(5))
        .expect("lease acquired logged");
    for key in ["timestamp", "level", "message", "target"] {
        assert!(event[key].is_string(), "{key} missing: {event}");
    }
    assert_eq!(event["worker_id"], lease.worker_id, "{event}");
    assert!(event.get("fields").is_none(), "nested fields: {event}");
    let detected = sidecar
        .wait_for_event("topology detected", secs(1))
        .expect("topology logged");
    assert_eq!(detected["topology"], "one server", "{detected}");
    sidecar.signal(Signal::SIGTERM);
    sidecar.wait_exit(secs(5)).expect("SIGTERM ends it");
    let released = sidecar
        .wait_for_event("lease released", secs(1))
        .expect("lease released logged");
    assert_eq!(released["worker_id"], lease.worker_id, "{released}");
    // Field values are JSON values, never Rust debug text such as `Some(0)`.
    for event in sidecar.events() {
        let fields = event.as_object().expect("an object");
        for (key, value) in fields {
            let text = value.as_str().unwrap_or_default();
            assert!(
                !text.starts_with("Some(") && text != "None",
                "{key} is Rust debug text: {event}"
            );
        }
    }
}

/// A sidecar that waited behind the guard and then finds every ID held says `claiming` (and
/// the guard gauge 0) while it waits for a free ID, not `guard_closed` with a past opening.
#[test]
fn waiting_for_a_held_id_is_claiming_not_guard_closed() {
    let redis = RedisServer::start();
    let spawn = |name: &str| {
        Sidecar::worker(&redis, "orders")
            .name(name)
            .flag("--ttl", "2s")
            .flag("--renew-interval", "500ms")
            .flag("--max-worker-id", "1")
            .spawn()
    };
    let sidecars: Vec<Sidecar> = ["a", "b", "c"].into_iter().map(spawn).collect();
    assert!(poll_until(secs(5), || sidecars
        .iter()
        .any(|s| s.http_get("/id", None).1.contains("guard_closed"))));
    assert!(poll_until(secs(10), || sidecars
        .iter()
        .filter(|s| s.id().is_some())
        .count()
        == 2));
    let waiting = sidecars.iter().find(|s| s.id().is_none()).expect("a third");
    let idle = || {
        let (status, body) = waiting.http_get("/id", None);
        let gauge = waiting.metric("snowlease_claim_guard_opens_timestamp_seconds");
        status == 503 && body.contains("\"claiming\"") && gauge == Some(0.0)
    };
    assert!(
        poll_until(secs(5), idle),
        "{:?} {:?}",
        waiting.http_get("/id", None),
        waiting.metric("snowlease_claim_guard_opens_timestamp_seconds")
    );
}

/// While the claim guard holds claims back (a fresh Redis), `/id` and `/readyz` say
/// `"state":"guard_closed"` with `opens_in_ms`, and a gauge gives the Unix time it opens.
#[test]
fn closed_guard_is_visible_in_http_and_metrics() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "20s")
        .flag("--renew-interval", "5s")
        .spawn();
    let body = poll_some(secs(10), || {
        let (status, body) = sidecar.http_get("/id", None);
        (status == 503 && body.contains("guard_closed")).then_some(body)
    })
    .expect("/id says guard_closed");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let opens_in = json["opens_in_ms"].as_u64().expect("opens_in_ms");
    assert!(opens_in > 0 && opens_in <= 20_000, "{json}");
    let (status, ready) = sidecar.http_get("/readyz", None);
    let ready: serde_json::Value = serde_json::from_str(&ready).unwrap();
    assert_eq!(
        (status, ready["state"].as_str()),
        (503, Some("guard_closed")),
        "{ready}"
    );
    assert!(ready["opens_in_ms"].as_u64().is_some(), "{ready}");
    let opens_at = sidecar
        .metric("snowlease_claim_guard_opens_timestamp_seconds")
        .expect("gauge");
    let now_s = unix_ms() as f64 / 1000.0;
    assert!(
        opens_at > now_s && opens_at <= now_s + 21.0,
        "{opens_at} vs {now_s}"
    );
}

/// A handover delay below twice the clock-skew bound is allowed but warned about at start (two
/// nodes within the bound differ by up to twice it); the defaults (1 s, 500 ms) are not.
#[test]
fn handover_delay_below_twice_the_skew_bound_is_warned_about() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let warning = "--handover-delay is below twice --max-clock-skew";
    let short = Sidecar::worker(&redis, "orders")
        .flag("--handover-delay", "100ms")
        .flag("--max-clock-skew", "1s")
        .spawn();
    let default = Sidecar::worker(&redis, "orders").spawn();
    short.wait_for_lease(secs(10));
    default.wait_for_lease(secs(10));
    assert_eq!(short.events_with(warning).len(), 1, "{:?}", short.events());
    assert!(default.events_with(warning).is_empty());
}

/// No ID file without its deadline: when the state file cannot be written (here a folder
/// stands at its path), the sidecar holds the lease but publishes no ID file, since a reader
/// takes an ID file without a state file as published with no deadline at all.
#[test]
fn no_id_file_is_published_without_its_state_file() {
    let redis = RedisServer::start();
    let pod = PodDir::new();
    fs::create_dir(pod.path().join("worker-id.state.json")).unwrap();
    let sidecar = Sidecar::worker(&redis, "orders").pod(&pod).spawn();
    assert!(
        sidecar.wait_for_log("cannot write state file", secs(15)),
        "the state file write must fail and be logged"
    );
    let lease = sidecar.wait_for_lease(secs(15));
    // Each renewal publishes again and fails again on the state file.
    assert!(
        poll_until(secs(15), || {
            assert_eq!(
                sidecar.read_output_file(),
                None,
                "ID {} published without a state file",
                lease.worker_id
            );
            sidecar.count_log("cannot write state file") >= 3
        }),
        "three renewals must try the state file"
    );
}

/// A sidecar that may not write the output folder (run as nobody, the folder root's) exits 1
/// naming `--output-file` beside the lock file it could not create (it named only the lock
/// file, a path the user never typed).
#[test]
fn unwritable_output_folder_names_output_file() {
    use std::os::unix::fs::PermissionsExt;
    let top = tempfile::tempdir().unwrap();
    let folder = top.path().join("ro");
    fs::create_dir(&folder).unwrap();
    for dir in [top.path(), folder.as_path()] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let file = folder.join("worker-id");
    let url = format!("redis://127.0.0.1:{}", free_port());
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
    cmd.args(["worker", "--app", "orders", "--listen", "127.0.0.1:0"]);
    cmd.args(["--redis-url", &url, "--output-file", file.to_str().unwrap()]);
    let run = run_command(cmd, secs(20));
    assert_eq!(run.code, Some(1), "{run:?}");
    let last = run.stderr.lines().last().unwrap_or("");
    assert!(
        last.contains("--output-file") && last.contains("Permission denied"),
        "{last}"
    );
}
