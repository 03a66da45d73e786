//! Real Redis topologies on free loopback ports, built from [`RedisServer`]s (so each node is
//! killed on drop and prints its log when the test panics):
//! - [`SentinelTopology`]: one primary, replicas, `redis-server --sentinel` sentinels.
//! - [`ClusterTopology`]: a Redis Cluster made by `redis-cli --cluster create`.
//!
//! Running topologies are limited by [`TopologyPermit`] (default 2 at once, env
//! `SNOWLEASE_MAX_TOPOLOGIES`) so that 8 test threads on 2 cores do not starve the nodes into
//! false failure detections (the timeouts here are 1 s). A test holds at most one topology.
//!
//! Clients reach data nodes at the addresses the sentinels (or `CLUSTER SLOTS`) announce. With
//! [`SentinelOptions::proxied`] each Sentinel data node is announced at its own
//! [`FaultProxy`], so faulting that proxy cuts the node off from sentinels, replicas and
//! clients alike (the harness's own checks go to the nodes directly). Not built for Cluster
//! (`cluster-announce-port` would do it).

use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{FaultProxy, RedisOptions, RedisServer, free_port, ms, poll_some, poll_until, secs};

/// Master name of [`SentinelTopology::start`].
pub const MASTER_NAME: &str = "mymaster";
/// Slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;
/// Deadline of each wait inside a topology operation (start, failover, promotion): 60 s, as a
/// long chaos run on 2 cores once needed more than 30 s for replicas to link to a new primary.
const TOPOLOGY_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Permit

/// One of the few topologies allowed to run at once; released on drop.
pub struct TopologyPermit(());

static RUNNING: Mutex<usize> = Mutex::new(0);
static RUNNING_CHANGED: Condvar = Condvar::new();

impl TopologyPermit {
    /// Waits until fewer than `SNOWLEASE_MAX_TOPOLOGIES` (default 2) topologies run.
    pub fn acquire() -> TopologyPermit {
        let max: usize = std::env::var("SNOWLEASE_MAX_TOPOLOGIES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2)
            .max(1);
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= max {
            running = RUNNING_CHANGED
                .wait(running)
                .unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        TopologyPermit(())
    }
}

impl Drop for TopologyPermit {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        RUNNING_CHANGED.notify_one();
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers shared by both topologies

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// Runs one command on a fresh connection to `port` with short timeouts; Err on any failure
/// (the node may be down).
fn try_query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(ms(500))?;
    conn.set_read_timeout(Some(secs(2)))?;
    cmd.query(&mut conn)
}

/// `field` of `INFO section` of the node on `port`; None when down or missing.
fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let info: String = try_query(port, redis::cmd("INFO").arg(section)).ok()?;
    info.lines().find_map(|line| {
        let (name, value) = line.trim_end().split_once(':')?;
        (name == field).then(|| value.to_owned())
    })
}

/// Panics with `what` unless `cond` turns true within [`TOPOLOGY_TIMEOUT`].
fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    assert!(poll_until(TOPOLOGY_TIMEOUT, cond), "timed out: {what}");
}

// ---------------------------------------------------------------------------------------------
// Sentinel

/// Shape and timing of a [`SentinelTopology`].
#[derive(Clone, Debug)]
pub struct SentinelOptions {
    pub master_name: String,
    pub replicas: usize,
    pub sentinels: usize,
    pub quorum: usize,
    /// `sentinel down-after-milliseconds`: ms without a valid reply before a node is down.
    pub down_after_ms: u64,
    /// `sentinel failover-timeout` in ms; a failed failover is retried after twice this.
    pub failover_timeout_ms: u64,
    /// Put a [`FaultProxy`] in front of every data node and make it the node's address for
    /// everyone (sentinels, replication, clients) via `replica-announce-port` and the monitor
    /// line; faulting a node's proxy then cuts that node off the network.
    pub proxied: bool,
}

impl Default for SentinelOptions {
    /// 1 primary + 2 replicas + 3 sentinels, quorum 2, down after 1 s, failover timeout 2 s.
    fn default() -> Self {
        SentinelOptions {
            master_name: MASTER_NAME.into(),
            replicas: 2,
            sentinels: 3,
            quorum: 2,
            down_after_ms: 1000,
            failover_timeout_ms: 2000,
            proxied: false,
        }
    }
}

/// One primary, its replicas and the sentinels that watch them, all on loopback.
pub struct SentinelTopology {
    opts: SentinelOptions,
    /// Data nodes; `nodes[0]` is the first primary. Roles change with failovers.
    nodes: Vec<RedisServer>,
    /// With [`SentinelOptions::proxied`]: `proxies[i]` fronts `nodes[i]`.
    proxies: Vec<FaultProxy>,
    sentinels: Vec<RedisServer>,
    startup: Duration,
    _permit: TopologyPermit,
}

