//! `snowlease lock`: a distributed mutex around a command, against a real `redis-server`.
//! Each command is a small `sh` job that records what it saw (fence, owner, PID, start and end
//! times in ns) in files of a shared folder, and waits for a `go` file before it exits.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::kill;
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::harness::*;

/// `--ttl` of these tests: validity 2.9 s (margin 100 ms), renewed every 1 s, renew calls
/// bounded by 250 ms (short enough to be quick, long enough for a host under heavy load).
const TTL: Duration = Duration::from_secs(3);
/// TTL - margin: how long after the last confirmed send the lock is treated as held.
const VALIDITY: Duration = Duration::from_millis(2_900);
/// `--grace` of these tests (below a quarter of the validity, so used as is).
const GRACE: &str = "300ms";
/// Slack for observing a process end after a deadline (polling, scheduling on a busy machine).
const SLACK: Duration = Duration::from_millis(250);
/// Exit code of `lock` when the lock is not acquired within `--wait`.
const NOT_ACQUIRED: i32 = 69;
/// Exit code of `lock` when the lock was lost while the command ran.
const LOST: i32 = 75;

/// The job every test runs: records fence, owner, PID, start time; waits for `$ME.go`; records
/// its end time; exits with `$CODE` (0 when unset). `exec sleep` is avoided so traps stay.
const JOB: &str = r#"
echo "$SNOWLEASE_FENCE" > "$DIR/$ME.fence"
echo "$SNOWLEASE_LOCK_OWNER" > "$DIR/$ME.owner"
echo $$ > "$DIR/$ME.pid"
date +%s%N > "$DIR/$ME.start"
while [ ! -e "$DIR/$ME.go" ]; do sleep 0.02; done
date +%s%N > "$DIR/$ME.end"
exit "${CODE:-0}"
"#;

/// Like [`JOB`], but on SIGTERM it records the time in `$ME.term` and goes on running, so only
/// SIGKILL ends it.
const STUBBORN_JOB: &str = r#"
trap 'date +%s%N > "$DIR/$ME.term"' TERM
echo "$SNOWLEASE_FENCE" > "$DIR/$ME.fence"
echo $$ > "$DIR/$ME.pid"
date +%s%N > "$DIR/$ME.start"
while :; do sleep 0.02; done
"#;

/// Like [`JOB`], but SIGTERM makes it record `$ME.term` and exit 3.
const POLITE_JOB: &str = r#"
trap 'date +%s%N > "$DIR/$ME.term"; exit 3' TERM
echo $$ > "$DIR/$ME.pid"
date +%s%N > "$DIR/$ME.start"
while :; do sleep 0.02; done
"#;

/// The lock key of `name` under the default prefix.
fn lock_key(name: &str) -> String {
    format!("snowlease:lock:{{{name}}}")
}

/// The fence counter of `name` under the default prefix.
fn fence_key(name: &str) -> String {
    format!("{}:fence", lock_key(name))
}

/// The node record of `name` under the default prefix (`acquire.lua`'s rollback gate).
fn node_key(name: &str) -> String {
    format!("{}:node", lock_key(name))
}

/// The shared folder of the jobs of one test.
struct Jobs(TempDir);

impl Jobs {
    fn new() -> Jobs {
        Jobs(
            tempfile::Builder::new()
                .prefix("snowlease-lock-")
                .tempdir()
                .expect("tempdir"),
        )
    }

    fn path(&self, job: &str, what: &str) -> PathBuf {
        self.0.path().join(format!("{job}.{what}"))
    }

    /// `snowlease lock --name NAME --ttl 3s --grace 300ms FLAGS -- sh -c SCRIPT` as job `job`.
    fn lock(
        &self,
        redis_url: &str,
        name: &str,
        job: &str,
        flags: &[(&str, &str)],
        script: &str,
    ) -> SidecarBuilder {
        let mut builder = SidecarBuilder::new("lock")
            .name(format!("lock {job}"))
            .without("--listen")
            .flag("--name", name)
            .flag("--redis-url", redis_url)
            .flag("--ttl", format!("{}s", TTL.as_secs()))
            .flag("--grace", GRACE)
            .env("DIR", self.0.path())
            .env("ME", job);
        for (flag, value) in flags {
            builder = builder.flag(flag, *value);
        }
        builder
            .switch("--")
            .switch("sh")
            .switch("-c")
            .switch(script)
    }

