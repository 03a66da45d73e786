//! Mint mode's scripts on real Redis (standalone and Cluster): `mark.lua`, `reserve.lua` and
//! `settle.lua` are owner-checked, the mark only rises and never expires, a reservation is
//! capped at Redis' TIME + the lead, the settled record lowers the next floor without
//! lowering the mark, and on Cluster every key of a worker ID is in its lease key's slot.

use std::time::Duration;

use snowlease::connection::{Redis, RedisTarget};
use snowlease::identity::Owner;
use snowlease::worker_id::mint::script::{MintKeys, read_mark, reserve, settle};

use crate::harness::*;

const LEAD: Duration = Duration::from_secs(10);

fn conn(url: &str) -> Redis {
    RedisTarget::parse(url).unwrap().connect(secs(5)).unwrap()
}

async fn set(conn: &mut Redis, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

/// The whole contract on one worker ID of `app`, on any deployment.
async fn contract(deployment: &impl Keyspace, url: &str, app: &str) {
    let mut c = conn(url);
    let keys = MintKeys::new(PREFIX, app);
    let lease = worker_key(app, 3);
    let (mark, settled) = (keys.mark(&lease), keys.settled(&lease));
    let (ours, other) = (Owner::generate("minter"), Owner::generate("other"));
    set(&mut c, &lease, ours.as_str()).await;

    // A fresh worker ID: floor and mark 0.
    let read = read_mark(&mut c, &keys, &lease, &ours).await.unwrap();
    assert!(
        read.ours && read.floor_unix_ms == 0 && read.mark_unix_ms == 0,
        "{read:?}"
    );
    let now = read.redis_ms;
    assert!(now.abs_diff(unix_ms()) < 5_000, "Redis TIME in ms: {now}");

    // Reserve 5 s ahead: the mark is the target, without expiry.
    let r = reserve(&mut c, &keys, &lease, &ours, now + 5_000, LEAD)
        .await
        .unwrap();
    assert!(r.ours && r.mark_unix_ms == now + 5_000, "{r:?}");
    assert_eq!(deployment.get(&mark), Some((now + 5_000).to_string()));
    assert_eq!(deployment.pttl(&mark), -1, "the mark never expires");
    // Lower: unchanged. Far ahead: capped at TIME + lead.
    let r = reserve(&mut c, &keys, &lease, &ours, now, LEAD)
        .await
        .unwrap();
    assert_eq!(r.mark_unix_ms, now + 5_000, "only rises");
    let r = reserve(&mut c, &keys, &lease, &ours, now + 3_600_000, LEAD)
        .await
        .unwrap();
    assert!(r.mark_unix_ms <= r.redis_ms + 10_000, "{r:?}");
    assert!(r.mark_unix_ms >= now + 10_000, "{r:?}");
    let high = r.mark_unix_ms;

    // Another owner's calls write nothing and read nothing.
    let r = reserve(&mut c, &keys, &lease, &other, high + 1, LEAD)
        .await
        .unwrap();
    assert!(!r.ours && r.mark_unix_ms == high, "{r:?}");
    let read = read_mark(&mut c, &keys, &lease, &other).await.unwrap();
    assert!(!read.ours && read.floor_unix_ms == 0, "{read:?}");
    let s = settle(&mut c, &keys, &lease, &other, 1).await.unwrap();
    assert!(!s.ours && !deployment.exists(&settled), "{s:?}");

    // Settle below the mark: the next floor is the record, the mark stays.
    let s = settle(&mut c, &keys, &lease, &ours, now + 100)
        .await
        .unwrap();
    assert!(
        s.ours && s.settled_unix_ms == now + 100 && s.mark_unix_ms == high,
        "{s:?}"
    );
    let read = read_mark(&mut c, &keys, &lease, &ours).await.unwrap();
    assert_eq!((read.floor_unix_ms, read.mark_unix_ms), (now + 100, high));
    let s = settle(&mut c, &keys, &lease, &ours, now).await.unwrap();
    assert_eq!(s.settled_unix_ms, now + 100, "a record never falls");
    assert_eq!(deployment.pttl(&settled), -1);

    // The next reservation deletes the record: the floor is the mark again.
    reserve(&mut c, &keys, &lease, &ours, 0, LEAD)
        .await
        .unwrap();
    assert!(!deployment.exists(&settled));
    let read = read_mark(&mut c, &keys, &lease, &ours).await.unwrap();
    assert_eq!(read.floor_unix_ms, high);
    // A settle above the mark raises it.
    let s = settle(&mut c, &keys, &lease, &ours, high + 7)
        .await
        .unwrap();
    assert_eq!((s.settled_unix_ms, s.mark_unix_ms), (high + 7, high + 7));

    // The lease key gone (expired, or another type): nobody's.
    let _: () = redis::cmd("DEL")
        .arg(&lease)
        .query_async(&mut c)
        .await
        .unwrap();
    let r = reserve(&mut c, &keys, &lease, &ours, high + 100, LEAD)
        .await
        .unwrap();
    assert!(!r.ours && r.mark_unix_ms == high + 7, "{r:?}");
    let _: () = redis::cmd("HSET")
        .arg(&lease)
        .arg("f")
        .arg(ours.as_str())
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(!read_mark(&mut c, &keys, &lease, &ours).await.unwrap().ours);
}

/// The scripts' contract on one server.
#[tokio::test(flavor = "current_thread")]
async fn mark_reserve_and_settle_on_one_server() {
    let redis = RedisServer::start();
    contract(&redis, &redis.url(), "mint").await;
}

/// The same on a Cluster: every key of a worker ID lives on its lease key's node, so each
/// script is one call there (no CROSSSLOT).
#[tokio::test(flavor = "current_thread")]
async fn mark_reserve_and_settle_on_cluster_in_the_lease_keys_slot() {
    let cluster = Deployment::start(Topo::Cluster);
    let app = "mint-cluster";
    contract(&cluster, &cluster.url(), app).await;
    let keys = MintKeys::new(PREFIX, app);
    let lease = worker_key(app, 3);
    let node = cluster.node_for(&lease).port();
    assert_eq!(cluster.node_for(&keys.mark(&lease)).port(), node);
    assert_eq!(cluster.node_for(&keys.settled(&lease)).port(), node);
}

/// Bad arguments, and a mark that is not Unix ms, are refused by the scripts, naming what is
/// wrong; nothing is written.
#[tokio::test(flavor = "current_thread")]
async fn scripts_refuse_bad_arguments() {
    let redis = RedisServer::start();
    let mut c = conn(&redis.url());
    let keys = MintKeys::new(PREFIX, "bad");
    let owner = Owner::generate("minter");
    let lease = worker_key("bad", 0);
    set(&mut c, &lease, owner.as_str()).await;
    let eval = |script: &'static str, args: Vec<String>| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script)
            .arg(3)
            .arg(&lease)
            .arg(keys.mark(&lease))
            .arg(keys.settled(&lease))
            .arg(owner.as_str());
        for a in args {
            cmd.arg(a);
        }
        cmd
    };
    let reserve_lua = include_str!("../../src/worker_id/mint/reserve.lua");
    let settle_lua = include_str!("../../src/worker_id/mint/settle.lua");
    for (script, args, says) in [
        (reserve_lua, vec!["-1".into(), "0".into()], "target must be"),
        (
            reserve_lua,
            vec!["1.5".into(), "0".into()],
            "target must be",
        ),
        (reserve_lua, vec!["5".into(), "x".into()], "lead must be"),
        (settle_lua, vec!["soon".into()], "last must be"),
    ] {
        let err = eval(script, args)
            .query_async::<redis::Value>(&mut c)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
    assert_eq!(redis.dbsize(), 1, "only the lease key");

    // A mark that is not Unix ms (written by hand) is never taken for 0.
    set(&mut c, &keys.mark(&lease), "soon").await;
    let (lease, owner) = (lease.as_str(), &owner);
    let errors = [
        read_mark(&mut c, &keys, lease, owner).await.unwrap_err(),
        reserve(&mut c, &keys, lease, owner, 5, LEAD)
            .await
            .unwrap_err(),
        settle(&mut c, &keys, lease, owner, 5).await.unwrap_err(),
    ];
    for err in errors {
        assert!(err.to_string().contains("is not Unix ms"), "{err}");
    }
    assert_eq!(redis.get(&keys.mark(lease)).as_deref(), Some("soon"));
    assert_eq!(redis.dbsize(), 2, "nothing else written");
}