impl SentinelTopology {
    /// The full topology of [`SentinelOptions::default`], ready: replicas in sync, every
    /// sentinel sees the replicas and the other sentinels.
    pub fn start() -> SentinelTopology {
        SentinelTopology::start_with(SentinelOptions::default())
    }

    /// The cheap one: 1 primary + 1 replica + 1 sentinel (quorum 1). It fails over
    /// (planned or after a kill) like the full one, with half the processes.
    pub fn start_small() -> SentinelTopology {
        SentinelTopology::start_with(SentinelOptions {
            replicas: 1,
            sentinels: 1,
            quorum: 1,
            ..SentinelOptions::default()
        })
    }

    pub fn start_with(opts: SentinelOptions) -> SentinelTopology {
        let permit = TopologyPermit::acquire();
        let started = Instant::now();
        // A proxy's upstream is set once its node has a port (unreachable until then).
        let proxies: Vec<FaultProxy> = (0..=opts.replicas)
            .filter(|_| opts.proxied)
            .map(|_| FaultProxy::start(loopback(1)))
            .collect();
        let mut topo = SentinelTopology {
            opts,
            nodes: Vec::new(),
            proxies,
            sentinels: Vec::new(),
            startup: Duration::ZERO,
            _permit: permit,
        };
        for i in 0..=topo.opts.replicas {
            let mut args = topo.node_args(i);
            if i > 0 {
                args.extend(replica_args(topo.addr_port(0)));
            }
            let node = RedisServer::start_with(RedisOptions {
                args,
                name: format!("sentinel-topology node {i}"),
                ..RedisOptions::default()
            });
            if let Some(proxy) = topo.proxies.get(i) {
                proxy.set_upstream(loopback(node.port()));
            }
            topo.nodes.push(node);
        }
        // Sentinels find replicas through the primary's INFO: start them once all are linked.
        topo.wait_replicas_in_sync();
        for i in 0..topo.opts.sentinels {
            let sentinel = RedisServer::start_with(RedisOptions {
                config_file: Some(topo.sentinel_conf()),
                args: strings(&["--sentinel"]),
                name: format!("sentinel {i}"),
                ..RedisOptions::default()
            });
            topo.sentinels.push(sentinel);
        }
        topo.wait_sentinels_ready();
        topo.startup = started.elapsed();
        topo
    }

    /// Time from start to ready, without the wait for a [`TopologyPermit`].
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    fn sentinel_conf(&self) -> String {
        let o = &self.opts;
        let m = &o.master_name;
        format!(
            "sentinel monitor {m} 127.0.0.1 {port} {q}\n\
             sentinel down-after-milliseconds {m} {down}\n\
             sentinel failover-timeout {m} {fo}\n\
             sentinel parallel-syncs {m} {par}\n",
            port = self.addr_port(0),
            q = o.quorum,
            down = o.down_after_ms,
            fo = o.failover_timeout_ms,
            par = o.replicas.max(1),
        )
    }

    pub fn master_name(&self) -> &str {
        &self.opts.master_name
    }

