//! The harness's fault proxy and topologies, proven against real `redis-server` processes.
//! A raw RESP client is used for the proxy so each byte's fate is visible (a redis-rs
//! connection would hide a late reply behind its own timeout handling).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::harness::*;

/// A plain TCP client speaking RESP, with a read deadline per call.
struct Raw(TcpStream);

impl Raw {
    fn connect(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to proxy");
        Raw(s)
    }

    fn send(&mut self, args: &[&str]) {
        let mut out = format!("*{}\r\n", args.len());
        for a in args {
            out.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        self.0.write_all(out.as_bytes()).expect("write to proxy");
    }

    /// Bytes that arrive within `wait` (stops early at a complete-looking reply);
    /// Err on a reset or EOF.
    fn read_for(&mut self, wait: Duration) -> Result<String, ErrorKind> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            self.0
                .set_read_timeout(Some(deadline - Instant::now() + ms(1)))
                .unwrap();
            match self.0.read(&mut buf) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof),
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.ends_with(b"\r\n") {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.kind()),
            }
        }
        Ok(String::from_utf8_lossy(&got).into_owned())
    }

    /// Reads until `want` has arrived (5 s deadline) and returns everything read.
    fn read_until(&mut self, want: &str) -> String {
        let mut got = String::new();
        let deadline = Instant::now() + secs(5);
        while !got.contains(want) && Instant::now() < deadline {
            got += &self.read_for(ms(200)).expect("connection open");
        }
        assert!(got.contains(want), "wanted {want:?}, got {got:?}");
        got
    }
}

fn proxy_and_redis() -> (RedisServer, FaultProxy) {
    let redis = RedisServer::start();
    let proxy = FaultProxy::for_redis(&redis);
    (redis, proxy)
}

/// Pass mode forwards both ways, and the proxy numbers connections in accept order.
#[test]
fn harness_proxy_pass_lists_connections() {
    let (redis, proxy) = proxy_and_redis();
    let mut a = Raw::connect(proxy.port());
    let mut b = Raw::connect(proxy.port());
    a.send(&["SET", "k", "v"]);
    a.read_until("+OK");
    b.send(&["GET", "k"]);
    b.read_until("v");
    assert_eq!(redis.get("k").as_deref(), Some("v"));
    let conns = proxy.connections();
    assert_eq!(conns.len(), 2, "{conns:?}");
    assert_eq!(conns[0].peer, a.0.local_addr().unwrap());
    assert_eq!(conns[1].peer, b.0.local_addr().unwrap());
    assert!(conns.iter().all(|c| c.open && c.mode == Mode::Pass));
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
}

/// Blackhole holds a request (Redis never sees it) and a reply (the client never sees it),
/// and a release delivers both, in order.
#[test]
fn harness_proxy_blackhole_holds_then_release_delivers() {
    let (redis, proxy) = proxy_and_redis();
    let mut c = Raw::connect(proxy.port());
    c.send(&["PING"]);
    c.read_until("PONG");
    // A reply held on its way back: BLPOP parks in Redis, the push comes from elsewhere.
    c.send(&["BLPOP", "q", "0"]);
    assert!(redis.wait_info("clients", "blocked_clients", "1", secs(5)));
    proxy.set_mode(Mode::Blackhole);
    let _: () = redis.query(redis::cmd("RPUSH").arg("q").arg("item"));
    assert!(poll_until(secs(5), || proxy.connections()[0].queued_down > 0));
    assert_eq!(c.read_for(ms(300)), Ok(String::new()), "reply leaked");
    // A request held on its way in.
    c.send(&["SET", "held", "1"]);
    let conn = proxy.wait_queued_up(1, secs(5)).expect("request held");
    assert_eq!(conn.mode, Mode::Blackhole);
    thread_sleep_observe();
    assert!(
        !redis.exists("held"),
        "request leaked through the blackhole"
    );

    proxy.release();
    let got = c.read_until("+OK");
    assert!(
        got.find("item").unwrap() < got.find("+OK").unwrap(),
        "{got:?}"
    );
    assert_eq!(redis.get("held").as_deref(), Some("1"));
}

/// A short window in which a leak would show; the condition checked after it has no event to
/// wait for (we prove that nothing happens).
fn thread_sleep_observe() {
    std::thread::sleep(ms(300));
}

