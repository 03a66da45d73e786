//! The mint variant of the fault run: every sidecar runs `worker --mint` under
//! libfaketime (so its wall clock can step +-30 s), and one client per sidecar pulls
//! `/next?count=N` batches (N in 1-64) all run long, reading the sidecar's state file before
//! and after each batch. The check: no ID twice over every batch of every sidecar; every
//! ID's worker bits equal to the worker ID its sidecar's state file named just before or
//! just after the batch (a worker ID it held at that moment); every batch strictly
//! increasing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::SlotView;
use crate::it_dir::harness::ms;

/// Largest `count` a client asks for.
const MAX_COUNT: usize = 64;

/// Worker bits of an ID in the default layout (41:10:12).
fn worker_of(id: u64) -> u16 {
    ((id >> 12) & 0x3ff) as u16
}

/// One batch a client got.
pub struct Batch {
    /// The slot it came from.
    pub slot: usize,
    /// The worker ID the slot's state file named before and after the request.
    pub held: [Option<u16>; 2],
    /// The IDs, as answered.
    pub ids: Vec<u64>,
}

/// What one client got.
#[derive(Default)]
pub struct Pulled {
    pub batches: Vec<Batch>,
    /// 503s by the state they named.
    pub refused: BTreeMap<String, u64>,
}

/// The worker ID the state file at `path` names (whatever its `release_unconfirmed`).
fn held(path: &PathBuf) -> Option<u16> {
    let text = std::fs::read(path).ok()?;
    let state: serde_json::Value = serde_json::from_slice(&text).ok()?;
    u16::try_from(state["worker_id"].as_u64()?).ok()
}

/// Pulls batches from slot `index` until `stop`.
pub fn pull(
    index: usize,
    view: Arc<Mutex<SlotView>>,
    state_file: PathBuf,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> thread::JoinHandle<Pulled> {
    thread::spawn(move || {
        let http = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(2))
            .build();
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6d69_6e74 ^ index as u64);
        let mut pulled = Pulled::default();
        while !stop.load(Ordering::SeqCst) {
            let Some(addr) = view.lock().unwrap().addr else {
                thread::sleep(ms(20));
                continue;
            };
            let count = rng.random_range(1..=MAX_COUNT);
            let before = held(&state_file);
            let answer = http
                .get(&format!("http://{addr}/next?count={count}"))
                .call();
            match answer {
                Ok(reply) => {
                    let body: serde_json::Value = reply.into_json().expect("JSON IDs");
                    let ids = body["ids"]
                        .as_array()
                        .expect("ids")
                        .iter()
                        .map(|id| id.as_str().expect("a string").parse().expect("decimal"))
                        .collect();
                    let after = held(&state_file);
                    pulled.batches.push(Batch {
                        slot: index,
                        held: [before, after],
                        ids,
                    });
                }
                Err(ureq::Error::Status(503, reply)) => {
                    let body: serde_json::Value = reply.into_json().unwrap_or_default();
                    let state = body["state"].as_str().unwrap_or("?").to_owned();
                    *pulled.refused.entry(state).or_default() += 1;
                    thread::sleep(ms(20));
                }
                Err(_) => thread::sleep(ms(20)),
            }
            thread::sleep(ms(rng.random_range(5..=15)));
        }
        pulled
    })
}

/// Prints the figures; Err on an ID twice, a worker bit mismatch or a batch out of order.
pub fn check(pulled: &[Pulled]) -> Result<(), String> {
    let batches: Vec<&Batch> = pulled.iter().flat_map(|p| &p.batches).collect();
    let mut all: Vec<u64> = batches.iter().flat_map(|b| b.ids.iter().copied()).collect();
    let minted = all.len();
    all.sort_unstable();
    let twice = all.windows(2).filter(|w| w[0] == w[1]).count();
    let mut foreign = Vec::new();
    let mut unordered = 0;
    for b in &batches {
        unordered += usize::from(!b.ids.windows(2).all(|w| w[0] < w[1]));
        let held: Vec<u16> = b.held.iter().flatten().copied().collect();
        if let Some(id) = b.ids.iter().find(|id| !held.contains(&worker_of(**id))) {
            foreign.push((b.slot, b.held, *id, worker_of(*id)));
        }
    }
    let mut refused: BTreeMap<&str, u64> = BTreeMap::new();
    for (state, n) in pulled.iter().flat_map(|p| &p.refused) {
        *refused.entry(state).or_default() += n;
    }
    let workers: std::collections::BTreeSet<u16> = all.iter().map(|id| worker_of(*id)).collect();
    eprintln!(
        "chaos: minted {minted} IDs in {} batches over worker IDs {workers:?}; 503s by state: {refused:?}",
        batches.len()
    );
    eprintln!("chaos: IDs minted twice {twice} (must be 0)");
    eprintln!(
        "chaos: batches whose worker bits no state file named {} (must be 0)",
        foreign.len()
    );
    eprintln!("chaos: batches out of order {unordered} (must be 0)");
    for f in foreign.iter().take(20) {
        eprintln!(
            "chaos: FOREIGN slot {} held {:?}: ID {} has worker bits {}",
            f.0, f.1, f.2, f.3
        );
    }
    if twice > 0 || !foreign.is_empty() || unordered > 0 {
        return Err(format!(
            "{twice} IDs minted twice, {} batches with foreign worker bits, {unordered} out of order",
            foreign.len()
        ));
    }
    if minted < 1000 {
        return Err(format!("only {minted} IDs minted: {}", crate::VACUOUS));
    }
    Ok(())
}