    /// `127.0.0.1:<port>` of every sentinel.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect()
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/<master name>`.
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/{}",
            self.sentinel_addrs().join(","),
            self.opts.master_name
        )
    }

    /// The sentinels (e.g. to SIGSTOP or kill one).
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    pub fn sentinels_mut(&mut self) -> &mut [RedisServer] {
        &mut self.sentinels
    }

    /// The data nodes, in start order (roles change with failovers; see [`Self::primary`]).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The primary's address (its proxy's when proxied) as each running sentinel answers it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`); None for a sentinel that does not answer.
    pub fn primary_addrs_seen(&self) -> Vec<Option<SocketAddr>> {
        let cmd = self.sentinel_cmd("GET-MASTER-ADDR-BY-NAME");
        self.running_sentinels()
            .map(|s| {
                let (host, port): (String, u16) = try_query(s.port(), &cmd).ok()?;
                format!("{host}:{port}").parse().ok()
            })
            .collect()
    }

    /// The primary's address when every running sentinel names the same one.
    pub fn primary_addr(&self) -> Option<SocketAddr> {
        let seen = self.primary_addrs_seen();
        let first = (*seen.first()?)?;
        seen.iter().all(|a| *a == Some(first)).then_some(first)
    }

    /// Index in [`Self::nodes`] of the primary the sentinels agree on (30 s deadline).
    pub fn primary_index(&self) -> usize {
        let addr = poll_some(TOPOLOGY_TIMEOUT, || self.primary_addr())
            .expect("the sentinels do not agree on a primary");
        self.index_of(addr.port())
    }

    /// The data node the sentinels name as primary.
    pub fn primary(&self) -> &RedisServer {
        &self.nodes[self.primary_index()]
    }

    fn index_of(&self, port: u16) -> usize {
        (0..self.nodes.len())
            .find(|&i| self.addr_port(i) == port)
            .unwrap_or_else(|| panic!("sentinels name :{port}, not a node of this topology"))
    }

    /// The port everyone uses for node `i`: its proxy's when proxied, else its own. (The
    /// harness's own checks always go to the node directly.)
    pub fn addr_port(&self, i: usize) -> u16 {
        match self.proxies.get(i) {
            Some(proxy) => proxy.port(),
            None => self.nodes[i].port(),
        }
    }

    /// The proxy in front of node `i` (only with [`SentinelOptions::proxied`]).
    pub fn proxy(&self, i: usize) -> &FaultProxy {
        self.proxies
            .get(i)
            .expect("proxies exist only with SentinelOptions::proxied")
    }

    /// Options of node `i` that survive restarts: no sync delay, and its proxy's address
    /// announced when proxied.
    fn node_args(&self, i: usize) -> Vec<String> {
        let mut args = data_node_args();
        if let Some(proxy) = self.proxies.get(i) {
            let port = proxy.port().to_string();
            args.extend(strings(&[
                "--replica-announce-ip",
                "127.0.0.1",
                "--replica-announce-port",
                &port,
            ]));
        }
        args
    }

    /// Planned failover (`SENTINEL FAILOVER` on a sentinel, retried while the sentinels refuse
    /// it, e.g. just after another failover). Returns the index of the new primary once every
    /// running sentinel names it, it is a primary, and the other replicas follow it in sync.
    /// The old primary still runs as a primary then (see [`Self::wait_replicas_in_sync`]).
    pub fn failover(&self) -> usize {
        let old = self.primary_index();
        let old_port = self.addr_port(old);
        let cmd = self.sentinel_cmd("FAILOVER");
        // A failover the Sentinels abort (a replica slow to report its promotion on a loaded
        // machine: `-failover-abort-slave-timeout`) is not retried by them: ask again.
        for _ in 0..3 {
            let mut last_err = String::new();
            let asked = poll_until(TOPOLOGY_TIMEOUT, || {
                let s = self.running_sentinels().next().expect("a running sentinel");
                match try_query::<String>(s.port(), &cmd) {
                    Ok(_) => true,
                    Err(e) => {
                        last_err = e.to_string();
                        false
                    }
                }
            });
            assert!(asked, "SENTINEL FAILOVER refused: {last_err}");
            if poll_until(secs(10), || {
                self.primary_addr().is_some_and(|a| a.port() != old_port)
            }) {
                break;
            }
        }
        self.wait_new_primary(old)
    }

    /// SIGKILLs the primary and waits until the sentinels promote a replica and the running
    /// replicas follow it. Returns (index of the killed node, index of the new primary).
    pub fn kill_primary(&mut self) -> (usize, usize) {
        let old = self.primary_index();
        self.nodes[old].stop();
        (old, self.wait_new_primary(old))
    }

    /// Starts the stopped node `index` (empty, same port) as a replica of the current primary
    /// and waits until every replica is in sync (as after a crashed primary comes back).
    pub fn restart_as_replica(&mut self, index: usize) {
        let primary = self.primary_index();
        assert_ne!(primary, index, "node {index} is the primary");
        let mut args = self.node_args(index);
        args.extend(replica_args(self.addr_port(primary)));
        self.nodes[index].restart_with(args);
        self.wait_replicas_in_sync();
    }

    /// Waits until every running non-primary node is a replica of the primary with its link up
    /// and the primary's `WAIT` counts all of them (the replication offsets agree). After a
    /// planned failover this includes the old primary, which the sentinels convert only some
    /// 8 s after the switch (4 x their 2 s publish period): until then it still takes writes.
    /// The primary is asked of the sentinels again at each poll: under load they may fail over
    /// a second time (a new primary busy with a full sync missed `down-after-milliseconds`).
    pub fn wait_replicas_in_sync(&self) {
        if self.sentinels.is_empty() {
            return self.wait_in_sync(|| Some(0), None);
        }
        self.wait_in_sync(
            || self.primary_addr().map(|a| self.index_of(a.port())),
            None,
        );
    }

    /// Waits until the running nodes other than the primary (`primary()` at each poll; None:
    /// not known yet) and `except` replicate it and its `WAIT` counts them all.
    fn wait_in_sync(&self, primary: impl Fn() -> Option<usize>, except: Option<usize>) {
        wait_for("replicas linked to the primary and in sync", || {
            primary().is_some_and(|p| self.in_sync(p, except))
        });
    }

    /// Whether the running nodes other than `primary` and `except` are its replicas, link up,
    /// and its `WAIT` (500 ms) counts every one of them.
    fn in_sync(&self, primary: usize, except: Option<usize>) -> bool {
        let replicas: Vec<u16> = (0..self.nodes.len())
            .filter(|&i| i != primary && Some(i) != except && self.nodes[i].is_running())
            .map(|i| self.nodes[i].port())
            .collect();
        let primary_addr = self.addr_port(primary).to_string();
        let linked = replicas.iter().all(|&r| {
            info_field(r, "replication", "master_port").as_deref() == Some(&primary_addr)
                && info_field(r, "replication", "master_link_status").as_deref() == Some("up")
        });
        let want = replicas.len() as i64;
        let primary = self.nodes[primary].port();
        linked
            && try_query::<i64>(primary, redis::cmd("WAIT").arg(want).arg(500)).ok() == Some(want)
    }

    /// Waits until the sentinels name a primary other than node `old`, it has role master, and
    /// the other replicas (not `old`) follow it in sync; returns its index. For failovers the
    /// test caused itself, e.g. by black-holing the primary's proxy.
    pub fn wait_new_primary(&self, old: usize) -> usize {
        let old_port = self.addr_port(old);
        let addr = poll_some(TOPOLOGY_TIMEOUT, || {
            self.primary_addr().filter(|a| a.port() != old_port)
        })
        .unwrap_or_else(|| panic!("no new primary announced: {:?}", self.primary_addrs_seen()));
        let new = self.index_of(addr.port());
        let new_port = self.nodes[new].port();
        wait_for("new primary has role master", || {
            info_field(new_port, "replication", "role").as_deref() == Some("master")
        });
        self.wait_in_sync(|| Some(new), Some(old));
        new
    }

    /// Waits until every running sentinel sees the primary, all replicas and all other
    /// sentinels (so quorum and failovers work), and has seen every running replica report
    /// itself as a replica. The last matters for back-to-back failovers: a Sentinel polls a
    /// replica's `INFO` only every 10 s, so one that has not yet seen a demoted primary turn
    /// replica still counts it as "reporting master" since long ago, and converts it straight
    /// back to a replica when the next failover promotes it (`-failover-abort-slave-timeout`,
    /// then again at every retry).
    pub fn wait_sentinels_ready(&self) {
        let replicas = self.nodes.iter().filter(|n| n.is_running()).count() - 1;
        let others = self.sentinels.len() - 1;
        let (master, listed) = (self.sentinel_cmd("MASTER"), self.sentinel_cmd("REPLICAS"));
        wait_for(
            "sentinels see every replica (as a replica) and sentinel",
            || {
                self.running_sentinels().all(|s| {
                    let Ok(fields) = try_query::<Vec<String>>(s.port(), &master) else {
                        return false;
                    };
                    let Ok(seen) = try_query::<Vec<Vec<String>>>(s.port(), &listed) else {
                        return false;
                    };
                    let up_as_replicas = seen
                        .iter()
                        .filter(|r| {
                            field(r, "role-reported") == Some("slave")
                                && field(r, "flags").is_some_and(|f| !f.contains("down"))
                        })
                        .count();
                    let count = |name: &str| field(&fields, name).and_then(|v| v.parse().ok());
                    count("num-slaves") == Some(replicas)
                        && count("num-other-sentinels") == Some(others)
                        && up_as_replicas == replicas
                })
            },
        );
    }

    fn running_sentinels(&self) -> impl Iterator<Item = &RedisServer> {
        self.sentinels.iter().filter(|s| s.is_running())
    }

    fn sentinel_cmd(&self, sub: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg(sub).arg(&self.opts.master_name);
        cmd
    }
}

