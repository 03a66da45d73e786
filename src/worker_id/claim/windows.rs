//! Claim windows (docs/worker.md, "Claim windows"): a range of more than
//! [`WINDOW`] IDs is claimed one window of at most 64 IDs per script call,
//! so no call holds Redis for long; where a claim starts and where it looks
//! next. Pure functions; the calls are in `claimer.rs`.

use std::ops::Range;

/// IDs per window: one `claim.lua` call over 64 pairs costs Redis about
/// 45 us (128 keys; 1024 IDs in one call cost 700 us, docs/worker.md).
pub(crate) const WINDOW: usize = 64;

/// The windows of IDs `0..=max_worker_id`: `[0, 64)`, `[64, 128)`, ...,
/// the last one shorter when the range is no multiple of 64. A range of at
/// most 64 IDs is one window.
pub(crate) fn windows(max_worker_id: u16) -> Vec<Range<usize>> {
    let count = usize::from(max_worker_id) + 1;
    (0..count)
        .step_by(WINDOW)
        .map(|first| first..(first + WINDOW).min(count))
        .collect()
}

/// The window a claim by `owner` starts in: spread over the windows by a
/// hash of the owner string (its nonce is random), so sidecars started at
/// once mostly claim in different windows, and a retry with the same owner
/// string (a reply that was lost) starts where the first try did.
pub(crate) fn start_window(owner: &str, count: usize) -> usize {
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

    #[test]
    fn ranges_split_into_windows_of_64() {
        assert_eq!(windows(31), vec![0..32]);
        assert_eq!(windows(63), vec![0..64]);
        assert_eq!(windows(64), vec![0..64, 64..65]);
        assert_eq!(windows(99), vec![0..64, 64..100]);
        let all = windows(1023);
        assert_eq!(all.len(), 16);
        assert!(all.iter().all(|w| w.len() == WINDOW));
        assert_eq!(all[15], 960..1024);
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
