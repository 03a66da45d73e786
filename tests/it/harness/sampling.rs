//! Sampling `/id` of many sidecars through a fault: each sample names the ID every sidecar
//! publishes at that instant; two sidecars publishing one ID in one sample fail the test.
//! Used by the topology tests and by `benches/worker.rs` (failover gap).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{POLL_INTERVAL, ms, poll_until, secs};

/// `/id` of each sidecar: the published worker ID, None when it answers anything but 200.
pub fn published(addrs: &[SocketAddr]) -> Vec<Option<u32>> {
    addrs
        .iter()
        .map(|addr| {
            let reply = ureq::get(&format!("http://{addr}/id"))
                .set("Accept", "application/json")
                .timeout(ms(300))
                .call()
                .ok()?;
            let body: serde_json::Value = reply.into_json().ok()?;
            body["worker_id"].as_u64().map(|id| id as u32)
        })
        .collect()
}

/// Samples `/id` of every sidecar every 20 ms while `during` runs. Panics when two
/// sidecars publish one ID in the same sample; returns each sidecar's longest stretch
/// without a published ID.
pub fn sample_through<T>(addrs: &[SocketAddr], during: impl FnOnce() -> T) -> (T, Vec<Duration>) {
    let stop = AtomicBool::new(false);
    let (out, samples) = thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                samples.push((Instant::now(), published(addrs)));
                thread::sleep(POLL_INTERVAL);
            }
            samples
        });
        let out = during();
        // Go on until every sidecar publishes again (bounded), so the gaps are whole.
        poll_until(secs(30), || published(addrs).iter().all(Option::is_some));
        stop.store(true, Ordering::Relaxed);
        (out, sampler.join().unwrap())
    });
    let mut gaps = vec![Duration::ZERO; addrs.len()];
    let mut since: Vec<Option<Instant>> = vec![None; addrs.len()];
    for (at, ids) in &samples {
        let mut seen: Vec<u32> = ids.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert!(
            seen.windows(2).all(|w| w[0] != w[1]),
            "one ID published twice at once: {ids:?}"
        );
        for (i, id) in ids.iter().enumerate() {
            match (id, since[i]) {
                (None, None) => since[i] = Some(*at),
                (Some(_), Some(start)) => {
                    gaps[i] = gaps[i].max(*at - start);
                    since[i] = None;
                }
                _ => {}
            }
        }
    }
    for (i, start) in since.iter().enumerate() {
        if let Some(start) = start {
            gaps[i] = gaps[i].max(samples.last().unwrap().0 - *start);
        }
    }
    (out, gaps)
}
