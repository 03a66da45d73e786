//! Claims over a full range of 1024 IDs (`--max-worker-id 1023`) in 64 interleaved windows
//! of 16 IDs (window w: w, w + 64, ...): the lowest free ID of the window found, one call
//! past a taken lower half, the exhaustion message, 64 concurrent claims on one server and
//! on Cluster.

use std::collections::BTreeSet;

use futures_util::future::join_all;
use snowlease::connection::{Keyspace, Redis, RedisTarget};
use snowlease::identity::Owner;
use snowlease::worker_id::claim::{ClaimOutcome, Claimer, windows};
use snowlease::worker_id::keys::LeaseKeys;

use crate::harness::*;

pub(crate) const MAX: u16 = 1023;
/// Windows of 1024 IDs, and so the step between the IDs of one window (the claimer's
/// layout: `the_layout_is_the_claimers`).
pub(crate) const WINDOWS: usize = 64;

#[test]
fn the_layout_is_the_claimers() {
    assert_eq!(windows(MAX).len(), WINDOWS);
}

/// The library's connection handle on `url`.
pub(crate) fn conn(url: &str) -> Redis {
    RedisTarget::parse(url).unwrap().connect(secs(5)).unwrap()
}

/// `MSET` of every lease key of `ids` to another owner's string, in one call.
pub(crate) fn hold(redis: &RedisServer, app: &str, ids: impl Iterator<Item = u32>) {
    let mut mset = redis::cmd("MSET");
    for id in ids {
        mset.arg(worker_key(app, id)).arg("10.9.9.9#beef");
    }
    let _: () = redis.query(&mut mset);
}

async fn claim(
    conn: &mut Redis,
    keys: &LeaseKeys,
) -> (Owner, snowlease::worker_id::claim::ClaimReply) {
    let owner = Owner::generate("test");
    let reply = Claimer::new(keys, MAX)
        .claim(conn, &owner, secs(30))
        .await
        .unwrap();
    (owner, reply)
}

/// One server, 1024 IDs, only 650 and 714 free (one window: 10, 74, ..., 970): wherever a
/// claim starts, it walks the windows to that one and takes its lowest free ID, 650, then
/// the next claim 714 (the hint names that window); a third finds all held after one call
/// per window (64), none over 16 IDs.
#[tokio::test(flavor = "current_thread")]
async fn a_full_range_is_walked_window_by_window() {
    let redis = RedisServer::start();
    let mut c = conn(&redis.url());
    let keys = LeaseKeys::new(PREFIX, "wide");
    redis.set_stamped(&format!("{PREFIX}wide:guard"), 0);
    hold(
        &redis,
        "wide",
        (0..=1023).filter(|id| ![650, 714].contains(id)),
    );

    let (owner, first) = claim(&mut c, &keys).await;
    assert_eq!(first.outcome, ClaimOutcome::Claimed(650), "{first:?}");
    assert_eq!(
        redis.get(&worker_key("wide", 650)).as_deref(),
        Some(owner.as_str())
    );
    assert_eq!(
        redis.get(&format!("{PREFIX}wide:hint")).as_deref(),
        Some("650")
    );
    let (_, second) = claim(&mut c, &keys).await;
    assert_eq!(second.outcome, ClaimOutcome::Claimed(714), "{second:?}");
    assert!(second.calls <= 2, "the hint names window 10: {second:?}");

    // Every command into the slow log, to read each call's key count.
    let _: () = redis.query(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0),
    );
    // Commands the scripts run are logged too: room for all of them.
    let _: () = redis.query(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-max-len")
            .arg(10_000),
    );
    let _: () = redis.query(redis::cmd("SLOWLOG").arg("RESET"));
    let (_, third) = claim(&mut c, &keys).await;
    assert_eq!(
        (third.outcome, third.calls),
        (ClaimOutcome::AllHeld, WINDOWS as u32)
    );
    let logged: Vec<(i64, i64, i64, Vec<String>)> = redis
        .query::<Vec<redis::Value>>(redis::cmd("SLOWLOG").arg("GET").arg(1000))
        .into_iter()
        .map(|entry| {
            let (id, at, us, args, _, _): (i64, i64, i64, Vec<String>, String, String) =
                redis::from_redis_value(entry).unwrap();
            (id, at, us, args)
        })
        .collect();
    let key_counts: Vec<usize> = logged
        .iter()
        .filter(|(.., args)| args[0].eq_ignore_ascii_case("evalsha"))
        .map(|(.., args)| args[2].parse().unwrap())
        .collect();
    assert_eq!(
        key_counts,
        vec![33; WINDOWS],
        "16 pairs and the hint per call"
    );
}

