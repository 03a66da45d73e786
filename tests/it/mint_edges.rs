//! Mint mode's edges: clock settings that start-up accepts never stall minting.

use crate::clock_skew::set_offset;
use crate::harness::*;
use crate::mint_worker::{APP, faked_at, first_batch, next};

/// A clock 600 ms ahead of Redis, within `--max-clock-skew 1s`, with `--mint-window 200ms`:
/// the sidecar trusts its clock (a forward re-anchor) and asks for reservations up to the
/// clock + the window. Before, `reserve.lua` capped them at Redis' TIME + the window, below the
/// clock, so every `/next` answered `503 reserving` for good; now the cap adds the skew the
/// clock is trusted within, and the sidecar mints, and keeps minting.
#[test]
fn a_clock_ahead_within_the_skew_never_stalls_minting() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");
    set_offset(&stamp, "+0.6");
    let sidecar = faked_at(&redis.url(), &stamp)
        .flag("--mint-window", "200ms")
        .flag("--max-clock-skew", "1s")
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .spawn();
    let first = first_batch(&sidecar, 16);
    assert_eq!(first.len(), 16);
    // Well past several windows: still minting.
    let end = std::time::Instant::now() + secs(3);
    let mut minted = 0;
    while std::time::Instant::now() < end {
        if let Ok(batch) = next(&sidecar, 64) {
            minted += batch.len();
        }
    }
    assert!(minted > 1000, "only {minted} IDs in 3 s");
    let last = next(&sidecar, 1);
    assert!(last.is_ok(), "{last:?}");
}

/// One raw HTTP/1.1 request to the sidecar's `--listen` port: the status line's code.
fn raw_status(sidecar: &Sidecar, method: &str, target: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(sidecar.http_addr()).unwrap();
    let head = format!("{method} {target} HTTP/1.1\r\nHost: mint\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"))
}

/// `HEAD /next` mints nothing (axum would run the GET handler and drop its IDs: counted as
/// answered, never delivered): 405. `Accept` is matched without regard to case and honours
/// `q=0`: `Text/Plain` gets text, `text/plain;q=0` JSON.
#[test]
fn head_mints_nothing_and_accept_is_negotiated() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let sidecar = crate::mint_worker::minter_at(&redis.url())
        .flag("--max-worker-id", "0")
        .spawn();
    first_batch(&sidecar, 1);
    let minted = || sidecar.metric("snowlease_ids_minted_total").unwrap();
    let before = minted();
    for _ in 0..3 {
        assert_eq!(raw_status(&sidecar, "HEAD", "/next?count=4096"), 405);
    }
    assert_eq!(minted(), before, "HEAD minted IDs");

    let (status, body) = sidecar.http_get("/next", Some("Text/Plain"));
    assert_eq!(status, 200);
    assert!(body.trim().parse::<u64>().is_ok(), "text: {body:?}");
    let (status, body) = sidecar.http_get("/next", Some("text/plain;q=0, application/json"));
    assert_eq!(status, 200);
    assert!(body.starts_with("{\"id\":"), "JSON: {body:?}");
}