    /// A value the job wrote (once it parses), waiting up to 10 s.
    fn wait<T: std::str::FromStr>(&self, job: &str, what: &str) -> Option<T> {
        let path = self.path(job, what);
        poll_some(secs(10), || read_value(&path))
    }

    /// A value the job wrote, if it has.
    fn read<T: std::str::FromStr>(&self, job: &str, what: &str) -> Option<T> {
        read_value(&self.path(job, what))
    }

    /// Lets job `job` finish.
    fn go(&self, job: &str) {
        fs::write(self.path(job, "go"), "").expect("write go file");
    }
}

/// The value in `path`, once written: the shell's `>` creates the file before `echo` writes
/// the line, so an empty file is "not yet" (an empty owner was read once under CI load).
fn read_value<T: std::str::FromStr>(path: &std::path::Path) -> Option<T> {
    let text = fs::read_to_string(path).ok()?;
    let value = text.trim();
    (!value.is_empty()).then(|| value.parse().ok()).flatten()
}

/// A holder dropped by its test is SIGKILLed, and a SIGKILLed `lock` leaves its command
/// running (docs/lock.md): end every job that wrote its PID, so none outlives the test.
impl Drop for Jobs {
    fn drop(&mut self) {
        let Ok(entries) = fs::read_dir(self.0.path()) else {
            return;
        };
        for entry in entries.flatten() {
            let pid = fs::read_to_string(entry.path())
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok());
            // Only a job of this test: its PID may have gone to another process since.
            let ours = pid.is_some_and(|pid| {
                fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                    let dir = format!("DIR={}", self.0.path().display());
                    env.split(|b| *b == 0).any(|var| var == dir.as_bytes())
                })
            });
            if let (true, true, Some(pid)) = (
                entry.path().extension().is_some_and(|e| e == "pid"),
                ours,
                pid,
            ) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

fn process_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Unix time in ns.
fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Two `lock` processes on one name: the second waits (it logs so, and its command has not
/// started) and its command starts only after the first's command has exited, by the times
/// the commands wrote; its fence is one higher; both release, so no lock key is left.
#[test]
fn second_waiter_runs_only_after_the_first_command_exits() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let mut first = jobs.lock(&redis.url(), "report", "a", &[], JOB).spawn();
    let fence_a: u64 = jobs
        .wait::<u128>("a", "start")
        .and(jobs.wait("a", "fence"))
        .expect("a runs");
    let mut second = jobs
        .lock(&redis.url(), "report", "b", &[("--wait", "20s")], JOB)
        .spawn();
    assert!(second.wait_for_log("waiting for the lock", secs(10)));
    assert_eq!(
        jobs.read::<u128>("b", "start"),
        None,
        "b must not run while a holds"
    );

    jobs.go("a");
    assert_eq!(first.wait_exit(secs(10)).and_then(|s| s.code()), Some(0));
    let a_end: u128 = jobs.read("a", "end").expect("a recorded its end");
    let b_start: u128 = jobs.wait("b", "start").expect("b runs after a");
    assert!(
        b_start > a_end,
        "b started at {b_start}, a ended at {a_end}"
    );
    assert_eq!(jobs.read::<u64>("b", "fence"), Some(fence_a + 1));

    jobs.go("b");
    assert_eq!(second.wait_exit(secs(10)).and_then(|s| s.code()), Some(0));
    assert!(!redis.exists(&lock_key("report")), "released");
}

/// `--wait 0` while another holds the lock: exit 69 at once (well within one TTL), the
/// command never starts, the holder's key is untouched.
#[test]
fn wait_zero_exits_not_acquired_at_once() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let _holder = jobs.lock(&redis.url(), "report", "a", &[], JOB).spawn();
    let owner: String = jobs.wait("a", "owner").expect("a runs");
    let started = Instant::now();
    let args = [
        "lock",
        "--name",
        "report",
        "--redis-url",
        &redis.url(),
        "--wait",
        "0s",
        "--",
        "sh",
        "-c",
        "touch \"$MARK\"",
    ];
    let marker = jobs.path("b", "marker");
    let run = run_snowlease(&args, &[("MARK", marker.to_str().unwrap())], secs(10));
    let took = started.elapsed();
    assert_eq!(run.code, Some(NOT_ACQUIRED), "{run:?}");
    assert!(took < secs(1), "took {took:?}");
    assert!(run.stderr.contains("not acquired"), "{run:?}");
    assert!(!marker.exists(), "the command must never start");
    assert_eq!(redis.get(&lock_key("report")), Some(owner));
}

