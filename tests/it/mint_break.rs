//! Mint mode under adversarial use (findings of a break session): handovers between
//! sidecars whose `--epoch` differs, and a high-water mark that cannot be read. Real
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

/// Finding: a rolling update that changes `--epoch` (or `--id-layout`) hands a worker ID
/// from a sidecar minting in one format to one minting in another. The mark is in Unix ms,
/// so the new holder mints above it, but its IDs encode `t - epoch`: with an epoch 3 s later
/// its IDs are those the old holder minted 3 s earlier. Nothing records the format an app
/// mints in, so nothing refuses it. Expected: no ID twice (the new holder refuses to mint,
/// or mints above in its own format). Ignored until the format is recorded in Redis and
/// checked; docs/kubernetes.md "Upgrading" now warns against the change.
#[test]
#[ignore = "finding: a changed --epoch between holders mints duplicate IDs (not fixed yet)"]
fn a_handover_to_another_epoch_never_mints_an_id_twice() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let mut first = minter_at(&redis.url()).flag("--max-worker-id", "0").spawn();
    let old: BTreeSet<u64> = pull_for(&first, 3).into_iter().collect();
    first.signal(Signal::SIGTERM);
    assert!(first.wait_exit(secs(10)).is_some_and(|s| s.success()));

    let later_epoch = (DEFAULT_EPOCH_MS + 3_000).to_string();
    let second = minter_at(&redis.url())
        .flag("--max-worker-id", "0")
        .flag("--epoch", later_epoch)
        .spawn();
    let new = poll_some(secs(15), || next(&second, 4096).ok()).unwrap_or_default();
    let mut new: BTreeSet<u64> = new.into_iter().collect();
    let until = std::time::Instant::now() + secs(3);
    while std::time::Instant::now() < until {
        match next(&second, 4096) {
            Ok(batch) => new.extend(batch),
            Err(_) => std::thread::sleep(ms(20)),
        }
    }
    let twice = old.intersection(&new).count();
    assert_eq!(
        twice,
        0,
        "{twice} IDs minted twice ({} old, {} new)",
        old.len(),
        new.len()
    );
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
