//! `snowlease worker --mint` as a process against a real Redis: `/next` over `--listen` and
//! the unix socket, the worker ID kept from the app (no ID file, `/id` 409, `exec` and `id`
//! refuse), the settled record at SIGTERM, handovers (clean, SIGKILL mid-burst, to a clock
//! behind), and wall-clock steps while minting (libfaketime): never an ID twice, never one
//! at or below the previous holder's.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use nix::sys::signal::Signal;
use serde_json::Value;
use snowlease::worker_id::mint::layout::{DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Epoch, IdLayout};

use crate::clock_skew::set_offset;
use crate::harness::*;

pub(crate) const APP: &str = "mint";

/// A mint-mode sidecar (TTL 2 s from the harness; a window that fits below it).
fn minter(redis: &RedisServer) -> SidecarBuilder {
    minter_at(&redis.url())
}

/// [`minter`] in `pod` serving `/next` on `<pod>/mint.sock`, and that socket's path.
fn socket_minter(redis: &RedisServer, pod: &PodDir) -> (SidecarBuilder, std::path::PathBuf) {
    let socket = pod.path().join("mint.sock");
    let builder = minter(redis)
        .pod(pod)
        .flag("--mint-socket", socket.to_string_lossy());
    (builder, socket)
}

/// [`minter`] for any Redis URL (Sentinel, Cluster).
pub(crate) fn minter_at(url: &str) -> SidecarBuilder {
    Sidecar::worker_at(url, APP)
        .switch("--mint")
        .flag("--mint-window", "500ms")
}

/// The worker bits of `id` in the default layout.
pub(crate) fn worker_of(id: u64) -> u16 {
    let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), unix_ms()).unwrap();
    IdLayout::parse(DEFAULT_LAYOUT)
        .unwrap()
        .decompose(epoch, id)
        .worker_id
}

/// The timestamp (Unix ms) of `id` in the default layout.
pub(crate) fn unix_ms_of(id: u64) -> u64 {
    let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), unix_ms()).unwrap();
    IdLayout::parse(DEFAULT_LAYOUT)
        .unwrap()
        .decompose(epoch, id)
        .unix_ms
}

