//! Rate budgets against real redis-servers: the take script's accuracy
//! under 100 concurrent clients, several keys charged all or nothing,
//! expiry when idle, penalize, bad input refused by the Rust checks and by
//! the script alike (nothing written), `snowlease budget` as a process
//! (exit 0/2/6), and Cluster and Sentinel.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use snowlease::budget::{Budget, BudgetError, BudgetKey, BudgetScript, Rate, budget_key};
use snowlease::connection::RedisTarget;
use tokio::time::Instant;

use crate::harness::{
    ClusterTopology, RedisServer, Run, SentinelTopology, ms, poll_until, run_snowlease, secs,
};

pub(crate) fn rate(text: &str) -> Rate {
    text.parse().unwrap()
}

pub(crate) async fn budget(redis: &RedisServer, name: &str) -> Budget {
    let conn = RedisTarget::parse(&redis.url())
        .unwrap()
        .connect(secs(2))
        .unwrap();
    Budget::new(conn, name).unwrap()
}

/// Runs `snowlease budget <args>` against `url`.
pub(crate) fn budget_cmd(url: &str, args: &[&str]) -> Run {
    let mut argv = vec!["budget"];
    argv.extend_from_slice(args);
    run_snowlease(&argv, &[("REDIS_URL", url)], secs(20))
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run:?}"))
}

/// The accuracy test: 100 clients, each on its own connection,
/// call the take script (EVALSHA through redis-rs, not snowlease's handle)
/// on one key at 50/s with a burst of 10; within the first 3 s of Redis
/// time (from the first call) 10 + 150 are admitted, +- 2.
///
/// The count is judged at the last call made within those 3 s (10 + one
/// per 20 ms up to it): a CPU-starved test process that makes no call in
/// the window's last few ms leaves tokens for after it, which says nothing
/// about the budget (seen at load 7: 154 by the window's end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_clients_admit_burst_plus_rate() {
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conns = Vec::new();
    for _ in 0..100 {
        conns.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    let key = budget_key("acc", "example.com");
    let end = Instant::now() + ms(3300);
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let key = key.clone();
            tokio::spawn(async move {
                let script = BudgetScript::Take.script();
                // (Redis ms of every admitted take, of every call)
                let (mut admitted, mut calls) = (Vec::new(), Vec::new());
                while Instant::now() < end {
                    let reply: Vec<i64> = script
                        .key(&key)
                        .arg(1)
                        .arg(50)
                        .arg(1000)
                        .arg(10)
                        .invoke_async(&mut conn)
                        .await
                        .unwrap();
                    calls.push(reply[4]);
                    if reply[0] == 1 {
                        admitted.push(reply[4]);
                    } else {
                        // Clients poll; they do not sleep the whole hint.
                        tokio::time::sleep(ms(reply[2].clamp(1, 2) as u64)).await;
                    }
                }
                (admitted, calls)
            })
        })
        .collect();
    let (mut times, mut calls) = (Vec::new(), Vec::new());
    for task in tasks {
        let (admitted, made) = task.await.unwrap();
        times.extend(admitted);
        calls.extend(made);
    }
    let first = *calls.iter().min().unwrap();
    let last = *calls.iter().filter(|t| **t <= first + 3000).max().unwrap();
    // 10 at once, then one per 20 ms; the slot at `last` counts.
    let expected = 10 + (last - first) / 20;
    let admitted = times.iter().filter(|t| **t <= last).count() as i64;
    let by_end = times.iter().filter(|t| **t <= first + 3000).count();
    eprintln!(
        "accuracy: admitted {admitted} by the last call {} ms into the run (expected {expected} +- 2), {by_end} by 3000 ms",
        last - first
    );
    assert!(
        last - first >= 2500,
        "no call in the window's last 500 ms: the test process was starved"
    );
    assert!(
        (expected - 2..=expected + 2).contains(&admitted),
        "admitted {admitted}, expected {expected} +- 2 (10 + 1 per 20 ms)"
    );
}

/// Charges of a key at rate 1/h, read back from its remaining time (the
/// TAT is start + n * 3.6 s while nothing refills).
fn charges_at_one_per_hour(redis: &RedisServer, key: &str) -> u64 {
    let pttl = redis.pttl(key).max(0) as u64;
    pttl.div_ceil(3_600_000)
}

