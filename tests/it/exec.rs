//! The app side: `snowlease exec` in a pod simulated with processes (a shared temporary folder
//! stands for the emptyDir), `snowlease id`, `snowlease install`.

use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;

/// Poll interval given to `exec` in these tests.
const POLL: &str = "100ms";
/// Grace period (`--grace 500ms`) given to `exec` in these tests: below a quarter of the
/// lease's validity (`exec` caps it there), so the SIGKILL after a loss comes after all of it.
const GRACE: Duration = Duration::from_millis(500);

/// App script: writes the ID it got to `$SAW` (atomically) and its PID to `$SAW.pid`, then
/// becomes `sleep` (same PID).
pub(crate) const APP: &str = r#"echo "$WORKER_ID" > "$SAW.tmp" && mv "$SAW.tmp" "$SAW"; echo $$ > "$SAW.pid"; exec sleep 600"#;

/// Like [`APP`], but the app ignores SIGTERM, so only the SIGKILL after `--grace` stops it.
const STUBBORN_APP: &str = r#"trap '' TERM; echo "$WORKER_ID" > "$SAW.tmp" && mv "$SAW.tmp" "$SAW"; echo $$ > "$SAW.pid"; exec sleep 600"#;

/// `snowlease exec <flags> -- sh -c <script>` reading `<pod>/worker-id`, with `SAW` set to
/// `<pod>/<name>.saw`. Flags must come before the command, hence all of them here.
pub(crate) fn exec_app(
    pod: &PodDir,
    name: &str,
    flags: &[(&str, &str)],
    script: &str,
) -> SidecarBuilder {
    let mut builder = SidecarBuilder::new("exec")
        .name(name)
        .pod(pod)
        .without("--listen")
        .flag("--file", pod.worker_id_file().to_string_lossy())
        .flag("--env", "WORKER_ID")
        .flag("--poll", POLL)
        .flag("--grace", "500ms")
        .env("SAW", saw_path(pod, name));
    for (flag, value) in flags {
        builder = builder.flag(flag, *value);
    }
    builder
        .switch("--")
        .switch("sh")
        .switch("-c")
        .switch(script)
}

fn saw_path(pod: &PodDir, name: &str) -> PathBuf {
    pod.path().join(format!("{}.saw", name.replace(' ', "-")))
}

/// The worker ID the app wrote, once it has.
pub(crate) fn wait_app_saw(pod: &PodDir, name: &str, timeout: Duration) -> Option<u32> {
    let path = saw_path(pod, name);
    poll_some(timeout, || {
        fs::read_to_string(&path).ok()?.trim().parse().ok()
    })
}

/// PID the app wrote beside its `saw` file.
pub(crate) fn app_pid(pod: &PodDir, name: &str) -> i32 {
    let mut path = saw_path(pod, name).into_os_string();
    path.push(".pid");
    poll_some(secs(5), || {
        fs::read_to_string(&path).ok()?.trim().parse().ok()
    })
    .expect("app wrote its PID")
}

fn process_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The sidecar of the simulated pod: TTL 3 s, renew every 1 s.
fn pod_sidecar(redis: &RedisServer, pod: &PodDir) -> Sidecar {
    Sidecar::worker(redis, "orders")
        .name("sidecar")
        .pod(pod)
        .flag("--ttl", "3s")
        .flag("--renew-interval", "1s")
        .spawn()
}

