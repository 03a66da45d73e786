//! One Redis deployment of any topology, so that a worker scenario is written once and run on
//! each ([`Topo`], [`Deployment`]): every scenario on every topology.
//!
//! Standalone: a fresh [`RedisServer`] per test. Sentinel (1 primary + 2 replicas + 3
//! sentinels) and Cluster (3 primaries + 3 replicas): one topology shared by every test that
//! runs at the same time, started by the first (it holds a [`TopologyPermit`] while it runs)
//! and killed when the last handle is dropped, so no process outlives the test binary. Tests
//! on a shared topology use their own app names and must not fault the topology itself.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use super::{
    ClusterTopology, PREFIX, RedisServer, SentinelTopology, Sidecar, SidecarBuilder, run_snowlease,
    secs, timed,
};

/// A Redis topology the worker scenarios run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topo {
    Standalone,
    Sentinel,
    Cluster,
}

/// Where a key lives: the data node that serves it. The provided methods read and write
/// there, so one assertion works on a server and on a [`Deployment`].
pub trait Keyspace {
    /// The node serving `key`: the server itself; the primary the Sentinels name; the Cluster
    /// primary whose slots hold `key`.
    fn node_for(&self, key: &str) -> &RedisServer;

    /// GET as a string (None when missing).
    fn get(&self, key: &str) -> Option<String> {
        self.node_for(key).get(key)
    }

    /// PTTL in ms (-2 missing, -1 no expiry).
    fn pttl(&self, key: &str) -> i64 {
        self.node_for(key).pttl(key)
    }

    /// GET and PTTL of one key, read atomically.
    fn get_with_pttl(&self, key: &str) -> (Option<String>, i64) {
        self.node_for(key).get_with_pttl(key)
    }

    fn exists(&self, key: &str) -> bool {
        self.node_for(key).exists(key)
    }

    /// Overwrites `key` by hand, as another writer would: `SET key value KEEPTTL`.
    fn overwrite(&self, key: &str, value: &str) {
        let _: () = self
            .node_for(key)
            .query(redis::cmd("SET").arg(key).arg(value).arg("KEEPTTL"));
    }
}

impl Keyspace for RedisServer {
    fn node_for(&self, _key: &str) -> &RedisServer {
        self
    }
}

/// A topology shared by the tests that run at the same time.
struct Shared<T>(Mutex<Weak<T>>);

impl<T> Shared<T> {
    const fn new() -> Self {
        Shared(Mutex::new(Weak::new()))
    }

    /// The running topology, or a new one from `start` when no test holds one (its start-up
    /// time printed, so a run shows how often that happened).
    fn get(&self, what: Topo, start: impl FnOnce() -> T) -> Arc<T> {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(running) = slot.upgrade() {
            return running;
        }
        let (started, took) = timed(start);
        eprintln!("shared {what:?} topology started in {took:?}");
        let started = Arc::new(started);
        *slot = Arc::downgrade(&started);
        started
    }
}

static SENTINEL: Shared<SentinelTopology> = Shared::new();
static CLUSTER: Shared<ClusterTopology> = Shared::new();

enum Nodes {
    Standalone(RedisServer),
    Sentinel(Arc<SentinelTopology>),
    Cluster(Arc<ClusterTopology>),
}

/// A Redis deployment of one [`Topo`] for one test (see the module doc for sharing).
pub struct Deployment {
    nodes: Nodes,
}

impl Deployment {
    /// A fresh standalone server, or a handle on the shared Sentinel or Cluster topology.
    pub fn start(topo: Topo) -> Deployment {
        let nodes = match topo {
            Topo::Standalone => Nodes::Standalone(RedisServer::start()),
            Topo::Sentinel => Nodes::Sentinel(SENTINEL.get(topo, SentinelTopology::start)),
            Topo::Cluster => Nodes::Cluster(CLUSTER.get(topo, ClusterTopology::start)),
        };
        Deployment { nodes }
    }

    pub fn topo(&self) -> Topo {
        match self.nodes {
            Nodes::Standalone(_) => Topo::Standalone,
            Nodes::Sentinel(_) => Topo::Sentinel,
            Nodes::Cluster(_) => Topo::Cluster,
        }
    }

    /// The `--redis-url` a sidecar gets: `redis://`, `redis+sentinel://.../mymaster`, or the
    /// Cluster's seed list.
    pub fn url(&self) -> String {
        match &self.nodes {
            Nodes::Standalone(redis) => redis.url(),
            Nodes::Sentinel(topo) => topo.url(),
            Nodes::Cluster(topo) => topo.url(),
        }
    }

    /// `snowlease worker` for `app` on this deployment, with [`Sidecar::worker`]'s defaults.
    pub fn worker(&self, app: &str) -> SidecarBuilder {
        Sidecar::worker_at(&self.url(), app)
    }