/// The value after `name` in a Sentinel reply of alternating names and values.
fn field<'a>(fields: &'a [String], name: &str) -> Option<&'a str> {
    let i = fields.iter().position(|f| f == name)?;
    fields.get(i + 1).map(String::as_str)
}

impl Drop for SentinelTopology {
    /// On a panic, what the sentinels and nodes said last (their logs follow, one per node).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let roles: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                let role = info_field(n.port(), "replication", "role");
                format!(":{} {}", n.port(), role.as_deref().unwrap_or("down"))
            })
            .collect();
        eprintln!(
            "===== sentinel topology: primary per sentinel {:?}; nodes {roles:?} =====",
            self.primary_addrs_seen()
        );
    }
}

/// `--replicaof` the primary reachable on `primary_port`.
fn replica_args(primary_port: u16) -> Vec<String> {
    strings(&["--replicaof", "127.0.0.1", &primary_port.to_string()])
}

/// Options of every data node: a primary starts a full sync at once (the default waits 5 s
/// for more replicas to join the same transfer).
fn data_node_args() -> Vec<String> {
    strings(&["--repl-diskless-sync-delay", "0"])
}

// ---------------------------------------------------------------------------------------------
// Cluster

/// `cluster-node-timeout` in ms: a primary is failed over about 2-3 s after it dies.
pub const CLUSTER_NODE_TIMEOUT_MS: u64 = 1000;