/// `GET /next?count=n` as JSON: the IDs, or the status and body of a refusal (status 0: no
/// answer within 2 s; a request at the ceiling waits up to 500 ms for a reservation).
pub(crate) fn next(sidecar: &Sidecar, count: usize) -> Result<Vec<u64>, (u16, String)> {
    let target = format!("/next?count={count}");
    let (status, body) = sidecar.http_get_within(&target, None, secs(2));
    if status != 200 {
        return Err((status, body));
    }
    let json: Value = serde_json::from_str(&body).unwrap();
    Ok(json["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().expect("IDs are strings").parse().unwrap())
        .collect())
}

/// A client pulling batches of 256 until `stop` (or the sidecar is gone): the IDs in the
/// order received and the 503 states seen.
pub(crate) fn pull(
    sidecar: Arc<Sidecar>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(Vec<u64>, Vec<String>)> {
    std::thread::spawn(move || {
        let (mut ids, mut refused) = (Vec::new(), Vec::new());
        while !stop.load(Ordering::Relaxed) {
            match next(&sidecar, 256) {
                Ok(batch) => ids.extend(batch),
                Err((0, _)) => break,
                Err((_, body)) => {
                    refused.push(body);
                    std::thread::sleep(ms(20));
                }
            }
        }
        (ids, refused)
    })
}

/// Waits until `/next` answers and returns the first batch.
pub(crate) fn first_batch(sidecar: &Sidecar, count: usize) -> Vec<u64> {
    poll_some(secs(15), || next(sidecar, count).ok())
        .unwrap_or_else(|| panic!("no IDs: {:?}", next(sidecar, count)))
}

/// One HTTP/1.1 request over a unix socket, as an app in the pod sends it.
pub(crate) fn socket_get(path: &Path, target: &str, accept: &str) -> String {
    let mut stream = UnixStream::connect(path).unwrap();
    let head = format!(
        "GET {target} HTTP/1.1\r\nHost: mint\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// Every ID strictly increasing, once.
pub(crate) fn assert_increasing(ids: &[u64]) {
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "not increasing");
}

/// The whole interface on a live sidecar: JSON strings and text, batches in order, 400
/// naming `count`, the socket at mode 0660, `/id` 409, no ID file but a state file marked
/// `mint`, `exec` and `id` refused with exit 5, metrics counting, and the worker bits of
/// every ID equal to the held worker ID.
#[test]
fn mint_mode_answers_next_and_keeps_the_worker_id_from_the_app() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let (sidecar, socket) = socket_minter(&redis, &pod);
    let sidecar = sidecar.switch("--next-on-listen").spawn();
    let batch = first_batch(&sidecar, 100);
    assert_eq!(batch.len(), 100);
    assert_increasing(&batch);

    let (status, body) = sidecar.http_get("/next", None);
    assert_eq!(status, 200, "{body}");
    let one: Value = serde_json::from_str(&body).unwrap();
    let one: u64 = one["id"].as_str().expect("a string").parse().unwrap();
    assert!(one > *batch.last().unwrap());
    let (status, text) = sidecar.http_get("/next?count=3", Some("text/plain"));
    assert_eq!(status, 200);
    let lines: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert_increasing(&lines);
    assert!(lines[0] > one);
    for bad in ["0", "4097", "x", "-1"] {
        let (status, body) = sidecar.http_get(&format!("/next?count={bad}"), None);
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(body.contains("count") && body.contains("1-4096"), "{body}");
    }

    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660);
    let answer = socket_get(&socket, "/next", "text/plain");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let over_socket: u64 = answer
        .rsplit("\r\n\r\n")
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(over_socket > lines[2]);
    assert!(socket_get(&socket, "/livez", "*/*").starts_with("HTTP/1.1 200"));

    let (status, body) = sidecar.get_id();
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("minting"), "{body}");
    assert_eq!(sidecar.read_output_file(), None, "no ID file in mint mode");
    let state = sidecar.read_state().expect("a state file");
    assert_eq!(state["mint"], true, "{state}");
    let worker_id = u16::try_from(state["worker_id"].as_u64().unwrap()).unwrap();
    for id in batch.iter().chain(&lines).chain([&one, &over_socket]) {
        assert_eq!(worker_of(*id), worker_id);
    }

    let file = sidecar.output_file().to_string_lossy().into_owned();
    let exec = run_snowlease(
        &["exec", "--file", &file, "--wait", "2s", "--", "true"],
        &[],
        secs(10),
    );
    assert_eq!(exec.code, Some(5), "{}", exec.stderr);
    assert!(exec.stderr.contains("mint mode"), "{}", exec.stderr);
    let url = format!("http://{}", sidecar.http_addr());
    let id = run_snowlease(&["id", "--url", &url], &[], secs(10));
    assert_eq!(id.code, Some(5), "{}", id.stderr);
    assert!(id.stderr.contains("GET /next"), "{}", id.stderr);

    let status = run_snowlease(
        &["status", "--app", APP, "--redis-url", &redis.url()],
        &[],
        secs(10),
    );
    assert!(status.stdout.contains("(mint mark +"), "{}", status.stdout);

    let minted = sidecar.metric("snowlease_ids_minted_total").unwrap();
    assert!(minted >= 105.0, "{minted}");
    let lead = sidecar.metric("snowlease_mint_mark_lead_seconds").unwrap();
    assert!(
        lead > 0.0 && lead <= 0.6,
        "the mark leads the clock: {lead}"
    );
}

/// With `--mint-socket`, `/next` is served on the socket only: on `--listen` it answers 404
/// naming the socket (any pod reaching the port would mint with this worker ID), while
/// `/readyz`, `/livez` and `/metrics` stay on the port.
#[test]
fn with_a_mint_socket_next_is_not_served_on_the_port() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let (sidecar, socket) = socket_minter(&redis, &pod);
    let sidecar = sidecar.spawn();
    // The socket is bound before the claim: there once the lease is held.
    assert!(poll_until(secs(10), || sidecar.readyz() == 200));
    let minted = poll_until(secs(10), || {
        socket_get(&socket, "/next", "text/plain").starts_with("HTTP/1.1 200")
    });
    assert!(minted, "{}", socket_get(&socket, "/next", "text/plain"));
    for target in ["/next", "/next?count=5"] {
        let (status, body) = sidecar.http_get(target, None);
        assert_eq!(status, 404, "{target}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains(&*socket.to_string_lossy()), "{detail}");
        assert!(detail.contains("--next-on-listen"), "{detail}");
    }
    assert_eq!(sidecar.readyz(), 200);
    assert_eq!(sidecar.http_get("/livez", None).0, 200);
    assert!(sidecar.metric("snowlease_lease_held") == Some(1.0));
}