/// A pod of processes: the app sees the sidecar's ID; a stolen lease stops the app (SIGTERM
/// ignored, so SIGKILL after --grace) within one renew interval plus the grace period, exit
/// 75; restarted, the app gets the sidecar's new ID; app-then-sidecar termination leaves no
/// key of ours in Redis.
#[test]
fn pod_app_follows_the_sidecars_lease() {
    let redis = RedisServer::start();
    let pod = PodDir::new();
    let mut sidecar = pod_sidecar(&redis, &pod);
    let lease = sidecar.wait_for_lease(secs(10));

    let mut app = exec_app(&pod, "app", &[], STUBBORN_APP).spawn();
    assert_eq!(
        wait_app_saw(&pod, "app", secs(10)),
        Some(lease.worker_id),
        "the app sees the sidecar's ID in WORKER_ID"
    );
    let pid = app_pid(&pod, "app");

    let key = worker_key("orders", lease.worker_id);
    let _: () = redis.query(redis::cmd("SET").arg(&key).arg("other").arg("KEEPTTL"));
    let stolen = Instant::now();
    let status = app.wait_exit(secs(10)).expect("exec exits after the loss");
    let took = stolen.elapsed();
    assert_eq!(status.code(), Some(75), "documented exit code: lease lost");
    // Renew interval 1 s + grace, plus poll (100 ms) and scheduling slack.
    assert!(took < secs(1) + GRACE + ms(800), "stopped after {took:?}");
    assert!(
        took >= GRACE,
        "SIGTERM was ignored, so only SIGKILL after --grace ended it"
    );
    assert!(!process_exists(pid), "the app process is gone");
    assert!(app.count_log("worker ID no longer published") > 0);
    assert!(app.count_log("SIGKILL") > 0);

    let relet = sidecar.wait_for_lease(secs(10));
    assert_ne!(
        relet.worker_id, lease.worker_id,
        "the stolen ID is someone else's"
    );
    let mut restarted = exec_app(&pod, "app restarted", &[], APP).spawn();
    assert_eq!(
        wait_app_saw(&pod, "app restarted", secs(10)),
        Some(relet.worker_id),
        "the restarted app gets the sidecar's new ID"
    );

    // Kubernetes order: the app container first, then the sidecar.
    restarted.signal(Signal::SIGTERM);
    let status = restarted.wait_exit(secs(5)).expect("app exits on SIGTERM");
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "exec exits with the child's status"
    );
    sidecar.signal(Signal::SIGTERM);
    let status = sidecar
        .wait_exit(secs(5))
        .expect("sidecar exits on SIGTERM");
    assert_eq!(status.code(), Some(0));
    let ours: Vec<String> = redis
        .keys(&format!("{PREFIX}orders:*"))
        .into_iter()
        .filter(|k| redis.get(k).as_deref() != Some("other"))
        // The claim guard (`<prefix><app>:guard`) is per app, not a lease, and stays.
        .filter(|k| !k.ends_with(":guard"))
        // So is the ranges record, which expires on its own.
        .filter(|k| !k.ends_with(":ranges"))
        .collect();
    // Released: what is left of ours is the release tombstone (ID handover), nothing else.
    assert!(ours.len() <= 1, "keys left behind: {ours:?}");
    for key in &ours {
        crate::handover::assert_tombstone(&redis, key);
    }
    assert!(!pod.worker_id_file().exists());
}

/// Runs `exec --file FILE FLAGS -- sh -c 'touch MARKER'`: the marker exists only if the
/// command was started.
fn exec_touching(file: &std::path::Path, marker: &std::path::Path, flags: &[&str]) -> Run {
    let mut args = vec!["exec", "--file", file.to_str().unwrap()];
    args.extend_from_slice(flags);
    args.extend(["--", "sh", "-c", "touch \"$MARK\""]);
    run_snowlease(&args, &[("MARK", marker.to_str().unwrap())], secs(10))
}

/// `exec` with no ID published within `--wait`: the command never starts (its marker file is
/// never created), a clear error names the file, exit 3.
#[test]
fn exec_without_published_id_never_starts_the_command() {
    let pod = PodDir::new();
    let marker = pod.path().join("marker");
    let file = pod.worker_id_file();
    let started = Instant::now();
    let run = exec_touching(&file, &marker, &["--wait", "1s", "--poll", "100ms"]);
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(started.elapsed() >= secs(1), "waited --wait");
    assert!(
        run.stderr.contains("no worker ID published") && run.stderr.contains("worker-id"),
        "{run:?}"
    );
    assert!(!marker.exists(), "the command must never start");
}

/// SIGTERM while `exec` waits for an ID: exit 143 (128 + 15), the command never starts, and
/// the last line on stderr says so (before, 143 came without one).
#[test]
fn sigterm_while_waiting_for_an_id_ends_with_a_last_line() {
    let pod = PodDir::new();
    let mut app = exec_app(&pod, "early", &[("--wait", "60s")], APP).spawn();
    assert!(app.wait_for_log("waiting for a worker ID", secs(10)));
    app.signal(Signal::SIGTERM);
    let status = app.wait_exit(secs(5)).expect("exec exits");
    assert_eq!(status.code(), Some(128 + 15));
    let log = app.log_lines();
    let last = log.last().map_or("", String::as_str);
    assert_eq!(
        last,
        "snowlease exec: SIGTERM before any worker ID was published; the command was not started",
        "{log:?}"
    );
    assert_eq!(wait_app_saw(&pod, "early", ms(300)), None, "never started");
}

