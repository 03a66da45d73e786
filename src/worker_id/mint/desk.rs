//! The desk: the one [`Minter`] that the keeper feeds (grants, renewals, reservations, stops)
//! and every `/next` request mints from, behind a lock held only for one `mint` call, plus
//! the two signals between them (a reservation wanted, a reservation made).

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::minter::{MintRefusal, Minter, Step};
use crate::boot_clock::BootInstant;

/// Longest a request waits for the keeper's reservation when the minter reached its
/// ceiling (the keeper reserves ahead, at the low water, so this is the rare case).
const RESERVATION_WAIT: Duration = Duration::from_millis(500);

/// The minter shared between the keeper and the HTTP handlers.
#[derive(Debug)]
pub(crate) struct MintDesk {
    minter: Mutex<Minter>,
    /// A request found the ceiling reached: the keeper should reserve now.
    wanted: Notify,
    /// The keeper raised the ceiling (or stopped the lease): waiting requests look again.
    raised: Notify,
}

/// What [`MintDesk::mint`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Minted {
    /// The IDs, strictly increasing.
    pub ids: Vec<u64>,
    /// How often this request waited for the next ms.
    pub sequence_waits: u64,
}

impl MintDesk {
    /// A desk around `minter`.
    pub(crate) fn new(minter: Minter) -> Self {
        Self {
            minter: Mutex::new(minter),
            wanted: Notify::new(),
            raised: Notify::new(),
        }
    }

    /// Runs `change` on the minter (the keeper's grants, renewals, reservations and stops),
    /// then wakes requests waiting for a reservation.
    pub(crate) fn update<T>(&self, change: impl FnOnce(&mut Minter) -> T) -> T {
        let out = change(&mut lock(&self.minter));
        self.raised.notify_waiters();
        out
    }

    /// Reads the minter (e.g. [`Minter::reservation_due`]) without waking anyone.
    pub(crate) fn read<T>(&self, look: impl FnOnce(&Minter) -> T) -> T {
        look(&lock(&self.minter))
    }

    /// Resolves when a request found the ceiling reached (the keeper's cue to reserve now,
    /// besides its own low-water check).
    pub(crate) async fn reservation_wanted(&self) {
        self.wanted.notified().await;
    }

    /// Mints `count` IDs on the boot clock: waits for the next ms while the sequence is spent
    /// (busy, with yields: the wait is under 1 ms, below a timer's resolution), and once for
    /// a reservation when the ceiling is reached; any other refusal is answered at once.
    /// IDs minted before a refusal are dropped, never answered (they stay unique).
    pub(crate) async fn mint(&self, count: usize) -> Result<Minted, MintRefusal> {
        let mut ids = Vec::with_capacity(count);
        let mut sequence_waits = 0;
        let mut asked = false;
        loop {
            // Made before the check: a raise between the check and the wait still wakes it.
            let raised = self.raised.notified();
            let (step, now) = {
                let mut minter = lock(&self.minter);
                let now = BootInstant::now().as_millis();
                (minter.mint(now, count, &mut ids), now)
            };
            match step {
                Ok(Step::Done) => {
                    return Ok(Minted {
                        ids,
                        sequence_waits,
                    });
                }
                Ok(Step::NextMs) => {
                    sequence_waits += 1;
                    while BootInstant::now().as_millis() <= now {
                        tokio::task::yield_now().await;
                    }
                }
                Err(MintRefusal::NeedsReservation) if !asked => {
                    asked = true;
                    self.wanted.notify_one();
                    let _ = crate::timing::within(RESERVATION_WAIT, raised).await;
                }
                Err(refusal) => return Err(refusal),
            }
        }
    }
}

fn lock(minter: &Mutex<Minter>) -> MutexGuard<'_, Minter> {
    // Nothing in the minter panics; were it to, its last timestamp moves with each ID pushed,
    // so a poisoned minter is still consistent.
    minter
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