/// SIGTERM records the last minted timestamp; the next holder of the worker ID (same pod
/// volume gone: a new pod) mints at once, above every ID of the first.
#[test]
fn a_clean_handover_mints_above_the_previous_holder() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let mut first = minter(&redis).flag("--max-worker-id", "0").spawn();
    let mut old = first_batch(&first, 4096);
    old.extend(next(&first, 4096).unwrap());
    first.signal(Signal::SIGTERM);
    assert!(first.wait_exit(secs(10)).is_some_and(|s| s.success()));
    let settled_key = "snowflake:worker:mint:settled:{snowflake:worker:mint:0}";
    let settled: u64 = redis
        .get(settled_key)
        .expect("settled record")
        .parse()
        .unwrap();
    assert!(first.wait_for_log("recorded the last minted timestamp", secs(1)));

    let second = minter(&redis).flag("--max-worker-id", "0").spawn();
    let new = first_batch(&second, 4096);
    assert!(new[0] > *old.last().unwrap(), "above every old ID");
    let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), unix_ms()).unwrap();
    let layout = IdLayout::parse(DEFAULT_LAYOUT).unwrap();
    assert!(layout.decompose(epoch, new[0]).unix_ms > settled);
    assert_eq!(
        layout.decompose(epoch, *old.last().unwrap()).unix_ms,
        settled
    );
}

/// Clients pull batches while the holder is SIGKILLed: the next holder (after the key
/// expires) mints above the mark, so above every ID any client got from the first.
#[test]
fn sigkill_mid_burst_then_a_new_holder_mints_above() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let first = Arc::new(minter(&redis).flag("--max-worker-id", "0").spawn());
    first_batch(&first, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4).map(|_| pull(first.clone(), stop.clone())).collect();
    std::thread::sleep(ms(700));
    first.signal(Signal::SIGKILL);
    stop.store(true, Ordering::Relaxed);
    let old: Vec<u64> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap().0)
        .collect();
    assert!(old.len() > 4096, "a burst: {}", old.len());

    let second = minter(&redis).flag("--max-worker-id", "0").spawn();
    let new = first_batch(&second, 4096);
    let newest_old = *old.iter().max().unwrap();
    assert!(new[0] > newest_old, "above every old ID");
    let all: BTreeSet<u64> = old.iter().chain(&new).copied().collect();
    assert_eq!(all.len(), old.len() + new.len(), "no ID twice");
}

/// A sidecar for worker ID 0 under libfaketime (wall clock offset by the stamp file; the
/// boot clock left alone).
fn faked(redis: &RedisServer, stamp: &Path) -> SidecarBuilder {
    faked_at(&redis.url(), stamp)
}

/// [`faked`] for any Redis URL.
pub(crate) fn faked_at(url: &str, stamp: &Path) -> SidecarBuilder {
    minter_at(url)
        .flag("--max-worker-id", "0")
        .env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", stamp)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
}

/// A handover to a sidecar whose clock is 30 s behind: beyond `--max-clock-skew` it mints
/// nothing (503 `clock_skew`) until its clock is right; within it (3 s behind, skew bound
/// 5 s) it answers 503 `clock_behind` with the wait, then mints above the old IDs.
#[test]
fn a_handover_to_a_clock_behind_mints_nothing_at_or_below_the_old_ids() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");

    let mut first = minter(&redis).flag("--max-worker-id", "0").spawn();
    let old = first_batch(&first, 4096);
    first.signal(Signal::SIGTERM);
    assert!(first.wait_exit(secs(10)).is_some());

    set_offset(&stamp, "-30s");
    let mut behind = faked(&redis, &stamp).spawn();
    assert!(
        poll_until(secs(10), || {
            next(&behind, 1)
                .is_err_and(|(status, body)| status == 503 && body.contains("clock_skew"))
        }),
        "{:?}",
        next(&behind, 1)
    );
    set_offset(&stamp, "+0");
    let new = first_batch(&behind, 10);
    assert!(new[0] > *old.last().unwrap());
    behind.signal(Signal::SIGTERM);
    assert!(behind.wait_exit(secs(10)).is_some());
    let last = new.last().copied().unwrap();

    set_offset(&stamp, "-3s");
    let near = faked(&redis, &stamp)
        .flag("--ttl", "10s")
        .flag("--renew-interval", "2s")
        .flag("--max-clock-skew", "5s")
        .spawn();
    let (status, body) = poll_some(secs(10), || {
        next(&near, 1)
            .err()
            .filter(|(s, b)| *s == 503 && b.contains("clock_behind"))
    })
    .unwrap_or_else(|| panic!("{:?}", next(&near, 1)));
    let refused: Value = serde_json::from_str(&body).unwrap();
    let wait_ms = refused["wait_ms"].as_u64().unwrap();
    assert!((1..=3_000).contains(&wait_ms), "{status} {body}");
    let newer = first_batch(&near, 10);
    assert!(newer[0] > last, "above the last holder's IDs");
}