/// A `--mint-socket` path of 100 bytes (107 is the most a socket address holds): bound and
/// served. Before, the temporary name `<path>.<pid>.tmp` it was bound under overflowed the
/// address and start-up failed ("path must be shorter than SUN_LEN"). Nothing but the socket
/// is left in its folder.
#[test]
fn a_mint_socket_path_of_100_bytes_is_served() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let base = pod.path().to_string_lossy().len() + 1;
    let socket = pod.path().join("s".repeat(100 - base));
    assert_eq!(socket.as_os_str().len(), 100);
    let sidecar = crate::mint_worker::minter_at(&redis.url())
        .pod(&pod)
        .flag("--max-worker-id", "0")
        .flag("--mint-socket", socket.to_string_lossy())
        .switch("--next-on-listen")
        .spawn();
    first_batch(&sidecar, 1);
    let answer = crate::mint_worker::socket_get(&socket, "/next", "text/plain");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let leftovers: Vec<String> = std::fs::read_dir(pod.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Switching a pod's sidecar to `--mint` under a running app: the plain sidecar is killed
/// (its release never reaches Redis) and comes back with `--mint` on the same volume while
/// the app under `exec` still runs with `WORKER_ID=0`. The new sidecar re-adopts ID 0 but
/// mints nothing while the app lives (it waits for the app's recorded deadline, which `exec`
/// stops the app before). Before, it minted at once, 0.4-0.95 s before the app stopped.
#[test]
fn switching_to_mint_under_a_running_app_mints_only_once_the_app_is_gone() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let lease = |b: SidecarBuilder| {
        b.pod(&pod)
            .flag("--max-worker-id", "0")
            .flag("--ttl", "4s")
            .flag("--renew-interval", "1s")
    };
    let mut plain = lease(Sidecar::worker(&redis, APP).name("plain")).spawn();
    plain.wait_for_lease(secs(10));
    let _app = crate::exec::exec_app(&pod, "app", &[], crate::exec::APP).spawn();
    assert_eq!(crate::exec::wait_app_saw(&pod, "app", secs(10)), Some(0));
    let app_pid = crate::exec::app_pid(&pod, "app");
    plain.signal(Signal::SIGKILL);
    let _ = plain.wait_exit(secs(5));
    // ID 0 minted on this node before (a missing mark would be raised and hold minting
    // back on its own: rollback.rs).
    let mark = snowlease::worker_id::keys::MintKeys::new(PREFIX, APP).mark(&worker_key(APP, 0));
    redis.set_stamped(&mark, 0);

    let minter = lease(crate::mint_worker::minter_at(&redis.url()).name("minter")).spawn();
    let alive = || std::path::Path::new(&format!("/proc/{app_pid}")).exists();
    let end = std::time::Instant::now() + secs(15);
    let mut minted = false;
    while std::time::Instant::now() < end && !minted {
        if next(&minter, 1).is_ok() {
            assert!(
                !alive(),
                "minted with worker ID 0 while the app still runs on it"
            );
            minted = true;
        }
        std::thread::sleep(ms(10));
    }
    assert!(minted, "the minter never minted");
    assert!(
        minter.wait_for_log("last published to an app", secs(1)),
        "the wait is explained"
    );
}

/// The reverse: a mint-mode sidecar whose clock runs 400 ms ahead (within
/// `--max-clock-skew`) mints, is killed, and comes back without `--mint` on the same volume.
/// It re-adopts the ID but publishes it only once Redis' TIME has passed the ID's high-water
/// mark by the skew, so the app's own generator starts above every minted timestamp. Before,
/// it published at once, below the minted timestamps.
#[test]
fn switching_from_mint_publishes_only_past_the_minted_ids() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");
    set_offset(&stamp, "+0.4");
    let pod = PodDir::new();
    let mut ahead = faked_at(&redis.url(), &stamp)
        .name("ahead")
        .pod(&pod)
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .spawn();
    let mut ids = first_batch(&ahead, 64);
    let end = std::time::Instant::now() + ms(500);
    while std::time::Instant::now() < end {
        ids.extend(next(&ahead, 256).unwrap_or_default());
    }
    ahead.signal(Signal::SIGKILL);
    let _ = ahead.wait_exit(secs(5));
    let newest = ids
        .iter()
        .map(|id| crate::mint_worker::unix_ms_of(*id))
        .max()
        .unwrap();

    let plain = Sidecar::worker(&redis, APP)
        .name("plain")
        .pod(&pod)
        .flag("--max-worker-id", "0")
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .spawn();
    let published = poll_some(secs(15), || plain.id().map(|_| unix_ms())).expect("published");
    assert!(
        published > newest,
        "published at {published}, below the newest minted timestamp {newest}"
    );
}