/// Two keys charged together never diverge: 20 clients charge the pair
/// {domain, proxy:domain} or the proxy key alone, until the pair's burst
/// is spent; the domain key carries exactly the allowed pair takes, the
/// pair key those plus the lone ones; denials charged nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_charged_together_never_diverge() {
    let redis = RedisServer::start();
    let b = budget(&redis, "crawl").await;
    let hourly = rate("1/h");
    let pair = Arc::new([
        BudgetKey::new("example.com", hourly, 100),
        BudgetKey::new("p7:example.com", hourly, 60),
    ]);
    let (pairs, lone) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (b, pair, pairs, lone) = (b.clone(), pair.clone(), pairs.clone(), lone.clone());
            tokio::spawn(async move {
                for round in 0..20 {
                    let both = (i + round) % 3 != 0;
                    let keys = if both { &pair[..] } else { &pair[1..] };
                    if b.take(keys, 1).await.unwrap().allowed {
                        let counter = if both { &pairs } else { &lone };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let (pairs, lone) = (pairs.load(Ordering::Relaxed), lone.load(Ordering::Relaxed));
    assert_eq!(pairs + lone, 60, "the pair key's burst is spent exactly");
    let domain = budget_key("crawl", "example.com");
    let proxy = budget_key("crawl", "p7:example.com");
    assert_eq!(charges_at_one_per_hour(&redis, &domain), pairs);
    assert_eq!(charges_at_one_per_hour(&redis, &proxy), pairs + lone);
    let denied = b.take(&pair[..], 1).await.unwrap();
    assert!(!denied.allowed && denied.remaining == 0, "{denied:?}");
    assert_eq!(charges_at_one_per_hour(&redis, &domain), pairs);
}

/// Every write sets the key's expiry to when the budget is full again: an
/// idle key is gone then; a denial writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_when_the_budget_is_full_again() {
    let redis = RedisServer::start();
    let b = budget(&redis, "idle").await;
    let keys = [BudgetKey::new("a", rate("10/s"), 2)];
    let first = b.take(&keys, 2).await.unwrap();
    assert!(first.allowed && first.remaining == 0, "{first:?}");
    assert!((195..=200).contains(&first.reset_after_ms), "{first:?}");
    let key = budget_key("idle", "a");
    let pttl = redis.pttl(&key);
    assert!((150..=200).contains(&pttl), "pttl {pttl}");
    let denied = b.take(&keys, 2).await.unwrap();
    assert!(!denied.allowed && denied.retry_after_ms > 100, "{denied:?}");
    assert!(redis.pttl(&key) <= pttl, "a denial does not extend the key");
    assert!(
        poll_until(secs(2), || !redis.exists(&key)),
        "key gone when full"
    );
    assert!(b.take(&keys, 2).await.unwrap().allowed, "full again");
}

/// retry_after_ms is exact to the ms, and a lowered rate applies at once
/// (the limits travel with each call; a raised one once the key's time,
/// set by the old rate, has passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_in_ms_and_rates_apply_at_once() {
    let redis = RedisServer::start();
    let b = budget(&redis, "ms").await;
    let slow = [BudgetKey::new("k", rate("4/s"), 1)];
    assert!(b.take(&slow, 1).await.unwrap().allowed);
    let denied = b.take(&slow, 1).await.unwrap();
    assert!((200..=250).contains(&denied.retry_after_ms), "{denied:?}");
    tokio::time::sleep(denied.retry_after()).await;
    assert!(
        b.take(&slow, 1).await.unwrap().allowed,
        "allowed at the hint"
    );
    let fast = [BudgetKey::new("f", rate("1000/s"), 1)];
    assert!(b.take(&fast, 1).await.unwrap().allowed);
    tokio::time::sleep(ms(5)).await;
    assert!(b.take(&fast, 1).await.unwrap().allowed);
    let lowered = [BudgetKey::new("f", rate("1/s"), 1)];
    tokio::time::sleep(ms(5)).await;
    assert!(b.take(&lowered, 1).await.unwrap().allowed);
    let denied = b.take(&lowered, 1).await.unwrap();
    assert!(
        denied.retry_after_ms > 900,
        "the lowered rate at once: {denied:?}"
    );
}

/// Penalize: after the target's Retry-After of 500 ms, no take before it,
/// one at it, then the rate from an empty budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalize_pushes_a_key_back() {
    let redis = RedisServer::start();
    let b = budget(&redis, "pen").await;
    let keys = [BudgetKey::new("example.com", rate("10/s"), 5)];
    let p = b.penalize(&keys, ms(500)).await.unwrap();
    assert_eq!(p.retry_after_ms, 500, "{p:?}");
    let denied = b.take(&keys, 1).await.unwrap();
    // Exactly the penalty's rest on Redis' clock, however late the take
    // came (a loaded machine once took 51 ms).
    let rest = 500 - (denied.at_ms - p.at_ms);
    assert!(
        !denied.allowed && denied.retry_after_ms.abs_diff(rest) <= 1,
        "{denied:?}, {rest} ms of the penalty left"
    );
    let allowed = b.take_wait(&keys, 1, secs(1), &Default::default()).await;
    let allowed = allowed.unwrap();
    // From empty at 10/s: one unit per 100 ms since the penalty's end is all there is (the
    // waiter wakes after a spread, so some may have refilled).
    let refilled = (allowed.at_ms - p.at_ms).saturating_sub(500) / 100;
    assert!(
        allowed.allowed && allowed.remaining <= refilled,
        "{allowed:?}, {refilled} refilled"
    );
}