/// The lower half of 1024 IDs is held (a rollout's old pods, or sidecars that claimed the
/// lowest free ID): every window holds 8 free IDs of the upper half, so each newcomer takes
/// one in one call, the lowest free of its window (IDs of one window differ by 64); the IDs
/// are distinct.
#[tokio::test(flavor = "current_thread")]
async fn the_hint_leads_past_a_taken_lower_half() {
    let redis = RedisServer::start();
    let mut c = conn(&redis.url());
    let keys = LeaseKeys::new(PREFIX, "roll");
    redis.set_stamped(&format!("{PREFIX}roll:guard"), 0);
    hold(&redis, "roll", 0..512);
    let mut taken = BTreeSet::new();
    for n in 0..24 {
        let (_, reply) = claim(&mut c, &keys).await;
        let ClaimOutcome::Claimed(id) = reply.outcome else {
            panic!("{reply:?}")
        };
        assert!(id >= 512, "{reply:?}");
        assert!(
            (512 + id % WINDOWS..id)
                .step_by(WINDOWS)
                .all(|lower| taken.contains(&lower)),
            "{id}: the lowest free of its window ({taken:?})"
        );
        assert!(taken.insert(id), "{id} twice");
        assert_eq!(reply.calls, 1, "claim {n}: {reply:?}");
    }
}

/// On an empty range of 1024 IDs, 16 claims in turn each take the lowest free ID of the
/// window they start in: the window's own number (0-63) in a window not used yet, then 64
/// above the last ID taken there.
#[tokio::test(flavor = "current_thread")]
async fn claims_on_an_empty_range_take_the_low_end_of_their_windows() {
    let redis = RedisServer::start();
    let mut c = conn(&redis.url());
    let keys = LeaseKeys::new(PREFIX, "fleet");
    redis.set_stamped(&format!("{PREFIX}fleet:guard"), 0);
    let mut used = [0usize; WINDOWS];
    for n in 0..16 {
        let (_, reply) = claim(&mut c, &keys).await;
        let ClaimOutcome::Claimed(id) = reply.outcome else {
            panic!("{reply:?}")
        };
        let window = id % WINDOWS;
        assert_eq!(id, window + WINDOWS * used[window], "claim {n}: {used:?}");
        assert_eq!(reply.calls, 1, "claim {n}: {reply:?}");
        used[window] += 1;
    }
}

/// A sidecar over 1024 IDs, all held: it stays unready and exits 3 at `--claim-timeout`,
/// saying how many IDs exist and who holds them.
#[test]
fn every_one_of_1024_ids_held_is_said_at_the_claim_timeout() {
    let redis = RedisServer::start();
    redis.set_stamped(&format!("{PREFIX}full:guard"), 0);
    hold(&redis, "full", 0..1024);
    let mut sidecar = Sidecar::worker(&redis, "full")
        .flag("--max-worker-id", "1023")
        .flag("--claim-timeout", "2s")
        .spawn();
    assert!(sidecar.wait_for_log("all worker IDs are held", secs(10)));
    assert_eq!(sidecar.readyz(), 503);
    let status = sidecar
        .wait_exit(secs(10))
        .expect("exits at the claim timeout");
    assert_eq!(status.code(), Some(3), "{:?}", sidecar.log_lines());
    let said = sidecar.log_lines().join("\n");
    assert!(
        said.contains("all 1024 worker IDs are held (10.9.9.9: 1024)"),
        "{said}"
    );
}

/// 64 claims at once through the library (64 sidecar processes are too heavy for the test
/// machine's 2 cores), each on its own connection with its own owner string, over 1024 IDs:
/// 64 distinct IDs, each key holding its claimant's owner string.
async fn burst(url: &str, app: &str) -> Vec<(Owner, usize)> {
    let keys = LeaseKeys::new(PREFIX, app);
    let claims = (0..64).map(|_| {
        let keys = keys.clone();
        let mut c = conn(url);
        async move {
            let (owner, reply) = claim(&mut c, &keys).await;
            match reply.outcome {
                ClaimOutcome::Claimed(id) => (owner, id),
                other => panic!("{other:?}"),
            }
        }
    });
    let got = join_all(claims).await;
    let ids: BTreeSet<usize> = got.iter().map(|(_, id)| *id).collect();
    assert_eq!(ids.len(), 64, "distinct IDs: {ids:?}");
    got
}