/// Wall-clock steps of -30 s and +30 s under a minting sidecar: the IDs keep increasing (the
/// minting clock is the boot clock), the lease stays held, nothing is refused for the clock
/// (a late renewal on a loaded machine may refuse a few batches).
#[test]
fn clock_steps_while_minting_never_lower_an_id() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");
    set_offset(&stamp, "+0");
    let sidecar = faked(&redis, &stamp).spawn();
    let mut ids = first_batch(&sidecar, 1000);
    let (mut asked, mut refused) = (0, Vec::new());
    for offset in ["-30s", "+30s", "+0", "+30s"] {
        set_offset(&stamp, offset);
        let until = std::time::Instant::now() + ms(1_500);
        while std::time::Instant::now() < until {
            asked += 1;
            match next(&sidecar, 1000) {
                Ok(batch) => ids.extend(batch),
                // A renewal or reservation late on a loaded machine: not the clock's doing.
                Err(e) => refused.push((offset, e)),
            }
        }
    }
    assert_increasing(&ids);
    assert!(
        refused.len() * 10 < asked,
        "the clock steps refused minting: {refused:?}"
    );
    assert!(
        !refused.iter().any(|(_, (_, body))| body.contains("clock")),
        "{refused:?}"
    );
    let worker_id = sidecar.read_state().unwrap()["worker_id"].as_u64().unwrap();
    assert!(ids.iter().all(|id| u64::from(worker_of(*id)) == worker_id));
}

/// Bad mint flags end the start with exit 2 naming the flag (and the date a layout runs out),
/// before anything is written to Redis.
#[test]
fn bad_mint_flags_are_refused_naming_the_flag_and_nothing_is_written() {
    let redis = RedisServer::start();
    let url = redis.url();
    let cases: [(&[&str], &str); 5] = [
        (&["--id-layout", "41:4:12"], "--id-layout"),
        (&["--id-layout", "38:10:12"], "overflow at 2019-07-21"),
        (&["--id-layout", "42:10:12"], "--id-layout"),
        (&["--epoch", "2099-01-01T00:00:00Z"], "--epoch"),
        (&["--mint-window", "119s"], "--mint-window"),
    ];
    for (flags, named) in cases {
        let mut args = vec!["worker", "--app", APP, "--redis-url", &url, "--mint"];
        args.extend_from_slice(flags);
        let run = run_snowlease(&args, &[], secs(10));
        assert_eq!(run.code, Some(2), "{flags:?}: {}", run.stderr);
        assert!(run.stderr.contains(named), "{flags:?}: {}", run.stderr);
    }
    // Mint flags without --mint, and a negative window, are refused the same way.
    let cases: [(&[&str], &str); 4] = [
        (&["--mint-window", "3s"], "--mint"),
        (&["--epoch", "0"], "--mint"),
        (&["--id-layout", "41:10:12"], "--mint"),
        (
            &["--mint", "--mint-window", "-1s"],
            "--mint-window takes a duration, which is not negative",
        ),
    ];
    for (flags, named) in cases {
        let mut args = vec!["worker", "--app", APP, "--redis-url", &url];
        args.extend_from_slice(flags);
        let run = run_snowlease(&args, &[], secs(10));
        assert_eq!(run.code, Some(2), "{flags:?}: {}", run.stderr);
        assert!(run.stderr.contains(named), "{flags:?}: {}", run.stderr);
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
}

/// Reservations follow demand: while nobody asks for IDs the mark stays where the last
/// reservation put it (no Redis call beyond the renewals), and the next request raises it.
#[test]
fn an_idle_sidecar_does_not_reserve() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let sidecar = minter(&redis).flag("--max-worker-id", "0").spawn();
    let first = first_batch(&sidecar, 10);
    let mark_key = format!("snowflake:worker:{APP}:mark:{{{}}}", worker_key(APP, 0));
    let mark = || -> u64 { stamped_int(&redis.get(&mark_key).expect("a mark")) };
    // The window is 500 ms: reserving on the clock alone would keep the mark 250-500 ms
    // ahead. Idle, the clock passes it (a negative lead) and it stays.
    let lead = || sidecar.metric("snowlease_mint_mark_lead_seconds").unwrap();
    assert!(poll_until(secs(5), || lead() < 0.0), "lead {}", lead());
    let idle = mark();
    std::thread::sleep(ms(500));
    assert_eq!(mark(), idle, "no reservation while idle");
    let after = first_batch(&sidecar, 10);
    assert!(after[0] > first[9]);
    assert!(mark() > idle, "the next request reserved");
}

