//! Mint mode's scripts on real Redis (standalone and Cluster): `mark.lua`, `reserve.lua` and
//! `settle.lua` are owner-checked, the mark only rises and never expires, a reservation is
//! capped at Redis' TIME + the lead, the settled record lowers the next floor without
//! lowering the mark, and on Cluster every key of a worker ID is in its lease key's slot.

use std::time::Duration;

use snowlease::connection::{Redis, RedisTarget};
use snowlease::identity::Owner;
use snowlease::worker_id::keys::MintKeys;
use snowlease::worker_id::mint::script::{read_mark, reserve, settle};

use crate::harness::*;

const LEAD: Duration = Duration::from_secs(10);
/// The rollback lead (--mint-window + --max-clock-skew): here the lead, no skew.
const ROLLBACK: Duration = LEAD;

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

    // A fresh worker ID: no mark to vouch for, so it is raised to TIME + the rollback lead
    // (a missing mark cannot be told apart from one a rollback lost).
    let read = read_mark(&mut c, &keys, &lease, &ours, ROLLBACK)
        .await
        .unwrap();
    let now = read.redis_ms;
    assert!(
        read.ours
            && read.raised
            && read.floor_unix_ms == now + 10_000
            && read.mark_unix_ms == now + 10_000,
        "{read:?}"
    );
    assert!(now.abs_diff(unix_ms()) < 5_000, "Redis TIME in ms: {now}");
    // Vouched for now: a second read raises nothing.
    let read = read_mark(&mut c, &keys, &lease, &ours, ROLLBACK)
        .await
        .unwrap();
    assert!(
        !read.raised && read.mark_unix_ms == now + 10_000,
        "{read:?}"
    );
    let _: () = redis::cmd("DEL")
        .arg(&mark)
        .query_async(&mut c)
        .await
        .unwrap();

    // Reserve 5 s ahead: the mark is the target (vouched: stamped by this node), without
    // expiry.
    let r = reserve(&mut c, &keys, &lease, &ours, now + 5_000, LEAD, ROLLBACK)
        .await
        .unwrap();
    assert!(r.ours && r.mark_unix_ms >= now + 10_000, "{r:?}");
    let _: i64 = stamp_cmd(&mark, now + 5_000)
        .query_async(&mut c)
        .await
        .unwrap();
    let r = reserve(&mut c, &keys, &lease, &ours, now + 5_000, LEAD, ROLLBACK)
        .await
        .unwrap();
    assert!(r.ours && r.mark_unix_ms == now + 5_000, "{r:?}");
    let stored = deployment.get(&mark).unwrap();
    assert!(stored.starts_with(&format!("{}.", now + 5_000)), "{stored}");
    assert_eq!(deployment.pttl(&mark), -1, "the mark never expires");
    // Lower: unchanged. Far ahead: capped at TIME + lead.
    let r = reserve(&mut c, &keys, &lease, &ours, now, LEAD, ROLLBACK)
        .await
        .unwrap();
    assert_eq!(r.mark_unix_ms, now + 5_000, "only rises");
    let r = reserve(
        &mut c,
        &keys,
        &lease,
        &ours,
        now + 3_600_000,
        LEAD,
        ROLLBACK,
    )
    .await
    .unwrap();
    assert!(r.mark_unix_ms <= r.redis_ms + 10_000, "{r:?}");
    assert!(r.mark_unix_ms >= now + 10_000, "{r:?}");
    let high = r.mark_unix_ms;

    // Another owner's calls write nothing and read nothing.
    let r = reserve(&mut c, &keys, &lease, &other, high + 1, LEAD, ROLLBACK)
        .await
        .unwrap();
    assert!(!r.ours && r.mark_unix_ms == high, "{r:?}");
    let read = read_mark(&mut c, &keys, &lease, &other, ROLLBACK)
        .await
        .unwrap();
    assert!(!read.ours && read.floor_unix_ms == 0, "{read:?}");
    let s = settle(&mut c, &keys, &lease, &other, 1, ROLLBACK)
        .await
        .unwrap();
    assert!(!s.ours && !deployment.exists(&settled), "{s:?}");

    // Settle below the mark: the next floor is the record, the mark stays.
    let s = settle(&mut c, &keys, &lease, &ours, now + 100, ROLLBACK)
        .await
        .unwrap();
    assert!(
        s.ours && s.settled_unix_ms == now + 100 && s.mark_unix_ms == high,
        "{s:?}"
    );
    let read = read_mark(&mut c, &keys, &lease, &ours, ROLLBACK)
        .await
        .unwrap();
    assert_eq!((read.floor_unix_ms, read.mark_unix_ms), (now + 100, high));
    let s = settle(&mut c, &keys, &lease, &ours, now, ROLLBACK)
        .await
        .unwrap();
    assert_eq!(s.settled_unix_ms, now + 100, "a record never falls");
    assert_eq!(deployment.pttl(&settled), -1);

    // The next reservation deletes the record: the floor is the mark again.
    reserve(&mut c, &keys, &lease, &ours, 0, LEAD, ROLLBACK)
        .await
        .unwrap();
    assert!(!deployment.exists(&settled));
    let read = read_mark(&mut c, &keys, &lease, &ours, ROLLBACK)
        .await
        .unwrap();
    assert_eq!(read.floor_unix_ms, high);
    // A settle above the mark raises it.
    let s = settle(&mut c, &keys, &lease, &ours, high + 7, ROLLBACK)
        .await
        .unwrap();
    assert_eq!((s.settled_unix_ms, s.mark_unix_ms), (high + 7, high + 7));

    // The lease key gone (expired, or another type): nobody's.
    let _: () = redis::cmd("DEL")
        .arg(&lease)
        .query_async(&mut c)
        .await
        .unwrap();
    let r = reserve(&mut c, &keys, &lease, &ours, high + 100, LEAD, ROLLBACK)
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
    assert!(
        !read_mark(&mut c, &keys, &lease, &ours, ROLLBACK)
            .await
            .unwrap()
            .ours
    );
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

