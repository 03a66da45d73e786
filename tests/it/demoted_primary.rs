//! A demoted primary behind Sentinel: after a failover the old primary still answers as a
//! primary and takes writes for seconds (until Sentinel turns it into a replica, 8-12 s
//! here), and its node stamp does not change, so nothing there looks rolled back. A lock
//! holder or waiter, or a pool that keeps its connection, must not count what it writes
//! there (docs/operations.md, "Sentinel"). The worker has asked the Sentinels after every
//! claim and renewal since it first met Sentinel; `lock` and the pool did not (a breaker:
//! two holders of one lock and of one pool id, fences handed out below earlier ones, 3 of 3
//! runs each).

use std::fs;
use std::path::Path;
use std::thread;
use std::time::Instant;

use serde_json::json;
use tempfile::TempDir;

use crate::harness::*;

/// The command each lock holder runs: a line when it starts and one when it ends (also when
/// stopped: `lock` sends SIGTERM to the command's process group once the lock is lost), with
/// the fence and the time (ns), appended to `$DIR/log`.
const JOB: &str = r#"end() { echo "end $(date +%s%N) $SNOWLEASE_FENCE $ME" >> "$DIR/log"; }; trap 'end; exit 143' TERM; echo "start $(date +%s%N) $SNOWLEASE_FENCE $ME" >> "$DIR/log"; sleep "$HOLD"; end"#;

/// One holding of the lock or of the pool's id: (start, end, fence, who); times in ns (the
/// lock's command) or Redis ms (the pool's leases).
type Held = (u128, u128, u64, String);

/// Sorted by start, each holding ended before the next began, and has a smaller fence.
fn assert_one_at_a_time(mut held: Vec<Held>) {
    held.sort();
    for pair in held.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        assert!(
            a.1 <= b.0,
            "{} (fence {}) still held it when {} (fence {}) began: {held:#?}",
            a.3,
            a.2,
            b.3,
            b.2
        );
        assert!(
            a.2 < b.2,
            "{} held it with fence {} after {} with fence {}: {held:#?}",
            b.3,
            b.2,
            a.3,
            a.2
        );
    }
}

/// The runs in `$DIR/log`; a run without an end line (SIGKILL after the grace) ends at
/// `gone_ns`, when every lock process had exited.
fn runs(dir: &Path, gone_ns: u128) -> Vec<Held> {
    let text = fs::read_to_string(dir.join("log")).unwrap_or_default();
    let mut runs: Vec<Held> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (at, fence, who) = (
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].to_owned(),
        );
        match f[0] {
            "start" => runs.push((at, gone_ns, fence, who)),
            _ => {
                let run = runs
                    .iter_mut()
                    .find(|r| r.2 == fence && r.3 == who)
                    .expect("an end after its start");
                run.1 = at;
            }
        }
    }
    runs
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn lock(url: &str, who: &str, hold: &str, wait: &str, dir: &Path) -> SidecarBuilder {
    SidecarBuilder::new("lock")
        .name(format!("lock {who}"))
        .without("--listen")
        .flag("--name", "job")
        .flag("--redis-url", url)
        .flag("--ttl", "2s")
        .flag("--wait", wait)
        .env("DIR", dir)
        .env("ME", who)
        .env("HOLD", hold)
        .switch("--")
        .switch("sh")
        .switch("-c")
        .switch(JOB)
}