/// A new ID format as docs/kubernetes.md ("Upgrading") has it, followed to the letter: the
/// old app's pods stop, `status` lists no key, `mint carry-over`, `guard open`, then the new
/// app's pods start with an epoch 3 s later. No ID of the new app equals one of the old app
/// (all are above them). Without the carry-over step the new app's IDs at t were the old
/// app's at t - 3 s: 390,913 and 700,417 IDs twice in the runs that found it.
#[test]
fn a_format_change_as_the_docs_give_it_never_mints_an_old_id() {
    let redis = RedisServer::start();
    let url = redis.url();
    let minter = |app: &str, epoch: &str| {
        Sidecar::worker_at(&url, app)
            .name(app)
            .switch("--mint")
            .flag("--mint-window", "500ms")
            .flag("--max-worker-id", "0")
            .flag("--epoch", epoch)
    };
    let old_epoch = "1288834974657";
    redis.open_claim_guard("fmt-old");
    let mut old = minter("fmt-old", old_epoch).spawn();
    let mut old_ids = first_batch(&old, 256);
    let end = std::time::Instant::now() + secs(4);
    while std::time::Instant::now() < end {
        old_ids.extend(next(&old, 256).unwrap_or_default());
    }
    // 1-2: the old pods stop; wait until `status` lists no key of the old app.
    old.signal(Signal::SIGTERM);
    assert!(old.wait_exit(secs(10)).is_some());
    let status = || {
        run_snowlease(
            &["status", "--app", "fmt-old", "--json", "--redis-url", &url],
            &[],
            secs(10),
        )
    };
    assert!(
        poll_until(secs(10), || {
            let run = status();
            serde_json::from_str::<serde_json::Value>(&run.stdout)
                .is_ok_and(|s| s["held"] == 0 && s["released"] == 0)
        }),
        "{:?}",
        status()
    );
    // 2b: carry the old app's IDs over.
    let new_epoch = "1288834977657";
    let carry = run_snowlease(
        &[
            "mint",
            "carry-over",
            "--from-app",
            "fmt-old",
            "--app",
            "fmt-new",
            "--max-worker-id",
            "0",
            "--epoch",
            new_epoch,
            "--redis-url",
            &url,
        ],
        &[],
        secs(10),
    );
    assert_eq!(carry.code, Some(0), "{carry:?}");
    let report: serde_json::Value = serde_json::from_str(&carry.stdout).unwrap();
    assert!(report["wait_ms"].as_u64().unwrap() > 1_000, "{report}");
    // 3: open the new app's guard and start its pods.
    let open = guard_open(&url, "fmt-new", &["--max-worker-id", "0"]);
    assert_eq!(open.code, Some(0), "{open:?}");
    let new = minter("fmt-new", new_epoch).spawn();
    let mut new_ids = first_batch(&new, 256);
    let end = std::time::Instant::now() + secs(2);
    while std::time::Instant::now() < end {
        new_ids.extend(next(&new, 256).unwrap_or_default());
    }
    let old_set: std::collections::BTreeSet<u64> = old_ids.iter().copied().collect();
    let twice = new_ids.iter().filter(|id| old_set.contains(id)).count();
    assert_eq!(
        twice, 0,
        "{twice} IDs of the new app were minted by the old one"
    );
    let (oldest_new, newest_old) = (new_ids.iter().min().unwrap(), old_set.last().unwrap());
    assert!(oldest_new > newest_old, "{oldest_new} <= {newest_old}");
}

/// `mint carry-over` waits until its raised floors are on every replica before it says done:
/// with the replica of a Sentinel topology stopped (SIGSTOP) it exits 3 naming the replicas'
/// offsets (written, not durable: a failover to that replica would lose the floors); run
/// again once the replica runs, it exits 0 and says what holds the writes.
#[test]
fn carry_over_waits_for_its_floors_to_reach_every_replica() {
    let topo = SentinelTopology::start_small();
    let url = topo.url();
    topo.wait_replicas_in_sync();
    let replica = 1 - topo.primary_index();
    topo.nodes()[replica].pause();
    let run = carry_over(&url, &["--durable-wait", "2s"]);
    topo.nodes()[replica].resume();
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(run.stderr.contains("replicas did not catch up"), "{run:?}");
    assert!(run.stderr.contains("safe to run again"), "{run:?}");
    let run = carry_over(&url, &["--durable-wait", "10s"]);
    assert_durable(&run, "1 replica(s) have the writes");
}

/// A replica the primary drops during the wait (its link stalled past `repl-timeout`, 2 s
/// here) never got the writes, yet a failover may still pick it: the wait must fail, not
/// count the replicas left (zero, and so "all caught up", as before the fix).
#[test]
fn carry_over_fails_when_a_replica_is_dropped_during_the_wait() {
    let topo = SentinelTopology::start_small();
    let url = topo.url();
    topo.wait_replicas_in_sync();
    let primary = &topo.nodes()[topo.primary_index()];
    let replica = 1 - topo.primary_index();
    let timeout = |secs: &str| {
        let _: () = primary.query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("repl-timeout")
                .arg(secs),
        );
    };
    timeout("2");
    topo.nodes()[replica].pause();
    let run = carry_over(&url, &["--durable-wait", "8s"]);
    topo.nodes()[replica].resume();
    timeout("60");
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(run.stderr.contains("dropped"), "{run:?}");
}

/// On a Cluster `mint carry-over` waits for the replica of every shard (its floors spread
/// over the shards by worker ID) and says so.
#[test]
fn carry_over_on_a_cluster_waits_for_every_shards_replica() {
    let cluster = ClusterTopology::start();
    let run = carry_over(&cluster.url(), &[]);
    assert_durable(&run, "3 replica(s) have the writes");
}

/// With AOF on (`appendfsync everysec`, the default) carry-over waits out the fsync within
/// `--durable-wait`: a wait too short for it is exit 3, not a sleep past the wait.
#[test]
fn carry_over_with_aof_waits_for_the_fsync_within_the_wait() {
    let redis = RedisServer::start_with(RedisOptions {
        args: ["--appendonly", "yes"].map(String::from).to_vec(),
        ..RedisOptions::default()
    });
    let run = carry_over(&redis.url(), &["--durable-wait", "2s"]);
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(run.stderr.contains("appendfsync everysec"), "{run:?}");
    let run = carry_over(&redis.url(), &[]);
    assert_durable(&run, "the AOF fsynced them (everysec)");
}