    /// Opens the claim guard of `app` for IDs 0..=`max_worker_id` with `snowlease guard open`
    /// (on Cluster one guard per ID, in its key's slot), as an established deployment has it,
    /// so a first claim does not wait one TTL.
    pub fn open_guard(&self, app: &str, max_worker_id: u32) {
        let (url, max) = (self.url(), max_worker_id.to_string());
        let run = run_snowlease(
            &[
                "guard",
                "open",
                "--app",
                app,
                "--max-worker-id",
                &max,
                "--redis-url",
                &url,
            ],
            &[],
            secs(30),
        );
        assert_eq!(run.code, Some(0), "guard open on {self}: {run:?}");
    }

    /// Every data node that runs (primaries and replicas).
    pub fn data_nodes(&self) -> Vec<&RedisServer> {
        let all: &[RedisServer] = match &self.nodes {
            Nodes::Standalone(redis) => std::slice::from_ref(redis),
            Nodes::Sentinel(topo) => topo.nodes(),
            Nodes::Cluster(topo) => topo.servers(),
        };
        all.iter().filter(|n| n.is_running()).collect()
    }

    /// The primaries: the server, the Sentinels' primary, every Cluster primary with slots.
    fn primaries(&self) -> Vec<&RedisServer> {
        match &self.nodes {
            Nodes::Standalone(redis) => vec![redis],
            Nodes::Sentinel(topo) => vec![topo.primary()],
            Nodes::Cluster(topo) => topo
                .primaries()
                .iter()
                .map(|p| topo.server(p.port))
                .collect(),
        }
    }

    /// Creates ACL user `user` (password `password`, every command and key) on every data node
    /// (ACL rules are per node) and returns [`Self::url`] logging in as it.
    pub fn acl_user(&self, user: &str, password: &str) -> String {
        for node in self.data_nodes() {
            let _: () = node.query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg(user)
                    .arg("reset")
                    .arg("on")
                    .arg(format!(">{password}"))
                    .arg("~*")
                    .arg("&*")
                    .arg("+@all"),
            );
        }
        self.url()
            .replacen("://", &format!("://{user}:{password}@"), 1)
    }

    /// Replaces `user`'s password by `password` on every data node and closes its connections,
    /// as a password rotation done in the wrong order does: the next reconnect meets
    /// `WRONGPASS`.
    pub fn rotate_password(&self, user: &str, password: &str) {
        for node in self.data_nodes() {
            let _: () = node.query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg(user)
                    .arg("resetpass")
                    .arg(format!(">{password}")),
            );
            let _: i64 = node.query(redis::cmd("CLIENT").arg("KILL").arg("USER").arg(user));
        }
    }

    /// `SCRIPT FLUSH` on every data node.
    pub fn script_flush(&self) {
        for node in self.data_nodes() {
            let _: () = node.query(redis::cmd("SCRIPT").arg("FLUSH"));
        }
    }

    /// Keys matching `pattern` on every primary, sorted.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .primaries()
            .iter()
            .flat_map(|p| p.keys(pattern))
            .collect();
        keys.sort();
        keys
    }

    /// The lease keys of `app` (default prefix; not its guards), sorted.
    pub fn lease_keys(&self, app: &str) -> Vec<String> {
        self.keys(&format!("{PREFIX}{app}:[0-9]*"))
    }
}

impl Keyspace for Deployment {
    fn node_for(&self, key: &str) -> &RedisServer {
        match &self.nodes {
            Nodes::Standalone(redis) => redis,
            Nodes::Sentinel(topo) => topo.primary(),
            Nodes::Cluster(topo) => topo.server(topo.owner_of_key(key).port),
        }
    }
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({})", self.topo(), self.url())
    }
}

impl Drop for Deployment {
    /// On a panic, the end of each node's log when the shared topology stays up for other
    /// tests (the last handle's drop prints the whole logs).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let (shared, sentinels): (bool, &[RedisServer]) = match &self.nodes {
            Nodes::Standalone(_) => (false, &[]),
            Nodes::Sentinel(topo) => (Arc::strong_count(topo) > 1, topo.sentinels()),
            Nodes::Cluster(topo) => (Arc::strong_count(topo) > 1, &[]),
        };
        eprintln!("===== scenario failed on {self} =====");
        if !shared {
            return;
        }
        for node in self.data_nodes().into_iter().chain(sentinels) {
            let log = node.log();
            let lines: Vec<&str> = log.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            eprintln!(
                "===== {} :{} log (last {} lines) =====\n{}",
                node.name(),
                node.port(),
                tail.len(),
                tail.join("\n")
            );
        }
    }
}
