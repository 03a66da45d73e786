//! `--worker-ids LOW-HIGH`: regions with a Redis each hand out disjoint IDs; a recorded ID
//! outside the range is not re-adopted; overlapping ranges on one Redis are logged, counted
//! and shown by `status`; bad ranges refused naming the flags; a range filled by concurrent
//! claims on one server and on Cluster.

use std::collections::BTreeSet;

use futures_util::future::join_all;
use serde_json::Value;
use snowlease::connection::Keyspace;
use snowlease::identity::Owner;
use snowlease::worker_id::claim::{ClaimOutcome, Claimer};
use snowlease::worker_id::keys::LeaseKeys;
use snowlease::worker_id::range::WorkerRange;

use crate::harness::*;

/// A sidecar of `app` on `redis` that claims from `range` (TTL 2 s, renew every 500 ms).
fn region_worker(redis: &RedisServer, app: &str, range: &str) -> SidecarBuilder {
    Sidecar::worker(redis, app).flag("--worker-ids", range)
}

/// Two regions, each with its own Redis, give their sidecars 100-102 and 200-202: all six
/// sidecars hold IDs, no ID twice, each inside its region's range, lease keys with the real
/// ID; a fourth sidecar of region A finds its range exhausted, says which range, counts
/// `full`, stays unready and exits 3 at its claim timeout, as when every ID of an app is held.
#[test]
fn two_regions_on_two_redis_servers_never_hand_out_one_id() {
    let app = "orders";
    let regions = [
        (RedisServer::start(), "100-102", 100..=102u32),
        (RedisServer::start(), "200-202", 200..=202u32),
    ];
    let mut sidecars = Vec::new();
    for (redis, range, _) in &regions {
        redis.open_claim_guard(app);
        for _ in 0..3 {
            sidecars.push(region_worker(redis, app, range).spawn());
        }
    }
    let ids: Vec<u32> = sidecars
        .iter()
        .map(|s| s.wait_for_lease(secs(10)).worker_id)
        .collect();
    let distinct: BTreeSet<u32> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 6, "no ID twice: {ids:?}");
    for (i, (redis, _, allowed)) in regions.iter().enumerate() {
        let region = &ids[3 * i..3 * i + 3];
        assert!(region.iter().all(|id| allowed.contains(id)), "{region:?}");
        let keys: BTreeSet<String> = redis
            .keys(&format!("{PREFIX}{app}:[0-9]*"))
            .into_iter()
            .collect();
        let expected: BTreeSet<String> = allowed.clone().map(|id| worker_key(app, id)).collect();
        assert_eq!(keys, expected, "keys carry the real ID");
    }

    let mut extra = region_worker(&regions[0].0, app, "100-102")
        .flag("--claim-timeout", "3s")
        .spawn();
    let said = extra
        .wait_for_event("all worker IDs are held", secs(10))
        .expect("exhaustion is logged");
    assert_eq!(said["worker_ids"], "100-102", "{said}");
    assert_eq!(extra.metric("snowlease_worker_ids"), Some(3.0));
    assert!(
        extra
            .metric("snowlease_claim_attempts_total{outcome=\"full\"}")
            .unwrap_or(0.0)
            >= 1.0
    );
    assert_eq!(extra.readyz(), 503);
    // As when every ID of an app is held: exit 3 at the claim timeout, naming the range.
    let status = extra
        .wait_exit(secs(15))
        .expect("exits at the claim timeout");
    assert_eq!(status.code(), Some(3));
    let log = extra.log_lines().join("\n");
    assert!(log.contains("all 3 worker IDs (100-102) are held"), "{log}");
    assert!(
        regions[1].0.keys(&format!("{PREFIX}{app}:[0-9]*")).len() == 3,
        "the other region untouched"
    );
}