/// With AOF `always` nothing is waited for (the AOF is fsynced before Redis replies); with
/// `no` durability cannot be promised: exit 0, `durability_unchecked` and a warning naming it.
#[test]
fn carry_over_with_aof_always_or_no_says_so() {
    for (fsync, expect) in [("always", Some("(always)")), ("no", None)] {
        let redis = RedisServer::start_with(RedisOptions {
            args: ["--appendonly", "yes", "--appendfsync", fsync]
                .map(String::from)
                .to_vec(),
            ..RedisOptions::default()
        });
        let run = carry_over(&redis.url(), &[]);
        match expect {
            Some(says) => assert_durable(&run, says),
            None => {
                assert_eq!(run.code, Some(0), "{run:?}");
                let line: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
                let why = line["durability_unchecked"].as_str().unwrap_or_default();
                assert!(why.contains("appendfsync no"), "{line}");
                assert!(run.stderr.contains("warning:"), "{run:?}");
            }
        }
    }
}

/// `snowlease mint carry-over --from-app APP --app fmt-next` (epoch 10 s later) on `url`.
pub(crate) fn carry_over(url: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "mint",
        "carry-over",
        "--from-app",
        APP,
        "--app",
        "fmt-next",
        "--epoch",
        "1288834984657",
        "--redis-url",
        url,
    ];
    args.extend_from_slice(extra);
    run_snowlease(&args, &[], secs(90))
}

/// Exit 0, and the line's `durable` says `says`.
fn assert_durable(run: &Run, says: &str) {
    assert_eq!(run.code, Some(0), "{run:?}");
    let line: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("JSON");
    let durable = line["durable"].as_str().unwrap_or_default();
    assert!(durable.contains(says), "{line}");
}

/// `mint carry-over` refuses while the old app holds an ID (its pods may still mint): exit 5,
/// nothing written for the new app.
#[test]
fn carry_over_refuses_while_the_old_app_holds_ids() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let _old = crate::mint_worker::minter_at(&redis.url())
        .flag("--max-worker-id", "0")
        .spawn();
    _old.wait_for_log("minting above the high-water mark", secs(10));
    let run = carry_over(&redis.url(), &[]);
    assert_eq!(run.code, Some(5), "{run:?}");
    assert!(run.stderr.contains("still holds 1 worker ID"), "{run:?}");
    assert!(
        redis.keys("snowflake:worker:fmt-next*").is_empty(),
        "nothing written"
    );
}

/// With `save ""` and AOF off Redis still loads a `dump.rdb` left in its dir at a restart (a
/// manual `BGSAVE`, a backup, or the file a replica writes at its full sync, which stays on
/// disk after a failover promotes it). `mint carry-over` said "nothing to roll back to" and
/// a crash-restart brought the new app's format and floors back to before it; now it takes a
/// snapshot there too.
#[test]
fn carry_over_with_save_off_survives_a_restart_from_a_snapshot_on_disk() {
    let mut redis = RedisServer::start();
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let run = carry_over(&redis.url(), &[]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(redis.exists("snowflake:worker:fmt-next:format"), "{run:?}");
    redis.restart();
    assert!(
        redis.exists("snowflake:worker:fmt-next:format"),
        "carry-over said durable ({}) but a restart lost its writes",
        run.stdout.trim()
    );
}

/// A snapshot already running when `mint carry-over` sends `BGSAVE SCHEDULE` (Redis answers
/// "Background save already in progress" even with SCHEDULE while an RDB child runs: an
/// automatic save, a replica's full sync, an operator's BGSAVE) was taken for a Redis that
/// refuses BGSAVE (exit 0, `durability_unchecked`, nothing waited for); now carry-over waits
/// for it to end and takes its own.
#[test]
fn carry_over_waits_for_a_snapshot_when_one_is_already_running() {
    let redis = RedisServer::start_with(RedisOptions {
        args: ["--save", "3600 1"].map(String::from).to_vec(),
        ..RedisOptions::default()
    });
    // 50 keys x 40 ms: the snapshot runs about 2 s.
    redis.slow_snapshots(50, ms(40));
    let _: String = redis.query(&mut redis::cmd("BGSAVE"));
    let run = carry_over(&redis.url(), &["--durable-wait", "30s"]);
    assert_durable(&run, "a snapshot started after them finished");
}
