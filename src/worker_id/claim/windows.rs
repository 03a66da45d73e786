//! Claim windows (docs/worker.md, "Claim windows"): a range of more than
//! [`ONE_WINDOW_MAX`] IDs is claimed one window of at most [`WINDOW`] IDs
//! per script call, so no call holds Redis longer than the default range's
//! claim does; which IDs a window holds, where a claim starts and where it
//! looks next. Pure functions; the calls are in `claimer.rs`.

/// Most IDs of a range claimed in one window, the default range's size:
/// the seed's rule (the lowest free ID) holds up to here.
pub(crate) const ONE_WINDOW_MAX: usize = 32;

/// Most IDs per window of a larger range. The windows of a large range
/// differ from claim to claim, unlike the one window of a small range, and
/// cost Redis more per key: measured with the claims bench (a new sidecar
/// per claim, 1024 IDs, half taken), windows of 32 cost 84-87 us of Redis
/// time per call and 69-74 of 300 calls went over 100 us, windows of 16
/// 60 us and 11-19, against 40-60 us for the default 32-ID claim
/// (docs/worker.md, "Claim windows").
pub(crate) const WINDOW: usize = 16;

/// The worker IDs of one window: `first`, `first + step`, ... (`len` IDs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimWindow {
    /// The window's lowest worker ID (0-1023), also its number.
    pub first: usize,
    /// The step between its IDs: the number of windows of the range.
    pub step: usize,
    /// How many IDs it holds (1-32).
    pub len: usize,
}

impl ClaimWindow {
    /// The worker ID of the window's `index`-th pair.
    pub fn id(&self, index: usize) -> usize {
        self.first + index * self.step
    }

    /// The window's worker IDs, in ID order.
    pub fn ids(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len).map(|index| self.id(index))
    }
}

/// The windows of IDs `0..=max_worker_id`: a range of at most 32 IDs is
/// one window (`0, 1, 2, ...`); a larger one is split into `n = ceil(IDs /
/// 16)` windows that interleave: window `w` holds the IDs `w, w + n, w +
/// 2n, ...` (1024 IDs: 64 windows of 16, window 3 = 3, 67, 131, ...). Each
/// window samples the whole range, so a range filled from its low end (the
/// lowest free ID first, as the seed's rule and older sidecars claim)
/// leaves free IDs in every window until the whole range is nearly full,
/// and claims in any window take low IDs first.
pub fn windows(max_worker_id: u16) -> Vec<ClaimWindow> {
    let count = usize::from(max_worker_id) + 1;
    let n = if count <= ONE_WINDOW_MAX {
        1
    } else {
        count.div_ceil(WINDOW)
    };
    (0..n)
        .map(|first| ClaimWindow {
            first,
            step: n,
            len: (count - first).div_ceil(n),
        })
        .collect()
}

/// The window that holds worker ID `id` among `count` windows.
pub fn window_of(id: usize, count: usize) -> usize {
    id % count.max(1)
}

/// The window a claim by `owner` starts in: spread over the windows by a
/// hash of the owner string (its nonce is random), so sidecars started at
/// once mostly claim in different windows, and a retry with the same owner
/// string (a reply that was lost) starts where the first try did.
pub fn start_window(owner: &str, count: usize) -> usize {
    // FNV-1a: stable across builds and processes, unlike std's hasher.
    let hash = owner.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    usize::try_from(hash % count.max(1) as u64).expect("below count")
}

/// The windows one claim has looked at, and where it looks next.
#[derive(Debug)]
pub(crate) struct Walk {
    seen: Vec<bool>,
    current: usize,
}

impl Walk {
    /// A walk over `count` windows that starts at `start`.
    pub(crate) fn new(count: usize, start: usize) -> Self {
        let mut seen = vec![false; count];
        seen[start] = true;
        Self {
            seen,
            current: start,
        }
    }

    /// The window to look at now.
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// The current window had no free ID: moves to the window of the ID
    /// the hint names (where the last claim found one) when not looked at
    /// yet, else to the next window not looked at, wrapping. None when
    /// every window was looked at.
    pub(crate) fn advance(&mut self, hinted: Option<usize>) -> Option<usize> {
        let count = self.seen.len();
        let next = hinted
            .filter(|w| *w < count && !self.seen[*w])
            .or_else(|| {
                (1..count)
                    .map(|step| (self.current + step) % count)
                    .find(|w| !self.seen[*w])
            })?;
        self.seen[next] = true;
        self.current = next;
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(window: &ClaimWindow) -> Vec<usize> {
        window.ids().collect()
    }

    #[test]
    fn ranges_split_into_interleaved_windows_of_at_most_16() {
        let one = windows(31);
        assert_eq!(one.len(), 1);
        assert_eq!(ids(&one[0]), (0..32).collect::<Vec<_>>());
        assert_eq!(ids(&windows(0)[0]), vec![0]);
        let three = windows(32);
        assert_eq!(three.len(), 3);
        assert_eq!(ids(&three[0]), (0..33).step_by(3).collect::<Vec<_>>());
        assert_eq!(ids(&three[2]), (2..33).step_by(3).collect::<Vec<_>>());
        let uneven = windows(99);
        assert_eq!(uneven.len(), 7);
        assert_eq!(
            uneven.iter().map(|w| w.len).collect::<Vec<_>>(),
            [15, 15, 14, 14, 14, 14, 14]
        );
        let all = windows(1023);
        assert_eq!(all.len(), 64);
        assert!(all.iter().all(|w| w.len == WINDOW));
        assert_eq!(ids(&all[63])[..3], [63, 127, 191]);
        assert_eq!(all[63].id(15), 1023);
        // Every ID in exactly one window, and window_of finds it.
        for max in [32u16, 63, 64, 99, 200, 1000, 1023] {
            let ws = windows(max);
            let mut seen = vec![0; usize::from(max) + 1];
            for (w, window) in ws.iter().enumerate() {
                assert!(window.len <= WINDOW, "{max}: {window:?}");
                for id in window.ids() {
                    seen[id] += 1;
                    assert_eq!(window_of(id, ws.len()), w);
                }
            }
            assert!(seen.iter().all(|n| *n == 1), "{max}");
        }
    }

    /// Starts spread over the windows, the same for the same owner string.
    #[test]
    fn the_start_follows_the_owner_string() {
        assert_eq!(start_window("10.0.0.1#00aa", 1), 0);
        let a = start_window("10.0.0.1#00aa", 16);
        assert_eq!(a, start_window("10.0.0.1#00aa", 16));
        let starts: std::collections::BTreeSet<usize> = (0..200)
            .map(|n| start_window(&format!("10.0.0.1#{n:016x}"), 16))
            .collect();
        assert_eq!(starts.len(), 16, "{starts:?}");
    }

    /// Hint first, then on in order, wrapping; every window once.
    #[test]
    fn the_walk_follows_the_hint_then_goes_round() {
        let mut walk = Walk::new(4, 2);
        assert_eq!(walk.current(), 2);
        assert_eq!(walk.advance(Some(0)), Some(0), "the hint's window");
        assert_eq!(walk.advance(Some(2)), Some(1), "seen: on in order");
        assert_eq!(walk.advance(None), Some(3));
        assert_eq!(walk.advance(Some(7)), None, "all seen");
        let mut one = Walk::new(1, 0);
        assert_eq!(one.advance(Some(0)), None);
    }
}
