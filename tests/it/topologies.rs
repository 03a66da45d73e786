//! Every mode on Sentinel and Cluster, on real topologies from the harness.

use std::time::Instant;

use crate::connection::{acquire_over_http, pool_serve};
use crate::harness::*;

/// 8 sidecars claim, renew and release through `redis+sentinel://`; through a
/// planned failover and a killed primary every sidecar keeps or re-gets an ID within a
/// bounded time (printed), no two publish one ID at once, none exits. (Bad Sentinel input:
/// `connection::a_topology_that_does_not_match_is_named`.)
#[test]
fn sentinel_failovers_keep_ids_unique() {
    let mut topo = SentinelTopology::start();
    let url = topo.url();
    let (mut sidecars, addrs) = holding_sidecars(&url, "orders", 8);

    let ((), planned) = sample_through(&addrs, || {
        topo.failover();
    });
    println!("planned failover: longest time without an ID per sidecar: {planned:?}");
    let ((), killed) = sample_through(&addrs, || {
        topo.kill_primary();
    });
    println!("killed primary: longest time without an ID per sidecar: {killed:?}");
    for gap in planned.iter().chain(&killed) {
        assert!(*gap < secs(15), "a sidecar was without an ID for {gap:?}");
    }
    for s in &mut sidecars {
        assert!(s.is_running(), "{} exited", s.name());
    }
    // Renewals go to the new primary: each key there holds its sidecar's owner string.
    for s in &sidecars {
        let held = poll_some(secs(10), || {
            let id = s.id()?;
            (topo.primary().get(&worker_key("orders", id.worker_id)) == Some(id.owner))
                .then_some(())
        });
        assert!(held.is_some(), "{}: key not on the new primary", s.name());
    }

    // Release through the Sentinel's primary.
    let id = sidecars[0].id().expect("an ID").worker_id;
    sidecars[0].signal(Signal::SIGTERM);
    assert!(sidecars[0].wait_exit(secs(10)).is_some_and(|s| s.success()));
    // Released on the primary the Sentinels name: our owner string is gone; what is left is
    // the handover tombstone (`released:<owner>`, expiring after --handover-delay).
    let left = topo.primary().get(&worker_key("orders", id));
    assert!(
        left.as_deref().is_none_or(|v| v.starts_with("released:")),
        "{left:?}"
    );
}

/// `status`, the pool CLI and `pool serve` work on a Cluster reached by a plain
/// `redis://` URL (detected) and by `redis+cluster://`; `status` names the keys above its
/// `--max-worker-id` on every shard.
#[test]
fn cluster_status_and_pool_basics() {
    let topo = ClusterTopology::start_primaries_only();
    let url = topo.url();
    let forced = url.replacen("redis://", "redis+cluster://", 1);
    let above = [40u32, 151, 700, 1023];
    for id in above {
        let key = worker_key("orders", id);
        let _: () = topo
            .server(topo.owner_of_key(&key).port)
            .query(redis::cmd("SET").arg(&key).arg("10.0.0.9#00000000000000aa"));
    }
    for url in [&url, &forced] {
        let run = run_snowlease(
            &["status", "--app", "orders", "--redis-url", url, "--json"],
            &[],
            secs(20),
        );
        assert_eq!(run.code, Some(0), "{run:?}");
        let report: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        assert_eq!(report["above_range"], serde_json::json!(above), "{run:?}");
    }
    let shards: std::collections::BTreeSet<u16> = above
        .iter()
        .map(|id| topo.owner_of_key(&worker_key("orders", *id)).port)
        .collect();
    assert!(
        shards.len() > 1,
        "the keys above the range sit on one shard only"
    );
    let env = [("REDIS_URL", url.as_str())];
    let init = run_snowlease(
        &["pool", "init", "--pool", "proxies", "--ids", "a,b"],
        &env,
        secs(20),
    );
    assert_eq!(init.code, Some(0), "{init:?}");
    let other = run_snowlease(
        &["pool", "init", "--pool", "accounts", "--ids", "x"],
        &env,
        secs(20),
    );
    assert_eq!(other.code, Some(0), "{other:?}");
    let acquired = run_snowlease(
        &["pool", "acquire", "--pool", "proxies", "--ttl", "30s"],
        &env,
        secs(20),
    );
    assert_eq!(acquired.code, Some(0), "{acquired:?}");
    let lease: serde_json::Value = serde_json::from_str(&acquired.stdout).unwrap();
    let (id, token) = (
        lease["id"].as_str().unwrap(),
        lease["token"].as_str().unwrap(),
    );
    let released = run_snowlease(
        &[
            "pool", "release", "--pool", "proxies", "--id", id, "--token", token,
        ],
        &env,
        secs(20),
    );
    assert_eq!(released.code, Some(0), "{released:?}");

    let serve = pool_serve(&forced);
    assert!(poll_until(secs(15), || serve.readyz() == 200));
    assert_eq!(acquire_over_http(&serve), 201);
}