/// A sidecar killed with SIGKILL leaves its ID file behind: the running app is stopped by the
/// state file's `valid_until_ms` (SIGTERM the grace before it; exit 75), and after that deadline
/// a new `exec` refuses the stale ID (exit 3).
#[test]
fn stale_id_after_sidecar_crash_stops_and_refuses_the_app() {
    let redis = RedisServer::start();
    let pod = PodDir::new();
    let sidecar = Sidecar::worker(&redis, "orders")
        .pod(&pod)
        .flag("--ttl", "2s")
        .spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    let mut app = exec_app(&pod, "app", &[], APP).spawn();
    assert_eq!(wait_app_saw(&pod, "app", secs(10)), Some(lease.worker_id));

    sidecar.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let status = app.wait_exit(secs(10)).expect("exec stops the app");
    assert_eq!(status.code(), Some(75));
    let valid_until_ms = sidecar.read_state().expect("state file left behind")["valid_until_ms"]
        .as_u64()
        .expect("valid_until_ms");
    assert!(
        unix_ms() <= valid_until_ms + 50,
        "stopped by the deadline, not after it"
    );
    assert!(
        killed.elapsed() < secs(2) + ms(800),
        "{:?}",
        killed.elapsed()
    );
    assert!(
        pod.worker_id_file().exists(),
        "the ID file is still there: the state file's deadline decided"
    );
    assert!(app.count_log("stale") > 0, "{:?}", app.log_lines());

    // Once the deadline has passed, the ID is stale for good.
    assert!(poll_until(secs(5), || unix_ms() > valid_until_ms));
    let marker = pod.path().join("marker");
    let run = exec_touching(&pod.worker_id_file(), &marker, &["--wait", "300ms"]);
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(run.stderr.contains("stale"), "{run:?}");
    assert!(!marker.exists());
}

/// A frozen sidecar (SIGSTOP) leaves a fresh-looking ID file whose deadline nobody extends; Redis
/// frees the ID ~100 ms after that deadline. `exec` with a `--grace` longer than the lease
/// (10 s, capped at a quarter of the 1.9 s validity, with a warning) sends SIGTERM that much
/// before the deadline and SIGKILL at it: the app that ignores SIGTERM is gone by the deadline
/// (exit 75), while it kept running through every renewal before.
#[test]
fn frozen_sidecar_app_is_gone_by_the_deadline() {
    let redis = RedisServer::start();
    let pod = PodDir::new();
    let sidecar = Sidecar::worker(&redis, "orders").pod(&pod).spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    let mut app = exec_app(&pod, "app", &[("--grace", "10s")], STUBBORN_APP).spawn();
    assert_eq!(wait_app_saw(&pod, "app", secs(10)), Some(lease.worker_id));
    let pid = app_pid(&pod, "app");
    thread::sleep(secs(2));
    assert!(
        app.is_running(),
        "renewals keep the app running: {:?}",
        app.log_lines()
    );
    assert!(app.count_log("more than a quarter of the lease's validity") > 0);

    sidecar.pause();
    let state = sidecar.read_state().expect("state file");
    let valid_until_ms = state["valid_until_ms"].as_u64().expect("valid_until_ms");
    assert!(poll_until(secs(5), || !process_exists(pid)), "app stopped");
    let gone_ms = unix_ms();
    let status = app.wait_exit(secs(5)).expect("exec exits");
    sidecar.resume();
    assert_eq!(status.code(), Some(75));
    // SIGKILL at the deadline; allow for this test's polling (and ms rounding).
    assert!(
        gone_ms <= valid_until_ms + 50,
        "app gone {} ms after the deadline",
        gone_ms.saturating_sub(valid_until_ms)
    );
    assert!(app.count_log("goes stale") > 0, "{:?}", app.log_lines());
    assert!(app.count_log("SIGKILL") > 0);
}

