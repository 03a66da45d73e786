//! `--min-replicas-ack`: a claim or renew counts only once the
//! replicas acknowledged it (`WAIT`). The replica of a real Sentinel topology is SIGSTOPped,
//! so the primary's `WAIT` really times out.

use serde_json::json;

use crate::harness::*;

const APP: &str = "acked";

fn acked_sidecar(topo: &SentinelTopology) -> Sidecar {
    Sidecar::worker_at(&topo.url(), APP)
        .flag("--min-replicas-ack", "1")
        .spawn()
}

/// The body of `/readyz` (JSON while unready).
fn unready(sidecar: &Sidecar) -> serde_json::Value {
    let url = format!("http://{}/readyz", sidecar.http_addr());
    match ureq::get(&url).timeout(secs(2)).call() {
        Err(ureq::Error::Status(503, reply)) => reply.into_json().expect("JSON"),
        other => panic!("/readyz: {:?}", other.map(|r| r.status())),
    }
}

fn metric_or_zero(sidecar: &Sidecar, series: &str) -> f64 {
    sidecar.metric(series).unwrap_or(0.0)
}

/// Replica stopped: the claim runs (the key is ours on the primary) but is not acknowledged,
/// so nothing is published for longer than a TTL; after SIGCONT the same key is re-adopted
/// and published.
#[test]
fn claim_is_published_only_once_a_replica_acknowledged_it() {
    let topo = SentinelTopology::start_small();
    topo.primary().open_claim_guard(APP);
    let replica = 1 - topo.primary_index();
    topo.nodes()[replica].pause();
    let sidecar = acked_sidecar(&topo);
    let key = worker_key(APP, 0);
    assert!(
        poll_until(secs(10), || topo.primary().get(&key).is_some()),
        "the claim ran on the primary"
    );
    let series = "snowlease_claim_attempts_total{outcome=\"unacknowledged\"}";
    assert!(poll_until(secs(10), || metric_or_zero(&sidecar, series) >= 2.0));
    // Longer than one TTL (2 s) unacknowledged: never published, neither /id nor the file.
    let until = std::time::Instant::now() + secs(3);
    while std::time::Instant::now() < until {
        assert_eq!(sidecar.id(), None, "published an unacknowledged claim");
        assert_eq!(sidecar.read_output_file(), None);
        std::thread::sleep(ms(50));
    }
    assert_eq!(
        unready(&sidecar),
        json!({"state": "unacknowledged", "min_replicas_ack": 1})
    );
    topo.nodes()[replica].resume();
    let lease = sidecar.wait_for_lease(secs(10));
    assert_eq!(lease.worker_id, 0, "the key claimed before is re-adopted");
    assert_eq!(topo.primary().get(&key), Some(lease.owner));
}

/// A held ID whose renewals stop being acknowledged is unpublished by its validity deadline
/// (TTL 2 s - 100 ms after the last acknowledged renew), though every renew script ran.
#[test]
fn unacknowledged_renewals_unpublish_by_the_deadline() {
    let topo = SentinelTopology::start_small();
    topo.primary().open_claim_guard(APP);
    let sidecar = acked_sidecar(&topo);
    let lease = sidecar.wait_for_lease(secs(10));
    let replica = 1 - topo.primary_index();
    topo.nodes()[replica].pause();
    let paused = std::time::Instant::now();
    let gone = poll_until(secs(5), || sidecar.id().is_none());
    let after = paused.elapsed();
    assert!(gone, "still published 5 s after the replica stopped");
    assert!(after < ms(2000 + 300), "unpublished only after {after:?}");
    let series = "snowlease_renewals_total{outcome=\"unacknowledged\"}";
    assert!(metric_or_zero(&sidecar, series) >= 1.0);
    assert!(
        poll_until(secs(3), || sidecar.read_output_file().is_none()),
        "ID file removed"
    );
    // Lost, then claimed again and not acknowledged: /readyz names the replicas, not the loss.
    assert!(
        poll_until(secs(5), || unready(&sidecar)["state"] == "unacknowledged"),
        "{}",
        unready(&sidecar)
    );
    topo.nodes()[replica].resume();
    let again = sidecar.wait_for_lease(secs(15));
    assert_eq!(again.worker_id, lease.worker_id);
}

/// On a Cluster `WAIT` names no key; the handle routes it to the primary of the key's slot.
/// With that shard's replica stopped, `WAIT 1` after a write to the key answers 0 (another
/// shard's primary, whose replica runs, would answer 1), for keys on every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wait_goes_to_the_primary_of_the_key() {
    let cluster = ClusterTopology::start();
    let target = snowlease::connection::RedisTarget::parse(&cluster.url()).unwrap();
    let mut conn = target.connect(secs(2)).unwrap();
    // One key per shard.
    let mut keys: Vec<(String, ClusterNode)> = Vec::new();
    for id in 0..64 {
        let key = worker_key(APP, id);
        let owner = cluster.owner_of_key(&key);
        if !keys.iter().any(|(_, n)| n.port == owner.port) {
            keys.push((key, owner));
        }
    }
    assert_eq!(keys.len(), 3, "a key on each of the 3 shards");
    for (key, owner) in &keys {
        let mut set = redis::cmd("SET");
        set.arg(key).arg("x");
        set.query_async::<()>(&mut conn).await.unwrap();
        let acked = conn.wait_replicas(key, 1, ms(1000)).await.unwrap();
        assert_eq!(acked, 1, "{key}: its replica runs");
        let replica = cluster.replicas_of(&owner.id)[0].port;
        cluster.server(replica).pause();
        let mut set = redis::cmd("SET");
        set.arg(key).arg("y");
        set.query_async::<()>(&mut conn).await.unwrap();
        let acked = conn.wait_replicas(key, 1, ms(300)).await.unwrap();
        cluster.server(replica).resume();
        assert_eq!(
            acked, 0,
            "{key}: WAIT ran on the primary whose replica is stopped"
        );
    }
}

/// Start-up advice on `--min-replicas-ack` against the 2 replicas the primary has: 1 warns
/// that a failover can still lose a lease (and publishes), 2 says nothing, 3 warns that
/// nothing is published until a third replica links (and publishes nothing).
#[test]
fn start_up_compares_min_replicas_ack_with_the_replicas_connected() {
    let topo = SentinelTopology::start_with(SentinelOptions {
        replicas: 2,
        sentinels: 1,
        quorum: 1,
        ..SentinelOptions::default()
    });
    topo.primary().open_claim_guard(APP);
    let with_acks = |n: &str| {
        Sidecar::worker_at(&topo.url(), APP)
            .flag("--min-replicas-ack", n)
            .spawn()
    };
    let (below, all, above) = (with_acks("1"), with_acks("2"), with_acks("3"));
    below.wait_for_lease(secs(10));
    all.wait_for_lease(secs(10));
    assert!(above.wait_for_log("is more than the replicas connected", secs(10)));
    assert_eq!(below.count_log("is below the replicas connected"), 1);
    assert_eq!(all.count_log("--min-replicas-ack is"), 0);
    assert_eq!(above.count_log("is below"), 0);
    assert_eq!(above.id(), None, "3 acknowledgements from 2 replicas");
}