/// Datacenter bits: a sidecar with `--id-layout 41:5:5:12 --datacenter-id 17 --worker-ids
/// 16-31` mints IDs that decode to (timestamp, datacenter 17, a worker ID of its range,
/// sequence) and records the datacenter in the app's format; a sidecar of the app on this
/// Redis with datacenter 18 exits 2 before it claims, naming the flags; bad datacenter IDs
/// exit 2 naming `--datacenter-id` and its range.
#[test]
fn minted_ids_carry_the_datacenter_id_and_another_one_is_refused() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let layout = |dc| {
        IdLayout::parse("41:5:5:12")
            .unwrap()
            .with_datacenter_id(dc)
            .unwrap()
    };
    let dc = |id: &str| {
        minter(&redis)
            .flag("--id-layout", "41:5:5:12")
            .flag("--worker-ids", "16-31")
            .flag("--datacenter-id", id)
    };
    let first = dc("17").spawn();
    let ids = first_batch(&first, 4096);
    assert_increasing(&ids);
    let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), unix_ms()).unwrap();
    // Mint mode offers no /id: the held ID is the metric.
    let worker = first
        .metric("snowlease_worker_id")
        .expect("worker ID metric") as u32;
    assert!((16..=31).contains(&worker), "{worker}");
    for id in &ids {
        let parts = layout(17).decompose(epoch, *id);
        assert_eq!(parts.datacenter_id, 17, "{id}");
        assert_eq!(u32::from(parts.worker_id), worker, "{id}");
        assert!(parts.unix_ms.abs_diff(unix_ms()) < 60_000, "{parts:?}");
        assert_eq!(layout(17).compose(epoch, parts), Some(*id));
    }
    assert_eq!(
        redis.get("snowflake:worker:mint:format").as_deref(),
        Some("41:5:5:12@1288834974657,datacenter=17")
    );

    let mut other = dc("18").spawn();
    let status = other.wait_exit(secs(15)).expect("refused at start");
    assert_eq!(status.code(), Some(2));
    let stderr = other.log_lines().join("\n");
    assert!(stderr.contains("--datacenter-id"), "{stderr}");
    assert!(
        stderr.contains("datacenter=17") && stderr.contains("datacenter=18"),
        "{stderr}"
    );
    assert_eq!(other.count_log("lease acquired"), 0, "{stderr}");

    let url = redis.url();
    for (flags, says) in [
        (
            &["--id-layout", "41:5:5:12", "--datacenter-id", "32"][..],
            "outside 0-31",
        ),
        (&["--datacenter-id", "1"][..], "needs datacenter bits"),
        (
            &["--id-layout", "41:5:5:12", "--datacenter-id", "-1"][..],
            "-1 is outside",
        ),
    ] {
        let mut args = vec!["worker", "--app", "dc-bad", "--redis-url", &url, "--mint"];
        args.extend_from_slice(flags);
        let run = run_snowlease(&args, &[], secs(10));
        assert_eq!(run.code, Some(2), "{flags:?}: {}", run.stderr);
        assert!(
            run.stderr.contains("--datacenter-id"),
            "{flags:?}: {}",
            run.stderr
        );
        assert!(run.stderr.contains(says), "{flags:?}: {}", run.stderr);
    }
    assert!(
        redis.keys("snowflake:worker:dc-bad*").is_empty(),
        "nothing written"
    );
}

/// A minting sidecar's first use of an app on a Redis that holds other apps' keys: it writes
/// the app's format record before its first claim, and the claim's advice must still say
/// "first use" (it read the format record as a lease key: "lease keys of app ... exist
/// without its guard: Redis lost its data", and that only --force opens the guard).
#[test]
fn a_minting_newcomer_is_told_first_use() {
    let redis = RedisServer::start();
    let _: () = redis.query(redis::cmd("SET").arg(worker_key("billing", 0)).arg("x"));
    let sidecar = minter(&redis).spawn();
    let warned = sidecar
        .wait_for_event("no claim guard in Redis", secs(10))
        .expect("the missing-guard warning");
    let text = warned.to_string();
    assert!(text.contains("first use of app"), "{text}");
    assert!(!text.contains("exist without its guard"), "{text}");
    assert!(
        redis.exists(&format!("{PREFIX}{APP}:format")),
        "format written first"
    );
}
