//! Claims over ranges of more than 32 IDs (interleaved windows) broken on purpose: the
//! re-adoption of a key that still holds our owner string, sidecars of one app with
//! different `--max-worker-id`, bad hints, keys of another type, lost replies.

use snowlease::connection::Keyspace;
use snowlease::identity::Owner;
use snowlease::worker_id::claim::{ClaimOutcome, Claimer, start_window, window_of, windows};
use snowlease::worker_id::keys::LeaseKeys;

use crate::claim_windows::{conn, hold};
use crate::harness::*;

/// Whether a claim by `owner` over 1024 IDs starts in another window than ID 1000's
/// (window 40 of 64).
fn starts_away_from_1000(owner: &str) -> bool {
    let count = windows(1023).len();
    start_window(owner, count) != window_of(1000, count)
}

fn open_guard(redis: &RedisServer, app: &str) {
    redis.set_stamped(&format!("{PREFIX}{app}:guard"), 0);
}

/// The lease keys of `app` whose value is `owner`.
fn keys_holding(redis: &RedisServer, app: &str, owner: &str) -> Vec<String> {
    redis
        .keys(&format!("{PREFIX}{app}:[0-9]*"))
        .into_iter()
        .filter(|k| redis.get(k).as_deref() == Some(owner))
        .collect()
}

/// One keeper's [`Claimer`] over 1024 IDs: its claim took ID 1000 (window 40, the only free
/// one), then the range emptied. Claimed again with the same owner string (what the keeper
/// does after its lease was unpublished while the key still holds that string: a loss by
/// the deadline whose renew ran, an evicting Redis, a gate refusal), it must adopt 1000, as
/// the single call over 32 IDs does (`claim.lua` adopts first). It took the lowest free ID of
/// its start window instead (key 1000 kept our owner string until its TTL) until a claim
/// began starting in the window of the ID it last held.
#[tokio::test(flavor = "current_thread")]
async fn a_second_claim_by_the_same_owner_adopts_its_key_in_another_window() {
    let redis = RedisServer::start();
    let mut c = conn(&redis.url());
    let keys = LeaseKeys::new(PREFIX, "again");
    open_guard(&redis, "again");
    // The seed's range of 32 IDs, one call: the second claim adopts (the control).
    let seed = Owner::generate("test");
    hold(&redis, "again", 0..30);
    let mut claimer = Claimer::new(&keys, 31);
    let first = claimer.claim(&mut c, &seed, secs(30)).await.unwrap();
    assert_eq!(first.outcome, ClaimOutcome::Claimed(30), "{first:?}");
    let lower: Vec<String> = (0..30).map(|id| worker_key("again", id)).collect();
    let _: () = redis.query(redis::cmd("DEL").arg(&lower));
    let second = claimer.claim(&mut c, &seed, secs(30)).await.unwrap();
    assert_eq!(second.outcome, ClaimOutcome::Adopted(30), "{second:?}");
    let _: () = redis.query(&mut redis::cmd("FLUSHDB"));
    open_guard(&redis, "again");
    let owner = (0..)
        .map(|_| Owner::generate("test"))
        .find(|o| starts_away_from_1000(o.as_str()))
        .unwrap();
    hold(&redis, "again", (0..1024).filter(|id| *id != 1000));
    let mut claimer = Claimer::new(&keys, 1023);
    let first = claimer.claim(&mut c, &owner, secs(30)).await.unwrap();
    assert_eq!(first.outcome, ClaimOutcome::Claimed(1000), "{first:?}");

    let others: Vec<String> = (0..1024)
        .filter(|id| *id != 1000)
        .map(|id| worker_key("again", id))
        .collect();
    let _: () = redis.query(redis::cmd("DEL").arg(&others));
    let second = claimer.claim(&mut c, &owner, secs(30)).await.unwrap();
    assert_eq!(
        second.outcome,
        ClaimOutcome::Adopted(1000),
        "{second:?}; keys holding our owner string: {:?}",
        keys_holding(&redis, "again", owner.as_str())
    );
}

