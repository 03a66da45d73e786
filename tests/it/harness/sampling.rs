//! Sampling `/id` of sidecars through a fault.
//! - [`holding_sidecars`]: `n` worker sidecars of one app, each holding an ID, and their
//!   HTTP addresses, for the samplers.
//! - [`published`] / [`sample_through`]: one sampler for many sidecars; each sample names the
//!   ID every sidecar publishes at that instant; two sidecars publishing one ID in one sample
//!   fail the test (topology tests).
//! - [`sample_ids`] / [`assert_never_published_together`]: one sampler thread per sidecar,
//!   each answer with its send and receive time; two answers with one ID whose request
//!   intervals overlap fail the test (a paused sidecar answers late, after it resumes).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use super::{HTTP_TIMEOUT, IdReply, POLL_INTERVAL, Sidecar, ms, poll_until, secs};

/// `n` worker sidecars of `app` at `url` (`--ttl 4s --renew-interval 1s`), each holding an
/// ID (waits up to 20 s each: a fresh Redis closes the claim guard for one TTL), and their
/// HTTP addresses.
pub fn holding_sidecars(url: &str, app: &str, n: usize) -> (Vec<Sidecar>, Vec<SocketAddr>) {
    let sidecars: Vec<Sidecar> = (0..n)
        .map(|i| {
            Sidecar::worker_at(url, app)
                .name(format!("worker {i}"))
                .flag("--ttl", "4s")
                .flag("--renew-interval", "1s")
                .spawn()
        })
        .collect();
    for s in &sidecars {
        s.wait_for_lease(secs(20));
    }
    let addrs = sidecars.iter().map(Sidecar::http_addr).collect();
    (sidecars, addrs)
}

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

/// One `GET /id` answer of sidecar number `who`.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub who: usize,
    pub sent: Instant,
    pub recv: Instant,
    pub status: u16,
    pub worker_id: Option<u32>,
}

/// Sets the flag on drop, so sampler threads stop even when the test body panics.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One `GET /id` of `sidecar` (number `who`) with `timeout`.
pub fn sample_id(who: usize, sidecar: &Sidecar, timeout: Duration) -> Sample {
    let sent = Instant::now();
    let (status, body) = sidecar.http_get_within("/id", None, timeout);
    let recv = Instant::now();
    let worker_id = (status == 200).then(|| {
        serde_json::from_str::<IdReply>(&body)
            .unwrap_or_else(|e| panic!("bad /id body {body:?}: {e}"))
            .worker_id
    });
    Sample {
        who,
        sent,
        recv,
        status,
        worker_id,
    }
}

/// Samples `GET /id` of `sidecar` every 20 ms until `stop` (or 60 s).
pub fn sample_ids(who: usize, sidecar: &Sidecar, stop: &AtomicBool) -> Vec<Sample> {
    let mut samples = Vec::new();
    let end = Instant::now() + secs(60);
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        let sample = sample_id(who, sidecar, HTTP_TIMEOUT);
        let sent = sample.sent;
        samples.push(sample);
        if let Some(rest) = ms(20).checked_sub(sent.elapsed()) {
            thread::sleep(rest);
        }
    }
    samples
}

/// No two sidecars answered 200 with the same ID in overlapping request intervals.
pub fn assert_never_published_together(samples: &[Sample]) {
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.status == 200).collect();
    for a in &ok {
        for b in ok
            .iter()
            .filter(|b| b.who != a.who && b.worker_id == a.worker_id)
        {
            assert!(
                a.recv < b.sent || b.recv < a.sent,
                "sidecars {} and {} both answered 200 with ID {:?} at the same time: {a:?} {b:?}",
                a.who,
                b.who,
                a.worker_id
            );
        }
    }
}
