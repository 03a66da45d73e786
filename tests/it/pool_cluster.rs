//! Pool mode on a Redis Cluster (issue 10, test item 4). Every key of pool
//! `P` carries the hash tag `{P}`, so a pool lives in one slot, on the
//! primary that owns it; the test bodies of `pool.rs` read the keys there
//! ([`PoolOn`]) while the pool client goes through snowlease's own handle
//! with the cluster URL. Also: `pool add` batches and `pool serve` with two
//! pools on different primaries, and the pool's invariants after the
//! primary that holds it is killed.

use std::sync::{Arc, Mutex, Weak};

use serde_json::json;
use snowlease::pool::PoolKeys;

use crate::harness::*;
use crate::pool::{self, PoolRedis, check_invariants, dump, hash, zset};

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

/// Two pool names whose slots are served by different primaries.
fn pools_on_two_primaries(topo: &ClusterTopology) -> (&'static str, &'static str) {
    let names = [
        "west", "east", "north", "south", "alpha", "beta", "gamma", "delta",
    ];
    let owner = |name: &str| PoolOn::new(topo, name).owner_port();
    let first = names[0];
    let second = names[1..]
        .iter()
        .find(|n| owner(n) != owner(first))
        .expect("eight pool names on one primary of three");
    (first, second)
}

/// A file of `n` ids `<prefix>-0000`..., one per line.
fn ids_file(dir: &std::path::Path, prefix: &str, n: usize) -> String {
    let path = dir.join(format!("{prefix}.txt"));
    let text: String = (0..n).map(|i| format!("{prefix}-{i:04}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// POSTs `body` to `pool serve`; (status, JSON answer).
fn post(serve: &Sidecar, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let url = format!("http://{}{path}", serve.http_addr());
    let (status, reply) = match ureq::post(&url).timeout(secs(5)).send_json(body) {
        Ok(reply) => (reply.status(), reply),
        Err(ureq::Error::Status(code, reply)) => (code, reply),
        Err(e) => panic!("POST {path}: {e}"),
    };
    (status, reply.into_json().unwrap_or_default())
}

/// Issue 10 "Pool mode on Cluster": `pool init` and `pool add` of more ids
/// than one script call takes (calls of at most 1000, every call on the
/// pool's one slot) and `pool serve` with two pools on different primaries:
/// each lease is written on its pool's primary, released over HTTP.
#[test]
fn pool_add_batches_and_serve_two_pools_on_different_primaries() {
    let topo = shared_cluster();
    let (a, b) = pools_on_two_primaries(&topo);
    let (on_a, on_b) = (PoolOn::new(&topo, a), PoolOn::new(&topo, b));
    assert_ne!(on_a.owner_port(), on_b.owner_port());
    let dir = tempfile::tempdir().unwrap();
    let url = topo.url();
    let env = [("REDIS_URL", url.as_str())];
    let cli = |args: &[&str]| {
        let run = run_snowlease(args, &env, secs(30));
        assert_eq!(run.code, Some(0), "{args:?}: {run:?}");
        serde_json::from_str::<serde_json::Value>(&run.stdout).unwrap()
    };

    // 1500 ids at init (one init call, one add call), 2500 more by add (three calls).
    let init = cli(&[
        "pool",
        "init",
        "--pool",
        a,
        "--ids-file",
        &ids_file(dir.path(), "i", 1500),
    ]);
    assert_eq!(init["added"], 1500);
    let added = cli(&[
        "pool",
        "add",
        "--pool",
        a,
        "--ids-file",
        &ids_file(dir.path(), "j", 2500),
    ]);
    assert_eq!(added["added"], 2500);
    assert_eq!(zset(&on_a, &PoolKeys::new(a).ready).len(), 4000);
    cli(&["pool", "init", "--pool", b, "--ids", "x,y"]);

    let serve = SidecarBuilder::new("pool")
        .without("--listen")
        .without("--log-format")
        .switch("serve")
        .flag("--listen", "127.0.0.1:0")
        .flag("--log-format", "json")
        .flag("--redis-url", &url)
        .flag("--reap-interval", "200ms")
        .flag("--pool", format!("{a},{b}"))
        .name("pool serve")
        .spawn();
    assert!(poll_until(secs(15), || serve.readyz() == 200));
    for (name, on) in [(a, &on_a), (b, &on_b)] {
        let keys = PoolKeys::new(name);
        let (status, lease) = post(
            &serve,
            &format!("/pools/{name}/leases"),
            json!({"ttl_ms": 30000}),
        );
        assert_eq!(status, 201, "{name}: {lease}");
        let (id, token) = (
            lease["id"].as_str().unwrap(),
            lease["token"].as_str().unwrap(),
        );
        assert_eq!(
            hash(on, &keys.owners).get(id).map(String::as_str),
            Some(token)
        );
        check_invariants(on, &keys);
        let (status, reply) = post(
            &serve,
            &format!("/pools/{name}/leases/{id}/release"),
            json!({"token": token}),
        );
        assert_eq!(status, 200, "{name}: {reply}");
        assert!(hash(on, &keys.owners).is_empty());
        check_invariants(on, &keys);
    }
    let (status, _) = serve.http_get(&format!("/pools/{b}"), None);
    assert_eq!(status, 200);
}
