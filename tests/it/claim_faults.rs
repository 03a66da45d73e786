//! Claims over 1024 IDs (64 interleaved windows) under real faults, by an adversarial
//! tester: concurrent claimers at exhaustion, lease keys of another type inside windows, a
//! Cluster primary stopped or killed mid-claim, a standalone Redis restarted empty during
//! windowed claims, a slot migrated under windowed claims. Safety first: never two live
//! holders of one ID, no claimer left holding two keys, a clear answer when all are held.

use std::collections::{BTreeMap, BTreeSet};

use futures_util::future::join_all;
use snowlease::connection::Redis;
use snowlease::identity::Owner;
use snowlease::worker_id::claim::{ClaimOutcome, ClaimReply, Claimer, start_window};
use snowlease::worker_id::keys::LeaseKeys;

use crate::claim_windows::{MAX, conn};
use crate::harness::*;

const OTHER: &str = "10.9.9.9#beef";

/// Opens every guard of `app` (the app guard on one server, the per-ID guards on Cluster)
/// and sets the lease key of each of `held` to [`OTHER`], through the library's connection
/// (routed per key on Cluster).
async fn setup(url: &str, app: &str, held: impl Iterator<Item = u16>) {
    let mut c = conn(url);
    let keys = LeaseKeys::new(PREFIX, app);
    let keyspace = c.keyspace().await.unwrap();
    let mut pipe = redis::pipe();
    let guards: BTreeSet<String> = keys
        .guards(
            snowlease::worker_id::range::WorkerRange::up_to(MAX),
            keyspace,
        )
        .into_iter()
        .collect();
    for guard in guards {
        pipe.add_command(stamp_cmd(&guard, 0)).ignore();
    }
    for id in held {
        pipe.cmd("SET").arg(keys.id(id)).arg(OTHER).ignore();
    }
    let _: () = pipe.query_async(&mut c).await.unwrap();
}

/// Every string lease key of `app` on `primaries`, by worker ID, with its value.
fn string_leases(primaries: &[&RedisServer], app: &str) -> BTreeMap<u32, String> {
    let mut out = BTreeMap::new();
    for node in primaries {
        for key in node.keys(&format!("{PREFIX}{app}:[0-9]*")) {
            let id: u32 = key.rsplit(':').next().unwrap().parse().unwrap();
            if node.key_type(&key) == "string" {
                let value = node.get(&key).unwrap();
                assert!(out.insert(id, value).is_none(), "{key} on two primaries");
            }
        }
    }
    out
}

/// The primaries of a Cluster with slots, as their processes.
fn cluster_primaries(topo: &ClusterTopology) -> Vec<&RedisServer> {
    topo.primaries()
        .iter()
        .map(|p| topo.server(p.port))
        .collect()
}

