//! The minter's rules under a fake clock: boot ms and wall ms are plain numbers here.

use super::*;
use crate::worker_id::mint::layout::{DEFAULT_EPOCH_MS, DEFAULT_LAYOUT};

/// Boot ms at claim, and the wall clock then (2026-12-01T00:00:00Z).
const BOOT: u64 = 5_000;
const WALL: u64 = 1_796_083_200_000;
const WINDOW: MintWindow = MintWindow {
    ahead_ms: 5_000,
    low_water_ms: 2_000,
};

/// The ticket of a minter's first lease.
const FIRST: LeaseTicket = LeaseTicket(1);

fn minter(layout: &str) -> Minter {
    Minter::new(
        IdLayout::parse(layout).unwrap(),
        Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), WALL).unwrap(),
        WINDOW,
    )
}

/// A lease on worker 7 claimed at BOOT, valid 60 s, whose mark at claim was `floor`, and a
/// reservation up to `ceiling`.
fn minting(layout: &str, floor: u64, ceiling: u64) -> Minter {
    let mut m = minter(layout);
    m.start(Grant {
        worker_id: 7,
        anchor: Anchor {
            boot_ms: BOOT,
            unix_ms: WALL,
        },
        floor_unix_ms: floor,
        valid_until_boot_ms: BOOT + 60_000,
    });
    assert!(m.raise_ceiling(FIRST, ceiling));
    m
}

fn one(m: &mut Minter, now: u64) -> Result<u64, MintRefusal> {
    let mut out = Vec::new();
    assert_eq!(m.mint(now, 1, &mut out)?, Step::Done);
    Ok(out[0])
}

fn parts(id: u64) -> IdParts {
    let layout = IdLayout::parse(DEFAULT_LAYOUT).unwrap();
    layout.decompose(Epoch::parse("1288834974657", WALL).unwrap(), id)
}

#[test]
fn ids_carry_the_anchored_clock_the_worker_and_a_sequence() {
    let mut m = minting(DEFAULT_LAYOUT, WALL - 100, WALL + 5_000);
    let a = one(&mut m, BOOT + 10).unwrap();
    let b = one(&mut m, BOOT + 10).unwrap();
    let c = one(&mut m, BOOT + 11).unwrap();
    assert_eq!(
        (parts(a).unix_ms, parts(a).worker_id, parts(a).sequence),
        (WALL + 10, 7, 0)
    );
    assert_eq!((parts(b).unix_ms, parts(b).sequence), (WALL + 10, 1));
    assert_eq!((parts(c).unix_ms, parts(c).sequence), (WALL + 11, 0));
    assert_eq!(m.last_minted(), Some(WALL + 11));
    assert_eq!(m.worker_id(), Some(7));
}

/// The wall clock steps 30 s back: the minting clock runs on the boot clock and never sees
/// it; a re-anchor to the stepped clock is refused, and every next ID is larger.
#[test]
fn a_30s_wall_step_back_never_yields_a_smaller_timestamp() {
    let mut m = minting(DEFAULT_LAYOUT, WALL - 100, WALL + 5_000);
    let before = one(&mut m, BOOT + 1_000).unwrap();
    let stepped = Anchor {
        boot_ms: BOOT + 1_001,
        unix_ms: WALL + 1_001 - 30_000,
    };
    assert!(!m.reanchor(FIRST, stepped), "backwards: refused");
    let after = one(&mut m, BOOT + 1_001).unwrap();
    assert!(after > before);
    assert_eq!(parts(after).unix_ms, WALL + 1_001);
}

/// The wall clock steps 3 s forward: re-anchoring moves the minting clock ahead, IDs keep
/// rising, and past the ceiling minting waits for a reservation.
#[test]
fn a_step_forward_reanchors_ahead_within_the_ceiling() {
    let mut m = minting(DEFAULT_LAYOUT, WALL - 100, WALL + 5_000);
    let before = one(&mut m, BOOT + 1_000).unwrap();
    assert!(m.reanchor(
        FIRST,
        Anchor {
            boot_ms: BOOT + 1_000,
            unix_ms: WALL + 4_000,
        }
    ));
    let after = one(&mut m, BOOT + 1_000).unwrap();
    assert!(after > before);
    assert_eq!(parts(after).unix_ms, WALL + 4_000);
    assert_eq!(m.reservation_due(BOOT + 1_000), Some(WALL + 9_000));
    assert_eq!(
        one(&mut m, BOOT + 2_001),
        Err(MintRefusal::NeedsReservation)
    );
    m.raise_ceiling(FIRST, WALL + 9_000);
    assert_eq!(
        parts(one(&mut m, BOOT + 2_001).unwrap()).unix_ms,
        WALL + 5_001
    );
}