/// A penalty holds back takers whatever limits the penalizer passed: penalized with 1/s
/// burst 1, takers at 10/s burst 10 are denied until its end (before: allowed 0.9 s early),
/// and penalized with 10/s burst 10, takers at 1/s burst 1 are allowed at its end (before:
/// 0.9 s late); `retry_after_ms` says the penalty's end either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_ends_at_its_time_for_every_takers_limits() {
    let redis = RedisServer::start();
    let b = budget(&redis, "pen").await;
    let cases = [("1/s", 1, "10/s", 10), ("10/s", 10, "1/s", 1)];
    for (i, (pen_rate, pen_burst, take_rate, take_burst)) in cases.into_iter().enumerate() {
        let key = format!("k{i}");
        let penalizer = [BudgetKey::new(&key, rate(pen_rate), pen_burst)];
        let taker = [BudgetKey::new(&key, rate(take_rate), take_burst)];
        let p = b.penalize(&penalizer, ms(1500)).await.unwrap();
        assert_eq!(p.retry_after_ms, 1500, "{p:?}");
        let denied = b.take(&taker, 1).await.unwrap();
        let rest = 1500 - (denied.at_ms - p.at_ms);
        assert!(
            !denied.allowed && denied.retry_after_ms.abs_diff(rest) <= 1,
            "{pen_rate} penalty, {take_rate} taker: {denied:?}, {rest} ms left"
        );
        tokio::time::sleep(ms(rest + 20)).await;
        let allowed = b.take(&taker, 1).await.unwrap();
        assert!(
            allowed.allowed,
            "{pen_rate} penalty, {take_rate} taker, after its end: {allowed:?}"
        );
    }
}