/// Delay holds each direction for its time and keeps the order of pipelined commands.
#[test]
fn harness_proxy_delay_keeps_order() {
    let (_redis, proxy) = proxy_and_redis();
    let mut c = Raw::connect(proxy.port());
    c.send(&["PING"]);
    c.read_until("PONG");
    proxy.set_mode(Mode::Delay {
        up: ms(200),
        down: ms(300),
    });
    let t = Instant::now();
    c.send(&["ECHO", "first"]);
    c.send(&["ECHO", "second"]);
    c.send(&["ECHO", "third"]);
    let got = c.read_until("third");
    let took = t.elapsed();
    assert!(took >= ms(500), "round trip {took:?} < 200 + 300 ms");
    assert!(took < secs(3), "round trip {took:?}");
    let at = |w: &str| got.find(w).unwrap();
    assert!(
        at("first") < at("second") && at("second") < at("third"),
        "{got:?}"
    );
}

/// DropReplies lets requests reach Redis and discards the replies.
#[test]
fn harness_proxy_drop_replies() {
    let (redis, proxy) = proxy_and_redis();
    let mut c = Raw::connect(proxy.port());
    c.send(&["PING"]);
    c.read_until("PONG");
    proxy.set_mode(Mode::DropReplies);
    c.send(&["SET", "k", "v"]);
    assert!(poll_until(secs(5), || redis.exists("k")));
    assert!(poll_until(secs(5), || proxy.connections()[0].dropped_down
        >= "+OK\r\n".len()));
    assert_eq!(
        c.read_for(ms(300)),
        Ok(String::new()),
        "a reply got through"
    );
    // Back to pass: later replies flow again, the dropped one stays lost.
    proxy.release();
    c.send(&["GET", "k"]);
    assert_eq!(c.read_until("v"), "$1\r\nv\r\n");
}

/// Reset closes open connections with RST, on the client and on the Redis side, and resets
/// new ones while it is the proxy-wide mode.
#[test]
fn harness_proxy_reset() {
    let (redis, proxy) = proxy_and_redis();
    let mut c = Raw::connect(proxy.port());
    c.send(&["PING"]);
    c.read_until("PONG");
    // None when INFO itself went unanswered (a loaded machine): polled, not read once.
    let clients = |n: &str| redis.info_field("clients", "connected_clients").as_deref() == Some(n);
    // 2: the proxied client and the fresh connection that asks INFO.
    assert!(poll_until(secs(5), || clients("2")));
    proxy.set_mode(Mode::Reset);
    assert_eq!(c.read_for(secs(2)), Err(ErrorKind::ConnectionReset));
    assert!(poll_until(secs(5), || clients("1")));
    let mut late = Raw::connect(proxy.port());
    assert_eq!(late.read_for(secs(2)), Err(ErrorKind::ConnectionReset));
    assert!(proxy.connections().iter().all(|c| !c.open));
}

/// freeze_existing black-holes open connections while new ones pass; a release delivers what
/// the frozen one held.
#[test]
fn harness_proxy_freeze_existing() {
    let (redis, proxy) = proxy_and_redis();
    let mut old = Raw::connect(proxy.port());
    old.send(&["PING"]);
    old.read_until("PONG");
    proxy.freeze_existing();
    old.send(&["SET", "frozen", "1"]);
    let mut new = Raw::connect(proxy.port());
    new.send(&["SET", "fresh", "1"]);
    new.read_until("+OK");
    assert_eq!(old.read_for(ms(300)), Ok(String::new()));
    assert!(!redis.exists("frozen"));
    let conns = proxy.connections();
    assert_eq!(conns[0].mode, Mode::Blackhole);
    assert_eq!(conns[1].mode, Mode::Pass);

    proxy.release();
    old.read_until("+OK");
    assert!(redis.exists("frozen"));
}

/// A per-connection mode touches that connection only.
#[test]
fn harness_proxy_per_connection_mode() {
    let (redis, proxy) = proxy_and_redis();
    let mut a = Raw::connect(proxy.port());
    let mut b = Raw::connect(proxy.port());
    a.send(&["PING"]);
    a.read_until("PONG");
    b.send(&["PING"]);
    b.read_until("PONG");
    proxy.set_conn_mode(0, Mode::Blackhole);
    a.send(&["SET", "a", "1"]);
    b.send(&["SET", "b", "1"]);
    b.read_until("+OK");
    assert_eq!(a.read_for(ms(300)), Ok(String::new()));
    assert!(!redis.exists("a"));
    proxy.set_conn_mode(1, Mode::Reset);
    assert_eq!(b.read_for(secs(2)), Err(ErrorKind::ConnectionReset));
    proxy.set_conn_mode(0, Mode::Pass);
    a.read_until("+OK");
    assert!(redis.exists("a"));
}

