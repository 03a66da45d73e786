//! `claim.lua`'s contract on a real standalone redis-server: (lease key, guard) pairs, one
//! MGET, guards shared by pairs read and set once, closed guards skipped, wrong types
//! reported, adoption first.

use std::time::Duration;

use snowlease::connection::{Redis, RedisTarget};
use snowlease::identity::Owner;
use snowlease::worker_id::claim::{ClaimOutcome, GuardFound, claim_pairs};

use crate::harness::*;

fn conn(redis: &RedisServer) -> Redis {
    RedisTarget::parse(&redis.url())
        .unwrap()
        .connect(secs(2))
        .unwrap()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, g)| (k.to_string(), g.to_string()))
        .collect()
}

fn redis_now_ms(redis: &RedisServer) -> u64 {
    let (s, us): (u64, u64) = redis.query(&mut redis::cmd("TIME"));
    s * 1000 + us / 1000
}

const TTL: Duration = Duration::from_secs(10);

/// The integer part of a guard: "<ms>.<node stamp>" as the scripts write it.
fn stamped_int(redis: &RedisServer, key: &str) -> u64 {
    let value = redis.get(key).unwrap();
    let (int, stamp) = value
        .split_once('.')
        .unwrap_or_else(|| panic!("{key} = {value}: no stamp"));
    assert_eq!(stamp, redis.node_stamp(), "{key} stamped by this node");
    int.parse().unwrap()
}

/// One guard shared by every pair (one server): missing -> set once to now + TTL, paused;
/// open -> the lowest free key is taken, skipping a key of another type (reported).
#[tokio::test(flavor = "current_thread")]
async fn shared_guard_is_set_once_and_gates_every_pair() {
    let redis = RedisServer::start();
    let mut c = conn(&redis);
    let owner = Owner::generate("test");
    let p = pairs(&[("k:0", "k:guard"), ("k:1", "k:guard"), ("k:2", "k:guard")]);
    let _: () = redis.query(redis::cmd("SET").arg("k:0").arg("other#1"));
    let _: () = redis.query(redis::cmd("HSET").arg("k:1").arg("f").arg("v"));

    let before = redis_now_ms(&redis);
    let reply = claim_pairs(&mut c, &p, &owner, TTL).await.unwrap();
    let ClaimOutcome::Paused { wait, guard } = reply.outcome else {
        panic!("{reply:?}")
    };
    assert_eq!(guard, GuardFound::Missing);
    assert!(wait <= TTL && wait > TTL - secs(1), "{wait:?}");
    let open_at = stamped_int(&redis, "k:guard");
    assert!(open_at >= before + 10_000 && open_at <= redis_now_ms(&redis) + 10_000);
    assert!(
        !redis.exists("k:2"),
        "nothing claimed behind a closed guard"
    );

    // A second call finds it closed as set.
    let reply = claim_pairs(&mut c, &p, &owner, TTL).await.unwrap();
    assert!(matches!(
        reply.outcome,
        ClaimOutcome::Paused {
            guard: GuardFound::Closed,
            ..
        }
    ));

    redis.set_stamped("k:guard", 0);
    let reply = claim_pairs(&mut c, &p, &owner, TTL).await.unwrap();
    assert_eq!(reply.outcome, ClaimOutcome::Claimed(2));
    assert_eq!(reply.wrong_type, vec![1], "the hash at k:1 is reported");
    assert_eq!(redis.get("k:2").as_deref(), Some(owner.as_str()));
    assert!(redis.pttl("k:2") > 9_000);
    let field: String = redis.query(redis::cmd("HGET").arg("k:1").arg("f"));
    assert_eq!(field, "v", "a key of another type is never touched");

    // All taken now: -1 (AllHeld), not paused, guard untouched.
    let other = Owner::generate("other");
    let reply = claim_pairs(&mut c, &p, &other, TTL).await.unwrap();
    assert_eq!(reply.outcome, ClaimOutcome::AllHeld);
    assert_eq!(stamped_int(&redis, "k:guard"), 0);
}