/// The script's own guard: zero or absurd limits, a cost over the burst, a
/// foreign or repeated key are refused with the field and its range, and
/// nothing is written; a key of another type is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_refuses_bad_input_itself() {
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let key = budget_key("g", "k");
    let cases: [(&[&str], &[&str], &str); 9] = [
        (
            &[&key],
            &["1", "0", "1000", "5"],
            "rate_count an integer 1-1000000",
        ),
        (
            &[&key],
            &["1", "5", "0", "5"],
            "rate_period_ms an integer 1-86400000",
        ),
        (
            &[&key],
            &["1", "5", "1000", "0"],
            "burst an integer 1-1000000",
        ),
        (
            &[&key],
            &["0", "5", "1000", "5"],
            "cost an integer 1-1000000",
        ),
        (
            &[&key],
            &["6", "5", "1000", "5"],
            "cost at most the burst (5)",
        ),
        (
            &[&key],
            &["1", "1", "86400000", "1000000"],
            "window_ms burst / rate",
        ),
        (
            &[&key],
            &["1", "5", "1000"],
            "ARGV rate_count, rate_period_ms, burst",
        ),
        (
            &[&key, &key],
            &["1", "5", "1000", "5", "5", "1000", "5"],
            "keys[1] each key once",
        ),
        (&["{g}:k"], &["1", "5", "1000", "5"], "name 1-64 chars"),
    ];
    for (keys, args, expected) in cases {
        let mut inv = BudgetScript::Take.script().prepare_invoke();
        for k in keys {
            inv.key(*k);
        }
        for a in args {
            inv.arg(*a);
        }
        let err = inv
            .invoke_async::<redis::Value>(&mut conn)
            .await
            .unwrap_err();
        let err = BudgetError::from(err).to_string();
        let expected = expected.replacen(' ', ": expected ", 1);
        assert!(err.contains(&format!("invalid {expected}")), "{err}");
    }
    assert_eq!(redis.dbsize(), 0, "nothing written");
    redis.query::<()>(redis::cmd("HSET").arg(&key).arg("f").arg("v"));
    let b = budget(&redis, "g").await;
    let err = b
        .take(&[BudgetKey::new("k", rate("5/s"), 5)], 1)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BudgetError::WrongKeyType { found, .. } if found == "hash"),
        "{err}"
    );
}

/// A budget key holding a string that parses as a number but is no time
/// (`nan`, `inf`, `1e400`, negative, far beyond any window) is refused like
/// a key of another type, before any write: the other key of the take is
/// not charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_stored_values_are_refused_before_any_write() {
    let redis = RedisServer::start();
    let b = budget(&redis, "n").await;
    let keys = [
        BudgetKey::new("a", rate("10/s"), 10),
        BudgetKey::new("z", rate("10/s"), 10),
    ];
    let far = format!("{}", u64::MAX / 2);
    for value in ["nan", "inf", "-inf", "1e400", "-5", "0x10", far.as_str()] {
        redis.query::<()>(redis::cmd("SET").arg(budget_key("n", "z")).arg(value));
        let err = b.take(&keys, 1).await.unwrap_err();
        assert!(
            matches!(&err, BudgetError::WrongKeyType { key, found }
                if key == &budget_key("n", "z") && found == "string"),
            "{value}: {err}"
        );
        assert!(!redis.exists(&budget_key("n", "a")), "{value}: a charged");
        let err = b.penalize(&keys, ms(1000)).await.unwrap_err();
        assert!(
            matches!(&err, BudgetError::WrongKeyType { .. }),
            "{value}: {err}"
        );
        assert!(!redis.exists(&budget_key("n", "a")), "{value}: a penalized");
        assert_eq!(redis.get(&budget_key("n", "z")).as_deref(), Some(value));
    }
}

/// A denied take of cost 1 says remaining 0, at slow rates too: the key
/// is 50 ms from full, which at 1/d is a tiny fraction of an interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_of_one_leaves_nothing_remaining() {
    let redis = RedisServer::start();
    let b = budget(&redis, "slow").await;
    let fast = [BudgetKey::new("k", rate("10/s"), 1)];
    assert!(b.take(&fast, 1).await.unwrap().allowed);
    tokio::time::sleep(ms(50)).await;
    let slow = [BudgetKey::new("k", rate("1/d"), 1)];
    let taken = b.take(&slow, 1).await.unwrap();
    assert!(!taken.allowed, "{taken:?}");
    assert_eq!(taken.remaining, 0, "{taken:?}");
}