/// The cron recipe of docs/lock.md on two hosts, with `--quiet`: the loser (exit 69) and the
/// winner (exit 0) print nothing on stderr (the loser said "not acquired" even with
/// `SNOWLEASE_LOG=off`, the winner three INFO lines; cron mailed both); the recipe's
/// `|| [ $? -eq 69 ]` makes the loser's line exit 0. A Redis that does not answer (no host runs
/// the command) is still said.
#[test]
fn quiet_prints_nothing_unless_lock_fails() {
    let redis = RedisServer::start();
    let url = redis.url();
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(lock_key("nightly-report"))
            .arg("other-host#beef")
            .arg("PX")
            .arg(60_000),
    );
    let recipe = |url: &str, env: &[(&str, &str)]| {
        let line = format!(
            "\"$BIN\" lock --quiet --name nightly-report --ttl 1m --redis-url {url} -- true || [ $? -eq 69 ]"
        );
        let mut env = env.to_vec();
        env.push(("BIN", BIN));
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", &line]).env_clear().envs(env);
        run_command(cmd, secs(20))
    };
    for env in [&[][..], &[("SNOWLEASE_LOG", "off")][..]] {
        let loser = recipe(&url, env);
        assert_eq!(loser.code, Some(0), "{env:?}: {loser:?}");
        assert_eq!(loser.stderr, "", "{env:?}: the loser must print nothing");
        assert_eq!(loser.stdout, "", "{env:?}");
    }
    let _: () = redis.query(redis::cmd("DEL").arg(lock_key("nightly-report")));
    let winner = recipe(&url, &[]);
    assert_eq!(winner.code, Some(0), "{winner:?}");
    assert_eq!(winner.stderr, "", "the winner must print nothing");
    assert!(!redis.exists(&lock_key("nightly-report")), "released");
    let dead = format!("redis://127.0.0.1:{}", free_port());
    // Exit 69 too, but no host runs the report: said, so cron mails it.
    let failed = recipe(&dead, &[]);
    assert!(
        failed.stderr.contains("not acquired") && failed.stderr.contains("redis unavailable"),
        "{failed:?}"
    );
}

/// Fences strictly increase across acquires, also after a holder was killed with SIGKILL and
/// its key expired; the fence counter never expires.
#[test]
fn fences_increase_also_after_sigkill_and_expiry() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let mut fences = Vec::new();
    for job in ["a", "b"] {
        let mut lock = jobs.lock(&redis.url(), "report", job, &[], JOB).spawn();
        fences.push(jobs.wait::<u64>(job, "fence").expect("job runs"));
        jobs.go(job);
        assert_eq!(lock.wait_exit(secs(10)).and_then(|s| s.code()), Some(0));
    }
    let killed = jobs.lock(&redis.url(), "report", "c", &[], JOB).spawn();
    fences.push(jobs.wait::<u64>("c", "fence").expect("c runs"));
    let pid_c: i32 = jobs.wait("c", "pid").expect("c wrote its PID");
    killed.signal(Signal::SIGKILL);
    // The orphaned command is not ours to judge; end it so it does not outlive the test.
    let _ = kill(Pid::from_raw(pid_c), Signal::SIGKILL);
    assert!(
        poll_until(TTL + secs(2), || !redis.exists(&lock_key("report"))),
        "the killed holder's key expires"
    );
    let mut after = jobs.lock(&redis.url(), "report", "d", &[], JOB).spawn();
    fences.push(jobs.wait::<u64>("d", "fence").expect("d runs"));
    jobs.go("d");
    assert_eq!(after.wait_exit(secs(10)).and_then(|s| s.code()), Some(0));
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert_eq!(
        redis.pttl(&fence_key("report")),
        -1,
        "the counter never expires"
    );
}