/// `exec --url` reads `GET /id` of the sidecar: the app sees the ID, and a stolen lease (503 at
/// the next renew) stops it with exit 75.
#[test]
fn exec_over_http_follows_the_lease() {
    let redis = RedisServer::start();
    let pod = PodDir::new();
    let sidecar = pod_sidecar(&redis, &pod);
    let lease = sidecar.wait_for_lease(secs(10));
    let url = format!("http://{}", sidecar.http_addr());
    let mut app = exec_app(&pod, "app", &[("--url", &url)], APP)
        .without("--file")
        .spawn();
    assert_eq!(wait_app_saw(&pod, "app", secs(10)), Some(lease.worker_id));

    let key = worker_key("orders", lease.worker_id);
    let _: () = redis.query(redis::cmd("SET").arg(&key).arg("other").arg("KEEPTTL"));
    let stolen = Instant::now();
    let status = app.wait_exit(secs(10)).expect("exec exits after the loss");
    assert_eq!(status.code(), Some(75));
    assert!(
        stolen.elapsed() < secs(1) + ms(800),
        "{:?}",
        stolen.elapsed()
    );
}

/// Publishes `worker_id` the way the sidecar does, without a state file (no deadline).
fn publish_by_hand(pod: &PodDir, worker_id: u32) {
    let tmp = pod.path().join(".worker-id.tmp");
    fs::write(&tmp, format!("{worker_id}\n")).unwrap();
    fs::rename(&tmp, pod.worker_id_file()).unwrap();
}

/// The published ID changes under a running app (5, then 6, by hand, without a state file): the
/// app's ID is someone else's now, so `exec` stops it (SIGTERM; `sleep` obeys) and exits 75.
#[test]
fn exec_stops_the_app_when_the_published_id_changes() {
    let pod = PodDir::new();
    publish_by_hand(&pod, 5);
    let mut app = exec_app(&pod, "app", &[], APP).spawn();
    assert_eq!(wait_app_saw(&pod, "app", secs(10)), Some(5));
    let pid = app_pid(&pod, "app");
    assert!(app.is_running() && process_exists(pid));

    publish_by_hand(&pod, 6);
    let changed = Instant::now();
    let status = app.wait_exit(secs(5)).expect("exec exits after the change");
    assert_eq!(status.code(), Some(75), "documented exit code: lease lost");
    assert!(
        changed.elapsed() < GRACE + secs(1),
        "stopped after {:?}",
        changed.elapsed()
    );
    assert!(!process_exists(pid), "the app process is gone");
    assert!(
        app.count_log("changed to 6") > 0,
        "the reason names the new ID: {:?}",
        app.log_lines()
    );
    assert_eq!(
        fs::read_to_string(saw_path(&pod, "app")).unwrap().trim(),
        "5",
        "the app only ever saw ID 5"
    );
}