/// `snowlease budget take`: exit 0 with JSON, exit 6 with the JSON and
/// retry_after_ms when denied, --wait waits for it; bad input exits 2
/// naming the flag and its range, with nothing written.
#[test]
fn cli_take_exit_codes() {
    let redis = RedisServer::start();
    let url = redis.url();
    let take = |extra: &[&str]| {
        let mut args = vec!["take", "--name", "api", "--key", "example.com"];
        args.extend_from_slice(extra);
        budget_cmd(&url, &args)
    };
    let ok = take(&["--rate", "2/s", "--burst", "1"]);
    assert_eq!(ok.code, Some(0), "{ok:?}");
    assert_eq!(json(&ok)["allowed"], true);
    let denied = take(&["--rate", "2/s", "--burst", "1"]);
    assert_eq!(denied.code, Some(6), "{denied:?}");
    assert_eq!(json(&denied)["allowed"], false);
    assert!(json(&denied)["retry_after_ms"].as_u64().unwrap() > 0);
    assert!(denied.stderr.contains("denied by budget api"), "{denied:?}");
    let waited = take(&["--rate", "2/s", "--burst", "1", "--wait", "2s"]);
    assert_eq!(waited.code, Some(0), "{waited:?}");

    let bad = RedisServer::start();
    let cases: [(&[&str], &str); 8] = [
        (
            &["--rate", "0/s", "--burst", "1"],
            "--rate: keys[0].rate: expected an integer 1-1000000",
        ),
        (
            &["--rate", "+10/s", "--burst", "1"],
            "\"+10/s\" is not a rate like 10/s",
        ),
        (&["--rate", "1/2d", "--burst", "1"], "--rate"),
        (
            &["--rate", "1/s", "--burst", "0"],
            "--burst: keys[0].burst: expected an integer 1-1000000",
        ),
        (
            &["--rate", "1/d", "--burst", "100"],
            "--burst: keys[0].burst: expected a burst that refills within",
        ),
        (
            &["--rate", "1/s", "--burst", "2", "--cost", "3"],
            "--cost: cost: expected at most the burst (2)",
        ),
        (
            &[
                "--rate", "1/s", "--rate", "2/s", "--rate", "3/s", "--burst", "2", "--key", "b",
            ],
            "--rate: given 3 times for 2 --key",
        ),
        (
            &["--rate", "1/s", "--burst", "2", "--key", "a b"],
            "--key: keys[1]: expected 1-128 chars of [A-Za-z0-9_.:-]",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["take", "--name", "api", "--key", "example.com"];
        args.extend_from_slice(extra);
        let run = budget_cmd(&bad.url(), &args);
        assert_eq!(run.code, Some(2), "{extra:?}: {run:?}");
        assert!(run.stderr.contains(expected), "{extra:?}: {run:?}");
    }
    let run = budget_cmd(
        &bad.url(),
        &[
            "take", "--name", "a!", "--key", "k", "--rate", "1/s", "--burst", "1",
        ],
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("--name"), "{run:?}");
    assert_eq!(bad.dbsize(), 0, "nothing written");
}

/// A Redis that is down fails closed: exit 1, never 0.
#[test]
fn cli_fails_closed_when_redis_is_down() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.stop();
    let run = budget_cmd(
        &url,
        &[
            "take",
            "--name",
            "api",
            "--key",
            "k",
            "--rate",
            "1/s",
            "--burst",
            "1",
            "--redis-timeout",
            "500ms",
        ],
    );
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
}

/// On a Cluster and behind Sentinel: two keys charged together in one call
/// (one hash tag), the burst spent, then exit 6; `pool acquire --budget`
/// likewise.
#[test]
fn budget_runs_on_cluster_and_sentinel() {
    let cluster = ClusterTopology::start_primaries_only();
    let sentinel = SentinelTopology::start_small();
    for url in [cluster.url(), sentinel.url()] {
        let args = [
            "take",
            "--name",
            "crawl",
            "--key",
            "example.com",
            "--key",
            "p1:example.com",
            "--rate",
            "1/m",
            "--rate",
            "1/m",
            "--burst",
            "3",
            "--burst",
            "2",
        ];
        for _ in 0..2 {
            let run = budget_cmd(&url, &args);
            assert_eq!(run.code, Some(0), "{url}: {run:?}");
        }
        let run = budget_cmd(&url, &args);
        assert_eq!(run.code, Some(6), "{url}: {run:?}");
        assert_eq!(json(&run)["remaining"], 0, "{url}");
    }
    // pool acquire --budget: the charge's keys in the pool's slot.
    for url in [cluster.url(), sentinel.url()] {
        let pool = |args: &[&str]| {
            let mut argv = vec!["pool"];
            argv.extend_from_slice(args);
            run_snowlease(&argv, &[("REDIS_URL", url.as_str())], secs(20))
        };
        let init = pool(&["init", "--pool", "proxies", "--ids", "p1,p2"]);
        assert_eq!(init.code, Some(0), "{url}: {init:?}");
        let acquire = [
            "acquire",
            "--pool",
            "proxies",
            "--ttl",
            "30s",
            "--budget",
            "domains",
            "--budget-key",
            "example.com",
            "--budget-rate",
            "1/m",
            "--budget-burst",
            "1",
        ];
        let run = pool(&acquire);
        assert_eq!(run.code, Some(0), "{url}: {run:?}");
        let run = pool(&acquire);
        assert_eq!(run.code, Some(6), "{url}: {run:?}");
    }
    let owner = cluster.owner_of_key("snowlease:budget:{crawl}:example.com");
    assert_eq!(
        owner.port,
        cluster
            .owner_of_key("snowlease:budget:{crawl}:p1:example.com")
            .port,
        "one slot"
    );
}

