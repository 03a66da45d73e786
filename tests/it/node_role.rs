//! A node that stops being the primary under a plain `redis://` URL.
//! `READONLY` (which redis-rs returns inside `Ok` as a server-error value) makes the next call
//! open a new connection, which resolves the name again and must find a node that answers
//! `ROLE` as master: through a `REPLICAOF` on the sidecar's own node (worker, lock, pool serve,
//! pool CLI) and through a managed-Redis style failover that moves a DNS name. Also a server
//! at `maxclients`, whose refusal is named.

use crate::connection::{acquire_over_http, pool_serve};
use crate::harness::*;

/// The sidecar's node `a` (the primary at first) and `b`, its replica: the two sides of a
/// managed failover, on the same loopback address or on two.
struct Pair {
    a: RedisServer,
    b: RedisServer,
}

impl Pair {
    /// `a` on 127.0.0.1, `b` replicating it, in sync.
    fn start() -> Pair {
        let a = RedisServer::start();
        let b = replica_of(&a, None, None);
        Pair { a, b }
    }

    /// The managed failover: `b` promoted, `a` demoted to its replica, through Redis' own
    /// coordinated `FAILOVER` (Redis >= 6.2): `a` pauses writes until `b` holds every one of
    /// them, then the two switch roles, as a managed service's planned failover does. Clients
    /// of `a` stay connected and get READONLY. Returns once `a` replicates `b`.
    fn fail_over_to_b(&self) {
        switch(&self.a, &self.b);
    }

    /// Back: `a` promoted, `b` its replica again, the same way.
    fn fail_back_to_a(&self) {
        switch(&self.b, &self.a);
    }
}

/// `FAILOVER` from `primary` to its one replica `to` (no `TO`: the primary knows its replica
/// by the address it connects from, not by the one the test gave it); waits until `to` is primary and
/// `primary` its linked replica. (A bare `REPLICAOF NO ONE` on the replica can promote it
/// before it has the primary's last writes, which then vanish: seen in CI under load.)
fn switch(primary: &RedisServer, to: &RedisServer) {
    let _: String = primary.query(redis::cmd("FAILOVER").arg("TIMEOUT").arg(20_000));
    assert!(
        to.wait_info("replication", "role", "master", secs(30)),
        "{} was never promoted",
        to.name()
    );
    wait_linked(primary);
}

/// A server on `ip:port` (127.0.0.1 and a free port by default) replicating `primary`, in sync.
fn replica_of(primary: &RedisServer, ip: Option<&str>, port: Option<u16>) -> RedisServer {
    let mut args = vec![
        "--replicaof".into(),
        primary.ip().into(),
        primary.port().to_string(),
    ];
    // The primary knows a replica by the address it connects from; a `FAILOVER` then demotes
    // the primary to that address. Announce the one the replica listens on.
    if let Some(ip) = ip {
        args.extend(["--replica-announce-ip".into(), ip.into()]);
    }
    let replica = RedisServer::start_with(RedisOptions {
        args,
        name: "replica".into(),
        ip: ip.map(str::to_owned),
        port,
        ..RedisOptions::default()
    });
    wait_linked(&replica);
    replica
}

fn wait_linked(replica: &RedisServer) {
    assert!(
        replica.wait_info("replication", "master_link_status", "up", secs(15)),
        "{} never linked to its primary",
        replica.name()
    );
}

