//! Renewals under network faults (the fault proxy: black-holed and delayed connections) and
//! restarts: a late renew never re-creates a key that may have expired, the ID is unpublished
//! before Redis expires the key, and re-adoption never re-creates a missing key.
//!
//! One-line breaks each seen caught (then restored):
//! - `renew.lua` re-creating whenever allowed (`recreate_before ~= 0`, the old rule):
//!   `late_renew_never_recreates_a_key_that_may_have_expired`,
//!   `renew_recreates_only_before_the_recorded_expiry`.
//! - the publisher's deadline timer an hour later: `id_file_is_gone_by_the_deadline_while_a_renew_hangs`.
//! - validity from the reply (`let sent = BootInstant::now();` first in `Worker::held`):
//!   `validity_counts_from_the_send_when_replies_are_slow`.
//! - `renew.lua` ignoring "do not re-create" (`if value == false then`):
//!   `readoption_never_recreates_a_missing_key`.

use std::thread;
use std::time::{Duration, Instant};

use snowlease::identity::Owner;
use snowlease::lease::{self, RenewOutcome};

use crate::double_publish::both_published;
use crate::harness::*;
use crate::pool::{manager, redis_ms};

/// `renew.lua` against a real Redis: a missing key is set again only while Redis' time is
/// before `recreate_before`, never with 0; the bound derived from the reply's `expires_ms`
/// lies before the key's real expiry (`PEXPIRETIME`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_recreates_only_before_the_recorded_expiry() {
    let redis = RedisServer::start();
    let mut conn = manager(&redis).await;
    let owner = Owner::generate("10.0.0.1");
    let ttl = secs(10);
    let key = "snowflake:worker:orders:0";
    let now = redis_ms(&redis);
    for (recreate_before, expected) in [
        (0, RenewOutcome::Lost),
        (now.saturating_sub(1), RenewOutcome::Lost),
        (now + 5_000, RenewOutcome::Recreated),
    ] {
        let _: () = redis.query(redis::cmd("DEL").arg(key));
        let reply = lease::renew(&mut conn, key, &owner, ttl, recreate_before)
            .await
            .unwrap();
        assert_eq!(reply.outcome, expected, "recreate_before {recreate_before}");
        let written = reply.outcome == RenewOutcome::Recreated;
        assert_eq!(
            redis.exists(key),
            written,
            "recreate_before {recreate_before}"
        );
    }
    let reply = lease::renew(&mut conn, key, &owner, ttl, 0).await.unwrap();
    assert_eq!(reply.outcome, RenewOutcome::Extended);
    let expires_at: u64 = redis.query(redis::cmd("PEXPIRETIME").arg(key));
    let bound = lease::recreate_before(reply.expires_ms, ttl);
    assert!(
        bound < expires_at,
        "re-create bound {bound} not before the key's expiry {expires_at}"
    );
}

/// A late renew: the holder's connection black-holed, its last renew queued in the proxy
/// across its deadline, the key expires, a newcomer claims the ID, Redis loses its data
/// (FLUSHALL), then the queued renew is delivered within its call timeout. It must answer
/// "lost" (Redis' time is past the key's expiry), not re-create the key and publish the ID
/// beside the newcomer.
#[test]
fn late_renew_never_recreates_a_key_that_may_have_expired() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let proxy = FaultProxy::for_redis(&redis);
    // Call timeout 1.5 s, retry base 1 s: renews sent at 6 s (times out) and 11.5 s, which
    // is still in flight at the 11.88 s deadline and the 12 s expiry.
    let holder = Sidecar::worker_at(&proxy.url(), "orders")
        .name("holder")
        .flag("--max-worker-id", "0")
        .flag("--ttl", "12s")
        .flag("--renew-interval", "6s")
        .flag("--retries", "0")
        .spawn();
    holder.wait_for_lease(secs(10));
    proxy.set_mode(Mode::Blackhole);
    let key = worker_key("orders", 0);
    assert!(
        poll_until(secs(15), || !redis.exists(&key)),
        "key never expired"
    );
    let newcomer = Sidecar::worker(&redis, "orders")
        .name("newcomer")
        .flag("--max-worker-id", "0")
        .flag("--ttl", "10s")
        .flag("--renew-interval", "5s")
        .spawn();
    newcomer.wait_for_lease(secs(5));
    let _: () = redis.query(&mut redis::cmd("FLUSHALL"));
    proxy.release();
    let dup = both_published(&holder, &newcomer, secs(2));
    assert_eq!(
        dup, None,
        "holder re-created the key and publishes ID 0 again"
    );
    assert!(holder.wait_for_log("lease lost", secs(2)));
}