/// A mark rolled back by a crash-restart from an older snapshot is not taken for the floor:
/// the next holder's floor is above every timestamp reserved before the restart, and the
/// settled record from before (which may predate later minting) is dropped. Before the fix
/// the floor was the snapshot's mark, below what the old holder had reserved and minted.
#[tokio::test(flavor = "current_thread")]
async fn a_mark_rolled_back_by_a_restart_is_raised_above_every_reservation() {
    let mut redis = RedisServer::start();
    let keys = MintKeys::new(PREFIX, "rolled");
    let lease = worker_key("rolled", 1);
    let (old, new) = (Owner::generate("old"), Owner::generate("new"));
    let mut c = conn(&redis.url());
    set(&mut c, &lease, old.as_str()).await;
    let read = read_mark(&mut c, &keys, &lease, &old, ROLLBACK)
        .await
        .unwrap();
    let now = read.redis_ms;
    // A handover's record, then the snapshot.
    settle(&mut c, &keys, &lease, &old, now + 1, ROLLBACK)
        .await
        .unwrap();
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    // After the snapshot the old holder reserves further (and may mint up to it).
    let r = reserve(&mut c, &keys, &lease, &old, now + 60_000, LEAD, ROLLBACK)
        .await
        .unwrap();
    let reserved = r.mark_unix_ms;
    assert!(reserved > read.mark_unix_ms, "{r:?}");

    redis.restart();
    let mut c = conn(&redis.url());
    assert!(
        redis.exists(&keys.settled(&lease)),
        "the snapshot's record is back"
    );
    set(&mut c, &lease, new.as_str()).await;
    let read = read_mark(&mut c, &keys, &lease, &new, ROLLBACK)
        .await
        .unwrap();
    assert!(read.ours && read.raised, "{read:?}");
    assert!(
        read.floor_unix_ms > reserved,
        "floor {} must be above the reservation {reserved} the restart lost",
        read.floor_unix_ms
    );
    assert_eq!(read.floor_unix_ms, read.redis_ms + 10_000, "{read:?}");
    assert!(
        !redis.exists(&keys.settled(&lease)),
        "the old record is dropped"
    );

    // A holder that kept its lease through the restart: its next reservation raises the
    // mark the same way before it mints past its old ceiling, and a settle after a
    // rollback writes no record (the next floor is the raised mark).
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    redis.restart();
    let mut c = conn(&redis.url());
    let r = reserve(&mut c, &keys, &lease, &new, 0, LEAD, ROLLBACK)
        .await
        .unwrap();
    assert!(r.ours && r.mark_unix_ms >= r.redis_ms + 10_000, "{r:?}");
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    redis.restart();
    let mut c = conn(&redis.url());
    let s = settle(&mut c, &keys, &lease, &new, 5, ROLLBACK)
        .await
        .unwrap();
    assert!(s.ours && s.settled_unix_ms == 0, "{s:?}");
    assert!(!redis.exists(&keys.settled(&lease)));
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
    let eval = |script: &str, args: Vec<String>| {
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
    let prelude = concat!(
        include_str!("../../src/lease/node.lua"),
        include_str!("../../src/worker_id/mint/vouch.lua")
    );
    let reserve_lua = &format!(
        "{prelude}{}",
        include_str!("../../src/worker_id/mint/reserve.lua")
    );
    let settle_lua = &format!(
        "{prelude}{}",
        include_str!("../../src/worker_id/mint/settle.lua")
    );
    for (script, args, says) in [
        (reserve_lua, vec!["-1".into(), "0".into()], "target must be"),
        (
            reserve_lua,
            vec!["1.5".into(), "0".into()],
            "target must be",
        ),
        (reserve_lua, vec!["5".into(), "x".into()], "lead must be"),
        (
            reserve_lua,
            vec!["5".into(), "0".into(), "-1".into()],
            "rollback lead must be",
        ),
        (settle_lua, vec!["soon".into()], "last must be"),
        (settle_lua, vec!["5".into()], "rollback lead must be"),
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
        read_mark(&mut c, &keys, lease, owner, ROLLBACK)
            .await
            .unwrap_err(),
        reserve(&mut c, &keys, lease, owner, 5, LEAD, ROLLBACK)
            .await
            .unwrap_err(),
        settle(&mut c, &keys, lease, owner, 5, ROLLBACK)
            .await
            .unwrap_err(),
    ];
    for err in errors {
        assert!(err.to_string().contains("is not Unix ms"), "{err}");
    }
    assert_eq!(redis.get(&keys.mark(lease)).as_deref(), Some("soon"));
    assert_eq!(redis.dbsize(), 2, "nothing else written");
}