/// A holder paused (SIGSTOP) past its TTL: another holder gets the lock with a higher fence;
/// on resume the old holder stops its command at once (the deadline has passed) and exits
/// 75, and its release never deletes nor extends the new holder's key.
#[test]
fn paused_holder_is_stopped_on_resume_and_never_touches_the_new_key() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let mut old = jobs.lock(&redis.url(), "report", "a", &[], JOB).spawn();
    let fence_a: u64 = jobs.wait("a", "fence").expect("a runs");
    let pid_a: i32 = jobs.wait("a", "pid").expect("a wrote its PID");
    old.pause();
    let mut new = jobs
        .lock(&redis.url(), "report", "b", &[("--wait", "20s")], JOB)
        .spawn();
    let fence_b: u64 = jobs
        .wait("b", "fence")
        .expect("b gets the lock after a's TTL");
    let owner_b: String = jobs.wait("b", "owner").expect("b wrote its owner");
    assert!(fence_b > fence_a, "{fence_b} > {fence_a}");

    old.resume();
    let resumed = Instant::now();
    assert_eq!(old.wait_exit(secs(5)).and_then(|s| s.code()), Some(LOST));
    assert!(
        resumed.elapsed() < secs(1),
        "stopped {:?} after resume",
        resumed.elapsed()
    );
    assert!(!process_exists(pid_a), "a's command is gone");
    assert!(old.count_log("validity deadline passed") > 0);
    let (value, pttl) = redis.get_with_pttl(&lock_key("report"));
    assert_eq!(
        value.as_deref(),
        Some(owner_b.as_str()),
        "b's key survives a's release"
    );
    assert!(pttl > 0 && pttl <= TTL.as_millis() as i64, "{pttl}");
    assert_eq!(jobs.read::<u128>("b", "end"), None, "b keeps running");
    jobs.go("b");
    assert_eq!(new.wait_exit(secs(10)).and_then(|s| s.code()), Some(0));
}

/// Redis down (the server killed) while the command runs: SIGTERM comes before, and the
/// command (which ignores it) is gone by, the validity deadline of the last renew, which was
/// sent before Redis went down; `lock` exits 75.
#[test]
fn redis_down_stops_the_command_by_the_validity_deadline() {
    stopped_by_the_deadline_when(|redis| redis.stop());
}

/// Redis paused (SIGSTOP: connections stay open, nothing answers, every renew times out):
/// the command is gone by the validity deadline all the same, `lock` exits 75.
#[test]
fn redis_paused_stops_the_command_by_the_validity_deadline() {
    stopped_by_the_deadline_when(|redis| redis.pause());
}

/// Holds a lock with a command that ignores SIGTERM, applies `fault` to Redis once a renewal
/// was confirmed, and checks: SIGTERM sent (by `lock`'s log) no later, and the command gone
/// no later (plus [`SLACK`]), than [`VALIDITY`] after the fault; `lock` exits 75.
fn stopped_by_the_deadline_when(fault: impl FnOnce(&mut RedisServer)) {
    let mut redis = RedisServer::start();
    let jobs = Jobs::new();
    let mut lock = jobs
        .lock(&redis.url(), "report", "a", &[], STUBBORN_JOB)
        .spawn();
    let pid: i32 = jobs.wait("a", "pid").expect("a runs");
    jobs.wait::<u128>("a", "start").expect("a started");
    // Wait for a confirmed renew (the TTL was reset), so this is the holding phase.
    assert!(renewed_within(&redis, secs(5)));
    let down_ns = unix_ns();
    let down = Instant::now();
    fault(&mut redis);
    let latest = down + VALIDITY;
    assert!(
        poll_until(VALIDITY + SLACK, || !process_exists(pid)),
        "command still running {:?} after the fault",
        down.elapsed()
    );
    let gone = Instant::now();
    assert!(
        gone <= latest + SLACK,
        "gone {:?} after the fault",
        gone - down
    );
    // When `lock` sent SIGTERM, from its log (the command's trap may run late on a busy host).
    let event = lock
        .wait_for_event("stopping the command (SIGTERM)", secs(1))
        .expect("SIGTERM came first");
    let stamp = event["timestamp"].as_str().expect("timestamp");
    let term = humantime::parse_rfc3339(stamp)
        .expect("RFC 3339 timestamp")
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    assert!(
        term <= down_ns + VALIDITY.as_nanos(),
        "SIGTERM {} ms after the fault",
        (term - down_ns) / 1_000_000
    );
    assert_eq!(lock.wait_exit(secs(5)).and_then(|s| s.code()), Some(LOST));
}