/// Our own key is adopted (TTL reset) before any guard is looked at, even a closed one.
#[tokio::test(flavor = "current_thread")]
async fn own_key_is_adopted_whatever_the_guard() {
    let redis = RedisServer::start();
    let mut c = conn(&redis);
    let owner = Owner::generate("test");
    let far = redis_now_ms(&redis) + 5_000;
    redis.set_stamped("k:guard", far);
    let _: () = redis.query(
        redis::cmd("SET")
            .arg("k:1")
            .arg(owner.as_str())
            .arg("PX")
            .arg(500),
    );
    let p = pairs(&[("k:0", "k:guard"), ("k:1", "k:guard")]);
    let reply = claim_pairs(&mut c, &p, &owner, TTL).await.unwrap();
    assert_eq!(reply.outcome, ClaimOutcome::Adopted(1));
    assert!(redis.pttl("k:1") > 9_000);
    assert!(reply.expires_ms >= redis_now_ms(&redis) + 9_000);
}

/// Pairs with guards of their own (Cluster layout, here several per call): a closed guard
/// skips only its ID; the next ID behind an open guard is taken. With every free ID's guard
/// closed the reply is paused with the soonest opening; a guard more than one TTL ahead is
/// pulled in to one TTL and named so.
#[tokio::test(flavor = "current_thread")]
async fn per_id_guards_gate_only_their_own_id() {
    let redis = RedisServer::start();
    let mut c = conn(&redis);
    let owner = Owner::generate("test");
    let now = redis_now_ms(&redis);
    redis.set_stamped("g:0", now + 3_000);
    redis.set_stamped("g:1", 0);
    let p = pairs(&[("k:0", "g:0"), ("k:1", "g:1")]);
    let reply = claim_pairs(&mut c, &p, &owner, TTL).await.unwrap();
    assert_eq!(
        reply.outcome,
        ClaimOutcome::Claimed(1),
        "ID 0 waits, ID 1 is free"
    );
    assert!(!redis.exists("k:0"));

    let p = pairs(&[("k:0", "g:0"), ("k:2", "g:2"), ("k:3", "g:3")]);
    redis.set_stamped("g:3", now + 60_000);
    let other = Owner::generate("other");
    let reply = claim_pairs(&mut c, &p, &other, TTL).await.unwrap();
    let ClaimOutcome::Paused { wait, guard } = reply.outcome else {
        panic!("{reply:?}")
    };
    assert_eq!(
        guard,
        GuardFound::Missing,
        "g:2 was missing: the most telling"
    );
    assert!(wait <= ms(3_000), "soonest opening is g:0's: {wait:?}");
    assert!(redis.exists("g:2"));
    let g3 = stamped_int(&redis, "g:3");
    assert!(
        g3 <= redis_now_ms(&redis) + 10_000,
        "g:3 pulled in to one TTL"
    );
    assert!(!redis.exists("k:0") && !redis.exists("k:2") && !redis.exists("k:3"));

    // Alone, a guard too far ahead is named as such (the sidecar logs why it waits).
    redis.set_stamped("g:5", now + 60_000);
    let reply = claim_pairs(&mut c, &pairs(&[("k:5", "g:5")]), &other, TTL)
        .await
        .unwrap();
    assert!(
        matches!(
            reply.outcome,
            ClaimOutcome::Paused {
                guard: GuardFound::TooFar,
                ..
            }
        ),
        "{reply:?}"
    );
}