/// A sidecar restarted in its pod with another range does not re-adopt the ID its state file
/// names when that ID is outside the range: it says why and claims one inside; the old key is
/// left to its TTL.
#[test]
fn a_recorded_id_outside_the_range_is_not_readopted() {
    let redis = RedisServer::start();
    let app = "moved";
    redis.open_claim_guard(app);
    let pod = PodDir::new();
    let mut first = Sidecar::worker(&redis, app)
        .pod(&pod)
        .flag("--max-worker-id", "3")
        .flag("--ttl", "30s")
        .flag("--renew-interval", "1s")
        .spawn();
    let old = first.wait_for_lease(secs(10));
    assert!(
        poll_until(secs(5), || first.read_state().is_some()),
        "the state file is written"
    );
    first.signal(Signal::SIGKILL);
    first.wait_exit(secs(2)).expect("SIGKILL ends it");
    let old_key = worker_key(app, old.worker_id);
    assert_eq!(redis.get(&old_key).as_deref(), Some(old.owner.as_str()));

    let second = Sidecar::worker(&redis, app)
        .pod(&pod)
        .flag("--worker-ids", "8-11")
        .flag("--ttl", "30s")
        .flag("--renew-interval", "1s")
        .spawn();
    let new = second.wait_for_lease(secs(10));
    assert!((8..=11).contains(&new.worker_id), "{new:?}");
    assert_ne!(new.owner, old.owner, "the recorded owner string is dropped");
    let said = second
        .wait_for_event(
            "not re-adopting the lease recorded in the state file",
            secs(2),
        )
        .expect("the refusal is logged");
    assert!(
        message(&said).contains("outside --worker-ids 8-11"),
        "{said}"
    );
    assert_eq!(redis.get(&old_key).as_deref(), Some(old.owner.as_str()));
}