/// A renewal counts only when it ran on the node the Sentinels name.
/// The Sentinels are pointed at another server while the old primary still accepts writes:
/// the sidecar notices at its next renewal, moves to the named node and sets its key there.
#[test]
fn sentinel_renewals_follow_the_named_primary() {
    let topo = SentinelTopology::start_with(SentinelOptions {
        replicas: 0,
        sentinels: 1,
        quorum: 1,
        ..SentinelOptions::default()
    });
    let other = RedisServer::start();
    let sidecar = Sidecar::worker_at(&topo.url(), "orders")
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .spawn();
    let lease = sidecar.wait_for_lease(secs(20));
    let key = worker_key("orders", lease.worker_id);
    assert_eq!(topo.primary().get(&key), Some(lease.owner.clone()));

    let sentinel = &topo.sentinels()[0];
    let _: String = sentinel.query(redis::cmd("SENTINEL").arg("REMOVE").arg(topo.master_name()));
    let _: String = sentinel.query(
        redis::cmd("SENTINEL")
            .arg("MONITOR")
            .arg(topo.master_name())
            .arg("127.0.0.1")
            .arg(other.port())
            .arg(1),
    );
    assert!(
        poll_until(secs(10), || other.get(&key) == Some(lease.owner.clone())),
        "the sidecar never renewed on the node the Sentinels name"
    );
    let unconfirmed = "snowlease_renewals_total{outcome=\"unconfirmed\"}";
    assert!(sidecar.metric(unconfirmed).unwrap_or(0.0) >= 1.0);
    assert_eq!(sidecar.id().map(|id| id.worker_id), Some(lease.worker_id));
}

