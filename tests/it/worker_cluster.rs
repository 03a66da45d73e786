//! Worker mode on Redis Cluster: lease keys spread over slots and shards, one claim
//! guard per ID key in its slot. Real topologies: a killed primary, a slot migrated while
//! leases renew, a shard that comes back empty; `/id` of every sidecar sampled every 20 ms.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Instant;

use snowlease::connection::{Keyspace, Redis, RedisTarget};
use snowlease::identity::Owner;
use snowlease::worker_id::claim::{ClaimOutcome, claim_lowest};
use snowlease::worker_id::keys::LeaseKeys;

use crate::harness::*;

/// GET `key` on the primary that serves it.
fn cluster_get(topo: &ClusterTopology, key: &str) -> Option<String> {
    topo.server(topo.owner_of_key(key).port).get(key)
}

/// The primary port serving each worker ID's key.
fn shards(topo: &ClusterTopology, app: &str, ids: u32) -> BTreeMap<u32, u16> {
    (0..ids)
        .map(|id| (id, topo.owner_of_key(&worker_key(app, id)).port))
        .collect()
}

/// 33 sidecars over 32 IDs on 3 primaries + 3 replicas: `guard open` opens every per-ID guard
/// (claims at once); the 32 IDs are unique and each key on its shard holds its sidecar's owner;
/// the 33rd waits. A primary holding IDs is killed (replica promoted): no ID published twice
/// in any 20 ms sample, every sidecar publishes again, none exits. (Handover to the 33rd and
/// re-adoption after a restart run on Cluster in `scenarios`.)
#[test]
fn worker_on_cluster_shares_ids_and_survives_a_killed_primary() {
    let mut topo = ClusterTopology::start();
    let url = topo.url();
    let app = "crowd";
    let open = guard_open(&url, app, &[]);
    assert_eq!(open.code, Some(0), "{open:?}");
    let line: serde_json::Value = serde_json::from_str(&open.stdout).unwrap();
    assert_eq!(line["guards"], 32, "{line}");
    assert!(
        topo.server(
            topo.owner_of_key(&format!("{PREFIX}{app}:guard:{{{PREFIX}{app}:5}}"))
                .port
        )
        .exists(&format!("{PREFIX}{app}:guard:{{{PREFIX}{app}:5}}")),
        "the per-ID guard lives in its ID key's slot"
    );

    let spawn = |i: usize, pod: Option<&PodDir>| {
        let mut b = Sidecar::worker_at(&url, app)
            .name(format!("sidecar {i}"))
            .flag("--ttl", "4s")
            .flag("--renew-interval", "1s")
            .flag("--max-worker-id", "31");
        if let Some(pod) = pod {
            b = b.pod(pod);
        }
        b.spawn()
    };
    let started = Instant::now();
    let mut holders: Vec<Sidecar> = (0..32).map(|i| spawn(i, None)).collect();
    let leases: Vec<IdReply> = holders.iter().map(|s| s.wait_for_lease(secs(30))).collect();
    let detected = holders[0]
        .wait_for_event("topology detected", secs(1))
        .expect("the plain redis:// URL's topology is logged");
    assert_eq!(detected["topology"], "cluster", "{detected}");
    println!(
        "32 sidecars published on Cluster {:?} after spawn",
        started.elapsed()
    );
    let ids: BTreeSet<u32> = leases.iter().map(|l| l.worker_id).collect();
    assert_eq!(ids, (0..=31).collect::<BTreeSet<u32>>(), "unique IDs");
    // Run again over 32 held keys under 32 open guards: a no-op, exit 0.
    let again = guard_open(&url, app, &[]);
    assert_eq!(again.code, Some(0), "{again:?}");
    let line: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(
        (&line["already_open"], &line["lease_keys"]),
        (&serde_json::json!(true), &serde_json::json!(32)),
        "{line}"
    );
    for lease in &leases {
        let key = worker_key(app, lease.worker_id);
        assert_eq!(cluster_get(&topo, &key), Some(lease.owner.clone()), "{key}");
    }
    let mut last = spawn(32, None);
    assert!(last.wait_for_log("all worker IDs are held", secs(20)));
    assert_eq!(last.get_id().0, 503);

    // Kill the primary serving the most IDs.
    let by_shard = shards(&topo, app, 32);
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    for port in by_shard.values() {
        *counts.entry(*port).or_default() += 1;
    }
    let (&victim, &held_there) = counts.iter().max_by_key(|(_, n)| **n).unwrap();
    let mut addrs: Vec<SocketAddr> = holders.iter().map(Sidecar::http_addr).collect();
    addrs.push(last.http_addr());
    let (promoted, gaps) = sample_through(&addrs[..32], || topo.kill_primary(victim));
    println!(
        "killed primary :{victim} ({held_there} IDs) -> :{}; longest time without an ID: {:?}",
        promoted.port,
        gaps.iter().max()
    );
    for gap in &gaps {
        assert!(*gap < secs(15), "a sidecar was without an ID for {gap:?}");
    }
    for s in holders.iter_mut().chain([&mut last]) {
        assert!(s.is_running(), "{} exited", s.name());
    }
    let now: Vec<Option<u32>> = published(&addrs);
    let seen: Vec<u32> = now.iter().flatten().copied().collect();
    assert_eq!(
        seen.len(),
        seen.iter().collect::<BTreeSet<_>>().len(),
        "{now:?}"
    );
}