/// Validity, the file publisher's timer: with the connection black-holed and a renew
/// in flight across the validity deadline (the keeper only declares the loss when that call
/// times out, after Redis expired the key), the ID file must be gone by the deadline: never
/// there while Redis has no key.
#[test]
fn id_file_is_gone_by_the_deadline_while_a_renew_hangs() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let proxy = FaultProxy::for_redis(&redis);
    let holder = Sidecar::worker_at(&proxy.url(), "orders")
        .flag("--max-worker-id", "0")
        .flag("--ttl", "12s")
        .flag("--renew-interval", "6s")
        .flag("--retries", "0")
        .spawn();
    holder.wait_for_lease(secs(10));
    assert!(poll_until(secs(2), || holder.read_output_file().is_some()));
    proxy.set_mode(Mode::Blackhole);
    let key = worker_key("orders", 0);
    let late = published_without_key(&redis, &key, secs(16), || {
        holder.read_output_file().is_some()
    });
    assert_eq!(
        late, None,
        "ID file still there after Redis expired the key"
    );
}

/// Validity from the send: a renew whose bytes are delayed 400 ms each way (a
/// round trip of 0.8 s, inside the 1 s call timeout), then the connection black-holed. Counted
/// from the reply, validity would end 0.3 s after Redis expires the key; the ID (`/id` and
/// the file) must be gone before.
#[test]
fn validity_counts_from_the_send_when_replies_are_slow() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let proxy = FaultProxy::for_redis(&redis);
    let holder = Sidecar::worker_at(&proxy.url(), "orders")
        .flag("--max-worker-id", "0")
        .flag("--ttl", "8s")
        .flag("--renew-interval", "4s")
        .spawn();
    // The start-up check takes several round trips in one call timeout: start undelayed.
    holder.wait_for_lease(secs(10));
    proxy.set_mode(Mode::delay(ms(400)));
    let renewed = "snowlease_renewals_total{outcome=\"renewed\"}";
    assert!(
        poll_until(secs(8), || holder.metric(renewed).unwrap_or(0.0) >= 1.0),
        "no renew confirmed through the delay"
    );
    proxy.set_mode(Mode::Blackhole);
    let key = worker_key("orders", 0);
    let late = published_without_key(&redis, &key, secs(12), || {
        holder.id().is_some() || holder.read_output_file().is_some()
    });
    assert_eq!(late, None, "ID published after Redis expired the key");
}

/// Validity at re-adoption: a sidecar restarted in the same pod after Redis lost its
/// data (key and claim guard gone) must not re-create its recorded key; it claims anew through
/// the claim guard, so nothing is published for one TTL.
#[test]
fn readoption_never_recreates_a_missing_key() {
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let pod = PodDir::new();
    let worker = |name: &str| {
        Sidecar::worker(&redis, "orders")
            .name(name)
            .pod(&pod)
            .flag("--max-worker-id", "3")
            .flag("--ttl", "4s")
            .flag("--renew-interval", "1s")
            .spawn()
    };
    let mut first = worker("first");
    let lease = first.wait_for_lease(secs(10));
    assert!(poll_until(secs(2), || first.read_state().is_some()));
    first.signal(Signal::SIGKILL);
    first.wait_exit(secs(5)).expect("killed");
    let _: () = redis.query(&mut redis::cmd("FLUSHALL"));
    let restarted = worker("restarted");
    assert!(
        restarted.wait_for_log("recorded lease is gone", secs(5)),
        "no re-adoption attempt"
    );
    assert!(restarted.wait_for_log("no claim guard", secs(2)));
    let key = worker_key("orders", lease.worker_id);
    thread::sleep(ms(500));
    assert_ne!(
        redis.get(&key).as_deref(),
        Some(lease.owner.as_str()),
        "the recorded key was re-created"
    );
    assert_eq!(restarted.id(), None, "published while claims are paused");
}

/// Samples every 10 ms for `how_long` or until `published` turns false: the first moment (ms
/// after the start) `published` held while `key` no longer existed in Redis, if any.
fn published_without_key(
    redis: &RedisServer,
    key: &str,
    how_long: Duration,
    mut published: impl FnMut() -> bool,
) -> Option<u128> {
    let start = Instant::now();
    let mut conn = redis.conn();
    while start.elapsed() < how_long {
        let is_published = published();
        let exists: bool = redis::cmd("EXISTS").arg(key).query(&mut conn).unwrap();
        // Published before EXISTS answered "gone": a late unpublish.
        if is_published && !exists {
            return Some(start.elapsed().as_millis());
        }
        if !is_published {
            return None;
        }
        thread::sleep(ms(10));
    }
    panic!("still published after {how_long:?}");
}