/// IDs whose lease key holds `owner`.
fn ids_of(leases: &BTreeMap<u32, String>, owner: &str) -> Vec<u32> {
    leases
        .iter()
        .filter(|(_, v)| v.as_str() == owner)
        .map(|(id, _)| *id)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Exhaustion: 1020 of 1024 IDs held, 10 claimers at once.

/// The 4 free IDs, in windows 5, 37, 44 and 63.
const FREE: [u16; 4] = [5, 37, 300, 1023];

/// Windows of 1024 IDs, and so the step between the IDs of one window.
const WINDOWS: u16 = crate::claim_windows::WINDOWS as u16;

/// One claim by each of `claimers`, all at once.
async fn round(claimers: &mut [(Owner, Claimer, Redis)]) -> Vec<(String, ClaimReply)> {
    let calls = claimers.iter_mut().map(|(owner, claimer, c)| async move {
        let reply = claimer.claim(c, owner, secs(30)).await;
        (owner.as_str().to_owned(), reply.unwrap())
    });
    join_all(calls).await
}

/// 10 library claimers at once, each on its own connection with its own owner string, over
/// 1024 IDs of which 1020 are held: exactly 4 take an ID (the 4 free ones, distinct), the 6
/// others answer all held after looking at every window (64 calls on one server). Then 6 of
/// the other owner's keys are deleted and the 6 claim again with the same claimers and owner
/// strings: each takes one of those 6, distinct. Every key holds its claimant's string, and
/// no owner string is in two keys.
async fn ten_claimers_on_four_free_ids(url: &str, app: &str, primaries: &[&RedisServer]) {
    setup(url, app, (0..=MAX).filter(|id| !FREE.contains(id))).await;
    let keys = LeaseKeys::new(PREFIX, app);
    let mut claimers: Vec<(Owner, Claimer, Redis)> = (0..10)
        .map(|_| (Owner::generate("ten"), Claimer::new(&keys, MAX), conn(url)))
        .collect();
    let replies: Vec<(String, ClaimReply)> = round(&mut claimers).await;
    let (won, lost): (Vec<_>, Vec<_>) = replies
        .iter()
        .partition(|(_, r)| matches!(r.outcome, ClaimOutcome::Claimed(_)));
    let got: BTreeSet<usize> = won
        .iter()
        .map(|(_, r)| match r.outcome {
            ClaimOutcome::Claimed(id) => id,
            _ => unreachable!(),
        })
        .collect();
    let free: BTreeSet<usize> = FREE.iter().map(|id| usize::from(*id)).collect();
    assert_eq!((won.len(), &got), (4, &free), "{replies:?}");
    for (owner, reply) in &lost {
        assert_eq!(reply.outcome, ClaimOutcome::AllHeld, "{owner}: {reply:?}");
        assert!(
            reply.calls >= u32::from(WINDOWS),
            "every window looked at: {reply:?}"
        );
    }
    let leases = string_leases(primaries, app);
    for (owner, _) in &replies {
        let want = usize::from(won.iter().any(|(o, _)| o == owner));
        assert_eq!(ids_of(&leases, owner).len(), want, "{owner}");
    }

    // Free 6 of the other owner's IDs, spread over windows; the 6 losers claim again.
    let freed: [u16; 6] = [0, 1, 64, 500, 777, 1022];
    let mut del = redis::pipe();
    for id in freed {
        del.cmd("DEL").arg(keys.id(id)).ignore();
    }
    let _: () = del.query_async(&mut conn(url)).await.unwrap();
    let losers: Vec<&String> = lost.iter().map(|(o, _)| o).collect();
    let mut again: Vec<(Owner, Claimer, Redis)> = claimers
        .into_iter()
        .filter(|(o, ..)| losers.contains(&&o.as_str().to_owned()))
        .collect();
    assert_eq!(again.len(), 6);
    let replies = round(&mut again).await;
    let got: BTreeSet<usize> = replies
        .iter()
        .map(|(o, r)| match r.outcome {
            ClaimOutcome::Claimed(id) => id,
            _ => panic!("{o}: {r:?} (all replies: {replies:?})"),
        })
        .collect();
    let want: BTreeSet<usize> = freed.iter().map(|id| usize::from(*id)).collect();
    assert_eq!(got, want, "{replies:?}");
    let leases = string_leases(primaries, app);
    for (owner, reply) in &replies {
        let ClaimOutcome::Claimed(id) = reply.outcome else {
            unreachable!()
        };
        assert_eq!(ids_of(&leases, owner), vec![id as u32], "{owner}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn ten_claimers_share_the_last_four_of_1024_ids_on_one_server() {
    let redis = RedisServer::start();
    ten_claimers_on_four_free_ids(&redis.url(), "last4", &[&redis]).await;
}

#[tokio::test(flavor = "current_thread")]
async fn ten_claimers_share_the_last_four_of_1024_ids_on_cluster() {
    let topo = ClusterTopology::start_primaries_only();
    ten_claimers_on_four_free_ids(&topo.url(), "last4", &cluster_primaries(&topo)).await;
}

// ---------------------------------------------------------------------------------------------
// Lease keys of another type inside windows.

/// The window a claim by `owner` over 1024 IDs starts in (of 64).
fn start_of(owner: &str) -> u16 {
    u16::try_from(start_window(owner, usize::from(WINDOWS))).unwrap()
}

/// On 1024 IDs all held but for: in the claim's start window `s`, ID `s` is a hash and
/// `s + 64` a list (MGET reads both as nil, like free keys), and `s + 128` is a set; in
/// window `t = s + 7 (mod 64)`, ID `t + 192` is free. The claim takes `t + 192`, reports
/// `s`, `s + 64`, `s + 128` as wrong type, and the three keys keep their type, content and
/// no expiry. A second claimer then finds all held, reporting the same three.
async fn wrong_types_in_the_start_window(url: &str, app: &str, primaries: &[&RedisServer]) {
    let owner = Owner::generate("types");
    let s = start_of(owner.as_str());
    let t = (s + 7) % WINDOWS;
    let (hash, list, set, free) = (s, s + WINDOWS, s + 2 * WINDOWS, t + 3 * WINDOWS);
    let odd = [hash, list, set];
    setup(
        url,
        app,
        (0..=MAX).filter(|id| !odd.contains(id) && *id != free),
    )
    .await;
    let keys = LeaseKeys::new(PREFIX, app);
    let mut c = conn(url);
    let mut put = redis::pipe();
    put.cmd("HSET")
        .arg(keys.id(hash))
        .arg("f")
        .arg("v")
        .ignore();
    put.cmd("RPUSH")
        .arg(keys.id(list))
        .arg("a")
        .arg("b")
        .ignore();
    put.cmd("SADD").arg(keys.id(set)).arg("m").ignore();
    let _: () = put.query_async(&mut c).await.unwrap();

    let reply = Claimer::new(&keys, MAX)
        .claim(&mut c, &owner, secs(30))
        .await
        .unwrap();
    assert_eq!(
        reply.outcome,
        ClaimOutcome::Claimed(usize::from(free)),
        "{reply:?}"
    );
    let reported: BTreeSet<usize> = reply.wrong_type.iter().copied().collect();
    let odd_ids: BTreeSet<usize> = odd.iter().map(|id| usize::from(*id)).collect();
    assert_eq!(reported, odd_ids, "{reply:?}");

    let second = Claimer::new(&keys, MAX)
        .claim(&mut c, &Owner::generate("types"), secs(30))
        .await
        .unwrap();
    assert_eq!(second.outcome, ClaimOutcome::AllHeld, "{second:?}");
    let reported: BTreeSet<usize> = second.wrong_type.iter().copied().collect();
    assert_eq!(reported, odd_ids, "{second:?}");

    let node_of = |id: u16| {
        let key = keys.id(id);
        let node = primaries
            .iter()
            .find(|n| n.keys(&key) == [key.clone()])
            .unwrap_or_else(|| panic!("{key} gone"));
        (key, *node)
    };
    let (key, node) = node_of(hash);
    let fields: Vec<String> = node.query(redis::cmd("HGETALL").arg(&key));
    assert_eq!(
        (node.key_type(&key), fields, node.pttl(&key)),
        ("hash".into(), vec!["f".into(), "v".into()], -1)
    );
    let (key, node) = node_of(list);
    let items: Vec<String> = node.query(redis::cmd("LRANGE").arg(&key).arg(0).arg(-1));
    assert_eq!(
        (node.key_type(&key), items, node.pttl(&key)),
        ("list".into(), vec!["a".into(), "b".into()], -1)
    );
    let (key, node) = node_of(set);
    let members: Vec<String> = node.query(redis::cmd("SMEMBERS").arg(&key));
    assert_eq!(
        (node.key_type(&key), members, node.pttl(&key)),
        ("set".into(), vec!["m".into()], -1)
    );
    let leases = string_leases(primaries, app);
    assert_eq!(ids_of(&leases, owner.as_str()), vec![u32::from(free)]);
    assert_eq!(leases.len(), 1021, "1020 held + ours");
}

#[tokio::test(flavor = "current_thread")]
async fn keys_of_another_type_in_a_window_are_skipped_on_one_server() {
    let redis = RedisServer::start();
    wrong_types_in_the_start_window(&redis.url(), "types", &[&redis]).await;
}

#[tokio::test(flavor = "current_thread")]
async fn keys_of_another_type_in_a_window_are_skipped_on_cluster() {
    let topo = ClusterTopology::start_primaries_only();
    wrong_types_in_the_start_window(&topo.url(), "types", &cluster_primaries(&topo)).await;
}

// ---------------------------------------------------------------------------------------------
// Cluster: a primary stopped or killed while sidecars over 1024 IDs claim.

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A sidecar over 1024 IDs (TTL 2 s, renew every 500 ms: call timeout 125 ms).
fn wide(url: &str, app: &str, name: String) -> Sidecar {
    Sidecar::worker_at(url, app)
        .name(name)
        .flag("--max-worker-id", "1023")
        .flag("--claim-timeout", "60s")
        .spawn()
}

/// Every sidecar publishes, the IDs are distinct, and each sidecar's owner string is in
/// exactly one lease key, the one of the ID it publishes; none exited.
fn assert_one_key_each(sidecars: &mut [Sidecar], primaries: &[&RedisServer], app: &str) {
    let leases: Vec<IdReply> = sidecars
        .iter()
        .map(|s| s.wait_for_lease(secs(30)))
        .collect();
    let ids: BTreeSet<u32> = leases.iter().map(|l| l.worker_id).collect();
    assert_eq!(ids.len(), leases.len(), "distinct IDs: {leases:?}");
    let keys = string_leases(primaries, app);
    for (s, lease) in sidecars.iter_mut().zip(&leases) {
        assert!(s.is_running(), "{} exited", s.name());
        assert_eq!(
            ids_of(&keys, &lease.owner),
            vec![lease.worker_id],
            "{}: keys holding its owner string",
            s.name()
        );
    }
    println!(
        "published: {:?}",
        leases.iter().map(|l| l.worker_id).collect::<Vec<_>>()
    );
}

/// The Cluster primary serving the most of `ids`' keys.
fn busiest_primary(topo: &ClusterTopology, app: &str, ids: &[u32]) -> u16 {
    let mut counts: BTreeMap<u16, usize> = topo.primaries().iter().map(|p| (p.port, 0)).collect();
    for id in ids {
        *counts
            .entry(topo.owner_of_key(&worker_key(app, *id)).port)
            .or_default() += 1;
    }
    counts.into_iter().max_by_key(|(_, n)| *n).unwrap().0
}

/// The lower half of 1024 IDs held by another owner, and 3 sidecars holding IDs of the upper
/// half: the sidecars, and the primary serving most of their keys.
fn holders_on(topo: &ClusterTopology, url: &str, app: &str) -> (Vec<Sidecar>, u16) {
    block_on(setup(url, app, 0..512));
    let holders: Vec<Sidecar> = (0..3)
        .map(|i| wide(url, app, format!("holder {i}")))
        .collect();
    let held: Vec<u32> = holders
        .iter()
        .map(|s| s.wait_for_lease(secs(20)).worker_id)
        .collect();
    let victim = busiest_primary(topo, app, &held);
    (holders, victim)
}

/// `n` sidecars over 1024 IDs started at once, named `newcomer <i>`.
fn newcomers_on(url: &str, app: &str, n: usize) -> Vec<Sidecar> {
    (0..n)
        .map(|i| wide(url, app, format!("newcomer {i}")))
        .collect()
}

/// 3 primaries + 3 replicas, lower half of 1024 IDs held: 3 sidecars hold IDs; the primary
/// serving most of them is SIGSTOPped just as 3 more sidecars start claiming, for past the
/// TTL (its replica is promoted meanwhile), then SIGCONTed (it rejoins as a replica). No ID
/// published by two sidecars in any 20 ms sample; in the end all 6 publish distinct IDs and
/// each owner string is in exactly one key.
#[test]
fn a_cluster_primary_stopped_during_windowed_claims() {
    let topo = ClusterTopology::start();
    let (url, app) = (topo.url(), "stopped");
    let (mut holders, victim) = holders_on(&topo, &url, app);
    let mut addrs: Vec<_> = holders.iter().map(Sidecar::http_addr).collect();
    let mut newcomers = Vec::new();
    let started = std::time::Instant::now();
    let ((), gaps) = sample_through(&addrs.clone(), || {
        newcomers = newcomers_on(&url, app, 3);
        topo.server(victim).pause();
        let paused = std::time::Instant::now();
        // Past the TTL, and until a replica serves the victim's slots.
        assert!(
            poll_until(secs(20), || paused.elapsed() > secs(3)
                && topo.primaries().iter().all(|p| p.port != victim)),
            "no replica of :{victim} promoted"
        );
        topo.server(victim).resume();
        println!("primary :{victim} stopped {:?}", paused.elapsed());
    });
    println!(
        "holders' longest gaps {gaps:?}, after {:?}",
        started.elapsed()
    );
    addrs.extend(newcomers.iter().map(Sidecar::http_addr));
    holders.append(&mut newcomers);
    topo.wait_cluster_ok();
    assert_one_key_each(&mut holders, &cluster_primaries(&topo), app);
}

/// The same with the primary SIGKILLed (its replica takes over) as the 3 newcomers claim.
#[test]
fn a_cluster_primary_killed_during_windowed_claims() {
    let mut topo = ClusterTopology::start();
    let (url, app) = (topo.url(), "killed");
    let (mut holders, victim) = holders_on(&topo, &url, app);
    let addrs: Vec<_> = holders.iter().map(Sidecar::http_addr).collect();
    let mut newcomers = Vec::new();
    let (promoted, gaps) = sample_through(&addrs, || {
        newcomers = newcomers_on(&url, app, 3);
        topo.kill_primary(victim)
    });
    println!(
        "killed :{victim} -> :{}; holders' longest gaps {gaps:?}",
        promoted.port
    );
    holders.append(&mut newcomers);
    assert_one_key_each(&mut holders, &cluster_primaries(&topo), app);
}

/// What each sidecar's claims went through: rounds that failed, keys adopted.
fn claim_story(sidecars: &[Sidecar]) -> Vec<String> {
    sidecars
        .iter()
        .map(|s| {
            let m = |o: &str| {
                s.metric(&format!(
                    "snowlease_claim_attempts_total{{outcome=\"{o}\"}}"
                ))
                .unwrap_or(0.0)
            };
            format!(
                "{}: retried {} error {} claimed {} adopted {}",
                s.name(),
                s.count_log("retrying claim"),
                m("error"),
                m("claimed"),
                m("adopted")
            )
        })
        .collect()
}

/// 3 primaries, no replicas (nothing is failed over): 3 holders, then 8 newcomers over 1024
/// IDs start; as soon as the first newcomer publishes, the primary serving most holders is
/// SIGSTOPped (the others still claiming; claims sent to it run when it resumes) for 3 s
/// (past the TTL and the node timeout: the Cluster goes down), then SIGCONTed.
#[test]
fn a_cluster_primary_without_replicas_stopped_mid_claims() {
    let topo = ClusterTopology::start_primaries_only();
    let (url, app) = (topo.url(), "midstop");
    let (mut all, victim) = holders_on(&topo, &url, app);
    let addrs: Vec<_> = all.iter().map(Sidecar::http_addr).collect();
    let mut newcomers: Vec<Sidecar> = Vec::new();
    let ((), gaps) = sample_through(&addrs, || {
        newcomers = newcomers_on(&url, app, 8);
        assert!(poll_until(secs(20), || newcomers
            .iter()
            .any(|s| s.id().is_some())));
        topo.server(victim).pause();
        let paused = std::time::Instant::now();
        let published = newcomers.iter().filter(|s| s.id().is_some()).count();
        assert!(poll_until(secs(10), || paused.elapsed() > secs(3)));
        topo.server(victim).resume();
        println!("{published} newcomers published when :{victim} stopped");
    });
    println!("holders' longest gaps {gaps:?}");
    all.append(&mut newcomers);
    topo.wait_cluster_ok();
    let story = claim_story(&all);
    println!("{}", story.join("\n"));
    assert_one_key_each(&mut all, &cluster_primaries(&topo), app);
}

// ---------------------------------------------------------------------------------------------
// One server restarted empty during windowed claims.

/// A standalone Redis with 1020 of 1024 IDs held by another owner (guard open), every sidecar
/// at TTL 4 s: 4 holders take the 4 free IDs (renewing every 1.5 s, so some re-create their
/// key up to 1.5 s after the restart), 6 newcomers find all held and keep claiming. Redis is
/// SIGKILLed and started empty on the same port. The holders keep their IDs (their renewals
/// re-create the keys); no newcomer publishes before one TTL after the restart (the claim
/// guard, lost with the data, is closed by the first claim); no ID is published twice in any
/// 20 ms sample; in the end all 10 publish distinct IDs, each owner string in one key.
#[test]
fn a_standalone_redis_restarted_empty_during_windowed_claims() {
    let mut redis = RedisServer::start();
    let (url, app) = (redis.url(), "restart");
    block_on(setup(&url, app, (0..=MAX).filter(|id| !FREE.contains(id))));
    let sidecar = |name: String, renew: &str| {
        Sidecar::worker_at(&url, app)
            .name(name)
            .flag("--max-worker-id", "1023")
            .flag("--claim-timeout", "60s")
            .flag("--ttl", "4s")
            .flag("--renew-interval", renew)
            .spawn()
    };
    let mut all: Vec<Sidecar> = (0..4)
        .map(|i| sidecar(format!("holder {i}"), "1500ms"))
        .collect();
    let held: Vec<u32> = all
        .iter()
        .map(|s| s.wait_for_lease(secs(20)).worker_id)
        .collect();
    let mut free: Vec<u32> = FREE.iter().map(|id| u32::from(*id)).collect();
    let mut sorted = held.clone();
    free.sort();
    sorted.sort();
    assert_eq!(sorted, free);
    all.extend((0..6).map(|i| sidecar(format!("newcomer {i}"), "500ms")));
    for s in &all[4..] {
        assert!(
            s.wait_for_log("all worker IDs are held", secs(10)),
            "{}",
            s.name()
        );
    }
    let addrs: Vec<_> = all.iter().map(Sidecar::http_addr).collect();
    let (first, gaps) = sample_through(&addrs, || {
        redis.restart();
        let restarted = std::time::Instant::now();
        // Each newcomer: when it publishes after the restart.
        let mut first: BTreeMap<usize, std::time::Duration> = BTreeMap::new();
        assert!(
            poll_until(secs(20), || {
                for (i, s) in all.iter().enumerate().skip(4) {
                    if !first.contains_key(&i) && s.id().is_some() {
                        first.insert(i, restarted.elapsed());
                    }
                }
                first.len() == 6
            }),
            "not every newcomer published: {first:?}"
        );
        first
    });
    println!("holders {held:?}; gaps {gaps:?}; newcomers published after the restart {first:?}");
    for (i, after) in &first {
        // The guard opens one TTL after the first claim that found it missing, which came
        // after the restart; 150 ms allowed for the sampling.
        assert!(
            *after >= ms(3850),
            "{} published {after:?} after the restart",
            all[*i].name()
        );
    }
    for (s, id) in all.iter().zip(&held) {
        assert_eq!(
            s.id().map(|l| l.worker_id),
            Some(*id),
            "{} kept its ID",
            s.name()
        );
        assert!(s.count_log("lease re-created") >= 1, "{}", s.name());
    }
    println!("{}", claim_story(&all).join("\n"));
    assert_one_key_each(&mut all, &[&redis], app);
}

// ---------------------------------------------------------------------------------------------
// Cluster: a slot in migration under windowed claims.

/// 3 primaries, 1024 IDs all held but two: `x` in the claim's start window and `y` in another.
/// The slot of `x` (its lease key and per-ID guard) is put in migration (`SETSLOT
/// IMPORTING/MIGRATING`; with `move_guard` its guard is `MIGRATE`d to the target): `claim.lua`
/// on the pair (missing lease key, existing guard) then meets `TRYAGAIN` at either end until
/// the move ends. The claim must still take `y` (the script never ran on `x`), not fail.
/// Before the fix the claim ended with `TryAgain: Multiple keys request during rehashing of
/// slot` after 1.3-2.6 s (redis-rs' own retries), without looking past `x`.
async fn claim_past_a_migrating_slot(move_guard: bool) {
    let topo = ClusterTopology::start_primaries_only();
    let (url, app) = (topo.url(), "migr");
    let owner = Owner::generate("migr");
    let s = start_of(owner.as_str());
    let (x, y) = (s + WINDOWS, (s + 5) % WINDOWS + 2 * WINDOWS);
    setup(&url, app, (0..=MAX).filter(|id| ![x, y].contains(id))).await;
    let keys = LeaseKeys::new(PREFIX, app);
    let slot = topo.keyslot(&keys.id(x));
    let to = topo.other_primary_than_owner(slot);
    let mut migration = topo.begin_migration(slot, to);
    if move_guard {
        assert!(migration.move_keys(100) > 0, "the guard of {x} moved");
    }
    let mut c = conn(&url);
    let started = std::time::Instant::now();
    let mut claimer = Claimer::new(&keys, MAX);
    let claim = claimer.claim(&mut c, &owner, secs(30));
    let reply = tokio::time::timeout(secs(10), claim).await;
    println!(
        "claim over a migrating slot of {x} took {:?}: {reply:?}",
        started.elapsed()
    );
    while migration.move_keys(100) > 0 {}
    migration.finish();
    let reply = reply.expect("the claim ends").expect("no error");
    assert_eq!(
        reply.outcome,
        ClaimOutcome::Claimed(usize::from(y)),
        "{reply:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_claim_goes_past_a_free_id_whose_slot_is_migrating() {
    claim_past_a_migrating_slot(false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_claim_goes_past_a_free_id_whose_guard_was_migrated() {
    claim_past_a_migrating_slot(true).await;
}

/// The same through the sidecar: 3 primaries, 1024 IDs all held but `x` = 100 (window 36)
/// and `y` = 1000 (window 40); the claim hint names 100, so a claim that does not start in
/// window 40 looks at window 36 second. The slot of 100 is left in migration (a reshard stopped half
/// way, until `redis-cli --cluster fix`). The sidecar (claim timeout 8 s; the harness's call
/// timeout, 125 ms) must publish 1000 while the slot migrates. Before the fix every claim
/// round stopped at 100 with `TRYAGAIN` ("redis unavailable; retrying claim") and the sidecar
/// exited 3 at the claim timeout, `no worker ID claimed within 8s: redis unavailable: TRYAGAIN
/// ...`, with 1000 free all along. With a call timeout under 2.6 s it still did after that
/// fix, as `redis call timed out after 125 ms`: redis-rs waited 1.28 s or more before each of
/// its own retries of `TRYAGAIN`, so the error never came within the call.
#[test]
fn a_sidecar_claims_past_a_free_id_whose_slot_is_migrating() {
    let topo = ClusterTopology::start_primaries_only();
    let (url, app) = (topo.url(), "migw");
    let (x, y) = (100u16, 1000u16);
    block_on(async {
        setup(&url, app, (0..=MAX).filter(|id| ![x, y].contains(id))).await;
        let _: () = redis::cmd("SET")
            .arg(format!("{PREFIX}{app}:hint"))
            .arg(x)
            .query_async(&mut conn(&url))
            .await
            .unwrap();
    });
    let keys = LeaseKeys::new(PREFIX, app);
    let slot = topo.keyslot(&keys.id(x));
    let to = topo.other_primary_than_owner(slot);
    let migration = topo.begin_migration(slot, to);
    let mut sidecar = (0..5)
        .find_map(|n| {
            let s = Sidecar::worker_at(&url, app)
                .name(format!("sidecar {n}"))
                .flag("--max-worker-id", "1023")
                .flag("--claim-timeout", "8s")
                .spawn();
            let owner = poll_some(secs(5), || {
                s.events_with("\"owner\"")
                    .iter()
                    .find_map(|e| e["owner"].as_str().map(str::to_owned))
            });
            match owner {
                // Started in window 40 itself (1 in 64): try another owner string.
                Some(o) if start_of(&o) == y % WINDOWS => None,
                _ => Some(s),
            }
        })
        .unwrap();
    let started = std::time::Instant::now();
    let published = poll_some(secs(10), || sidecar.id());
    let exit = sidecar.wait_exit(ms(500)).map(|e| e.code());
    let mut migration = migration;
    while migration.move_keys(100) > 0 {}
    migration.finish();
    let said: Vec<String> = sidecar
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("retrying claim") || l.contains("exiting"))
        .collect();
    assert_eq!(
        published.as_ref().map(|l| l.worker_id),
        Some(u32::from(y)),
        "after {:?} while slot {slot} of ID {x} migrates; exit {exit:?}; log: {said:#?}",
        started.elapsed()
    );
}