/// 2 sequence bits: 4 IDs per ms. A batch of 10 fills this ms, asks for the next, and goes
/// on there; every ID of the batch is larger than the one before.
#[test]
fn an_exhausted_sequence_waits_for_the_next_ms_and_a_batch_spans_several() {
    let mut m = minting("41:10:2", WALL - 100, WALL + 5_000);
    let mut out = Vec::new();
    let mut waits = 0;
    let mut now = BOOT + 1;
    while m.mint(now, 10, &mut out).unwrap() == Step::NextMs {
        waits += 1;
        assert_eq!(
            m.mint(now, 10, &mut out),
            Ok(Step::NextMs),
            "same ms: no more"
        );
        now += 1;
    }
    assert_eq!(out.len(), 10);
    assert_eq!(waits, 2, "4 + 4 + 2");
    assert!(out.windows(2).all(|w| w[0] < w[1]), "{out:?}");
    assert_eq!(m.last_minted(), Some(WALL + 3));
}

/// A `now` read before another caller minted at a later ms (a race outside the lock) keeps
/// the later timestamp: never a repeat.
#[test]
fn an_older_now_continues_on_the_last_timestamp() {
    let mut m = minting(DEFAULT_LAYOUT, WALL - 100, WALL + 5_000);
    let late = one(&mut m, BOOT + 50).unwrap();
    let stale = one(&mut m, BOOT + 40).unwrap();
    assert!(stale > late);
    assert_eq!(parts(stale).unix_ms, WALL + 50);
}

/// Nothing above the ceiling: a fresh lease mints nothing before its first reservation;
/// the reservation is due at the low water and asks for the window ahead.
#[test]
fn the_ceiling_holds_until_a_reservation_raises_it() {
    let mut m = minting(DEFAULT_LAYOUT, WALL - 100, 0);
    assert_eq!(
        one(&mut m, BOOT),
        Err(MintRefusal::NeedsReservation),
        "nothing reserved yet"
    );
    assert_eq!(m.reservation_due(BOOT), Some(WALL + 5_000));
    m.raise_ceiling(FIRST, WALL + 5_000);
    assert_eq!(m.mark_lead_ms(BOOT), Some(5_000));
    assert_eq!(
        m.reservation_due(BOOT + 2_999),
        None,
        "lead 2001 ms: above low water"
    );
    assert_eq!(m.reservation_due(BOOT + 3_001), Some(WALL + 8_001));
    assert!(one(&mut m, BOOT + 5_000).is_ok(), "at the ceiling");
    assert_eq!(
        one(&mut m, BOOT + 5_001),
        Err(MintRefusal::NeedsReservation)
    );
    assert_eq!(m.mark_lead_ms(BOOT + 5_001), Some(-1));
    m.raise_ceiling(FIRST, WALL + 1_000);
    assert_eq!(
        one(&mut m, BOOT + 5_001),
        Err(MintRefusal::NeedsReservation),
        "only rises"
    );
}

/// At the validity deadline minting stops, whatever was reserved; an extension moves it.
#[test]
fn nothing_is_minted_at_or_after_the_deadline() {
    let mut m = minting(DEFAULT_LAYOUT, WALL - 100, WALL + 600_000);
    assert!(one(&mut m, BOOT + 59_999).is_ok());
    assert_eq!(one(&mut m, BOOT + 60_000), Err(MintRefusal::LeaseInvalid));
    assert_eq!(one(&mut m, BOOT + 90_000), Err(MintRefusal::LeaseInvalid));
    m.extend(FIRST, BOOT + 120_000);
    assert!(one(&mut m, BOOT + 90_000).is_ok());
}