/// The lock key deleted while held (as by a Redis that lost its data): the renew never
/// re-creates it (watched until `lock` exits; the command ignores SIGTERM, so the stop lasts
/// the grace); the command is stopped (SIGTERM, then SIGKILL), `lock` exits 75.
#[test]
fn deleted_key_is_not_recreated_and_stops_the_command() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let key = lock_key("report");
    let mut lock = jobs
        .lock(&redis.url(), "report", "a", &[], STUBBORN_JOB)
        .spawn();
    jobs.wait::<u128>("a", "start").expect("a runs");
    let _: () = redis.query(redis::cmd("DEL").arg(&key));
    let recreated = poll_some(secs(5), || {
        if redis.exists(&key) {
            Some(true)
        } else {
            (!lock.is_running()).then_some(false)
        }
    });
    assert_eq!(
        recreated,
        Some(false),
        "the key was re-created (or lock did not exit)"
    );
    assert_eq!(lock.wait_exit(secs(5)).and_then(|s| s.code()), Some(LOST));
    assert!(
        jobs.read::<u128>("a", "term").is_some(),
        "the command got SIGTERM"
    );
    assert!(lock.count_log("no longer holds our owner string") > 0);
}

/// A lost lock ends `lock` as every failure ends: exit 75 and a last line on stderr naming the
/// lock, why it was lost and how the stopped command ended (before, exit 75 came without one).
#[test]
fn a_lost_lock_ends_with_a_last_line_naming_it() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let mut lock = jobs
        .lock(&redis.url(), "report", "a", &[], POLITE_JOB)
        .spawn();
    jobs.wait::<u128>("a", "start").expect("a runs");
    let _: () = redis.query(redis::cmd("SET").arg(lock_key("report")).arg("intruder"));
    assert_eq!(lock.wait_exit(secs(5)).and_then(|s| s.code()), Some(LOST));
    let log = lock.log_lines();
    let last = log.last().map_or("", String::as_str);
    assert!(
        last.starts_with(
            "snowlease lock: lock \"report\" was lost while the command ran (the lock key no longer \
             holds our owner string: it expired, was deleted or taken over, or Redis lost it (a \
             restart from an older snapshot, a failover; docs/lock.md)); the command was stopped ("
        ),
        "{log:?}"
    );
}

/// The lock key overwritten by another owner while held: the command is stopped, `lock`
/// exits 75, and the other owner's value stays (the release compares before it deletes).
#[test]
fn overwritten_key_stops_the_command_and_stays() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let mut lock = jobs
        .lock(&redis.url(), "report", "a", &[], POLITE_JOB)
        .spawn();
    jobs.wait::<u128>("a", "start").expect("a runs");
    let _: () = redis.query(redis::cmd("SET").arg(lock_key("report")).arg("intruder"));
    assert_eq!(lock.wait_exit(secs(5)).and_then(|s| s.code()), Some(LOST));
    assert!(
        jobs.read::<u128>("a", "term").is_some(),
        "the command got SIGTERM"
    );
    assert_eq!(redis.get(&lock_key("report")).as_deref(), Some("intruder"));
}

/// Redis unreachable for the whole `--wait`: exit 69 after the wait, the command never starts.
#[test]
fn redis_unreachable_exits_not_acquired_after_the_wait() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let jobs = Jobs::new();
    let marker = jobs.path("a", "marker");
    let started = Instant::now();
    let args = [
        "lock",
        "--name",
        "report",
        "--redis-url",
        &url,
        "--wait",
        "1s",
        "--",
        "sh",
        "-c",
        "touch \"$MARK\"",
    ];
    let run = run_snowlease(&args, &[("MARK", marker.to_str().unwrap())], secs(10));
    assert_eq!(run.code, Some(NOT_ACQUIRED), "{run:?}");
    assert!(started.elapsed() >= secs(1), "waited --wait");
    assert!(run.stderr.contains("redis unavailable"), "{run:?}");
    assert!(!marker.exists(), "the command must never start");
}

