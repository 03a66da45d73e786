//! Mint mode under adversarial use (findings of a break session): a high-water mark that
//! cannot be read. Real processes on a real Redis, as in `mint_worker.rs`.

use crate::harness::*;
use crate::mint_worker::{APP, minter_at, next};

/// The mark of worker ID 0 of [`APP`].
const MARK: &str = "snowflake:worker:mint:mark:{snowflake:worker:mint:0}";

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