/// On 3 primaries: (1) a slot holding a held ID key is migrated to another primary
/// (`SETSLOT MIGRATING/IMPORTING` + `MIGRATE`) while leases renew every 500 ms: no ID
/// published twice in any sample; the lease survives or is lost cleanly and reclaimed.
/// (2) A shard comes back empty: a newcomer does not get the IDs whose keys lived there
/// before their guards open, but takes the free ID on another shard at once; the holders of
/// the lost keys keep their IDs (their renewals re-create the keys). `status` summarises the
/// per-ID guards; `guard open` refuses while keys exist.
#[test]
fn worker_on_cluster_through_a_migration_and_an_empty_shard() {
    let mut topo = ClusterTopology::start_primaries_only();
    let url = topo.url();

    // (1) Migration.
    let app = "mig";
    assert_eq!(guard_open(&url, app, &[]).code, Some(0));
    let movers: Vec<Sidecar> = (0..4)
        .map(|i| {
            Sidecar::worker_at(&url, app)
                .name(format!("mover {i}"))
                .flag("--ttl", "2s")
                .flag("--renew-interval", "500ms")
                .flag("--max-worker-id", "3")
                .spawn()
        })
        .collect();
    let leases: Vec<IdReply> = movers.iter().map(|s| s.wait_for_lease(secs(20))).collect();
    let key = worker_key(app, leases[0].worker_id);
    let slot = topo.keyslot(&key);
    let from = topo.owner_of_slot(slot).port;
    let to = topo.other_primary_than_owner(slot);
    let addrs: Vec<SocketAddr> = movers.iter().map(Sidecar::http_addr).collect();
    let ((), gaps) = sample_through(&addrs, || {
        let mut m = topo.begin_migration(slot, to);
        std::thread::sleep(ms(700));
        while m.move_keys(10) > 0 {
            std::thread::sleep(ms(300));
        }
        std::thread::sleep(ms(1500));
        m.finish();
        std::thread::sleep(ms(1500));
    });
    println!("slot {slot} :{from} -> :{to}; longest time without an ID: {gaps:?}");
    assert_eq!(topo.owner_of_key(&key).port, to);
    let holder = poll_some(secs(10), || {
        topo.server(to)
            .get(&key)
            .filter(|v| !v.starts_with("released:"))
    });
    assert!(holder.is_some(), "{key} held on its new primary");
    for s in &movers {
        assert!(s.id().is_some(), "{} publishes", s.name());
    }

    // (2) An empty shard. Renewals 10 s apart leave a wide window in which the lost keys are
    // missing while their holders still publish them.
    let app = "orders";
    assert_eq!(guard_open(&url, app, &[]).code, Some(0));
    let worker = |name: String| {
        Sidecar::worker_at(&url, app)
            .name(name)
            .flag("--ttl", "20s")
            .flag("--renew-interval", "10s")
            .flag("--max-worker-id", "7")
            .spawn()
    };
    let holders: Vec<Sidecar> = (0..7).map(|i| worker(format!("holder {i}"))).collect();
    let held: BTreeSet<u32> = holders
        .iter()
        .map(|s| s.wait_for_lease(secs(20)).worker_id)
        .collect();
    assert_eq!(held, (0..7).collect::<BTreeSet<u32>>());
    let by_shard = shards(&topo, app, 8);
    let free_shard = by_shard[&7];
    let emptied = topo
        .primaries()
        .into_iter()
        .map(|p| p.port)
        .filter(|p| *p != free_shard)
        .max_by_key(|p| by_shard.values().filter(|s| *s == p).count())
        .unwrap();
    let lost: Vec<u32> = by_shard
        .iter()
        .filter(|(_, p)| **p == emptied)
        .map(|(id, _)| *id)
        .collect();
    assert!(!lost.is_empty(), "IDs on :{emptied}: {by_shard:?}");

    topo.restart_shard_empty(emptied);
    assert!(
        lost.iter()
            .all(|id| !topo.server(emptied).exists(&worker_key(app, *id))),
        "the shard came back empty"
    );
    let mut addrs: Vec<SocketAddr> = holders.iter().map(Sidecar::http_addr).collect();
    let spawned = Instant::now();
    let newcomer = worker("newcomer".into());
    addrs.push(newcomer.http_addr());
    let (took, _) = sample_through(&addrs, || newcomer.wait_for_lease(secs(10)));
    println!(
        "newcomer took ID {} {:?} after spawn; IDs {lost:?} lost with :{emptied}",
        took.worker_id,
        spawned.elapsed()
    );
    assert_eq!(
        took.worker_id, 7,
        "the free ID on a shard that kept its data"
    );
    let status = run_snowlease(
        &["status", "--app", app, "--redis-url", &url],
        &[],
        secs(20),
    );
    assert_eq!(status.code, Some(0), "{status:?}");
    assert!(
        status.stdout.contains("claim guards (one per ID)") && status.stdout.contains("closed"),
        "{}",
        status.stdout
    );
    // The holders of the lost keys renew within 10 s and re-create them; all keep their IDs.
    for id in &lost {
        let key = worker_key(app, *id);
        assert!(
            poll_until(secs(15), || topo.server(emptied).exists(&key)),
            "{key} re-created by its holder"
        );
    }
    let now = published(&addrs);
    assert!(now.iter().all(Option::is_some), "{now:?}");
    let refused = guard_open(&url, app, &[]);
    assert_eq!(refused.code, Some(5), "{refused:?}");

    // No lease key, but a per-ID guard closed (as a claim leaves it after a shard lost its
    // data): refused too, and no other guard is written.
    let fresh = "fresh";
    let guard = |id: u32| format!("{PREFIX}{fresh}:guard:{{{}}}", worker_key(fresh, id));
    let node = topo.server(topo.owner_of_key(&guard(2)).port);
    let (secs_now, _): (u64, u64) = node.query(&mut redis::cmd("TIME"));
    node.set_stamped(&guard(2), (secs_now + 60) * 1000);
    let refused = guard_open(&url, fresh, &["--max-worker-id", "3"]);
    assert_eq!(refused.code, Some(5), "{refused:?}");
    assert!(refused.stderr.contains("closed"), "{refused:?}");
    for id in [0, 1, 3] {
        assert_eq!(
            cluster_get(&topo, &guard(id)),
            None,
            "guard of {id} not written"
        );
    }
    // Forced, with one lease key: the reply counts it once.
    let key = worker_key(fresh, 1);
    let holder = topo.server(topo.owner_of_key(&key).port);
    let _: () = holder.query(redis::cmd("SET").arg(&key).arg("10.0.0.9#beef"));
    let forced = guard_open(&url, fresh, &["--max-worker-id", "3", "--force"]);
    assert_eq!(forced.code, Some(0), "{forced:?}");
    let line: serde_json::Value = serde_json::from_str(&forced.stdout).unwrap();
    assert_eq!(
        (line["lease_keys"].as_i64(), line["guards"].as_i64()),
        (Some(1), Some(4)),
        "{line}"
    );
}

