//! `cargo bench --bench replica_ack`: what `--min-replicas-ack 1` costs per
//! renew. A primary with one replica on loopback; the sidecar's own handle
//! and calls: `renew.lua` alone, then `renew.lua` followed by `WAIT 1` (as
//! the keeper sends them). Prints medians and the 99th percentile.

use std::time::{Duration, Instant};

use snowlease::connection::RedisTarget;
use snowlease::identity::Owner;
use snowlease::lease;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Redis;

const TRIALS: usize = 500;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * p) as usize]
}

async fn renews(url: &str, wait: bool) -> Vec<Duration> {
    let target = RedisTarget::parse(url).unwrap();
    let mut conn = target.connect(Duration::from_secs(1)).unwrap();
    let owner = Owner::generate("bench");
    let key = "snowflake:worker:bench:0";
    let ttl = Duration::from_secs(120);
    // The lease exists and is ours, as for a sidecar that holds it.
    let mut set = redis::cmd("SET");
    set.arg(key).arg(owner.as_str()).arg("PX").arg(120_000);
    set.query_async::<()>(&mut conn).await.unwrap();
    let mut samples = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS + 20 {
        let start = Instant::now();
        let reply = lease::renew(&mut conn, key, &owner, ttl, u64::MAX)
            .await
            .unwrap();
        assert_ne!(reply.outcome, lease::RenewOutcome::Lost);
        if wait {
            let acked = conn
                .wait_replicas(key, 1, Duration::from_millis(500))
                .await
                .unwrap();
            assert_eq!(acked, 1, "the replica acknowledged");
        }
        samples.push(start.elapsed());
    }
    samples.split_off(20)
}

fn main() {
    let primary = Redis::start();
    let _replica = Redis::start_replica_of(primary.port());
    let admin = redis::Client::open(primary.url()).unwrap();
    let mut admin = admin.get_connection().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let linked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(100)
            .query(&mut admin)
            .unwrap();
        if linked == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "replica did not link");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("renew round trip, primary + 1 replica on loopback ({TRIALS} renews each)");
    println!("{:<36} {:>10} {:>10}", "measure", "median", "p99");
    for (name, wait) in [("renew.lua", false), ("renew.lua + WAIT 1", true)] {
        let mut samples = runtime.block_on(renews(&primary.url(), wait));
        let median = percentile(&mut samples, 0.5);
        let p99 = percentile(&mut samples, 0.99);
        println!(
            "{name:<36} {:>8.1}us {:>8.1}us",
            median.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6
        );
    }
}