/// After set_upstream, new connections reach the new Redis; open ones keep the old one.
#[test]
fn harness_proxy_retarget() {
    let (first, proxy) = proxy_and_redis();
    let second = RedisServer::start();
    let mut old = Raw::connect(proxy.port());
    old.send(&["PING"]);
    old.read_until("PONG");
    proxy.set_upstream(std::net::SocketAddr::from(([127, 0, 0, 1], second.port())));
    let mut new = Raw::connect(proxy.port());
    new.send(&["SET", "where", "second"]);
    new.read_until("+OK");
    old.send(&["SET", "where", "first"]);
    old.read_until("+OK");
    assert_eq!(first.get("where").as_deref(), Some("first"));
    assert_eq!(second.get("where").as_deref(), Some("second"));
}

/// A real sidecar works through the proxy, and black-holing its connections stops its renewals
/// reaching Redis (the bytes wait in the proxy) until a release.
#[test]
fn harness_proxy_carries_a_sidecar() {
    let (redis, proxy) = proxy_and_redis();
    redis.open_claim_guard("orders");
    let sidecar = Sidecar::worker_at(&proxy.url(), "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(15));
    let key = worker_key("orders", lease.worker_id);
    assert_eq!(redis.get(&key), Some(lease.owner));
    assert!(proxy.open_connections().iter().any(|c| c.forwarded_up > 0));

    let renewals = || redis.command_calls("evalsha");
    proxy.set_mode(Mode::Blackhole);
    // A renew sent after the switch waits in the proxy; none reaches Redis meanwhile.
    assert!(proxy.wait_queued_up(1, secs(5)).is_some(), "no renew held");
    let before = renewals();
    thread_sleep_observe();
    assert_eq!(renewals(), before, "a renew got through the blackhole");
    proxy.release();
    assert!(
        poll_until(secs(5), || renewals() > before),
        "held renew never delivered"
    );
}

/// The sentinel topology fails over both ways (SENTINEL FAILOVER, then a SIGKILLed primary),
/// keeps its data, and takes the killed node back as a replica.
#[test]
fn harness_sentinel_topology_fails_over() {
    let mut topo = SentinelTopology::start();
    eprintln!("sentinel topology (1+2+3) up in {:?}", topo.startup_time());
    assert_eq!(topo.sentinel_addrs().len(), 3);
    let ports: Vec<String> = topo.sentinel_addrs();
    assert_eq!(
        topo.url(),
        format!("redis+sentinel://{}/{MASTER_NAME}", ports.join(","))
    );
    assert_eq!(topo.primary_index(), 0);
    let _: () = topo.primary().query(redis::cmd("SET").arg("k").arg("v"));

    let (first, took) = timed(|| topo.failover());
    eprintln!("planned failover took {took:?}");
    assert_ne!(first, 0);
    assert_eq!(
        topo.primary_addr().unwrap().port(),
        topo.nodes()[first].port()
    );
    assert_eq!(topo.nodes()[first].get("k").as_deref(), Some("v"));
    let role = |topo: &SentinelTopology, i: usize| {
        topo.nodes()[i].info_field("replication", "role").unwrap()
    };
    topo.wait_replicas_in_sync();
    assert_eq!(
        role(&topo, 0),
        "slave",
        "the old primary follows the new one"
    );

    let ((killed, second), took) = timed(|| topo.kill_primary());
    eprintln!("failover after SIGKILL took {took:?}");
    assert_eq!(killed, first);
    assert_ne!(second, first);
    assert_eq!(topo.nodes()[second].get("k").as_deref(), Some("v"));

    topo.restart_as_replica(killed);
    assert_eq!(role(&topo, killed), "slave");
    assert_eq!(topo.nodes()[killed].get("k").as_deref(), Some("v"));
}

/// The small sentinel topology (1 primary, 1 replica, 1 sentinel) fails over and back.
#[test]
fn harness_sentinel_small_topology_fails_over_and_back() {
    let topo = SentinelTopology::start_small();
    eprintln!(
        "small sentinel topology (1+1+1) up in {:?}",
        topo.startup_time()
    );
    let (new, took) = timed(|| topo.failover());
    eprintln!("small planned failover took {took:?}");
    assert_eq!(new, 1);
    // The old primary must be a replica again before it can be promoted back.
    let (_, took) = timed(|| topo.wait_replicas_in_sync());
    eprintln!("old primary converted to a replica after {took:?}");
    assert_eq!(topo.failover(), 0);
    assert_eq!(topo.primary().port(), topo.nodes()[0].port());
}

/// With proxies in front of the data nodes, black-holing the primary's proxy partitions it: a
/// replica is promoted while the cut-off primary still takes writes, which the heal discards.
#[test]
fn harness_sentinel_partitioned_primary_is_replaced() {
    let topo = SentinelTopology::start_with(SentinelOptions {
        proxied: true,
        replicas: 1,
        sentinels: 1,
        quorum: 1,
        ..SentinelOptions::default()
    });
    assert_eq!(topo.primary_addr().unwrap().port(), topo.addr_port(0));
    assert_ne!(topo.addr_port(0), topo.nodes()[0].port());

    topo.proxy(0).set_mode(Mode::Blackhole);
    let (new, took) = timed(|| topo.wait_new_primary(0));
    eprintln!("partitioned primary replaced after {took:?}");
    assert_eq!(new, 1);
    let role = topo.nodes()[0].info_field("replication", "role");
    assert_eq!(
        role.as_deref(),
        Some("master"),
        "cut off, it still acts as primary"
    );
    let _: () = topo.nodes()[0].query(redis::cmd("SET").arg("lost").arg("1"));

    topo.proxy(0).release();
    topo.wait_replicas_in_sync();
    assert_eq!(
        topo.nodes()[0].get("lost"),
        None,
        "the heal resyncs it from the new primary"
    );
}

/// The cluster forms with every slot served once, reports a key's owner, and moves a slot with
/// its key to another primary in steps (ASK while moving, MOVED after).
#[test]
fn harness_cluster_forms_and_migrates_a_slot() {
    let topo = ClusterTopology::start();
    eprintln!("cluster (3+3) up in {:?}", topo.startup_time());
    let primaries = topo.primaries();
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    let mut ranges: Vec<(u16, u16)> = primaries.iter().flat_map(|p| p.slots.clone()).collect();
    ranges.sort();
    assert_eq!(ranges.first().unwrap().0, 0);
    assert_eq!(ranges.last().unwrap().1, CLUSTER_SLOTS - 1);
    assert!(
        ranges.windows(2).all(|w| w[0].1 + 1 == w[1].0),
        "{ranges:?}"
    );
    for p in &primaries {
        assert_eq!(topo.replicas_of(&p.id).len(), 1, "replicas of {p:?}");
    }
    assert!(topo.url().starts_with("redis://127.0.0.1:"));
    assert_eq!(topo.url().matches(',').count(), 5);

    let key = "snowflake:worker:orders:7";
    let slot = topo.keyslot(key);
    let from = topo.owner_of_key(key);
    let _: () = topo
        .server(from.port)
        .query(redis::cmd("SET").arg(key).arg("owner-a"));
    let to = primaries.iter().find(|p| p.port != from.port).unwrap();

    let mut m = topo.begin_migration(slot, to.port);
    assert_eq!(m.move_keys(10), 1);
    let ask = redis::cmd("GET")
        .arg(key)
        .query::<Option<String>>(&mut topo.server(from.port).conn());
    assert!(
        ask.as_ref()
            .is_err_and(|e| e.to_string().to_uppercase().contains("ASK")),
        "{ask:?}"
    );
    assert_eq!(m.move_keys(10), 0);
    m.finish();

    assert_eq!(topo.owner_of_key(key).port, to.port);
    assert_eq!(topo.server(to.port).get(key).as_deref(), Some("owner-a"));
    let moved = redis::cmd("GET")
        .arg(key)
        .query::<Option<String>>(&mut topo.server(from.port).conn());
    assert!(
        moved
            .as_ref()
            .is_err_and(|e| e.to_string().to_uppercase().contains("MOVED")),
        "{moved:?}"
    );
}

/// A killed cluster primary is replaced by its replica, comes back as a replica, and a shard
/// restarted empty keeps its slots but loses its keys (on the replica too).
#[test]
fn harness_cluster_kill_primary_and_empty_shard() {
    let mut topo = ClusterTopology::start();
    let key = "k{7}";
    let owner = topo.owner_of_key(key);
    let _: () = topo
        .server(owner.port)
        .query(redis::cmd("SET").arg(key).arg("v"));
    let replica = topo.replicas_of(&owner.id)[0].clone();
    assert!(poll_until(secs(5), || topo.server(replica.port).dbsize() == 1));

    let (promoted, took) = timed(|| topo.kill_primary(owner.port));
    eprintln!("cluster failover after SIGKILL took {took:?}");
    assert_eq!(promoted.port, replica.port);
    assert_eq!(topo.owner_of_key(key).port, replica.port);
    assert_eq!(topo.server(replica.port).get(key).as_deref(), Some("v"));
    topo.restart_node(owner.port);
    assert_eq!(
        topo.node_on(owner.port).primary_id,
        Some(replica.id.clone())
    );

    let (_, took) = timed(|| topo.restart_shard_empty(replica.port));
    eprintln!("shard restarted empty in {took:?}");
    assert_eq!(topo.owner_of_key(key).port, replica.port, "slots kept");
    assert_eq!(topo.server(replica.port).dbsize(), 0);
    assert_eq!(
        topo.server(owner.port).dbsize(),
        0,
        "its replica resynced empty"
    );
}

/// A cluster shard crash-restarted from a snapshot keeps its slots and comes back with the
/// snapshot's key and without the one written after it, on its replica too.
#[test]
fn harness_cluster_shard_restarted_from_a_snapshot() {
    let mut topo = ClusterTopology::start();
    let (before, after) = ("before{7}", "after{7}");
    let owner = topo.owner_of_key(before);
    let primary = topo.server(owner.port);
    let _: () = primary.query(redis::cmd("SET").arg(before).arg("v"));
    let _: () = primary.query(&mut redis::cmd("SAVE"));
    let _: () = primary.query(redis::cmd("SET").arg(after).arg("v"));
    let replica = topo.replicas_of(&owner.id)[0].clone();
    assert!(poll_until(secs(5), || topo.server(replica.port).dbsize() == 2));

    let (_, took) = timed(|| topo.restart_shard_from_snapshot(owner.port));
    eprintln!("shard restarted from a snapshot in {took:?}");
    assert_eq!(topo.owner_of_key(before).port, owner.port, "slots kept");
    let node = topo.server(owner.port);
    assert_eq!(node.get(before).as_deref(), Some("v"));
    assert!(!node.exists(after), "a write made after the snapshot");
    // A replica answers MOVED to reads; its key count shows it dropped the later write.
    assert_eq!(
        topo.server(replica.port).dbsize(),
        1,
        "its replica resynced"
    );
}

/// The cheap cluster (3 primaries, no replicas) forms and serves every slot.
#[test]
fn harness_cluster_primaries_only_forms() {
    let topo = ClusterTopology::start_primaries_only();
    eprintln!("cluster (3+0) up in {:?}", topo.startup_time());
    assert_eq!(topo.primaries().len(), 3);
    assert_eq!(topo.cluster_nodes().len(), 3);
}

/// [`HostsFile`]: two servers share a port on 127.0.0.2 and 127.0.0.3; a process wrapped with
/// the file resolves the name to the first, and after `set` to the second (the same process
/// tree only: the machine's `/etc/hosts` is untouched).
#[test]
fn harness_hosts_file_moves_a_name() {
    let port = free_port_on(&["127.0.0.2", "127.0.0.3"]);
    let servers: Vec<RedisServer> = ["127.0.0.2", "127.0.0.3"]
        .iter()
        .map(|ip| {
            let server = RedisServer::start_with(RedisOptions {
                ip: Some(ip.to_string()),
                port: Some(port),
                name: format!("redis on {ip}"),
                ..RedisOptions::default()
            });
            let _: () = server.query(redis::cmd("SET").arg("who").arg(*ip));
            server
        })
        .collect();
    assert_eq!(servers[0].port(), servers[1].port());
    let hosts = HostsFile::new(&[("redis.test", "127.0.0.2")]);
    let who = || {
        let wrapper = hosts.wrapper();
        let mut cmd = std::process::Command::new(&wrapper[0]);
        cmd.args(&wrapper[1..])
            .args(["redis-cli", "-h", "redis.test", "-p", &port.to_string()])
            .args(["GET", "who"]);
        let run = run_command(cmd, secs(10));
        assert_eq!(run.code, Some(0), "{run:?}");
        run.stdout.trim().to_owned()
    };
    assert_eq!(who(), "127.0.0.2");
    hosts.set("redis.test", "127.0.0.3");
    assert_eq!(who(), "127.0.0.3");
    let machine = std::fs::read_to_string("/etc/hosts").unwrap();
    assert!(!machine.contains("redis.test"), "{machine}");
}