/// Bad input (ttl 0, empty name, a name with a space or braces, no `--` before the command):
/// exit 2 with the flag named, the command never starts, nothing written to Redis.
#[test]
fn bad_input_exits_2_and_writes_nothing() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let marker = jobs.path("a", "marker");
    let url = redis.url();
    let cmd = ["sh", "-c", "touch \"$MARK\""];
    let cases: [(&[&str], &str); 5] = [
        (&["--name", "report", "--ttl", "0s", "--"], "--ttl"),
        (&["--name", "", "--"], "--name"),
        (&["--name", "nightly report", "--"], "--name"),
        (&["--name", "a{b}", "--"], "--name"),
        (&["--name", "report"], "unexpected argument"),
    ];
    for (flags, named) in cases {
        let args = [&["lock", "--redis-url", url.as_str()], flags, &cmd].concat();
        let run = run_snowlease(&args, &[("MARK", marker.to_str().unwrap())], secs(10));
        assert_eq!(run.code, Some(2), "{flags:?}: {run:?}");
        assert!(run.stderr.contains(named), "{flags:?}: {run:?}");
    }
    assert!(!marker.exists(), "no command ran");
    assert_eq!(redis.dbsize(), 0, "nothing written: {:?}", redis.keys("*"));
}

/// The command's exit code passes through and the key is released; SIGTERM to `lock` reaches
/// the command (which exits 3 on it), `lock` exits 3 and releases the key.
#[test]
fn exit_code_passes_through_and_sigterm_reaches_the_command() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let mut lock = jobs
        .lock(&redis.url(), "report", "a", &[], JOB)
        .env("CODE", "7")
        .spawn();
    jobs.wait::<u128>("a", "start").expect("a runs");
    jobs.go("a");
    assert_eq!(lock.wait_exit(secs(10)).and_then(|s| s.code()), Some(7));
    assert!(!redis.exists(&lock_key("report")), "released after exit 7");

    let mut lock = jobs
        .lock(&redis.url(), "report", "b", &[], POLITE_JOB)
        .spawn();
    jobs.wait::<u128>("b", "start").expect("b runs");
    assert!(redis.exists(&lock_key("report")));
    lock.signal(Signal::SIGTERM);
    assert_eq!(lock.wait_exit(secs(10)).and_then(|s| s.code()), Some(3));
    assert!(
        jobs.read::<u128>("b", "term").is_some(),
        "the command got SIGTERM"
    );
    assert!(!redis.exists(&lock_key("report")), "released after SIGTERM");
}

/// `lock`, as documented in docs/lock.md: scripts by SHA, the commands they call, only
/// the lock keys.
pub(crate) const LOCK_RULES: &str = "resetkeys ~snowlease:lock:* resetchannels -@all +evalsha \
    +script|load +type +get +set +pexpire +pttl +incr +del +time +info +role +bgsave";

/// The documented ACL covers a whole lock: probe, acquire with fence, a waiter's attempts,
/// renewals, release; Redis denies nothing on the way.
#[test]
fn lock_runs_with_the_minimal_acl() {
    let redis = RedisServer::start();
    let url = crate::acl::acl_user(&redis, "locker", LOCK_RULES);
    let jobs = Jobs::new();
    let mut holder = jobs.lock(&url, "report", "a", &[], JOB).spawn();
    jobs.wait::<u128>("a", "start").expect("a runs");
    assert!(renewed_within(&redis, secs(5)), "renewed");
    let args = [
        "lock",
        "--name",
        "report",
        "--redis-url",
        &url,
        "--",
        "true",
    ];
    let run = run_snowlease(&args, &[], secs(10));
    assert_eq!(run.code, Some(NOT_ACQUIRED), "{run:?}");
    jobs.go("a");
    assert_eq!(holder.wait_exit(secs(10)).and_then(|s| s.code()), Some(0));
    assert!(!redis.exists(&lock_key("report")), "released");
    assert_eq!(redis.get(&fence_key("report")).as_deref(), Some("1"));
    assert_eq!(
        crate::acl::acl_log(&redis),
        Vec::<String>::new(),
        "nothing denied"
    );
}

/// Renewals refused mid-run (EVALSHA taken from the user after the start): `lock` stops the
/// command and exits 75, its log naming Redis' refusal in Redis' words, without redis-rs' kind
/// names (it logged "redis refused the renew script: NoPerm: this user has ...").
#[test]
fn a_refused_renewal_is_logged_in_redis_words() {
    let redis = RedisServer::start();
    let url = crate::acl::acl_user(&redis, "locker", LOCK_RULES);
    let jobs = Jobs::new();
    let mut holder = jobs.lock(&url, "report", "a", &[], JOB).spawn();
    jobs.wait::<u128>("a", "start").expect("a runs");
    let _: () = redis.query(
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("locker")
            .arg("-evalsha"),
    );
    let code = holder.wait_exit(secs(15)).and_then(|s| s.code());
    let log = holder.log_lines().join("\n");
    assert_eq!(code, Some(LOST), "{log}");
    assert!(
        log.contains(
            "redis refused the renew script: NOPERM this user has no permissions to run the 'evalsha' command"
        ),
        "{log}"
    );
    crate::acl::assert_no_kind_names(&log);
}