/// Sidecars of one app on one Redis with 0-5 and 4-9 (and a second 0-5, one deployment's
/// range): the ones of both ranges log the other range and the shared IDs 4-5 and count one
/// overlap; `status` lists both ranges and the overlap, with a warning line; a range that
/// overlaps none counts 0.
#[test]
fn overlapping_ranges_are_logged_counted_and_shown_by_status() {
    let redis = RedisServer::start();
    let app = "shared";
    redis.open_claim_guard(app);
    let a = region_worker(&redis, app, "0-5").spawn();
    let a2 = region_worker(&redis, app, "0-5").spawn();
    let b = region_worker(&redis, app, "4-9").spawn();
    for s in [&a, &a2, &b] {
        s.wait_for_lease(secs(10));
    }
    for (s, other) in [(&a, "4-9"), (&b, "0-5")] {
        let said = s
            .wait_for_event(
                "another sidecar of this app on this Redis claims from",
                secs(10),
            )
            .expect("the overlap is logged");
        assert_eq!(said["other_worker_ids"], other, "{said}");
        assert_eq!(said["shared"], "4-5", "{said}");
        assert!(poll_until(secs(5), || s
            .metric("snowlease_worker_id_range_overlaps")
            == Some(1.0)));
    }
    assert_eq!(
        a.count_log("another sidecar of this app on this Redis claims from"),
        1,
        "said once per range"
    );

    let run = run_snowlease(
        &[
            "status",
            "--app",
            app,
            "--redis-url",
            &redis.url(),
            "--worker-ids",
            "4-9",
            "--json",
        ],
        &[],
        secs(15),
    );
    assert_eq!(run.code, Some(0), "{run:?}");
    let report: Value = serde_json::from_str(&run.stdout).expect("JSON report");
    assert_eq!(report["worker_ids"], "4-9");
    assert_eq!(report["ids"], 6);
    let ranges: Vec<&str> = report["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["worker_ids"].as_str().unwrap())
        .collect();
    assert_eq!(ranges, ["0-5", "4-9"]);
    assert_eq!(
        report["range_overlaps"],
        serde_json::json!([{"a": "0-5", "b": "4-9", "shared": "4-5"}])
    );
    let run = run_snowlease(
        &[
            "status",
            "--app",
            app,
            "--redis-url",
            &redis.url(),
            "--worker-ids",
            "4-9",
        ],
        &[],
        secs(15),
    );
    assert!(
        run.stdout.contains(
            "warning: sidecars of the app on this Redis claim from --worker-ids 0-5 and 4-9, which share IDs 4-5"
        ),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("worker ID ranges of the app's sidecars"),
        "{}",
        run.stdout
    );

    let c = region_worker(&redis, app, "20-29").spawn();
    c.wait_for_lease(secs(10));
    assert!(poll_until(secs(5), || c
        .metric("snowlease_worker_id_range_overlaps")
        == Some(0.0)));
    assert_eq!(c.count_log("another sidecar of this app"), 0);
}

/// Bad ranges exit 2 before anything is written, naming the flags and the allowed range:
/// both range flags at once (also through the env twin), a range past 1023 or empty, and in
/// mint mode a range the layout's worker bits cannot hold.
#[test]
fn bad_ranges_are_refused_naming_the_flags() {
    let dir = PodDir::new();
    let out = dir.path().join("worker-id");
    let out = out.to_str().unwrap();
    let base = [
        "worker",
        "--app",
        "a",
        "--redis-url",
        "redis://127.0.0.1:1",
        "--output-file",
        out,
    ];
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: [Case; 6] = [
        (
            &["--worker-ids", "0-9", "--max-worker-id", "9"],
            &[],
            &["--worker-ids", "--max-worker-id"],
        ),
        (
            &["--max-worker-id", "9"],
            &[("SNOWLEASE_WORKER_IDS", "0-9")],
            &["--worker-ids", "--max-worker-id"],
        ),
        (
            &["--worker-ids", "512-1024"],
            &[],
            &["--worker-ids", "0-1023"],
        ),
        (&["--worker-ids", "9-3"], &[], &["--worker-ids", "9-3"]),
        (
            &["--worker-ids", "x"],
            &[("SNOWLEASE_WORKER_IDS", "1-2")],
            &["--worker-ids", "LOW-HIGH"],
        ),
        (
            &["--mint", "--id-layout", "41:5:12", "--worker-ids", "16-40"],
            &[],
            &[
                "--id-layout",
                "--worker-ids",
                "--max-worker-id",
                "0-31",
                "16-40",
            ],
        ),
    ];
    for (extra, env, says) in cases {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let run = run_snowlease(&args, env, secs(10));
        assert_eq!(run.code, Some(2), "{extra:?}: {run:?}");
        for word in says {
            assert!(
                run.stderr.contains(word),
                "{extra:?}: {word}: {}",
                run.stderr
            );
        }
        assert!(!dir.path().join("worker-id").exists(), "nothing written");
    }
}

/// 64 claims at once (through the library, as in `claim_windows`) over `--worker-ids
/// 100-163`, windows of 16 shifted to the range: exactly the IDs 100-163, each key holding its
/// claimant's owner string; a 65th claim finds all held.
async fn fill_range(url: &str, app: &str) -> Vec<(Owner, usize)> {
    let keys = LeaseKeys::new(PREFIX, app);
    let range = WorkerRange::new(100, 163).unwrap();
    let claims = (0..64).map(|_| {
        let keys = keys.clone();
        let mut c = crate::claim_windows::conn(url);
        async move {
            let owner = Owner::generate("test");
            let reply = Claimer::over(&keys, range)
                .claim(&mut c, &owner, secs(30))
                .await
                .unwrap();
            match reply.outcome {
                ClaimOutcome::Claimed(id) => (owner, id),
                other => panic!("{other:?}"),
            }
        }
    });
    let got = join_all(claims).await;
    let ids: BTreeSet<usize> = got.iter().map(|(_, id)| *id).collect();
    assert_eq!(ids, (100..=163).collect::<BTreeSet<_>>());
    let mut c = crate::claim_windows::conn(url);
    let reply = Claimer::over(&keys, range)
        .claim(&mut c, &Owner::generate("test"), secs(30))
        .await
        .unwrap();
    assert_eq!(reply.outcome, ClaimOutcome::AllHeld, "{reply:?}");
    got
}

#[tokio::test(flavor = "current_thread")]
async fn a_range_fills_with_its_own_ids_on_one_server() {
    let redis = RedisServer::start();
    redis.set_stamped(&format!("{PREFIX}fill:guard"), 0);
    for (owner, id) in fill_range(&redis.url(), "fill").await {
        let key = worker_key("fill", id as u32);
        assert_eq!(redis.get(&key).as_deref(), Some(owner.as_str()), "{key}");
    }
    let hint: u32 = redis
        .get(&format!("{PREFIX}fill:hint"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (100..=163).contains(&hint),
        "the hint names a real ID: {hint}"
    );
    assert!(redis.keys(&format!("{PREFIX}fill:[0-9]*")).len() == 64);
}

#[tokio::test(flavor = "current_thread")]
async fn a_range_fills_with_its_own_ids_on_cluster() {
    let topo = ClusterTopology::start_primaries_only();
    let url = topo.url();
    let mut c = crate::claim_windows::conn(&url);
    let keys = LeaseKeys::new(PREFIX, "fill");
    let mut open = redis::pipe();
    for guard in keys.guards(WorkerRange::new(100, 163).unwrap(), Keyspace::Slots) {
        open.add_command(stamp_cmd(&guard, 0)).ignore();
    }
    let _: () = open.query_async(&mut c).await.unwrap();
    for (owner, id) in fill_range(&url, "fill").await {
        let key = worker_key("fill", id as u32);
        let holder = topo.server(topo.owner_of_key(&key).port).get(&key);
        assert_eq!(holder.as_deref(), Some(owner.as_str()), "{key}");
    }
}

/// `guard open --worker-ids 8-11` counts lease keys of the app below the range as well as in
/// and above it (on one server the guard covers every ID): with the guard missing and a key
/// at ID 3 it refuses (exit 5, nothing written); with no key at all it opens.
#[test]
fn guard_open_with_a_range_counts_keys_below_it() {
    let redis = RedisServer::start();
    let url = redis.url();
    let guard = format!("{PREFIX}ranged:guard");
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(worker_key("ranged", 3))
            .arg("10.9.9.9#beef")
            .arg("PX")
            .arg(30_000),
    );
    let refused = guard_open(&url, "ranged", &["--worker-ids", "8-11"]);
    assert_eq!(refused.code, Some(5), "{refused:?}");
    assert!(refused.stderr.contains("1 lease key(s)"), "{refused:?}");
    assert!(!redis.exists(&guard), "nothing written");

    let _: () = redis.query(redis::cmd("DEL").arg(worker_key("ranged", 3)));
    let opened = guard_open(&url, "ranged", &["--worker-ids", "8-11"]);
    assert_eq!(opened.code, Some(0), "{opened:?}");
    assert!(redis.exists(&guard));
}

/// `range/record.lua` on a real server: the caller's entry first with TIME + its TTL, its old
/// entry, expired entries and text that is no entry dropped, the latest others kept up to
/// the cap, the key's PX the latest entry's expiry; bad arguments are errors.
#[test]
fn the_ranges_record_keeps_live_entries_up_to_the_cap() {
    let redis = RedisServer::start();
    let script = redis::Script::new(include_str!("../../src/worker_id/range/record.lua"));
    let key = format!("{PREFIX}rec:ranges");
    let now = unix_ms();
    let old = format!(
        "0-511:{},0-9:{},512-1023:{},junk,20-29:{},30-39:{}",
        now + 50_000,
        now - 1,
        now + 400_000,
        now + 300_000,
        now + 200_000
    );
    let _: () = redis.query(redis::cmd("SET").arg(&key).arg(old));
    let (record, time): (String, u64) = script
        .key(&key)
        .arg("0-511")
        .arg(10_000)
        .arg(10)
        .invoke(&mut redis.conn())
        .unwrap();
    assert!(time.abs_diff(now) < 5_000, "{time} {now}");
    let expected = [
        format!("0-511:{}", time + 10_000),
        format!("512-1023:{}", now + 400_000),
        format!("20-29:{}", now + 300_000),
        format!("30-39:{}", now + 200_000),
    ];
    assert_eq!(record, expected.join(","), "ours first, then the latest");
    assert_eq!(redis.get(&key), Some(record));
    let pttl = redis.pttl(&key);
    assert!(pttl > 390_000 && pttl <= 400_000, "{pttl}");

    // At a cap of 2: ours and the latest other.
    let (record, time): (String, u64) = script
        .key(&key)
        .arg("40-49")
        .arg(10_000)
        .arg(2)
        .invoke(&mut redis.conn())
        .unwrap();
    assert_eq!(
        record,
        format!("40-49:{},512-1023:{}", time + 10_000, now + 400_000)
    );

    let mut conn = redis.conn();
    for (range, ttl, most) in [("x", "1", "1"), ("1-2", "0", "1"), ("1-2", "1", "0")] {
        let err = script
            .key(&key)
            .arg(range)
            .arg(ttl)
            .arg(most)
            .invoke::<(String, u64)>(&mut conn)
            .unwrap_err();
        assert!(err.to_string().contains("ranges:"), "{err}");
    }
}
