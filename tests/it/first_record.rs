//! A store's first record (docs/rollback-design.md, "First use") where Redis cannot say
//! whether it is durable: an ACL without `+bgsave`, as on a managed service. The new lock,
//! pool or guard must then stay closed for one bound (TTL, max lease) from its first use, and
//! a rollback that loses the first record must still hand nothing out twice. (Where the
//! record is durable, the tests of `rollback_break.rs` show the store opening at once.)

use std::fs;
use std::time::Instant;

use tempfile::TempDir;

use crate::acl::{POOL_RULES, acl_log, acl_user, deploy_steps_rule};
use crate::harness::*;
use crate::lock::LOCK_RULES;
use crate::pool_cli::pool_cmd;

/// The documented deploy-steps user (docs/kubernetes.md) less `+bgsave`: its URL.
fn deploy_user_without_bgsave(redis: &RedisServer) -> String {
    acl_user(
        redis,
        "snowlease",
        &deploy_steps_rule().replace(" +bgsave", ""),
    )
}

/// A fence handed out after the counter was lifted to Redis time in µs.
const LIFTED: u64 = 1_000_000_000_000_000;

/// `lock` at `url`, its command writing its fence to `out` (30 s at most).
pub(crate) fn lock_run(url: &str, name: &str, ttl: &str, wait: &str, out: &std::path::Path) -> Run {
    run_snowlease(
        &[
            "lock",
            "--name",
            name,
            "--redis-url",
            url,
            "--ttl",
            ttl,
            "--wait",
            wait,
            "--",
            "sh",
            "-c",
            "echo \"$SNOWLEASE_FENCE\" > \"$OUT\"",
        ],
        &[("OUT", out.to_str().unwrap())],
        secs(30),
    )
}

fn fence_in(path: &std::path::Path) -> u64 {
    fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

/// Without `+bgsave` a new lock is closed for its TTL (3 s) from its first acquire, says why,
/// and then hands out a fence above Redis time in µs. A SIGKILL-restart from a snapshot older
/// than that first use loses the record, the fence and the holder's key; the next first use
/// waits one TTL again and its fence is above the first holder's.
#[test]
fn without_bgsave_a_new_lock_waits_its_ttl_and_a_lost_first_use_is_not_repeated() {
    let mut redis = RedisServer::start();
    let rules = LOCK_RULES.replace(" +bgsave", "");
    let url = acl_user(&redis, "locker", &rules);
    // The last snapshot: no lock yet.
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    let dir = TempDir::new().unwrap();
    let started = Instant::now();
    let first = lock_run(&url, "nightly", "3s", "10s", &dir.path().join("a"));
    let waited = started.elapsed();
    assert_eq!(first.code, Some(0), "{first:?}");
    assert!(
        waited >= ms(2500),
        "opened after {waited:?}, before its TTL"
    );
    assert!(
        first.stderr.contains("new lock") && first.stderr.contains("BGSAVE"),
        "says why it waits: {}",
        first.stderr
    );
    let fence_a = fence_in(&dir.path().join("a"));
    assert!(fence_a > LIFTED, "fence {fence_a} not lifted");

    redis.restart();
    // ACL users are not in the snapshot: the same user again.
    acl_user(&redis, "locker", &rules);
    assert!(
        !redis.exists("snowlease:lock:{nightly}:node"),
        "the record is lost"
    );
    let started = Instant::now();
    let second = lock_run(&url, "nightly", "3s", "10s", &dir.path().join("b"));
    let waited = started.elapsed();
    assert_eq!(second.code, Some(0), "{second:?}");
    assert!(waited >= ms(2500), "opened after {waited:?}");
    let fence_b = fence_in(&dir.path().join("b"));
    assert!(fence_b > fence_a, "fence {fence_b} not above {fence_a}");
    let denied = acl_log(&redis);
    assert!(
        !denied.is_empty() && denied.iter().all(|e| e.contains("bgsave")),
        "only BGSAVE denied: {denied:?}"
    );
}

/// Without `+bgsave` a pool written with plain commands is closed for the first acquire's
/// max lease (3 s): `pool acquire` exits 3 at once; with `--wait` it leases once that passed,
/// with a lifted fence.
#[test]
fn without_bgsave_a_new_pool_stays_closed_for_its_max_lease() {
    let redis = RedisServer::start();
    let _: () = redis.query(redis::cmd("ZADD").arg("{proxies}:ready").arg(0).arg("a"));
    let url = acl_user(&redis, "pooler", &POOL_RULES.replace(" +bgsave", ""));
    let env = [("REDIS_URL", url.as_str())];
    let acquire = [
        "acquire",
        "--pool",
        "proxies",
        "--ttl",
        "1s",
        "--max-lease",
        "3s",
    ];
    let started = Instant::now();
    let closed = pool_cmd(&redis, &acquire, &env);
    assert_eq!(closed.code, Some(3), "{closed:?}");
    let mut waiting = acquire.to_vec();
    waiting.extend(["--wait", "10s"]);
    let leased = pool_cmd(&redis, &waiting, &env);
    assert_eq!(leased.code, Some(0), "{leased:?}");
    assert!(started.elapsed() >= ms(2500), "leased before the max lease");
    let lease: serde_json::Value = serde_json::from_str(&leased.stdout).unwrap();
    assert!(lease["fence"].as_u64().unwrap() > LIFTED, "{lease}");
}

/// `guard open` with the deploy rule less `+bgsave`: it says the durability is unchecked,
/// leaves the guard closed for its `--ttl` (4 s), and the first sidecar claims after that.
#[test]
fn guard_open_without_bgsave_leaves_the_guard_closed_for_its_ttl() {
    let redis = RedisServer::start();
    let url = deploy_user_without_bgsave(&redis);
    let open = guard_open(&url, "orders", &["--ttl", "4s"]);
    assert_eq!(open.code, Some(0), "{open:?}");
    let line: serde_json::Value = serde_json::from_str(&open.stdout).unwrap();
    assert!(
        line["durability_unchecked"]
            .as_str()
            .is_some_and(|s| s.contains("BGSAVE")),
        "{line}"
    );
    assert!(
        open.stderr.contains("warning: durability unchecked"),
        "{open:?}"
    );
    let started = Instant::now();
    let mut sidecar = Sidecar::worker_at(&url, "orders")
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .spawn();
    sidecar.wait_for_lease(secs(15));
    assert!(
        started.elapsed() >= ms(2500),
        "claimed through a closed guard"
    );
    sidecar.signal(Signal::SIGTERM);
    assert_eq!(sidecar.wait_exit(secs(5)).and_then(|s| s.code()), Some(0));
}

/// `--force` where `BGSAVE` is refused: the operator vouches that no holder can be lost with
/// the guard, so it opens now (it stayed closed for `--ttl`, though docs/worker.md says
/// `--force` opens it), and says the durability is unchecked.
#[test]
fn guard_open_force_without_bgsave_opens_now() {
    let redis = RedisServer::start();
    let url = deploy_user_without_bgsave(&redis);
    let open = guard_open(&url, "orders", &["--ttl", "60s", "--force"]);
    assert_eq!(open.code, Some(0), "{open:?}");
    assert!(open.stdout.contains("durability_unchecked"), "{open:?}");
    // Closed, the guard would hold the claim for 60 s.
    let sidecar = Sidecar::worker_at(&url, "orders")
        .flag("--ttl", "60s")
        .spawn();
    sidecar.wait_for_lease(secs(10));
}