/// A claim counts only when it ran on the node the Sentinels name.
/// Sidecar Y waits for ID 0 on the old primary while the Sentinels are pointed at another
/// server, where X renews ID 0; when X's key expires on the old primary, Y must not claim and
/// publish ID 0 there.
#[test]
fn sentinel_claims_follow_the_named_primary() {
    let topo = SentinelTopology::start_with(SentinelOptions {
        replicas: 0,
        sentinels: 1,
        quorum: 1,
        ..SentinelOptions::default()
    });
    let other = RedisServer::start();
    let worker = |name: &str| {
        Sidecar::worker_at(&topo.url(), "orders")
            .name(name)
            .flag("--max-worker-id", "0")
            .flag("--ttl", "2s")
            .flag("--renew-interval", "500ms")
            .spawn()
    };
    let x = worker("x");
    x.wait_for_lease(secs(20));
    let y = worker("y");
    assert!(y.wait_for_log("all worker IDs are held", secs(20)));

    let sentinel = &topo.sentinels()[0];
    let _: String = sentinel.query(redis::cmd("SENTINEL").arg("REMOVE").arg(topo.master_name()));
    let _: String = sentinel.query(
        redis::cmd("SENTINEL")
            .arg("MONITOR")
            .arg(topo.master_name())
            .arg("127.0.0.1")
            .arg(other.port())
            .arg(1),
    );
    let key = worker_key("orders", 0);
    assert!(poll_until(secs(10), || other.exists(&key)), "x never moved");
    // X's key on the old primary expires within its TTL; watch well past that.
    let watch_until = std::time::Instant::now() + secs(5);
    while std::time::Instant::now() < watch_until {
        let (x_id, y_id) = (x.id(), y.id());
        assert!(
            !(x_id.is_some() && y_id.is_some()),
            "both publish ID 0: x {x_id:?}, y {y_id:?}"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// `lock` runs on a Cluster (the lock key and its fence share a hash slot) and behind
/// Sentinel, with the fence counted and the key released after the command.
#[test]
fn lock_runs_on_cluster_and_sentinel() {
    let cluster = ClusterTopology::start_primaries_only();
    let sentinel = SentinelTopology::start_small();
    for url in [cluster.url(), sentinel.url()] {
        for expected_fence in ["1", "2"] {
            let run = run_snowlease(
                &[
                    "lock",
                    "--name",
                    "nightly",
                    "--redis-url",
                    &url,
                    "--",
                    "sh",
                    "-c",
                    "echo $SNOWLEASE_FENCE",
                ],
                &[],
                secs(30),
            );
            assert_eq!(run.code, Some(0), "{url}: {run:?}");
            assert_eq!(run.stdout, expected_fence, "{url}: fences increase");
        }
    }
}

/// A stale Sentinel: five Sentinels in the URL after a failover: the first is stale (it still names
/// the old primary, now a replica), the second is down, three agree on the new primary. The
/// stale one is a real Sentinel that monitors the old primary under the same name but cannot
/// hear or send hello messages (its ACL user on the data nodes has no channels), and cannot
/// fail over or reconfigure anything (no quorum it could reach, no `REPLICAOF` in its ACL).
/// Four sidecars publish within seconds (on today's main they retried for 45 s with "the
/// Sentinels do not agree on the primary yet"), and the stale Sentinel is named in a warning.
#[test]
fn a_stale_sentinel_listed_first_is_outvoted() {
    let topo = SentinelTopology::start_with(SentinelOptions {
        replicas: 1,
        sentinels: 3,
        quorum: 2,
        ..SentinelOptions::default()
    });
    let m = topo.master_name().to_owned();
    for node in topo.nodes() {
        let _: String = node.query(
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("stale")
                .arg("on")
                .arg(">stalepw")
                .arg("resetchannels")
                .arg("-@all")
                .arg("+ping")
                .arg("+info")
                .arg("+role")
                .arg("+client|setname"),
        );
    }
    let old = topo.primary_index();
    let stale = RedisServer::start_with(RedisOptions {
        config_file: Some(format!(
            "sentinel monitor {m} 127.0.0.1 {port} 5\n\
             sentinel auth-user {m} stale\n\
             sentinel auth-pass {m} stalepw\n\
             sentinel down-after-milliseconds {m} 1000\n",
            port = topo.nodes()[old].port()
        )),
        args: vec!["--sentinel".into()],
        name: "stale sentinel".into(),
        ..RedisOptions::default()
    });
    let named_by_stale = || -> Option<u16> {
        let named: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&m)
            .query(&mut stale.conn())
            .ok()?;
        named.map(|(_, port)| port)
    };
    let old_port = topo.nodes()[old].port();
    assert!(poll_until(secs(10), || named_by_stale() == Some(old_port)));
    let new = topo.failover();
    assert!(
        topo.nodes()[old].wait_info("replication", "role", "slave", secs(30)),
        "the old primary was never demoted"
    );
    assert_eq!(
        named_by_stale(),
        Some(old_port),
        "the stale Sentinel caught up"
    );

    // An established deployment: the first claim does not wait one TTL for the guard.
    topo.nodes()[new].open_claim_guard("orders");
    let down = free_port();
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{down},{}/{m}",
        stale.port(),
        topo.sentinel_addrs().join(",")
    );
    let started = Instant::now();
    let sidecars: Vec<Sidecar> = (0..4)
        .map(|i| {
            Sidecar::worker_at(&url, "orders")
                .name(format!("worker {i}"))
                .flag("--ttl", "4s")
                .flag("--renew-interval", "1s")
                .spawn()
        })
        .collect();
    let mut published = Vec::new();
    for sidecar in &sidecars {
        sidecar.wait_for_lease(secs(10));
        published.push(started.elapsed());
    }
    eprintln!("published after {published:?}");
    let new_port = topo.nodes()[new].port();
    for sidecar in &sidecars {
        let lease = sidecar.id().expect("published");
        assert_eq!(
            topo.nodes()[new].get(&worker_key("orders", lease.worker_id)),
            Some(lease.owner)
        );
    }
    let stale_addr = format!("127.0.0.1:{} names 127.0.0.1:{old_port}", stale.port());
    let warned = |s: &Sidecar| {
        s.events_with("outvoted")
            .iter()
            .filter(|e| {
                e["fields"]["dissent"]
                    .as_str()
                    .is_some_and(|d| d.contains(&stale_addr))
                    || e.to_string().contains(&stale_addr)
            })
            .count()
    };
    assert!(
        poll_until(secs(5), || sidecars.iter().all(|s| warned(s) >= 1)),
        "no warning names the stale Sentinel ({stale_addr})"
    );
    // Rate-limited: one warning per sidecar for the same dissent, not one per renewal
    // (each has confirmed several renewals with all five Sentinels by now).
    assert!(poll_until(secs(10), || sidecars.iter().all(|s| s
        .metric("snowlease_renewals_total{outcome=\"renewed\"}")
        .unwrap_or(0.0)
        >= 3.0)));
    for sidecar in &sidecars {
        assert_eq!(warned(sidecar), 1, "{:?}", sidecar.log_lines());
    }
    assert_eq!(
        named_by_stale(),
        Some(old_port),
        "the stale Sentinel caught up"
    );
    assert_ne!(new_port, old_port);
}

/// Behind Sentinel: the primary is demoted behind the Sentinels' back (`REPLICAOF`
/// another server), so renewals are answered `READONLY` (inside `Ok`, as redis-rs returns
/// script errors); then the Sentinels are pointed at that server. The sidecar leaves the
/// demoted node (a new connection, which finds it answers `ROLE` as a replica and waits),
/// and renews on the node the Sentinels name, keeping its ID. On today's main it kept
/// renewing on the demoted node (no renewal succeeded, so no confirmation asked the
/// Sentinels) until its lease was lost.
#[test]
fn sentinel_renewals_leave_a_demoted_primary() {
    let topo = SentinelTopology::start_with(SentinelOptions {
        replicas: 0,
        sentinels: 1,
        quorum: 1,
        ..SentinelOptions::default()
    });
    let other = RedisServer::start();
    let sidecar = Sidecar::worker_at(&topo.url(), "orders")
        .flag("--ttl", "6s")
        .flag("--renew-interval", "500ms")
        .spawn();
    let lease = sidecar.wait_for_lease(secs(20));
    let key = worker_key("orders", lease.worker_id);
    let demoted = topo.primary();
    let _: String = demoted.query(redis::cmd("REPLICAOF").arg("127.0.0.1").arg(other.port()));
    assert!(
        poll_until(secs(10), || demoted
            .info_field("errorstats", "errorstat_READONLY")
            .is_some()),
        "no renewal reached the demoted node"
    );
    let sentinel = &topo.sentinels()[0];
    let _: String = sentinel.query(redis::cmd("SENTINEL").arg("REMOVE").arg(topo.master_name()));
    let _: String = sentinel.query(
        redis::cmd("SENTINEL")
            .arg("MONITOR")
            .arg(topo.master_name())
            .arg("127.0.0.1")
            .arg(other.port())
            .arg(1),
    );
    assert!(
        poll_until(secs(10), || other.get(&key) == Some(lease.owner.clone())),
        "the sidecar never renewed on the node the Sentinels name"
    );
    assert_eq!(sidecar.id().map(|id| id.worker_id), Some(lease.worker_id));
}