/// Client ids of the ordinary clients of `server` (not its replication links, not the
/// connection that asks): the sidecars' connections.
fn client_ids(server: &RedisServer) -> Vec<u64> {
    let list: String = server.query(redis::cmd("CLIENT").arg("LIST"));
    list.lines()
        .filter(|line| {
            let flags = field(line, "flags").unwrap_or("");
            !flags.contains('M')
                && !flags.contains('S')
                && field(line, "cmd") != Some("client|list")
        })
        .filter_map(|line| field(line, "id")?.parse().ok())
        .collect()
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// The one client of `server` once exactly one is connected (10 s).
fn the_client(server: &RedisServer) -> u64 {
    poll_some(secs(10), || match client_ids(server)[..] {
        [id] => Some(id),
        _ => None,
    })
    .unwrap_or_else(|| panic!("not one client: {:?}", client_ids(server)))
}

/// A demoted primary without a DNS change, for one long-running mode already connected
/// to `pair.a` (as client `before`): `a` is demoted, so the mode's next call is answered
/// READONLY and must leave that connection (on today's main its client id stayed through 4 s
/// of READONLY); `a` is promoted again, and the mode runs on a new connection.
fn demote_and_promote(pair: &Pair, before: u64, mode: &str) {
    pair.fail_over_to_b();
    assert!(
        poll_until(secs(15), || !client_ids(&pair.a).contains(&before)),
        "{mode}: its connection {before} to the demoted node stayed: {:?}",
        client_ids(&pair.a)
    );
    pair.fail_back_to_a();
    let after = poll_some(secs(15), || client_ids(&pair.a).into_iter().next());
    assert!(
        after.is_some_and(|id| id != before),
        "{mode}: no new connection to the promoted node: {after:?}"
    );
}

/// Worker: its renewal answered READONLY drops the connection; it keeps (or regains) its ID.
#[test]
fn worker_leaves_a_demoted_node_and_keeps_its_id() {
    let pair = Pair::start();
    let worker = Sidecar::worker(&pair.a, "orders")
        .flag("--max-worker-id", "0")
        .flag("--ttl", "10s")
        .flag("--renew-interval", "500ms")
        .spawn();
    let lease = worker.wait_for_lease(secs(15));
    let before = the_client(&pair.a);
    demote_and_promote(&pair, before, "worker");
    let key = worker_key("orders", 0);
    assert!(
        poll_until(secs(15), || pair.a.get(&key) == Some(lease.owner.clone())
            && worker.id().is_some_and(|id| id.worker_id == 0)),
        "the worker did not keep or regain ID 0 on the promoted node"
    );
    assert!(worker.count_log("READONLY") + worker.count_log("ROLE as slave") > 0);
}

/// Lock: the command keeps running, the lock is renewed on the promoted node.
#[test]
fn lock_leaves_a_demoted_node_and_keeps_the_lock() {
    let pair = Pair::start();
    let mut lock = SidecarBuilder::new("lock")
        .name("lock")
        .without("--listen")
        .flag("--name", "report")
        .flag("--redis-url", pair.a.url())
        // Generous: the lock must outlast the demoted phase (a full sync each way) on a
        // loaded machine; what is tested is the connection, not the deadline.
        .flag("--ttl", "12s")
        .switch("--")
        .switch("sleep")
        .switch("30")
        .spawn();
    let key = "snowlease:lock:{report}";
    assert!(poll_until(secs(10), || pair.a.exists(key)), "never locked");
    let owner = pair.a.get(key);
    let before = the_client(&pair.a);
    demote_and_promote(&pair, before, "lock");
    // A renewal is the PTTL going up between two polls: one first reading
    // taken in the ms of a renewal (PTTL = TTL) could never be exceeded.
    let mut last = pair.a.pttl(key);
    assert!(
        poll_until(secs(15), || {
            let now = pair.a.pttl(key);
            let renewed = now > last;
            last = now;
            renewed
        }),
        "the lock was not renewed on the promoted node"
    );
    assert_eq!(pair.a.get(key), owner);
    assert!(lock.is_running(), "lock stopped: {:?}", lock.log_lines());
}

/// `pool serve`: its reaper's call answered READONLY drops the connection; it serves again
/// on the promoted node.
#[test]
fn pool_serve_leaves_a_demoted_node() {
    let pair = Pair::start();
    let init = run_snowlease(
        &["pool", "init", "--pool", "proxies", "--ids", "a,b,c"],
        &[("REDIS_URL", pair.a.url().as_str())],
        secs(20),
    );
    assert_eq!(init.code, Some(0), "{init:?}");
    let serve = pool_serve(&pair.a.url());
    assert!(poll_until(secs(10), || acquire_over_http(&serve) == 201));
    let before = the_client(&pair.a);
    demote_and_promote(&pair, before, "pool serve");
    assert!(
        poll_until(secs(10), || acquire_over_http(&serve) == 201),
        "pool serve never served again"
    );
}

/// The pool CLI on a node that answers `ROLE` as a replica: refused as a transient state,
/// named (on today's main `pool status` read the replica's copy and exited 0, `acquire` said
/// only READONLY); once the node is promoted the same commands run.
#[test]
fn pool_cli_refuses_a_replica_and_runs_once_promoted() {
    let pair = Pair::start();
    let url = pair.a.url();
    let env = [("REDIS_URL", url.as_str())];
    let pool = |args: &[&str]| {
        let mut argv = vec!["pool"];
        argv.extend_from_slice(args);
        run_snowlease(&argv, &env, secs(20))
    };
    let init = pool(&["init", "--pool", "proxies", "--ids", "a,b"]);
    assert_eq!(init.code, Some(0), "{init:?}");
    pair.fail_over_to_b();
    for args in [
        &["status", "--pool", "proxies"][..],
        &["acquire", "--pool", "proxies", "--ttl", "10s"][..],
    ] {
        let run = pool(args);
        assert_eq!(run.code, Some(1), "{args:?} on a replica: {run:?}");
        assert!(
            run.stderr
                .contains("answers ROLE as slave, not as the primary"),
            "{args:?}: {run:?}"
        );
    }
    pair.fail_back_to_a();
    // The promotion changed the node: acquires are closed for the max lease (the rollback
    // gate, docs/pool.md "After a Redis rollback"), then it leases.
    let acquire = [
        "acquire",
        "--pool",
        "proxies",
        "--ttl",
        "1s",
        "--max-lease",
        "1s",
    ];
    let run = pool(&acquire);
    assert_eq!(run.code, Some(3), "{run:?}");
    assert!(run.stderr.contains("acquires are closed"), "{run:?}");
    let run = pool(&[&acquire[..], &["--wait", "10s"]].concat());
    assert_eq!(run.code, Some(0), "{run:?}");
}

/// Managed-Redis failover: the URL names `redis.test`, which resolves to the
/// primary on 127.0.0.2; the replica on 127.0.0.3 (same port) is promoted, the old primary
/// demoted, the name moved (the sidecar's private /etc/hosts rewritten). The sidecar follows:
/// its renewals run on the new primary and it keeps ID 0, a newcomer on the new primary finds
/// it held. Then the sidecar is paused past its TTL, the newcomer takes ID 0 and releases it
/// at SIGTERM: the sidecar claims it again on the new primary. On today's main it stayed on
/// the demoted node (READONLY) and never claimed there again.
#[test]
fn worker_follows_a_dns_failover_and_reclaims_its_id() {
    let port = free_port_on(&["127.0.0.2", "127.0.0.3"]);
    let old = RedisServer::start_with(RedisOptions {
        ip: Some("127.0.0.2".into()),
        port: Some(port),
        name: "primary on 127.0.0.2".into(),
        ..RedisOptions::default()
    });
    old.open_claim_guard("orders");
    let new = replica_of(&old, Some("127.0.0.3"), Some(port));
    let hosts = HostsFile::new(&[("redis.test", "127.0.0.2")]);
    let url = format!("redis://redis.test:{port}");
    let worker = Sidecar::worker_at(&url, "orders")
        .name("worker on redis.test")
        .flag("--max-worker-id", "0")
        .flag("--ttl", "4s")
        .flag("--renew-interval", "500ms")
        .wrap(
            &hosts
                .wrapper()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .spawn();
    let lease = worker.wait_for_lease(secs(15));
    assert_eq!(lease.worker_id, 0);
    let key = worker_key("orders", 0);

    switch(&old, &new);
    hosts.set("redis.test", "127.0.0.3");
    let moved = std::time::Instant::now();
    // Renewals extend the key on the new primary only (the old one is its replica now, so
    // its copy follows): the new primary's PTTL grows back after the move.
    let pttl_at_move = new.pttl(&key);
    assert!(
        poll_until(secs(15), || new.pttl(&key) > pttl_at_move
            && new.get(&key) == Some(lease.owner.clone())),
        "the sidecar never renewed on the new primary (pttl {} at the move, now {})",
        pttl_at_move,
        new.pttl(&key)
    );
    eprintln!(
        "renewed on the new primary {:?} after the name moved",
        moved.elapsed()
    );
    assert_eq!(worker.id().map(|id| id.worker_id), Some(0));

    let mut newcomer = Sidecar::worker(&new, "orders")
        .name("newcomer")
        .flag("--max-worker-id", "0")
        .spawn();
    assert!(newcomer.wait_for_log("all worker IDs are held", secs(15)));
    assert_eq!(newcomer.id(), None);

    worker.pause();
    newcomer.wait_for_lease(secs(15));
    worker.resume();
    assert!(
        poll_until(secs(10), || worker.id().is_none()),
        "the paused sidecar kept publishing ID 0 after the newcomer took it"
    );
    newcomer.signal(Signal::SIGTERM);
    assert!(
        newcomer.wait_exit(secs(10)).is_some(),
        "newcomer did not stop"
    );
    let again = worker.wait_for_lease(secs(20));
    assert_eq!(again.worker_id, 0);
    assert_eq!(new.get(&key), Some(again.owner));
}

/// A Redis at `maxclients` refuses new connections with `ERR max number of clients
/// reached` and closes them; the error says so (on today's main: "Connection reset by peer"
/// or "broken pipe").
#[test]
fn a_maxclients_refusal_is_named() {
    let redis = RedisServer::start_with(RedisOptions {
        args: vec!["--maxclients".into(), "1".into()],
        ..RedisOptions::default()
    });
    let _holder = redis.conn();
    let status = run_snowlease(
        &["status", "--app", "orders", "--redis-url", &redis.url()],
        &[],
        secs(20),
    );
    assert_eq!(status.code, Some(1), "{status:?}");
    assert!(
        status.stderr.contains("ERR max number of clients reached"),
        "{status:?}"
    );
    let mut worker = Sidecar::worker(&redis, "orders")
        .flag("--claim-timeout", "3s")
        .spawn();
    assert!(
        worker.wait_for_log("ERR max number of clients reached", secs(15)),
        "{:?}",
        worker.log_lines()
    );
    worker.wait_exit(secs(15));
    assert_eq!(
        worker.count_log("reset by peer") + worker.count_log("broken pipe"),
        0
    );
}