/// The limits table and the script agree at every boundary: for each range
/// the script checks, min - 1 and max + 1 are refused and min and max
/// accepted by the Rust API and by the script called raw alike; so are the
/// cross-field rules (refill within 30 days, 1 per us, cost <= burst) on
/// each side of their boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_and_lua_refuse_the_same_values() {
    use snowlease::budget::limits::{BURST, COST, PENALTY_MS, RATE_COUNT, RATE_PERIOD_MS, Range};
    let redis = RedisServer::start();
    let b = budget(&redis, "lim").await;
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    // [count, period_ms, burst, cost or penalty_ms]: a base where no cross
    // rule (1 per us, refill within 30 days, cost <= burst) interferes.
    let cases: [(Range, usize, [u64; 4], BudgetScript); 5] = [
        (RATE_COUNT, 0, [1, 86_400_000, 1, 1], BudgetScript::Take),
        (RATE_PERIOD_MS, 1, [1, 1000, 1, 1], BudgetScript::Take),
        (BURST, 2, [1_000_000, 1000, 1, 1], BudgetScript::Take),
        (COST, 3, [1_000_000, 1000, 1_000_000, 1], BudgetScript::Take),
        (PENALTY_MS, 3, [1, 1000, 1, 1], BudgetScript::Penalize),
    ];
    let mut n = 0;
    for (range, at, base, script) in cases {
        let values = [
            range.min.wrapping_sub(1),
            range.min,
            range.max,
            range.max + 1,
        ];
        for value in values.into_iter().filter(|v| *v != u64::MAX) {
            n += 1;
            let mut args = base;
            args[at] = value;
            let key = format!("k{n}");
            let limit = BudgetKey::new(
                &key,
                Rate {
                    count: args[0],
                    period: ms(args[1]),
                },
                args[2],
            );
            let rust = match script {
                BudgetScript::Take => b.take(&[limit], args[3]).await.map(|_| ()),
                _ => b.penalize(&[limit], ms(args[3])).await.map(|_| ()),
            };
            let mut inv = script.script().prepare_invoke();
            inv.key(budget_key("lim", &format!("raw{n}")));
            inv.arg(args[3]).arg(args[0]).arg(args[1]).arg(args[2]);
            let lua = inv.invoke_async::<redis::Value>(&mut conn).await;
            let lua = lua.map(|_| ()).map_err(BudgetError::from);
            let refused =
                |r: &Result<(), BudgetError>| matches!(r, Err(BudgetError::BadInput { .. }));
            assert_eq!(
                refused(&rust),
                refused(&lua),
                "{} = {value}: rust {rust:?}, lua {lua:?}",
                range.field
            );
            let outside = !range.allows(value);
            assert_eq!(refused(&lua), outside, "{} = {value}: {lua:?}", range.field);
            if let Err(BudgetError::BadInput { field, .. }) = &lua {
                assert_eq!(field, range.field, "the script names the field");
            }
        }
    }
    // The cross-field rules on each side of their boundary: [count,
    // period_ms, burst, cost], refused or not. The Rust checks alone: a
    // handle on a port nobody listens on (accepted = a Redis error).
    let dead = RedisTarget::parse("redis://127.0.0.1:1")
        .unwrap()
        .connect(secs(2))
        .unwrap();
    let dead = Budget::new(dead, "lim").unwrap();
    let cross: [([u64; 4], bool); 8] = [
        // A full burst refills within 30 days: burst * period <= 2592000000 * count.
        ([1, 86_400_000, 30, 1], false),
        ([1, 86_400_000, 31, 1], true),
        ([3, 13_383_821, 580, 1], false),
        ([3, 13_383_821, 581, 1], true),
        // At most 1 per microsecond.
        ([1000, 1, 1, 1], false),
        ([1001, 1, 1, 1], true),
        // Cost at most the burst.
        ([5, 1000, 5, 5], false),
        ([5, 1000, 5, 6], true),
    ];
    for (args, refuse) in cross {
        n += 1;
        let limit = BudgetKey::new(
            format!("k{n}"),
            Rate {
                count: args[0],
                period: ms(args[1]),
            },
            args[2],
        );
        let rust = dead.take(&[limit], args[3]).await.map(|_| ());
        let mut inv = BudgetScript::Take.script().prepare_invoke();
        inv.key(budget_key("lim", &format!("raw{n}")));
        inv.arg(args[3]).arg(args[0]).arg(args[1]).arg(args[2]);
        let lua = inv.invoke_async::<redis::Value>(&mut conn).await;
        let lua = lua.map(|_| ()).map_err(BudgetError::from);
        let refused = |r: &Result<(), BudgetError>| matches!(r, Err(BudgetError::BadInput { .. }));
        assert_eq!(refused(&rust), refuse, "{args:?}: rust {rust:?}");
        assert_eq!(refused(&lua), refuse, "{args:?}: lua {lua:?}");
    }
}

