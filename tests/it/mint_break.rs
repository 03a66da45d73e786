//! Mint mode under adversarial use (findings of a break session): a sidecar whose `--epoch`
//! or `--id-layout` differs from the app's recorded format, and a high-water mark that
//! cannot be read. Real
//! processes on a real Redis, as in `mint_worker.rs`.

use std::collections::BTreeSet;

use nix::sys::signal::Signal;
use snowlease::worker_id::mint::layout::DEFAULT_EPOCH_MS;

use crate::harness::*;
use crate::mint_worker::{APP, first_batch, minter_at, next};

/// The mark of worker ID 0 of [`APP`].
const MARK: &str = "snowflake:worker:mint:mark:{snowflake:worker:mint:0}";

/// Batches of 4096 from `sidecar` for `secs` seconds (503s skipped).
fn pull_for(sidecar: &Sidecar, secs: u64) -> Vec<u64> {
    let mut ids = first_batch(sidecar, 4096);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < until {
        if let Ok(batch) = next(sidecar, 4096) {
            ids.extend(batch);
        }
    }
    ids
}

/// Finding: a rolling update that changes `--epoch` (or `--id-layout`) handed a worker ID
/// from a sidecar minting in one format to one minting in another. The mark is in Unix ms,
/// so the new holder minted above it, but its IDs encode `t - epoch`: with an epoch 3 s
/// later its IDs were those the old holder minted 3 s earlier (57,344 twice). Now the first
/// sidecar records the app's format (`<prefix><app>:format`), and one minting in another
/// stops at start, before it claims (exit 2 naming both flags, its socket removed); a layout
/// change alike. The first format's sidecars go on minting.
#[test]
fn a_sidecar_in_another_id_format_refuses_to_mint() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let mut first = minter_at(&redis.url()).flag("--max-worker-id", "0").spawn();
    let old: BTreeSet<u64> = pull_for(&first, 1).into_iter().collect();
    first.signal(Signal::SIGTERM);
    assert!(first.wait_exit(secs(10)).is_some_and(|s| s.success()));
    assert_eq!(
        redis.get("snowflake:worker:mint:format").as_deref(),
        Some("41:10:12@1288834974657")
    );

    let later_epoch = (DEFAULT_EPOCH_MS + 3_000).to_string();
    let changed: [(&str, String); 2] = [
        ("--epoch", later_epoch),
        ("--id-layout", "41:9:13".to_owned()),
    ];
    for (flag, value) in changed {
        let pod = PodDir::new();
        let socket = pod.path().join("mint.sock");
        let mut second = minter_at(&redis.url())
            .pod(&pod)
            .flag("--max-worker-id", "0")
            .flag("--mint-socket", socket.to_string_lossy())
            .flag(flag, value.clone())
            .spawn();
        let status = second
            .wait_exit(secs(15))
            .unwrap_or_else(|| panic!("{flag} {value}: still running"));
        assert_eq!(status.code(), Some(2), "{flag} {value}");
        assert!(
            second.wait_for_log("mints IDs in the format", secs(1)),
            "{flag} {value}"
        );
        let stderr = second.log_lines().join("\n");
        assert!(stderr.contains("--id-layout, --epoch"), "{stderr}");
        // Refused at start: no claim (no tombstone of a pod that crash-loops), no socket.
        assert_eq!(second.count_log("lease acquired"), 0, "{stderr}");
        assert!(!socket.exists(), "the socket file is removed");
    }

    let third = minter_at(&redis.url()).flag("--max-worker-id", "0").spawn();
    let new = first_batch(&third, 4096);
    assert!(new.iter().all(|id| !old.contains(id)));
}

/// Finding: a mark that cannot be read (here set by hand to garbage) was retried with a
/// backoff that every renewal reset to 50 ms, each try logging a warning: about 8 warnings a
/// second with the test's 500 ms renewals. Now the backoff doubles to 1 s through renewals
/// and only the first failure warns; minting starts within the backoff once the mark is
/// readable again.
#[test]
fn an_unreadable_mark_is_retried_with_backoff_and_warned_once() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let _: () = redis.query(redis::cmd("SET").arg(MARK).arg("garbage"));
    let sidecar = minter_at(&redis.url()).flag("--max-worker-id", "0").spawn();
    let warning = "cannot read the high-water mark";
    assert!(sidecar.wait_for_log(warning, secs(10)));
    std::thread::sleep(secs(3));
    let warned = sidecar
        .events_with(warning)
        .iter()
        .filter(|e| level(e) == "WARN")
        .count();
    assert_eq!(warned, 1, "one warning per lease, not one per try");
    let (status, body) = sidecar.http_get("/next", None);
    assert_eq!(status, 503, "{body}");

    let _: () = redis.query(redis::cmd("DEL").arg(MARK));
    let minted = poll_until(secs(3), || next(&sidecar, 1).is_ok());
    assert!(
        minted,
        "mints within the 1 s backoff once the mark is readable"
    );
}

/// The format check's second place: a sidecar whose start-time check got no answer (its
/// Redis blackholed at start) checks again before its first mint, after its claim, and
/// still stops with exit 2 without answering an ID.
#[test]
fn a_format_unchecked_at_start_is_checked_before_the_first_mint() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let _: () = redis.query(
        redis::cmd("SET")
            .arg("snowflake:worker:mint:format")
            .arg("41:10:12@1288834977657"),
    );
    let proxy = FaultProxy::for_redis(&redis);
    proxy.set_mode(Mode::Blackhole);
    let mut sidecar = minter_at(&proxy.url()).flag("--max-worker-id", "0").spawn();
    // The server starts after the start-time check, which got no answer.
    assert!(sidecar.wait_for_log("http listening", secs(10)));
    proxy.set_mode(Mode::Pass);
    let mut answered = 0;
    let exited = poll_some(secs(20), || {
        answered += next(&sidecar, 1).map_or(0, |ids| ids.len());
        sidecar.wait_exit(ms(1))
    });
    let status = exited.expect("stopped");
    let log = sidecar.log_lines().join("\n");
    assert_eq!(status.code(), Some(2), "{log}");
    assert_eq!(answered, 0, "no ID answered");
    assert!(
        sidecar.count_log("lease acquired") >= 1,
        "claimed first: {log}"
    );
    assert!(log.contains("refusing to mint"), "{log}");
}