/// The same on Cluster (3 primaries): the claimer reads only the windows it walks, so its
/// second claim took the lowest free ID of its start window too.
#[tokio::test(flavor = "current_thread")]
async fn a_second_claim_by_the_same_owner_adopts_its_key_in_another_window_on_cluster() {
    let topo = ClusterTopology::start_primaries_only();
    let url = topo.url();
    let mut c = conn(&url);
    let keys = LeaseKeys::new(PREFIX, "again");
    let mut setup = redis::pipe();
    for guard in keys.guards(
        snowlease::worker_id::range::WorkerRange::up_to(1023),
        Keyspace::Slots,
    ) {
        setup.add_command(stamp_cmd(&guard, 0)).ignore();
    }
    for id in (0..1024).filter(|id| *id != 1000) {
        setup
            .cmd("SET")
            .arg(worker_key("again", id))
            .arg("10.9.9.9#beef")
            .ignore();
    }
    let _: () = setup.query_async(&mut c).await.unwrap();
    let owner = (0..)
        .map(|_| Owner::generate("test"))
        .find(|o| starts_away_from_1000(o.as_str()))
        .unwrap();
    let mut claimer = Claimer::new(&keys, 1023);
    let first = claimer.claim(&mut c, &owner, secs(30)).await.unwrap();
    assert_eq!(first.outcome, ClaimOutcome::Claimed(1000), "{first:?}");

    let mut del = redis::pipe();
    for id in (0..1024).filter(|id| *id != 1000) {
        del.cmd("DEL").arg(worker_key("again", id)).ignore();
    }
    let _: () = del.query_async(&mut c).await.unwrap();
    let second = claimer.claim(&mut c, &owner, secs(30)).await.unwrap();
    let ours: Vec<u32> = (0..1024)
        .filter(|id| {
            let key = worker_key("again", *id);
            topo.server(topo.owner_of_key(&key).port)
                .get(&key)
                .as_deref()
                == Some(owner.as_str())
        })
        .collect();
    assert_eq!(
        second.outcome,
        ClaimOutcome::Adopted(1000),
        "{second:?}; IDs whose key holds our owner string: {ours:?}"
    );
}

/// The same through the sidecar, as docs/worker.md promises for an evicting Redis ("It
/// claims again once the policy is `noeviction`, re-adopting the same key while it still
/// holds its owner string"): `--max-worker-id 1023`, the sidecar holds 1000 (the only free
/// ID, outside its start window), the range empties, `maxmemory-policy allkeys-lru`
/// unpublishes it, `noeviction` again while key 1000 still holds its owner string. Expected:
/// it holds 1000 again and no other key holds its owner string.
#[test]
fn an_evicting_redis_reclaim_readopts_its_key_over_1024_ids() {
    let redis = RedisServer::start_with(RedisOptions {
        args: vec!["--maxmemory".into(), "64mb".into()],
        ..RedisOptions::default()
    });
    open_guard(&redis, "evict");
    hold(&redis, "evict", (0..1024).filter(|id| *id != 1000));
    let (sidecar, owner) = (0..10)
        .find_map(|_| {
            let sidecar = Sidecar::worker(&redis, "evict")
                .flag("--max-worker-id", "1023")
                .flag("--ttl", "30s")
                .flag("--renew-interval", "1s")
                .spawn();
            let lease = sidecar.wait_for_lease(secs(10));
            assert_eq!(lease.worker_id, 1000);
            if starts_away_from_1000(&lease.owner) {
                return Some((sidecar, lease.owner));
            }
            // Started in window 40 itself (1 in 64): try another owner string.
            sidecar.signal(Signal::SIGKILL);
            let _: () = redis.query(redis::cmd("DEL").arg(worker_key("evict", 1000)));
            None
        })
        .expect("an owner string that starts outside window 40");
    let others: Vec<String> = (0..1024)
        .filter(|id| *id != 1000)
        .map(|id| worker_key("evict", id))
        .collect();
    let _: () = redis.query(redis::cmd("DEL").arg(&others));

    let set = |policy: &str| {
        let _: () = redis.query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(policy),
        );
    };
    set("allkeys-lru");
    assert!(
        poll_until(secs(5), || sidecar.id().is_none()),
        "still published 5 s after the policy changed"
    );
    assert_eq!(
        redis.get(&worker_key("evict", 1000)).as_deref(),
        Some(owner.as_str()),
        "key 1000 still holds the owner string"
    );
    set("noeviction");
    let lease = sidecar.wait_for_lease(secs(10));
    let ours = keys_holding(&redis, "evict", &owner);
    assert_eq!(
        (lease.worker_id, ours.clone()),
        (1000, vec![worker_key("evict", 1000)]),
        "re-adopted 1000; keys holding the owner string: {ours:?}"
    );
}