/// What docs/pool.md says a changed rate does: a key holds only a time, so time charged at the
/// old rate counts at the new one. Five takes at 1/m burst 5 used 5 minutes: at 1/h burst 5
/// that is a twelfth of one take, so 4 more pass and the fifth is denied; a raised rate (back
/// to 10/s burst 5) waits until the time already charged has passed.
#[test]
fn a_changed_rate_counts_the_time_already_charged() {
    let redis = RedisServer::start();
    let url = redis.url();
    let take = |rate: &str| {
        let run = budget_cmd(
            &url,
            &[
                "take", "--name", "api", "--key", "k", "--rate", rate, "--burst", "5",
            ],
        );
        assert!(matches!(run.code, Some(0 | 6)), "{run:?}");
        json(&run)
    };
    for _ in 0..5 {
        assert_eq!(take("1/m")["allowed"], true);
    }
    assert_eq!(take("1/m")["allowed"], false);
    for _ in 0..4 {
        assert_eq!(take("1/h")["allowed"], true);
    }
    let denied = take("1/h");
    assert_eq!(denied["allowed"], false, "{denied}");
    let raised = take("10/s");
    assert_eq!(raised["allowed"], false, "{raised}");
    assert!(
        raised["retry_after_ms"].as_u64().unwrap() > 3_600_000,
        "waits for the hours charged at 1/h: {raised}"
    );
}

/// 30 waiters on one key at 10/s (burst 1) are all admitted within their wait, and the
/// denials they hear do not wake them together: under 11 script calls per admission (7.3
/// measured; waking exactly at `retry_after_ms`, all of them at once: 16.5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_spread_their_retries() {
    let redis = RedisServer::start();
    let b = budget(&redis, "crawl").await;
    let key = Arc::new([BudgetKey::new("example.com", rate("10/s"), 1)]);
    let calls = |redis: &RedisServer| redis.command_stat("evalsha", "calls");
    let before = calls(&redis);
    let tasks: Vec<_> = (0..30)
        .map(|_| {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move {
                b.take_wait(&key[..], 1, secs(30), &Default::default())
                    .await
                    .unwrap()
                    .allowed
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += u64::from(task.await.unwrap());
    }
    let per_admission = (calls(&redis) - before) as f64 / admitted as f64;
    eprintln!("30 waiters on 10/s: {per_admission:.1} script calls per admission");
    assert_eq!(admitted, 30);
    assert!(
        per_admission < 8.0,
        "{per_admission:.1} calls per admission"
    );
}