/// One node as `CLUSTER NODES` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    pub id: String,
    pub port: u16,
    pub primary: bool,
    /// The primary's node ID, for a replica.
    pub primary_id: Option<String>,
    /// Flagged `fail` (or `fail?`) by the node that answered.
    pub failed: bool,
    /// Slot ranges served, inclusive (primaries only).
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    pub fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// A Redis Cluster on loopback: `primaries` primaries with `replicas` replicas each.
pub struct ClusterTopology {
    nodes: Vec<RedisServer>,
    startup: Duration,
    _permit: TopologyPermit,
}

impl ClusterTopology {
    /// 3 primaries + 3 replicas, `cluster_state:ok` on every node.
    pub fn start() -> ClusterTopology {
        ClusterTopology::start_with(3, 1)
    }

    /// The cheap one: 3 primaries, no replicas (slots, MOVED/ASK and migrations work; a
    /// killed primary is not replaced).
    pub fn start_primaries_only() -> ClusterTopology {
        ClusterTopology::start_with(3, 0)
    }

    /// `primaries` (at least 3, as `redis-cli --cluster create` requires) with `replicas`
    /// replicas each.
    pub fn start_with(primaries: usize, replicas: usize) -> ClusterTopology {
        let permit = TopologyPermit::acquire();
        let started = Instant::now();
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|i| {
                RedisServer::start_with(RedisOptions {
                    args: cluster_args(),
                    name: format!("cluster node {i}"),
                    ..RedisOptions::default()
                })
            })
            .collect();
        let mut topo = ClusterTopology {
            nodes,
            startup: Duration::ZERO,
            _permit: permit,
        };
        topo.create(replicas);
        topo.wait_cluster_ok();
        topo.startup = started.elapsed();
        topo
    }

    /// Time from start to ready, without the wait for a [`TopologyPermit`].
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    fn create(&self, replicas: usize) {
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        cmd.args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())));
        cmd.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = cmd.output().expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Seed URL in the comma form: `redis://127.0.0.1:P1,127.0.0.1:P2,...` (every
    /// node, in start order).
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis://{}", addrs.join(","))
    }

    /// The node processes, in start order (see [`Self::cluster_nodes`] for roles).
    pub fn servers(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The node process on `port`.
    pub fn server(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on :{port}"))
    }

    fn server_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no cluster node on :{port}"))
    }

    /// `CLUSTER NODES` as the first running node answers it.
    pub fn cluster_nodes(&self) -> Vec<ClusterNode> {
        let text: String = self
            .running()
            .find_map(|n| try_query(n.port(), redis::cmd("CLUSTER").arg("NODES")).ok())
            .expect("no cluster node answers CLUSTER NODES");
        text.lines().filter_map(parse_cluster_node).collect()
    }

    /// The primaries that serve slots, by their first slot.
    pub fn primaries(&self) -> Vec<ClusterNode> {
        let mut p: Vec<ClusterNode> = self
            .cluster_nodes()
            .into_iter()
            .filter(|n| n.primary && !n.failed && !n.slots.is_empty())
            .collect();
        p.sort_by_key(|n| n.slots[0].0);
        p
    }

    /// The replicas of the primary with node ID `primary_id`.
    pub fn replicas_of(&self, primary_id: &str) -> Vec<ClusterNode> {
        self.cluster_nodes()
            .into_iter()
            .filter(|n| n.primary_id.as_deref() == Some(primary_id))
            .collect()
    }

    /// `CLUSTER KEYSLOT key`.
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.running().next().expect("a running node").port();
        try_query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).expect("CLUSTER KEYSLOT")
    }

    /// The primary serving `slot`, as the cluster's config says (`CLUSTER NODES`).
    pub fn owner_of_slot(&self, slot: u16) -> ClusterNode {
        self.primaries()
            .into_iter()
            .find(|n| n.owns(slot))
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }

    /// The port of a primary that does not serve `slot`: where a test moves it.
    pub fn other_primary_than_owner(&self, slot: u16) -> u16 {
        self.primaries()
            .into_iter()
            .find(|n| !n.owns(slot))
            .unwrap_or_else(|| panic!("every primary serves slot {slot}"))
            .port
    }

    /// The primary serving `key`.
    pub fn owner_of_key(&self, key: &str) -> ClusterNode {
        self.owner_of_slot(self.keyslot(key))
    }

    /// Waits until every running node says `cluster_state:ok`, all of them agree on which
    /// primary serves each slot and on every node's role (primary, replica of whom, failed),
    /// and every running replica's link to its primary is up.
    pub fn wait_cluster_ok(&self) {
        wait_for(
            "cluster_state:ok and one view of slots and roles on every node",
            || {
                let views: Option<Vec<_>> = self.running().map(|n| node_view(n.port())).collect();
                views.is_some_and(|v| v.windows(2).all(|w| w[0] == w[1]))
                    && self.running().all(|n| {
                        info_field(n.port(), "replication", "role").as_deref() == Some("master")
                            || info_field(n.port(), "replication", "master_link_status").as_deref()
                                == Some("up")
                    })
            },
        );
    }

    /// SIGKILLs the primary on `port` and waits until one of its replicas is promoted and
    /// every running node is ok again. Returns the new primary.
    pub fn kill_primary(&mut self, port: u16) -> ClusterNode {
        let old = self.node_on(port);
        assert!(old.primary, ":{port} is not a primary");
        self.server_mut(port).stop();
        let new = poll_some(TOPOLOGY_TIMEOUT, || {
            self.primaries()
                .into_iter()
                .find(|n| n.port != port && n.owns(old.slots[0].0))
        })
        .unwrap_or_else(|| panic!("no replica of :{port} was promoted"));
        self.wait_cluster_ok();
        new
    }

    /// "A failover to a replica that missed writes" (asynchronous replication): once the
    /// replicas of the primary on `port` are in sync, they are SIGSTOPped and their links
    /// cut (a paused replica would otherwise read what was already sent once resumed),
    /// `during` runs (its writes reach the primary only), then the primary is SIGKILLed, the
    /// replicas resumed, and one of them promoted without those writes. Returns what
    /// `during` returned and the new primary.
    pub fn fail_over_to_lagging_replica<T>(
        &mut self,
        port: u16,
        during: impl FnOnce() -> T,
    ) -> (T, ClusterNode) {
        let old = self.node_on(port);
        let replicas = self.replicas_of(&old.id);
        assert!(!replicas.is_empty(), ":{port} has no replica");
        let offset = |p: u16| info_field(p, "replication", "master_repl_offset");
        wait_for("replicas in sync before they lag", || {
            replicas.iter().all(|r| offset(r.port) == offset(port))
        });
        for r in &replicas {
            self.server(r.port).pause();
        }
        let _: i64 = try_query(
            port,
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"),
        )
        .expect("CLIENT KILL TYPE replica");
        let out = during();
        self.server_mut(port).stop();
        for r in &replicas {
            self.server(r.port).resume();
        }
        let new = poll_some(TOPOLOGY_TIMEOUT, || {
            self.primaries()
                .into_iter()
                .find(|n| n.port != port && n.owns(old.slots[0].0))
        })
        .unwrap_or_else(|| panic!("no lagging replica of :{port} was promoted"));
        self.wait_cluster_ok();
        (out, new)
    }

    /// Restarts the stopped node on `port` (empty: a `dump.rdb` an earlier `SAVE` left is
    /// removed first; same `nodes.conf`): it rejoins as a replica of whoever took its slots.
    /// Waits until its link is up and the cluster is ok.
    pub fn restart_node(&mut self, port: u16) {
        let _ = std::fs::remove_file(self.server(port).dir().join("dump.rdb"));
        self.server_mut(port).restart();
        wait_for("restarted node linked to its primary", || {
            info_field(port, "replication", "master_link_status").as_deref() == Some("up")
                || info_field(port, "replication", "role").as_deref() == Some("master")
        });
        self.wait_cluster_ok();
    }

    /// "A shard comes back empty": the primary on `port` crashes and restarts at once, without
    /// persistence (a `dump.rdb` an earlier `SAVE` left is removed first), before the cluster
    /// fails it over. It keeps its slots (from `nodes.conf`) with no keys, and its replicas
    /// resync to it and drop their copy: the shard's data is gone while the cluster stays
    /// `ok`. This is the data loss the Redis replication docs warn of for primaries without
    /// persistence.
    pub fn restart_shard_empty(&mut self, port: u16) {
        let _ = std::fs::remove_file(self.server(port).dir().join("dump.rdb"));
        self.restart_shard_in_place(port);
    }

    /// "A shard crash-restarts from its last snapshot" (a rollback): the primary on `port` is
    /// SIGKILLed and restarted at once from the `dump.rdb` a `SAVE` left in its folder, before
    /// the cluster fails it over. It keeps its slots and comes back with the snapshot's keys;
    /// its replicas resync to it in full (their offset lies past the snapshot's) and drop
    /// what was written since: the shard is older while the cluster stays `ok`. Panics when
    /// there is no snapshot.
    pub fn restart_shard_from_snapshot(&mut self, port: u16) {
        let snapshot = self.server(port).dir().join("dump.rdb");
        assert!(snapshot.exists(), "no snapshot of :{port} to restart from");
        self.restart_shard_in_place(port);
    }

    /// SIGKILL and restart of the primary on `port` with what its folder holds, its replicas
    /// given `cluster-replica-no-failover yes` meanwhile (as a fast process restart would give).
    /// Waits until every replica is `online` on the restarted process (a full resync done: it
    /// holds what the primary holds) and the cluster is ok. The wait does not need a quiet
    /// shard: clients may write meanwhile.
    fn restart_shard_in_place(&mut self, port: u16) {
        let primary = self.node_on(port);
        assert!(primary.primary, ":{port} is not a primary");
        let replicas = self.replicas_of(&primary.id);
        let set_no_failover = |on: &str| {
            for r in &replicas {
                let _: () = try_query(
                    r.port,
                    redis::cmd("CONFIG")
                        .arg("SET")
                        .arg("cluster-replica-no-failover")
                        .arg(on),
                )
                .expect("CONFIG SET cluster-replica-no-failover");
            }
        };
        set_no_failover("yes");
        self.server_mut(port).restart();
        // The restarted process lists only replicas that synced with it since it started.
        wait_for("replicas resynced to the restarted primary", || {
            let info: String =
                try_query(port, redis::cmd("INFO").arg("replication")).unwrap_or_default();
            replicas.iter().all(|r| {
                info.lines().any(|l| {
                    l.starts_with("slave")
                        && l.contains(&format!(",port={},", r.port))
                        && l.contains("state=online")
                })
            })
        });
        set_no_failover("no");
        self.wait_cluster_ok();
    }

    /// Moves `slot` and its keys to the primary on `to_port` in one go (see [`SlotMigration`]
    /// for doing it in steps).
    pub fn migrate_slot(&self, slot: u16, to_port: u16) {
        let mut m = self.begin_migration(slot, to_port);
        while m.move_keys(100) > 0 {}
        m.finish();
    }

    /// Starts moving `slot` to the primary on `to_port`: `SETSLOT IMPORTING` on the target,
    /// `MIGRATING` on the source. From here the source answers ASK for keys it no longer has.
    pub fn begin_migration(&self, slot: u16, to_port: u16) -> SlotMigration<'_> {
        let from = self.owner_of_slot(slot);
        let to = self.node_on(to_port);
        assert!(
            to.primary && to.port != from.port,
            "bad migration target :{to_port}"
        );
        setslot(to.port, slot, "IMPORTING", &from.id);
        setslot(from.port, slot, "MIGRATING", &to.id);
        SlotMigration {
            topo: self,
            slot,
            from,
            to,
        }
    }

    /// The node on `port` as `CLUSTER NODES` lists it.
    pub fn node_on(&self, port: u16) -> ClusterNode {
        self.cluster_nodes()
            .into_iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on :{port}"))
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.is_running())
    }
}