#[tokio::test(flavor = "current_thread")]
async fn sixty_four_claims_at_once_get_distinct_ids_on_one_server() {
    let redis = RedisServer::start();
    redis.set_stamped(&format!("{PREFIX}burst:guard"), 0);
    for (owner, id) in burst(&redis.url(), "burst").await {
        let key = worker_key("burst", id as u32);
        assert_eq!(redis.get(&key).as_deref(), Some(owner.as_str()), "{key}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn sixty_four_claims_at_once_get_distinct_ids_on_cluster() {
    let topo = ClusterTopology::start_primaries_only();
    let url = topo.url();
    let mut c = conn(&url);
    let keys = LeaseKeys::new(PREFIX, "burst");
    let mut open = redis::pipe();
    for guard in keys.guards(
        snowlease::worker_id::range::WorkerRange::up_to(MAX),
        Keyspace::Slots,
    ) {
        open.add_command(stamp_cmd(&guard, 0)).ignore();
    }
    let _: () = open.query_async(&mut c).await.unwrap();
    for (owner, id) in burst(&url, "burst").await {
        let key = worker_key("burst", id as u32);
        let holder = topo.server(topo.owner_of_key(&key).port).get(&key);
        assert_eq!(holder.as_deref(), Some(owner.as_str()), "{key}");
    }
    // The claimers set the hint (in its own slot) after their claims.
    let hint = format!("{PREFIX}burst:hint");
    let node = topo.server(topo.owner_of_key(&hint).port);
    assert!(poll_until(secs(5), || node.exists(&hint)), "{hint}");
}

/// The claim guard gates windowed claims as it gates one call: on a fresh Redis (no guard)
/// a claim over 1024 IDs is paused after one call, the guard set one TTL ahead, and no lease
/// key written in any window.
#[tokio::test(flavor = "current_thread")]
async fn a_missing_guard_pauses_a_windowed_claim() {
    let redis = RedisServer::start();
    let mut c = conn(&redis.url());
    let keys = LeaseKeys::new(PREFIX, "fresh");
    let (_, reply) = claim(&mut c, &keys).await;
    assert!(
        matches!(
            reply.outcome,
            ClaimOutcome::Paused {
                guard: snowlease::worker_id::claim::GuardFound::Missing,
                ..
            }
        ),
        "{reply:?}"
    );
    assert_eq!(reply.calls, 1, "one guard for every window");
    assert!(redis.exists(&format!("{PREFIX}fresh:guard")));
    assert_eq!(
        redis.keys(&format!("{PREFIX}fresh:[0-9]*")),
        Vec::<String>::new()
    );
}

/// One `Claimer` whose owner string changes (a new process's nonce, a test reusing it) sends
/// the new one: its calls are rebuilt, not reused. Claimed by A, then by B in the same window
/// with A's key still held: B takes another ID, and each key holds its own owner string (a
/// call built for A would have adopted A's key for B).
#[tokio::test(flavor = "current_thread")]
async fn a_claimer_whose_owner_changes_sends_the_new_owner() {
    let redis = RedisServer::start();
    let mut c = conn(&redis.url());
    let keys = LeaseKeys::new(PREFIX, "rebuilt");
    redis.set_stamped(&format!("{PREFIX}rebuilt:guard"), 0);
    let mut claimer = Claimer::new(&keys, MAX);
    let (a, b) = (Owner::generate("a"), Owner::generate("b"));
    let first = claimer.claim(&mut c, &a, secs(30)).await.unwrap();
    let ClaimOutcome::Claimed(id_a) = first.outcome else {
        panic!("{first:?}")
    };
    let second = claimer.claim(&mut c, &b, secs(30)).await.unwrap();
    let ClaimOutcome::Claimed(id_b) = second.outcome else {
        panic!("B must take an ID of its own: {second:?}")
    };
    assert_ne!(id_a, id_b);
    let key = |id: usize| worker_key("rebuilt", id as u32);
    assert_eq!(redis.get(&key(id_a)).as_deref(), Some(a.as_str()));
    assert_eq!(redis.get(&key(id_b)).as_deref(), Some(b.as_str()));
}