/// Holds only while the claim runs: a test's own record of who holds which ID.
type Held = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<usize, String>>>;

/// Claimers of one app with `--max-worker-id` 31, 100 and 1023 at once (16 of each), each
/// claiming (again while all of 0-31 are held), holding a moment and releasing (owner-checked
/// DEL) 6 times: no ID is ever taken
/// while another claimer holds it, none outside its claimer's range, and the hint a wider
/// range leaves (up to 1023) never makes a narrower claim fail.
async fn mixed_ranges(url: &str, app: &str) {
    let keys = LeaseKeys::new(PREFIX, app);
    let held: Held = Default::default();
    let tasks = [31u16, 100, 1023]
        .into_iter()
        .flat_map(|max| (0..16).map(move |n| (max, n)));
    let claims = tasks.map(|(max, _)| {
        let (keys, held) = (keys.clone(), held.clone());
        let mut c = conn(url);
        async move {
            let mut claimer = Claimer::new(&keys, max);
            let mut got = Vec::new();
            for _ in 0..6 {
                let owner = Owner::generate("mixed");
                // 48 claimers may fill 0-31 for a while: all held is no finding.
                let id = loop {
                    let reply = claimer.claim(&mut c, &owner, secs(30)).await.unwrap();
                    match reply.outcome {
                        ClaimOutcome::Claimed(id) => break id,
                        ClaimOutcome::AllHeld if max == 31 => tokio::task::yield_now().await,
                        _ => panic!("max {max}: {reply:?}"),
                    }
                };
                assert!(id <= usize::from(max), "max {max} took {id}");
                if let Some(other) = held.lock().unwrap().insert(id, owner.as_str().into()) {
                    panic!("{id} taken by {owner:?} while {other} holds it");
                }
                got.push(id);
                tokio::task::yield_now().await;
                held.lock().unwrap().remove(&id);
                let key = keys.id(u16::try_from(id).unwrap());
                let del = redis::Script::new(
                    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
                );
                let n: i64 = del.key(&key).arg(owner.as_str()).invoke_async(&mut c).await.unwrap();
                assert_eq!(n, 1, "{key} no longer ours");
            }
            got
        }
    });
    let all: Vec<Vec<usize>> = futures_util::future::join_all(claims).await;
    assert_eq!(all.iter().map(Vec::len).sum::<usize>(), 48 * 6);
}

#[tokio::test(flavor = "current_thread")]
async fn mixed_ranges_of_one_app_never_share_an_id_on_one_server() {
    let redis = RedisServer::start();
    open_guard(&redis, "mixed");
    mixed_ranges(&redis.url(), "mixed").await;
}

