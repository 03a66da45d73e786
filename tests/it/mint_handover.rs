//! The mint guarantee on real Redis, with the minter on a fake clock (the keeper's wiring is
//! `mint_worker`'s): a worker ID handed to a holder whose clock is 30 s behind, with and without the
//! settled record, and a paused old holder that wakes after the handover, mint no ID twice.

use std::collections::BTreeSet;
use std::time::Duration;

use snowlease::connection::{Redis, RedisTarget};
use snowlease::identity::Owner;
use snowlease::worker_id::keys::MintKeys;
use snowlease::worker_id::mint::layout::{DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Epoch, IdLayout};
use snowlease::worker_id::mint::minter::{
    Anchor, Grant, LeaseTicket, MintRefusal, MintWindow, Minter, Standby, Step,
};
use snowlease::worker_id::mint::script::{read_mark, reserve, settle};

use crate::harness::*;

const WINDOW: MintWindow = MintWindow {
    ahead_ms: 5_000,
    low_water_ms: 2_000,
};
/// Far enough that no reservation here is capped (the cap: `mint_script`).
const LEAD: Duration = Duration::from_secs(60);
const APP: &str = "handover";

/// One holder: its owner string, its minter, and its own boot clock (ms, moved by hand).
struct Holder {
    owner: Owner,
    minter: Minter,
    ticket: Option<LeaseTicket>,
    boot_ms: u64,
}

impl Holder {
    fn new(name: &str) -> Holder {
        let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), unix_ms()).unwrap();
        let layout = IdLayout::parse(DEFAULT_LAYOUT).unwrap();
        Holder {
            owner: Owner::generate(name),
            minter: Minter::new(layout, epoch, WINDOW),
            ticket: None,
            boot_ms: 1_000,
        }
    }

    /// Takes the lease key (as a claim would, the old one gone), reads the floor after it,
    /// and starts minting with this holder's wall clock `skew_ms` off the real one.
    async fn claim(&mut self, c: &mut Redis, keys: &MintKeys, lease: &str, skew_ms: i64) {
        let _: () = redis::cmd("SET")
            .arg(lease)
            .arg(self.owner.as_str())
            .query_async(c)
            .await
            .unwrap();
        let read = read_mark(c, keys, lease, &self.owner, Duration::ZERO)
            .await
            .unwrap();
        assert!(read.ours);
        self.ticket = Some(self.minter.start(Grant {
            worker_id: 5,
            anchor: Anchor {
                boot_ms: self.boot_ms,
                unix_ms: unix_ms().saturating_add_signed(skew_ms),
            },
            floor_unix_ms: read.floor_unix_ms,
            valid_until_boot_ms: self.boot_ms + 120_000,
        }));
    }

    /// Reserves when due, as the keeper will; false when the lease key is not ours.
    async fn reserve_if_due(&mut self, c: &mut Redis, keys: &MintKeys, lease: &str) -> bool {
        let Some(target) = self.minter.reservation_due(self.boot_ms) else {
            return true;
        };
        let r = reserve(c, keys, lease, &self.owner, target, LEAD, Duration::ZERO)
            .await
            .unwrap();
        r.ours
            && self
                .minter
                .raise_ceiling(self.ticket.unwrap(), r.mark_unix_ms)
    }

    /// Mints `n` IDs, moving its boot clock 1 ms per wait, reserving when due.
    async fn mint(&mut self, c: &mut Redis, keys: &MintKeys, lease: &str, n: usize) -> Vec<u64> {
        let mut out = Vec::new();
        while out.len() < n {
            assert!(self.reserve_if_due(c, keys, lease).await, "lease lost");
            match self.minter.mint(self.boot_ms, n, &mut out) {
                Ok(Step::Done) => {}
                Ok(Step::NextMs) => self.boot_ms += 1,
                Err(refusal) => panic!("{refusal:?}"),
            }
        }
        out
    }
}

async fn handover(settled: bool) {
    let redis = RedisServer::start();
    let mut c = RedisTarget::parse(&redis.url())
        .unwrap()
        .connect(secs(2))
        .unwrap();
    let keys = MintKeys::new(PREFIX, APP);
    let lease = worker_key(APP, 5);

    // A worker ID that minted on this node before (a missing mark is raised: mint_script).
    redis.set_stamped(&keys.mark(&lease), 0);
    let mut old = Holder::new("old");
    old.claim(&mut c, &keys, &lease, 0).await;
    let minted_old = old.mint(&mut c, &keys, &lease, 20_000).await;
    if settled {
        let ended = old.minter.stop(Standby::Stopping).unwrap();
        let s = settle(
            &mut c,
            &keys,
            &lease,
            &old.owner,
            ended.settled_unix_ms,
            Duration::ZERO,
        )
        .await
        .unwrap();
        assert!(s.ours);
    }

    // The new holder's clock is 30 s behind: refused, with the wait, until it passes the floor.
    let mut new = Holder::new("new");
    new.claim(&mut c, &keys, &lease, -30_000).await;
    let refusal = new
        .minter
        .mint(new.boot_ms, 1, &mut Vec::new())
        .unwrap_err();
    let MintRefusal::ClockBehind { wait_ms } = refusal else {
        panic!("{refusal:?}")
    };
    assert!(wait_ms > 25_000, "about 30 s: {wait_ms}");
    new.boot_ms += wait_ms;
    let minted_new = new.mint(&mut c, &keys, &lease, 20_000).await;

    // Not settled: the old holder was paused past its lease (a VM pause its boot clock did
    // not count). It wakes just below its ceiling: its reservation is refused, and it mints
    // on only up to the ceiling it had.
    let mut late = Vec::new();
    if !settled {
        let r = reserve(
            &mut c,
            &keys,
            &lease,
            &old.owner,
            unix_ms() + 5_000,
            LEAD,
            Duration::ZERO,
        )
        .await
        .unwrap();
        assert!(!r.ours, "the old holder's reservation is refused");
        let lead = old.minter.mark_lead_ms(old.boot_ms).unwrap();
        old.boot_ms += u64::try_from(lead - 3).unwrap();
        loop {
            match old.minter.mint(old.boot_ms, usize::MAX, &mut late) {
                Ok(_) => old.boot_ms += 1,
                Err(MintRefusal::NeedsReservation) => break,
                Err(other) => panic!("{other:?}"),
            }
        }
        assert_eq!(late.len(), 4 * 4096, "the 4 ms up to its ceiling");
    }

    let newest_old = minted_old.iter().chain(&late).max().unwrap();
    assert!(
        minted_new.iter().min().unwrap() > newest_old,
        "the new holder mints above"
    );
    let all: BTreeSet<u64> = minted_old
        .iter()
        .chain(&late)
        .chain(&minted_new)
        .copied()
        .collect();
    assert_eq!(
        all.len(),
        minted_old.len() + late.len() + minted_new.len(),
        "no ID twice"
    );
}

/// A clean handover (the old holder settled its last timestamp) to a holder 30 s behind: it
/// waits out its own clock, then mints above every old ID.
#[tokio::test(flavor = "current_thread")]
async fn handover_to_a_clock_30s_behind_after_a_settle_mints_above() {
    handover(true).await;
}

/// No settle (a crash, or a pause past the lease): the new holder's floor is the old one's
/// reservation; the old holder, waking after the handover, mints only below that floor.
#[tokio::test(flavor = "current_thread")]
async fn handover_without_a_settle_and_a_waking_old_holder_mint_no_id_twice() {
    handover(false).await;
}