/// A holder that renews across a planned failover, a waiter that waits through it, and a
/// new `lock --wait 0s` every 300 ms for 12 s after it: no two commands ran at once, and
/// each later run has a greater fence. Before, the holder kept renewing on the demoted
/// primary while new holders ran on the new one, and the waiter then acquired there with
/// fence 3 after fences of about 1.8e15 (3 of 3 runs).
#[test]
fn a_lock_never_counts_a_demoted_primary() {
    let topo = SentinelTopology::start_small();
    let url = topo.url();
    let dir = TempDir::new().unwrap();
    let mut opened = lock(&url, "first", "0", "10s", dir.path()).spawn();
    let code = opened.wait_exit(secs(20)).and_then(|s| s.code());
    assert_eq!(code, Some(0), "{:#?}", opened.log_lines());
    let mut procs = vec![lock(&url, "holder", "7", "10s", dir.path()).spawn()];
    assert!(
        poll_until(secs(10), || fs::read_to_string(dir.path().join("log"))
            .is_ok_and(|t| t.contains("holder"))),
        "the holder never ran"
    );
    let waiter = lock(&url, "waiter", "2", "30s", dir.path()).spawn();
    assert!(
        waiter.wait_for_log("waiting for the lock", secs(10)),
        "the waiter never waited: {:#?}",
        waiter.log_lines()
    );
    procs.push(waiter);
    topo.failover();
    let until = Instant::now() + secs(12);
    let mut n = 0;
    while Instant::now() < until {
        procs.push(lock(&url, &format!("new{n}"), "1", "0s", dir.path()).spawn());
        n += 1;
        thread::sleep(ms(300));
    }
    for p in &mut procs {
        let _ = p.wait_exit(secs(40));
    }
    let held = runs(dir.path(), now_ns());
    assert!(held.len() >= 2, "{held:?}");
    assert_one_at_a_time(held);
}

/// `pool serve` keeps its connection across a planned failover while fresh `pool acquire`
/// processes ask the Sentinels: the pool's one id, never released, is leased again only
/// after the lease before it ended, and each lease has a greater fence than the one
/// before. Before, serve leased it on the demoted primary (fences 3, 4, 5) while the CLI
/// leased it on the new one (fence ~1.8e15): two tokens at once (3 of 3 runs).
#[test]
fn a_pool_never_counts_a_demoted_primary() {
    let topo = SentinelTopology::start_small();
    let url = topo.url();
    let env = [("REDIS_URL", url.as_str())];
    let init = run_snowlease(
        &["pool", "init", "--pool", "p", "--ids", "a"],
        &env,
        secs(30),
    );
    assert_eq!(init.code, Some(0), "{init:?}");
    let serve = crate::pool_http::Serve::start_at(
        &url,
        &["--pool", "p", "--max-lease", "3s", "--reap-interval", "1h"],
    );
    let ttl_ms = 3000;
    // A lease of the pool's only id: from its grant to its deadline (Redis ms).
    let grant = |body: &serde_json::Value, by: &str| -> Held {
        let deadline = body["deadline_ms"].as_u64().expect("deadline_ms");
        let fence = body["fence"].as_u64().expect("fence");
        (
            (deadline - ttl_ms).into(),
            deadline.into(),
            fence,
            by.to_owned(),
        )
    };
    let mut grants: Vec<Held> = Vec::new();
    // A 503 is an answer to retry (the Sentinels' check timing out on a loaded machine).
    let mut body = serde_json::Value::Null;
    let warmed = poll_until(secs(10), || {
        let (status, answer, _) =
            serve.call("POST", "/pools/p/leases", Some(json!({"ttl_ms": ttl_ms})));
        body = answer;
        status == 201
    });
    assert!(warmed, "no lease before the failover: {body}");
    let release = json!({"token": body["token"]});
    let (status, _, _) = serve.call("POST", "/pools/p/leases/a/release", Some(release));
    assert_eq!(status, 200);
    topo.failover();
    let until = Instant::now() + secs(12);
    while Instant::now() < until {
        let (status, body, _) =
            serve.call("POST", "/pools/p/leases", Some(json!({"ttl_ms": ttl_ms})));
        if status == 201 {
            grants.push(grant(&body, "serve"));
        }
        let run = run_snowlease(
            &[
                "pool",
                "acquire",
                "--pool",
                "p",
                "--ttl",
                "3s",
                "--max-lease",
                "3s",
            ],
            &env,
            secs(10),
        );
        if run.code == Some(0) {
            let body: serde_json::Value = serde_json::from_str(&run.stdout).expect("JSON");
            grants.push(grant(&body, "cli"));
        }
        thread::sleep(ms(300));
    }
    assert!(!grants.is_empty(), "no lease granted after the failover");
    assert_one_at_a_time(grants);
}