#[tokio::test(flavor = "current_thread")]
async fn mixed_ranges_of_one_app_never_share_an_id_on_cluster() {
    let topo = ClusterTopology::start_primaries_only();
    let url = topo.url();
    let keys = LeaseKeys::new(PREFIX, "mixed");
    let mut open = redis::pipe();
    for guard in keys.guards(
        snowlease::worker_id::range::WorkerRange::up_to(1023),
        Keyspace::Slots,
    ) {
        open.add_command(stamp_cmd(&guard, 0)).ignore();
    }
    let _: () = open.query_async(&mut conn(&url)).await.unwrap();
    mixed_ranges(&url, "mixed").await;
}

/// A hint of garbage or of another type, or naming an ID outside the range, on a range of
/// 101 IDs (7 windows of 14-15) where only ID 98 (window 0) is free: every claim takes 98
/// (no error, no ID outside the range) in at most one call per window, the hint of another
/// type is left as it was.
#[tokio::test(flavor = "current_thread")]
async fn bad_hints_lead_nowhere_wrong() {
    let redis = RedisServer::start();
    let mut c = conn(&redis.url());
    let keys = LeaseKeys::new(PREFIX, "hint");
    open_guard(&redis, "hint");
    let hint = format!("{PREFIX}hint:hint");
    let strings = [
        "abc", "-5", "99999", "1.5", "nan", "inf", "1e300", "0x10", "65535", "1000", "", " 7",
    ];
    let mut setups: Vec<(String, redis::Cmd)> = strings
        .iter()
        .map(|v| {
            (
                format!("string {v:?}"),
                redis::cmd("SET").arg(&hint).arg(*v).clone(),
            )
        })
        .collect();
    setups.push((
        "list".into(),
        redis::cmd("RPUSH").arg(&hint).arg("3").clone(),
    ));
    setups.push((
        "hash".into(),
        redis::cmd("HSET").arg(&hint).arg("a").arg("3").clone(),
    ));
    for (value, mut set) in setups {
        let _: () = redis.query(redis::cmd("FLUSHDB").arg("SYNC"));
        open_guard(&redis, "hint");
        hold(&redis, "hint", (0..=100).filter(|id| *id != 98));
        let _: redis::Value = redis.query(&mut set);
        let owner = Owner::generate("test");
        let reply = Claimer::new(&keys, 100)
            .claim(&mut c, &owner, secs(30))
            .await
            .unwrap_or_else(|e| panic!("hint {value}: {e}"));
        assert_eq!(reply.outcome, ClaimOutcome::Claimed(98), "hint {value}");
        assert!(reply.calls <= 7, "hint {value}: {reply:?}");
        match value.as_str() {
            "list" | "hash" => assert_eq!(redis.key_type(&hint), value),
            _ => assert_eq!(redis.get(&hint).as_deref(), Some("98"), "hint {value}"),
        }
    }
}

/// Environment variables of one run.
type Env<'a> = &'a [(&'a str, &'a str)];