impl Drop for ClusterTopology {
    /// On a panic, `CLUSTER NODES` as a running node saw it (the logs follow, one per node).
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let nodes = self
            .running()
            .find_map(|n| try_query::<String>(n.port(), redis::cmd("CLUSTER").arg("NODES")).ok());
        eprintln!(
            "===== cluster topology: CLUSTER NODES =====\n{}",
            nodes.as_deref().unwrap_or("<no node answers>")
        );
    }
}

/// A slot being moved between two primaries, step by step (a test can renew in between).
pub struct SlotMigration<'a> {
    topo: &'a ClusterTopology,
    pub slot: u16,
    pub from: ClusterNode,
    pub to: ClusterNode,
}

impl SlotMigration<'_> {
    /// Moves up to `count` keys of the slot (`CLUSTER GETKEYSINSLOT` + `MIGRATE ... KEYS`);
    /// returns how many moved (0: the source has none left).
    pub fn move_keys(&mut self, count: usize) -> usize {
        let keys: Vec<String> = try_query(
            self.from.port,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(count),
        )
        .expect("CLUSTER GETKEYSINSLOT");
        if keys.is_empty() {
            return 0;
        }
        let mut cmd = redis::cmd("MIGRATE");
        cmd.arg("127.0.0.1")
            .arg(self.to.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys);
        let _: String = try_query(self.from.port, &cmd).expect("MIGRATE");
        keys.len()
    }

    /// Ends the move: `SETSLOT NODE <target>` on the target, the source and every other
    /// primary; waits until every node agrees.
    pub fn finish(self) {
        setslot(self.to.port, self.slot, "NODE", &self.to.id);
        setslot(self.from.port, self.slot, "NODE", &self.to.id);
        for p in self.topo.primaries() {
            if p.port != self.to.port && p.port != self.from.port {
                setslot(p.port, self.slot, "NODE", &self.to.id);
            }
        }
        self.topo.wait_cluster_ok();
    }
}