/// The floor is the previous holders' mark: while the clock is at or below it (here 30 s
/// behind), minting is refused with the wait; then every timestamp is above it.
#[test]
fn the_floor_refuses_a_clock_behind_with_the_wait() {
    let floor = WALL + 30_000;
    let mut m = minting(DEFAULT_LAYOUT, floor, WALL + 40_000);
    assert_eq!(
        one(&mut m, BOOT),
        Err(MintRefusal::ClockBehind { wait_ms: 30_001 })
    );
    assert_eq!(
        one(&mut m, BOOT + 30_000),
        Err(MintRefusal::ClockBehind { wait_ms: 1 })
    );
    assert_eq!(
        MintRefusal::ClockBehind { wait_ms: 1 }.state(),
        "clock_behind"
    );
    assert_eq!(
        parts(one(&mut m, BOOT + 30_001).unwrap()).unix_ms,
        floor + 1
    );
}

/// Without a lease every call is refused with the standby's state; a stop hands the release
/// the last minted timestamp (the floor when none was).
#[test]
fn standby_refuses_and_a_stop_leaves_the_last_timestamp() {
    let mut m = minter(DEFAULT_LAYOUT);
    assert_eq!(
        one(&mut m, BOOT),
        Err(MintRefusal::NoLease(Standby::Claiming))
    );
    assert_eq!(m.stop(Standby::Lost), None);
    assert_eq!(MintRefusal::NoLease(Standby::Lost).state(), "lost");

    let mut m = minting(DEFAULT_LAYOUT, WALL - 100, WALL + 5_000);
    assert_eq!(
        m.clone().stop(Standby::Stopping),
        Some(Ended {
            worker_id: 7,
            settled_unix_ms: WALL - 100
        })
    );
    one(&mut m, BOOT + 20).unwrap();
    let ended = m.stop(Standby::Stopping).unwrap();
    assert_eq!(ended.settled_unix_ms, WALL + 20);
    assert_eq!(
        one(&mut m, BOOT + 21),
        Err(MintRefusal::NoLease(Standby::Stopping))
    );
    assert_eq!(m.reservation_due(BOOT + 21), None);
}

/// A timestamp past the layout's end is refused, never wrapped into a small or negative ID.
#[test]
fn a_timestamp_past_the_layout_is_refused() {
    let layout = IdLayout::parse("30:10:12").unwrap();
    let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), WALL).unwrap();
    let mut m = Minter::new(layout, epoch, WINDOW);
    let end = layout.overflows_at(epoch);
    m.start(Grant {
        worker_id: 1,
        anchor: Anchor {
            boot_ms: BOOT,
            unix_ms: end - 1,
        },
        floor_unix_ms: end - 10,
        valid_until_boot_ms: BOOT + 60_000,
    });
    m.raise_ceiling(FIRST, end + 5_000);
    assert!(one(&mut m, BOOT).is_ok());
    assert_eq!(one(&mut m, BOOT + 1), Err(MintRefusal::LayoutExhausted));
}

/// A reply for a lease that ended (a renew, a reservation, a clock reading that arrives
/// after a loss and a new claim) changes nothing of the next lease: another worker ID's mark
/// says nothing of this one's.
#[test]
fn changes_for_an_ended_lease_leave_the_next_one_alone() {
    let mut m = minting(DEFAULT_LAYOUT, WALL - 100, WALL + 5_000);
    m.stop(Standby::Lost);
    assert!(!m.raise_ceiling(FIRST, WALL + 9_000), "no lease");
    let next = m.start(Grant {
        worker_id: 9,
        anchor: Anchor {
            boot_ms: BOOT,
            unix_ms: WALL,
        },
        floor_unix_ms: WALL - 50,
        valid_until_boot_ms: BOOT + 1_000,
    });
    assert_ne!(next, FIRST);
    assert!(!m.raise_ceiling(FIRST, WALL + 9_000));
    assert!(!m.extend(FIRST, BOOT + 60_000));
    let ahead = Anchor {
        boot_ms: BOOT,
        unix_ms: WALL + 1_000,
    };
    assert!(!m.reanchor(FIRST, ahead));
    assert_eq!(
        one(&mut m, BOOT),
        Err(MintRefusal::NeedsReservation),
        "ceiling untouched"
    );
    assert!(m.raise_ceiling(next, WALL + 5_000));
    assert_eq!(
        one(&mut m, BOOT + 1_000),
        Err(MintRefusal::LeaseInvalid),
        "deadline untouched"
    );
    assert!(m.reanchor(next, ahead));
}