/// `--max-worker-id` out of range, negative or huge, in every spelling: exit 2, a message
/// that names the flag and its range 0-1023, nothing written to Redis. `1024` and `70000`
/// say `... is outside 0-1023 (10 bits)`; `-1` as its own argument said only
/// `unexpected argument '-1' found` (no flag, no range), and `=-1`, `99999999999` and the
/// env var `-1` said `is not in 0..=4294967295` (the parser's type, not the range).
#[test]
fn a_negative_or_huge_max_worker_id_names_the_flag_and_its_range() {
    let redis = RedisServer::start();
    let url = redis.url();
    let base = ["worker", "--app", "badin", "--redis-url", url.as_str()];
    let cases: [(&[&str], Env); 6] = [
        (&["--max-worker-id", "1024"], &[]),
        (&["--max-worker-id", "70000"], &[]),
        (&["--max-worker-id", "-1"], &[]),
        (&["--max-worker-id=-1"], &[]),
        (&["--max-worker-id", "99999999999"], &[]),
        (&[], &[("SNOWLEASE_MAX_WORKER_ID", "-1")]),
    ];
    let mut wrong = Vec::new();
    for (extra, env) in cases {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let run = run_snowlease(&args, env, secs(10));
        assert_eq!(run.code, Some(2), "{extra:?} {env:?}: {run:?}");
        let said = run.stderr.to_lowercase();
        if !(said.contains("max-worker-id") && said.contains("0-1023")) {
            wrong.push(format!("{extra:?} {env:?}: {}", run.stderr.trim()));
        }
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
    assert!(
        wrong.is_empty(),
        "messages without the flag or 0-1023:\n{}",
        wrong.join("\n")
    );
}

/// A windowed claim whose reply is lost: a sidecar over 1024 IDs waits behind a missing
/// guard (one TTL, 2 s); Redis is SIGSTOPped before that round, past the call timeout, then
/// SIGCONTed. Whatever ran, the sidecar ends up holding one ID, and only that ID's key holds
/// its owner string.
#[test]
fn a_lost_windowed_claim_reply_is_adopted_not_doubled() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "lost")
        .flag("--max-worker-id", "1023")
        .switch("--allow-evicting-redis")
        .spawn();
    assert!(sidecar.wait_for_log("no claim guard", secs(10)));
    // Lower half held: the claim goes on in its start window (8 free IDs each).
    hold(&redis, "lost", 0..512);
    redis.pause();
    assert!(
        sidecar.wait_for_log("retrying claim", secs(15)),
        "a claim round must time out"
    );
    redis.resume();
    let lease = sidecar.wait_for_lease(secs(15));
    let ours = keys_holding(&redis, "lost", &lease.owner);
    assert_eq!(
        ours,
        vec![worker_key("lost", lease.worker_id)],
        "one key holds the owner string"
    );
    assert!(lease.worker_id >= 512, "{lease:?}");
    // The claim sent while Redis was stopped ran at SIGCONT; the next round adopted its key.
    let adopted = sidecar.metric("snowlease_claim_attempts_total{outcome=\"adopted\"}");
    assert_eq!(adopted, Some(1.0), "the lost claim's key adopted");
}

/// `SCRIPT FLUSH` on every node between windowed claims (one server, Cluster of 3
/// primaries): each claim loads `claim.lua` again and takes an ID; 8 claims, 8 distinct IDs.
#[tokio::test(flavor = "current_thread")]
async fn script_flush_between_windowed_claims_is_ridden_through() {
    let redis = RedisServer::start();
    open_guard(&redis, "flush");
    let topo = ClusterTopology::start_primaries_only();
    let keys = LeaseKeys::new(PREFIX, "flush");
    let mut open = redis::pipe();
    for guard in keys.guards(
        snowlease::worker_id::range::WorkerRange::up_to(1023),
        Keyspace::Slots,
    ) {
        open.add_command(stamp_cmd(&guard, 0)).ignore();
    }
    let _: () = open.query_async(&mut conn(&topo.url())).await.unwrap();
    let flush = |servers: &[&RedisServer]| {
        for server in servers {
            let _: () = server.query(redis::cmd("SCRIPT").arg("FLUSH"));
        }
    };
    let nodes: Vec<&RedisServer> = topo.servers().iter().collect();
    for (url, servers) in [(redis.url(), vec![&redis]), (topo.url(), nodes)] {
        let mut c = conn(&url);
        let mut ids = std::collections::BTreeSet::new();
        for n in 0..8 {
            flush(&servers);
            let reply = Claimer::new(&keys, 1023)
                .claim(&mut c, &Owner::generate("test"), secs(30))
                .await
                .unwrap_or_else(|e| panic!("{url} claim {n}: {e}"));
            let ClaimOutcome::Claimed(id) = reply.outcome else {
                panic!("{url} claim {n}: {reply:?}")
            };
            assert!(ids.insert(id), "{url}: {id} twice");
        }
    }
}