/// Renewals refused mid-run: a refusal never read the key, so `lock` keeps
/// the command running and retries until the deadline rules stop it (SIGTERM `--grace` before
/// the validity deadline that the key's PTTL just before the refusal bounds), not at the first
/// refused renewal (before the fix: at most one renew interval, 3 s, after it); exit 75 naming
/// the refusal.
#[test]
fn a_refused_renewal_runs_the_command_until_the_deadline() {
    let redis = RedisServer::start();
    let url = crate::acl::acl_user(&redis, "locker", LOCK_RULES);
    let jobs = Jobs::new();
    let flags = [("--ttl", "9s"), ("--grace", "1s")];
    let mut holder = jobs.lock(&url, "report", "a", &flags, JOB).spawn();
    jobs.wait::<u128>("a", "start").expect("a runs");
    // The local deadline ends a margin (90 ms) before the key expires.
    let pttl = ms(redis.pttl(&lock_key("report")).try_into().unwrap());
    let _: () = redis.query(
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("locker")
            .arg("-evalsha"),
    );
    let revoked = Instant::now();
    let code = holder.wait_exit(secs(20)).and_then(|s| s.code());
    let ran = revoked.elapsed();
    let log = holder.log_lines().join("\n");
    assert_eq!(code, Some(LOST), "{log}");
    let term_due = pttl.saturating_sub(ms(90) + secs(1));
    assert!(
        ran + ms(300) >= term_due,
        "stopped {} ms after the refusal; SIGTERM was due {} ms after it\n{log}",
        ran.as_millis(),
        term_due.as_millis()
    );
    assert!(
        ran <= pttl + secs(2),
        "stopped {} ms after the refusal",
        ran.as_millis()
    );
    assert!(
        log.contains(
            "redis refused the renew script: NOPERM this user has no permissions to run the 'evalsha' command"
        ),
        "{log}"
    );
    assert!(
        !jobs.path("a", "end").exists(),
        "the command did not end by itself"
    );
}

/// A user without INCR: the acquire script's SET runs, its INCR is refused; `lock` exits 1
/// naming the refusal, the command never starts, and the half-taken key is released.
#[test]
fn lock_without_incr_fails_before_the_command_and_releases() {
    let redis = RedisServer::start();
    let url = crate::acl::acl_user(&redis, "noincr", &LOCK_RULES.replace(" +incr", ""));
    let jobs = Jobs::new();
    let marker = jobs.path("a", "marker");
    let args = [
        "lock",
        "--name",
        "report",
        "--redis-url",
        &url,
        "--",
        "sh",
        "-c",
        "touch \"$MARK\"",
    ];
    let run = run_snowlease(&args, &[("MARK", marker.to_str().unwrap())], secs(10));
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.contains("redis refused the acquire script"),
        "{run:?}"
    );
    assert!(!marker.exists(), "the command must never start");
    assert_eq!(
        redis.keys("*"),
        vec![node_key("report")],
        "nothing left behind but the node record, which stays as the fence counter does"
    );
}

/// SIGTERM while waiting for the lock: `lock` exits 143 (128 + 15) at once, the command
/// never starts, and the holder's key is untouched.
#[test]
fn sigterm_while_waiting_exits_without_running_the_command() {
    let redis = RedisServer::start();
    let jobs = Jobs::new();
    let _holder = jobs.lock(&redis.url(), "report", "a", &[], JOB).spawn();
    let owner: String = jobs.wait("a", "owner").expect("a runs");
    let mut waiter = jobs
        .lock(&redis.url(), "report", "b", &[("--wait", "60s")], JOB)
        .spawn();
    assert!(waiter.wait_for_log("waiting for the lock", secs(10)));
    waiter.signal(Signal::SIGTERM);
    assert_eq!(
        waiter.wait_exit(secs(2)).and_then(|s| s.code()),
        Some(128 + 15)
    );
    assert_eq!(jobs.read::<u128>("b", "start"), None, "b never ran");
    assert_eq!(redis.get(&lock_key("report")), Some(owner));
}

