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