fn setslot(port: u16, slot: u16, state: &str, node_id: &str) {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("SETSLOT").arg(slot).arg(state).arg(node_id);
    let _: String = try_query(port, &cmd)
        .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {slot} {state} on :{port}: {e}"));
}

fn cluster_args() -> Vec<String> {
    let mut args = data_node_args();
    args.extend(strings(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        &CLUSTER_NODE_TIMEOUT_MS.to_string(),
        // Bus port from the harness's range: the default (port + 10000) may be ephemeral.
        "--cluster-port",
        &free_port().to_string(),
    ]));
    args
}

/// One line of `CLUSTER NODES`:
/// `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot> <slot>...`.
fn parse_cluster_node(line: &str) -> Option<ClusterNode> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 8 {
        return None;
    }
    let port = f[1].split('@').next()?.rsplit_once(':')?.1.parse().ok()?;
    let flags: Vec<&str> = f[2].split(',').collect();
    // Slots being moved show as `[slot->-id]`; only plain slots and ranges are served.
    let slots = f[8..]
        .iter()
        .filter(|s| !s.starts_with('['))
        .filter_map(|s| match s.split_once('-') {
            Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
            None => s.parse().ok().map(|a| (a, a)),
        })
        .collect();
    Some(ClusterNode {
        id: f[0].to_owned(),
        port,
        primary: flags.contains(&"master"),
        primary_id: (f[3] != "-").then(|| f[3].to_owned()),
        failed: flags.iter().any(|x| x.starts_with("fail")),
        slots,
    })
}