/// A descendant that left the command's process group with `setsid` (exec not PID 1, e.g.
/// `shareProcessNamespace: true`) still carries `WORKER_ID`: when the ID is lost, `exec` stops
/// it too (it is a child subreaper), not only the process group.
#[test]
fn exec_stops_descendants_that_called_setsid() {
    let pod = PodDir::new();
    publish_by_hand(&pod, 5);
    let pid_file = pod.path().join("escaped.pid");
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 1001' & exec sleep 10001",
        pid_file.display()
    );
    let mut app = exec_app(&pod, "app", &[], &script).spawn();
    let escaped: i32 = poll_some(secs(10), || {
        fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .expect("the setsid child started");
    assert!(process_exists(escaped));
    fs::remove_file(pod.worker_id_file()).unwrap();
    let status = app.wait_exit(secs(5)).expect("exec exits after the loss");
    assert_eq!(status.code(), Some(75));
    assert!(
        poll_until(secs(2), || !process_exists(escaped)),
        "the setsid descendant {escaped} still runs with the lost worker ID"
    );
}

/// SIGTERM and SIGINT reach the command, and `exec` exits with the command's status (its code,
/// or 128 + signal when the signal killed it).
#[test]
fn exec_forwards_signals_and_exits_with_the_commands_status() {
    let pod = PodDir::new();
    publish_by_hand(&pod, 5);
    let trapping = r#"trap 'exit 7' TERM; trap 'exit 8' INT; echo "$WORKER_ID" > "$SAW"; while :; do sleep 0.05; done"#;
    for (signal, code) in [(Signal::SIGTERM, 7), (Signal::SIGINT, 8)] {
        let name = format!("trap {signal}");
        let mut app = exec_app(&pod, &name, &[], trapping).spawn();
        assert_eq!(wait_app_saw(&pod, &name, secs(10)), Some(5));
        app.signal(signal);
        let status = app.wait_exit(secs(5)).expect("exec exits");
        assert_eq!(status.code(), Some(code), "{signal}");
    }
    let mut app = exec_app(&pod, "plain", &[], APP).spawn();
    assert_eq!(wait_app_saw(&pod, "plain", secs(10)), Some(5));
    app.signal(Signal::SIGTERM);
    let status = app.wait_exit(secs(5)).expect("exec exits");
    assert_eq!(status.code(), Some(128 + 15));
}

/// As PID 1 of a PID namespace (`unshare --pid --fork`), `exec` still gets SIGTERM (explicit
/// handlers), forwards it, reaps orphans handed to it, and exits with the command's status.
/// Needs `unshare --pid` (see [`pid1_tests_can_run`]).
#[test]
fn exec_works_as_pid_1() {
    if !pid1_tests_can_run() {
        return;
    }
    let pod = PodDir::new();
    publish_by_hand(&pod, 9);
    // The inner sh is orphaned at once, so PID 1 (our exec) must reap it when it ends.
    let script = r#"trap 'exit 7' TERM; (sh -c 'sleep 0.2; touch "$SAW.orphan"' &); echo "$WORKER_ID" > "$SAW"; while :; do sleep 0.05; done"#;
    let mut app = exec_app(&pod, "pid1", &[], script)
        .wrap(&["unshare", "--pid", "--fork"])
        .spawn();
    assert_eq!(wait_app_saw(&pod, "pid1", secs(10)), Some(9));
    let orphan_done = saw_path(&pod, "pid1").with_extension("saw.orphan");
    assert!(poll_until(secs(5), || orphan_done.exists()), "orphan ran");
    let exec_pid = app.pid();
    assert!(
        poll_until(secs(3), || child_pids(exec_pid).len() == 1),
        "orphan reaped; only the command is left: {:?}",
        child_pids(exec_pid)
    );
    app.signal(Signal::SIGTERM);
    let status = app.wait_exit(secs(5)).expect("exec exits");
    assert_eq!(status.code(), Some(7));
}

/// A command that does not exist: exit 127 and a message naming it.
#[test]
fn exec_reports_a_missing_command() {
    let pod = PodDir::new();
    publish_by_hand(&pod, 1);
    let run = run_snowlease(
        &[
            "exec",
            "--file",
            pod.worker_id_file().to_str().unwrap(),
            "--",
            "/nonexistent/app",
        ],
        &[],
        secs(10),
    );
    assert_eq!(run.code, Some(127), "{run:?}");
    assert!(run.stderr.contains("/nonexistent/app"), "{run:?}");
}

/// Bad `exec` flags exit 2 naming the flag, before anything runs.
#[test]
fn exec_bad_flags_exit_2() {
    for (args, flag) in [
        (&["exec", "--env", "9X", "--", "true"][..], "--env"),
        (&["exec", "--url", "https://h:1", "--", "true"][..], "--url"),
        (&["exec", "--poll", "0s", "--", "true"][..], "--poll"),
    ] {
        let run = run_snowlease(args, &[], secs(10));
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
        assert!(run.stderr.contains(flag), "{args:?}: {run:?}");
    }
}

/// One env name per concept: `SNOWLEASE_ID_FILE` points `exec` and `id` alike at the ID file.
#[test]
fn exec_and_id_share_the_id_file_variable() {
    let pod = PodDir::new();
    publish_by_hand(&pod, 9);
    let file = pod.worker_id_file();
    let env = [("SNOWLEASE_ID_FILE", file.to_str().unwrap())];
    let id = run_snowlease(&["id"], &env, secs(10));
    assert_eq!((id.code, id.stdout.as_str()), (Some(0), "9"), "{id:?}");
    let exec = run_snowlease(
        &["exec", "--", "sh", "-c", "echo $WORKER_ID"],
        &env,
        secs(10),
    );
    assert_eq!(
        (exec.code, exec.stdout.as_str()),
        (Some(0), "9"),
        "{exec:?}"
    );
}

/// `snowlease id` prints the published ID, exits 3 when none, and `--wait` picks up an ID
/// published later.
#[test]
fn id_prints_the_published_id_for_scripts() {
    let pod = PodDir::new();
    let file = pod.worker_id_file();
    let file = file.to_str().unwrap();
    let run = run_snowlease(&["id", "--file", file], &[], secs(10));
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(
        run.stdout.is_empty() && run.stderr.contains("no worker ID"),
        "{run:?}"
    );

    const DELAY: Duration = Duration::from_millis(300);
    let started = Instant::now();
    let later = {
        let pod = pod.clone();
        thread::spawn(move || {
            thread::sleep(DELAY);
            publish_by_hand(&pod, 12);
        })
    };
    let run = run_snowlease(&["id", "--file", file, "--wait", "5s"], &[], secs(10));
    let took = started.elapsed();
    later.join().unwrap();
    assert_eq!((run.code, run.stdout.as_str()), (Some(0), "12"), "{run:?}");
    assert!(
        took >= DELAY,
        "`id --wait` returned after {took:?}, before the ID was published ({DELAY:?})"
    );
    assert!(
        took < DELAY + secs(2),
        "`id --wait 5s` must return soon after the ID appears, not at the end of its wait: {took:?}"
    );
}

/// `snowlease id --url` against a live sidecar prints the same ID as `/id`.
#[test]
fn id_over_http_matches_the_sidecar() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    let url = format!("http://{}", sidecar.http_addr());
    let run = run_snowlease(&["id", "--url", &url], &[], secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stdout, lease.worker_id.to_string());
}