/// True once the lock key's PTTL went up between two polls: a renewal reset it. (Comparing
/// with one first reading misses renewals when that reading came just after one.)
fn renewed_within(redis: &RedisServer, timeout: Duration) -> bool {
    let mut last = redis.pttl(&lock_key("report"));
    poll_until(timeout, || {
        let now = redis.pttl(&lock_key("report"));
        let renewed = now > last;
        last = now;
        renewed
    })
}

/// Redis crash-restarted from a snapshot older than the holder's acquire (a rollback: the lock
/// key and the last fence are gone while the holder still runs): a newcomer is refused as if
/// the lock were held (exit 69, the log names the restart) until one TTL has passed, and its
/// fence is then greater than every fence handed out before the restart. Before the node
/// record, the newcomer took the lock at once with the holder's fence again.
#[test]
fn a_restart_from_an_older_snapshot_closes_the_lock_for_one_ttl() {
    let mut redis = RedisServer::start();
    let jobs = Jobs::new();
    let url = redis.url();
    // Every run of this lock uses --ttl 3s: the node record keeps the largest TTL seen.
    let first = run_snowlease(
        &[
            "lock",
            "--name",
            "report",
            "--redis-url",
            &url,
            "--ttl",
            "3s",
            "--",
            "true",
        ],
        &[],
        secs(10),
    );
    assert_eq!(first.code, Some(0), "{first:?}");
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    // After the snapshot: holder a (fence 2), which the restart loses.
    let _holder = jobs.lock(&url, "report", "a", &[], JOB).spawn();
    let fence_a: u64 = jobs.wait("a", "fence").expect("a runs");
    assert_eq!(fence_a, 2);
    redis.restart();
    assert!(
        !redis.exists(&lock_key("report")),
        "the restart loaded the older snapshot"
    );
    assert_eq!(redis.get(&fence_key("report")).as_deref(), Some("1"));

    let before_ms = redis_time_ms(&redis);
    let marker = jobs.path("b", "marker");
    let args = [
        "lock",
        "--name",
        "report",
        "--redis-url",
        &url,
        "--ttl",
        "3s",
        "--",
        "sh",
        "-c",
        "touch \"$MARK\"",
    ];
    let run = run_snowlease(&args, &[("MARK", marker.to_str().unwrap())], secs(10));
    assert_eq!(
        run.code,
        Some(NOT_ACQUIRED),
        "a newcomer must not take the lock of a holder the rollback lost: {run:?}"
    );
    assert!(run.stderr.contains("Redis restart or failover"), "{run:?}");
    assert!(!marker.exists(), "the command must never start");

    let started = Instant::now();
    let b = jobs
        .lock(&url, "report", "b", &[("--wait", "10s")], JOB)
        .spawn();
    let fence_b: u64 = jobs.wait("b", "fence").expect("b runs once the lock opens");
    assert!(
        started.elapsed() >= TTL - secs(1),
        "b waited for the TTL a lost holder may still run: {:?}",
        started.elapsed()
    );
    assert!(fence_b > fence_a, "{fence_b} > {fence_a}");
    assert!(
        fence_b > before_ms * 1000,
        "the fence lifted to Redis time in us: {fence_b} vs {before_ms}"
    );
    jobs.go("b");
    drop(b);
}

/// Redis time in ms.
fn redis_time_ms(redis: &RedisServer) -> u64 {
    let (s, us): (u64, u64) = redis.query(&mut redis::cmd("TIME"));
    s * 1000 + us / 1000
}

/// The lock's first log line names the Redis it took the lock in (scheme, host, port, db; no
/// user name or password), as the sidecar's does.
#[test]
fn the_lock_log_names_the_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let run = crate::harness::run_snowlease(
        &["lock", "--name", "named", "--redis-url", &url, "--", "true"],
        &[],
        secs(20),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let acquired = run
        .stderr
        .lines()
        .find(|l| l.contains("lock acquired"))
        .unwrap_or_else(|| panic!("{run:?}"));
    assert!(acquired.contains(&format!("redis={url}")), "{acquired}");
}