/// What the node on `port` believes, when it says `cluster_state:ok`: its slot map and each
/// node's (id, primary, primary id, failed), sorted. None when down or not ok.
#[allow(clippy::type_complexity)]
fn node_view(
    port: u16,
) -> Option<(
    Vec<(u16, u16, u16)>,
    Vec<(String, bool, Option<String>, bool)>,
)> {
    let info: String = try_query(port, redis::cmd("CLUSTER").arg("INFO")).ok()?;
    if !info.contains("cluster_state:ok") {
        return None;
    }
    let text: String = try_query(port, redis::cmd("CLUSTER").arg("NODES")).ok()?;
    let mut roles: Vec<_> = text
        .lines()
        .filter_map(parse_cluster_node)
        .map(|n| (n.id, n.primary, n.primary_id, n.failed))
        .collect();
    roles.sort();
    Some((slot_view(port)?, roles))
}

/// `CLUSTER SLOTS` of the node on `port` as sorted (first, last, primary port) triples.
fn slot_view(port: u16) -> Option<Vec<(u16, u16, u16)>> {
    let slots: Vec<redis::Value> = try_query(port, redis::cmd("CLUSTER").arg("SLOTS")).ok()?;
    let mut view = Vec::new();
    for range in slots {
        let redis::Value::Array(items) = range else {
            return None;
        };
        let first: u16 = redis::from_redis_value_ref(items.first()?).ok()?;
        let last: u16 = redis::from_redis_value_ref(items.get(1)?).ok()?;
        let redis::Value::Array(primary) = items.get(2)? else {
            return None;
        };
        let primary_port: u16 = redis::from_redis_value_ref(primary.get(1)?).ok()?;
        view.push((first, last, primary_port));
    }
    view.sort();
    Some(view)
}

/// How long `f` took, for start-up figures.
pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed())
}