/// The full `/id` URL (as the `/id` table of docs/worker.md shows it) works like the base URL, in `id`
/// and `exec` alike; it is not turned into `/id/id`.
#[test]
fn id_and_exec_accept_the_full_id_url() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    let url = format!("http://{}/id", sidecar.http_addr());
    let run = run_snowlease(&["id", "--url", &url], &[], secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stdout, lease.worker_id.to_string());
    let run = run_snowlease(
        &[
            "exec",
            "--url",
            &url,
            "--wait",
            "5s",
            "--",
            "sh",
            "-c",
            "echo $WORKER_ID",
        ],
        &[],
        secs(10),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stdout, lease.worker_id.to_string());
}

/// `snowlease install DIR` copies a working binary (for an init container without `cp`).
#[test]
fn install_copies_a_working_binary() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("bin");
    let run = run_snowlease(&["install", target.to_str().unwrap()], &[], secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    let copied = target.join("snowlease");
    assert_eq!(run.stdout, copied.to_str().unwrap());
    let out = std::process::Command::new(&copied)
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("snowlease "));
}

/// `snowlease install DIR | true`: a closed stdout is a clear error with exit 1, never a panic
/// (exit 134 with `panic = "abort"`).
#[test]
fn closed_stdout_is_an_error_not_a_panic() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    drop(read_end);
    let out = Command::new(BIN)
        .args(["install", dir.path().to_str().unwrap()])
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stdout"), "{stderr}");
}

/// An orderly stop of the sidecar (SIGTERM: it releases the ID) stops the app with exit 75
/// and says "released", with no ERROR line; a loss (the key taken over) still logs ERROR
/// "lost". Before, both said ERROR "lost". Over the ID file (the default); over HTTP a
/// sidecar that is gone cannot say it stopped in order (only a `503 stopping` seen in time).
#[test]
fn exec_says_released_for_an_orderly_sidecar_stop_and_lost_for_a_loss() {
    let redis = RedisServer::start();
    {
        let pod = PodDir::new();
        let mut sidecar = pod_sidecar(&redis, &pod);
        let lease = sidecar.wait_for_lease(secs(10));
        let mut app = exec_app(&pod, "released", &[], APP).spawn();
        assert_eq!(
            wait_app_saw(&pod, "released", secs(10)),
            Some(lease.worker_id)
        );
        sidecar.signal(Signal::SIGTERM);
        assert_eq!(sidecar.wait_exit(secs(5)).and_then(|s| s.code()), Some(0));
        let status = app.wait_exit(secs(10)).expect("exec exits");
        assert_eq!(status.code(), Some(75));
        let lines = app.log_lines().join("\n");
        assert!(lines.contains("released"), "{lines}");
        assert!(!lines.contains("\"level\":\"ERROR\""), "{lines}");
    }

    // A loss: the key is taken over by hand.
    let pod = PodDir::new();
    let sidecar = pod_sidecar(&redis, &pod);
    let lease = sidecar.wait_for_lease(secs(10));
    let mut app = exec_app(&pod, "lost", &[], APP).spawn();
    assert_eq!(wait_app_saw(&pod, "lost", secs(10)), Some(lease.worker_id));
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(worker_key("orders", lease.worker_id))
            .arg("thief#1"),
    );
    let status = app.wait_exit(secs(10)).expect("exec exits");
    assert_eq!(status.code(), Some(75));
    let lines = app.log_lines().join("\n");
    assert!(lines.contains("\"level\":\"ERROR\""), "{lines}");
    assert!(lines.contains("lost"), "{lines}");
}