/// A guard written on another node, or before Redis restarted (from its RDB, as a crash
/// restarts it), or a plain number (a version without stamps), is closed for one TTL as a
/// missing one is, and named so; a guard this node wrote stays open. A restart from an older
/// snapshot keeps the guard but may lose the newest lease keys (docs/rollback-design.md).
#[tokio::test(flavor = "current_thread")]
async fn guard_of_another_node_is_closed_for_one_ttl() {
    let mut redis = RedisServer::start();
    let owner = Owner::generate("test");
    let p = pairs(&[("k:0", "k:guard"), ("k:1", "k:guard")]);
    redis.set_stamped("k:guard", 0);
    let _: () = redis.query(&mut redis::cmd("SAVE"));
    // After the snapshot: a claim of ID 0, which the restart loses.
    let mut c = conn(&redis);
    let reply = claim_pairs(&mut c, &p, &owner, TTL).await.unwrap();
    assert_eq!(reply.outcome, ClaimOutcome::Claimed(0));
    let stamp = redis.node_stamp();
    redis.restart();
    assert!(
        !redis.exists("k:0"),
        "the restart loaded the older snapshot"
    );
    assert_ne!(
        redis.node_stamp(),
        stamp,
        "a restart changes the node stamp"
    );

    let other = Owner::generate("other");
    let mut c = conn(&redis);
    let before = redis_now_ms(&redis);
    let reply = claim_pairs(&mut c, &p, &other, TTL).await.unwrap();
    let ClaimOutcome::Paused { wait, guard } = reply.outcome else {
        panic!("a newcomer must not take ID 0 after the rollback: {reply:?}")
    };
    assert_eq!(guard, GuardFound::OtherNode);
    assert!(wait > TTL - secs(1) && wait <= TTL, "{wait:?}");
    assert!(stamped_int(&redis, "k:guard") >= before + 10_000);
    assert!(!redis.exists("k:0") && !redis.exists("k:1"));

    // A plain number (written by hand, or by a version without stamps) is no proof either.
    let _: () = redis.query(redis::cmd("SET").arg("k:guard").arg(0));
    let reply = claim_pairs(&mut c, &p, &other, TTL).await.unwrap();
    assert!(
        matches!(
            reply.outcome,
            ClaimOutcome::Paused {
                guard: GuardFound::OtherNode,
                ..
            }
        ),
        "{reply:?}"
    );
    // Written here in this life: open.
    redis.set_stamped("k:guard", 0);
    let reply = claim_pairs(&mut c, &p, &other, TTL).await.unwrap();
    assert_eq!(reply.outcome, ClaimOutcome::Claimed(0));
}

/// Bad input is refused by name: no pairs, a guard of another type (nothing written).
#[tokio::test(flavor = "current_thread")]
async fn bad_input_is_refused() {
    let redis = RedisServer::start();
    let mut c = conn(&redis);
    let owner = Owner::generate("test");
    let err = claim_pairs(&mut c, &[], &owner, TTL).await.unwrap_err();
    assert!(err.to_string().contains("pairs"), "{err}");
    let _: () = redis.query(redis::cmd("SADD").arg("g").arg("x"));
    let err = claim_pairs(&mut c, &pairs(&[("k:0", "g")]), &owner, TTL)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("g is not a string"), "{err}");
    assert!(!redis.exists("k:0"));
}

/// Puts `guard` in the state a claim call finds as `found`: missing, closed as set (this
/// node's stamp, half a TTL ahead), too far (this node's stamp, ten TTLs ahead), or written
/// on another node (a stamp no node has).
fn guard_in(redis: &RedisServer, guard: &str, found: GuardFound) {
    let now = redis_now_ms(redis);
    let ttl = TTL.as_millis() as u64;
    let _: () = redis.query(redis::cmd("DEL").arg(guard));
    match found {
        GuardFound::Missing => {}
        GuardFound::Closed => redis.set_stamped(guard, now + ttl / 2),
        GuardFound::TooFar => redis.set_stamped(guard, now + 10 * ttl),
        GuardFound::OtherNode => {
            let other = format!("{}.000000000000001", now + ttl / 2);
            assert_ne!(redis.node_stamp(), "000000000000001");
            let _: () = redis.query(redis::cmd("SET").arg(guard).arg(other));
        }
    }
}

/// The claim guard's ranking is written twice: `claim.lua` names the most telling guard of
/// one call, `GuardFound::more_telling` ranks the findings of a Cluster claim's calls. For
/// every ordered pair of findings, one call over two free IDs with their own guards in
/// those states reports what the Rust ranking picks.
#[tokio::test(flavor = "current_thread")]
async fn the_scripts_guard_ranking_is_the_rusts() {
    let redis = RedisServer::start();
    let mut c = conn(&redis);
    let owner = Owner::generate("test");
    let all = [
        GuardFound::Missing,
        GuardFound::OtherNode,
        GuardFound::TooFar,
        GuardFound::Closed,
    ];
    let p = pairs(&[("r:0", "r:guard:0"), ("r:1", "r:guard:1")]);
    for a in all {
        for b in all {
            guard_in(&redis, "r:guard:0", a);
            guard_in(&redis, "r:guard:1", b);
            let reply = claim_pairs(&mut c, &p, &owner, TTL).await.unwrap();
            let ClaimOutcome::Paused { guard, .. } = reply.outcome else {
                panic!("{a:?}, {b:?}: {reply:?}")
            };
            assert_eq!(guard, a.more_telling(b), "guards found {a:?}, {b:?}");
            assert!(!redis.exists("r:0") && !redis.exists("r:1"));
        }
    }
}