async fn set(conn: &mut Redis, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

/// `claim_lowest` on 3 primaries, its reads grouped into one pipeline per node: with every
/// ID on one node taken, the lowest free ID (on another node) is claimed in 2 calls (the
/// read, one script call); our own key is found and adopted wherever it lives, also while
/// its slot is being migrated (the node answers ASK for it) and after the move (our slot
/// view is stale: the group is read again key by key).
#[tokio::test(flavor = "current_thread")]
async fn cluster_claim_reads_each_node_once_and_follows_a_moving_slot() {
    let topo = ClusterTopology::start_primaries_only();
    let mut conn = RedisTarget::parse(&topo.url())
        .unwrap()
        .connect(secs(5))
        .unwrap();
    let (ttl, owner) = (secs(30), Owner::generate("test"));
    let keys = LeaseKeys::new(PREFIX, "spread");
    for guard in keys.guards(
        snowlease::worker_id::range::WorkerRange::up_to(31),
        Keyspace::Slots,
    ) {
        let _: i64 = stamp_cmd(&guard, 0).query_async(&mut conn).await.unwrap();
    }
    let node: Vec<u16> = (0..32)
        .map(|id| topo.owner_of_key(&keys.id(id)).port)
        .collect();
    assert!(node.iter().collect::<BTreeSet<_>>().len() == 3, "{node:?}");

    // Every ID on the node of ID 0 is held by others.
    for id in (0..32).filter(|id| node[*id] == node[0]) {
        set(&mut conn, &keys.id(id as u16), "other#0").await;
    }
    let lowest_free = (0..32).find(|id| node[*id] != node[0]).unwrap();
    let reply = claim_lowest(&mut conn, &keys, 31, &owner, ttl)
        .await
        .unwrap();
    assert_eq!(
        reply.outcome,
        ClaimOutcome::Claimed(lowest_free),
        "{reply:?}"
    );
    assert_eq!(reply.calls, 2, "one read, one script call");
    let key = keys.id(lowest_free as u16);
    assert_eq!(
        topo.server(node[lowest_free]).get(&key).as_deref(),
        Some(owner.as_str())
    );
    let again = claim_lowest(&mut conn, &keys, 31, &owner, ttl)
        .await
        .unwrap();
    assert_eq!(
        (again.outcome, again.calls),
        (ClaimOutcome::Adopted(lowest_free), 2)
    );

    // Our key alone, on ID 31: found and adopted, not a lower free ID claimed.
    for id in 0..32u16 {
        let _: () = redis::cmd("DEL")
            .arg(keys.id(id))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let ours = keys.id(31);
    set(&mut conn, &ours, owner.as_str()).await;
    let adopt = async |conn: &mut Redis| {
        let reply = claim_lowest(conn, &keys, 31, &owner, ttl).await.unwrap();
        assert_eq!(reply.outcome, ClaimOutcome::Adopted(31), "{reply:?}");
    };
    adopt(&mut conn).await;
    let slot = topo.keyslot(&ours);
    let to = topo
        .primaries()
        .into_iter()
        .find(|p| p.port != node[31])
        .unwrap()
        .port;
    let mut migration = topo.begin_migration(slot, to);
    assert!(migration.move_keys(10) > 0, "key and guard moved");
    adopt(&mut conn).await;
    migration.finish();
    adopt(&mut conn).await;
    adopt(&mut conn).await;
    assert_eq!(topo.server(to).get(&ours).as_deref(), Some(owner.as_str()));
    assert_eq!(topo.owner_of_key(&ours).port, to, "the slot moved");
}
