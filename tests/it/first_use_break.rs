//! Breaking "First use" (docs/rollback-design.md): a new store's first record is said durable
//! as soon as a `BGSAVE` *starts*. Redis counts `rdb_saves` when it forks the snapshot child
//! (`rdbSaveBackground`: `server.stat_rdb_saves++` before `fork`), not when the snapshot is on
//! disk, and `durable.rs` takes `rdb_saves` above the count it saw for "a snapshot started
//! after them finished". So a slow snapshot (a large data set) that a crash interrupts, or a
//! snapshot that fails, leaves nothing on disk while the store already opened at fence 1.

use std::fs;
use std::path::Path;

use nix::sys::signal::{Signal, kill};
use tempfile::TempDir;

use crate::harness::*;

const HOLDER_JOB: &str = r#"
echo "$SNOWLEASE_FENCE" > "$DIR/$ME.fence"
echo $$ > "$DIR/$ME.pid"
while [ ! -e "$DIR/$ME.go" ]; do sleep 0.02; done
"#;

fn wait_value(path: &Path) -> Option<u64> {
    poll_some(secs(30), || {
        fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
    })
}

/// A slow snapshot (300 keys x 100 ms: 30 s, as a large data set) and a crash while it runs:
/// `a` took the new lock "job" with fence 1 within a second (its record "durable" because the
/// BGSAVE had *started*). The restart loads the older `dump.rdb`: no record, so `b`'s first
/// use opens at once, fence 1 again, while `a`'s command still runs.
///
/// Since a snapshot counts only once none runs and the last one succeeded, `a` waits 12 s
/// for it, and the lock opens by its own time (one TTL) without a durable record; the
/// restart then loses that record too, and `b`'s first use (now durable at once) opens and
/// hands out fence 1 while `a` runs with a lifted fence: a known limit
/// (docs/rollback-design.md, "First use", "Not covered").
#[test]
#[ignore = "known limit (docs/rollback-design.md, First use: a record never durable, then a rollback): fails today"]
fn lock_first_use_during_a_slow_snapshot_then_a_crash_is_not_handed_out_twice() {
    let mut redis = RedisServer::start();
    for i in 0..300 {
        let _: () = redis.query(redis::cmd("SET").arg(format!("filler:{i}")).arg(i));
    }
    // The last snapshot on disk: before the lock's first use.
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let _: () = redis.query(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("rdb-key-save-delay")
            .arg(100_000),
    );
    let dir = TempDir::new().unwrap();
    let _a = SidecarBuilder::new("lock")
        .name("lock a")
        .without("--listen")
        .flag("--name", "job")
        .flag("--redis-url", redis.url())
        .flag("--ttl", "10s")
        .flag("--wait", "12s")
        .env("DIR", dir.path())
        .env("ME", "a")
        .switch("--")
        .switch("sh")
        .switch("-c")
        .switch(HOLDER_JOB)
        .spawn();
    let fence_a = wait_value(&dir.path().join("a.fence")).expect("a runs");
    let pid_a = wait_value(&dir.path().join("a.pid")).expect("a runs");
    let saving = redis.info_field("persistence", "rdb_bgsave_in_progress");
    // The crash takes the snapshot child with it (a node lost, an OOM kill of the pod).
    for child in child_pids(redis.pid()) {
        let _ = kill(child, Signal::SIGKILL);
    }
    redis.restart();
    let b_fence = dir.path().join("b.fence");
    let run = run_snowlease(
        &[
            "lock",
            "--name",
            "job",
            "--redis-url",
            &redis.url(),
            "--ttl",
            "10s",
            "--",
            "sh",
            "-c",
            "echo \"$SNOWLEASE_FENCE\" > \"$OUT\"",
        ],
        &[("OUT", b_fence.to_str().unwrap())],
        secs(20),
    );
    let a_running = Path::new(&format!("/proc/{pid_a}")).exists();
    fs::write(dir.path().join("a.go"), "").unwrap();
    let fence_b = fs::read_to_string(&b_fence).ok();
    assert!(a_running, "a's command ran through b's attempt");
    assert!(
        fence_b.is_none(),
        "b ran with fence {fence_b:?} while a (fence {fence_a}) still ran; the snapshot \
         was still in progress ({saving:?}) when a opened; b: {run:?}"
    );
}

/// A snapshot that fails (here `dump.rdb` is a folder, as a full or read-only disk): the
/// docs say the new lock stays closed for its TTL; it opens at once with fence 1.
#[test]
fn lock_first_use_with_a_failing_snapshot_stays_closed() {
    let redis = RedisServer::start();
    fs::create_dir_all(redis.dir().join("dump.rdb").join("x")).unwrap();
    let out = redis.dir().join("fence.out");
    let run = run_snowlease(
        &[
            "lock",
            "--name",
            "job",
            "--redis-url",
            &redis.url(),
            "--ttl",
            "20s",
            "--",
            "sh",
            "-c",
            "echo \"$SNOWLEASE_FENCE\" > \"$OUT\"",
        ],
        &[("OUT", out.to_str().unwrap())],
        secs(30),
    );
    let status = redis.info_field("persistence", "rdb_last_bgsave_status");
    let _ = fs::remove_dir_all(redis.dir().join("dump.rdb"));
    assert_eq!(
        run.code,
        Some(69),
        "the snapshot failed ({status:?}) yet the new lock opened: fence {:?}; {run:?}",
        fs::read_to_string(&out).ok()
    );
}
