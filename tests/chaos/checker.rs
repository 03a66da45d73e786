//! The history checker of the fault run: pure functions over recorded samples.
//!
//! # What sampling can and cannot prove
//! A sample is one `GET /id` sent at `sent_us` and answered at `recv_us` (one monotonic clock,
//! µs since the run began). A "published X" answer proves the sidecar published X at *some*
//! instant inside `[sent_us, recv_us]`, nothing more. A run of consecutive samples of one
//! process that all say "published X" is taken as one publish interval; the sidecar is assumed
//! to have held X between them (an unpublish and re-publish of the same ID by the same process
//! between two samples is still one holder of X). Any other sample (none, another ID, no
//! answer, another process generation) ends the run: we never assume a publish we did not see.
//!
//! The interval the checker uses is the part certainly covered: from the *answer* of the first
//! sample to the *send* of the last, `[first.recv_us, last.sent_us]`. Two intervals of one ID
//! from different sidecars are reported only when these certain parts intersect, so a report
//! is a proven double publish (no false positives). The price: overlaps shorter than about one
//! sample period plus one request are missed, and a run of one sample proves nothing.
//!
//! # Apps under `snowlease exec`
//! A slot may also run an app under `snowlease exec`; its samples ([`Source::App`]) say which
//! `WORKER_ID` a live app process of that slot had (read from `/proc`, the process's own
//! environment). An app is a holder like its sidecar: an app still running with ID n while a
//! sidecar (or app) of another slot publishes n is an overlap. The app and the sidecar of one
//! slot are one pod: they never overlap each other.

use std::collections::BTreeMap;

/// What one `GET /id` said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Obs {
    /// 200 with this worker ID.
    Published(u32),
    /// 503: no valid lease (`readopting` kept apart: the earlier process's ID file stays then).
    NotPublished { readopting: bool },
    /// No answer (stopped, killed, not started yet, timed out).
    NoAnswer,
}

/// What a sample looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// The sidecar's `/id` and ID file.
    #[default]
    Sidecar,
    /// The app `snowlease exec` runs in the same slot (its `WORKER_ID`).
    App,
}

/// One sample of one sidecar, or of the app beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Sidecar slot (its pod folder).
    pub sidecar: usize,
    pub source: Source,
    /// Process generation in that slot (bumped at each sidecar restart; for an app, its PID).
    pub generation: u32,
    /// Request sent / answered (or given up), µs on the run's monotonic clock.
    pub sent_us: u64,
    pub recv_us: u64,
    pub obs: Obs,
    /// The ID the ID file named, read right after the answer.
    pub file: Option<u32>,
}

impl Sample {
    /// The ID this sample shows published: `/id`'s, or while re-adopting the ID file's (the
    /// app reads that file; nobody else may hold the ID then, so it counts as a publish).
    pub fn published(&self) -> Option<u32> {
        match self.obs {
            Obs::Published(id) => Some(id),
            Obs::NotPublished { readopting: true } => self.file,
            _ => None,
        }
    }
}

/// A publish interval: the certainly covered part `[start_us, end_us]` (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    pub sidecar: usize,
    pub source: Source,
    pub generation: u32,
    pub id: u32,
    pub start_us: u64,
    pub end_us: u64,
    pub samples: usize,
}

/// Two sidecars whose intervals for one ID provably intersect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub id: u32,
    pub a: Interval,
    pub b: Interval,
}

impl Overlap {
    /// When the overlap began: the later start of its two intervals, µs.
    pub fn began_us(&self) -> u64 {
        self.a.start_us.max(self.b.start_us)
    }
}

/// Index of the last of `starts` (ascending, µs) at or before `at_us`; None if all are later.
pub fn last_at_or_before(starts: &[u64], at_us: u64) -> Option<usize> {
    starts.partition_point(|&s| s <= at_us).checked_sub(1)
}

/// Whether `overlap` began (the later of its two intervals started) during a failover or
/// within `window_us` after one ended; `failovers` are (start, end) in µs.
pub fn follows_failover(overlap: &Overlap, failovers: &[(u64, u64)], window_us: u64) -> bool {
    let began = overlap.began_us();
    failovers
        .iter()
        .any(|&(start, end)| start <= began && began <= end + window_us)
}

/// A sidecar whose ID file named an ID while `/id` said "none" for two samples or more in a
/// row and for longer than [`FILE_LAG_US`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleFile {
    pub sidecar: usize,
    pub id: u32,
    pub from_us: u64,
    /// Send time of the last sample of the run.
    pub until_us: u64,
    pub samples: usize,
}

/// How long the ID file may outlive `/id`'s "none": `/id` answers from the sidecar's HTTP
/// thread the moment the keeper's state changes, while the publisher removes the file on the
/// main thread once that thread runs again and has finished a write in flight (the state and
/// ID files, each written with an fsync, at every renewal). On the 2-core CI machine running
/// the three short runs at once that took up to 295 ms (managed run, 12 samples). The file's
/// deadline is not at stake meanwhile: its state file still names it, and `exec` and `id`
/// judge it.
pub const FILE_LAG_US: u64 = 1_000_000;

impl StaleFile {
    fn counts(&self) -> bool {
        self.samples >= 2 && self.until_us - self.from_us > FILE_LAG_US
    }
}

/// Publish intervals of `samples` (any order; sorted here per sidecar and source by send
/// time). Runs of a single sample are dropped: they prove no interval.
pub fn intervals(samples: &[Sample]) -> Vec<Interval> {
    let mut out = Vec::new();
    for source in [Source::Sidecar, Source::App] {
        let of_source: Vec<Sample> = samples
            .iter()
            .filter(|s| s.source == source)
            .copied()
            .collect();
        intervals_of(&of_source, &mut out);
    }
    out
}

/// [`intervals`] of samples of one source.
fn intervals_of(samples: &[Sample], out: &mut Vec<Interval>) {
    for run in per_sidecar(samples).values() {
        let mut open: Option<(Sample, Sample, usize)> = None;
        for s in run {
            let continues = open.as_ref().is_some_and(|(first, _, _)| {
                first.generation == s.generation && first.published() == s.published()
            });
            match (&mut open, s.published()) {
                (Some((_, last, n)), Some(_)) if continues => {
                    *last = *s;
                    *n += 1;
                }
                _ => {
                    close(out, open.take());
                    open = s.published().map(|_| (*s, *s, 1));
                }
            }
        }
        close(out, open);
    }
}

fn close(out: &mut Vec<Interval>, run: Option<(Sample, Sample, usize)>) {
    let Some((first, last, n)) = run else { return };
    if n < 2 || first.recv_us > last.sent_us {
        return;
    }
    out.push(Interval {
        sidecar: first.sidecar,
        source: first.source,
        generation: first.generation,
        id: first.published().expect("a run is published"),
        start_us: first.recv_us,
        end_us: last.sent_us,
        samples: n,
    });
}

/// Samples of one source grouped by sidecar, each group sorted by send time (the caller
/// keeps sidecar and app samples apart).
pub fn per_sidecar(samples: &[Sample]) -> BTreeMap<usize, Vec<Sample>> {
    let mut by: BTreeMap<usize, Vec<Sample>> = BTreeMap::new();
    for s in samples {
        by.entry(s.sidecar).or_default().push(*s);
    }
    for run in by.values_mut() {
        run.sort_by_key(|s| s.sent_us);
    }
    by
}

/// Every pair of intervals of one ID from different slots (sidecar or app) that intersect
/// (touching ends do not: `[1, 5]` and `[5, 9]` prove nothing).
pub fn overlaps(intervals: &[Interval]) -> Vec<Overlap> {
    let mut out = Vec::new();
    for (i, a) in intervals.iter().enumerate() {
        for b in &intervals[i + 1..] {
            let disjoint = a.end_us <= b.start_us || b.end_us <= a.start_us;
            if a.id == b.id && a.sidecar != b.sidecar && !disjoint {
                out.push(Overlap {
                    id: a.id,
                    a: *a,
                    b: *b,
                });
            }
        }
    }
    out
}

/// Runs of two or more samples in a row, longer than [`FILE_LAG_US`], where the file named an
/// ID while `/id` answered "none" (not re-adopting). No-answer samples end a run: they prove nothing about `/id`.
/// App samples are left out (they read no file).
pub fn stale_files(samples: &[Sample]) -> Vec<StaleFile> {
    let mut out = Vec::new();
    let sidecars: Vec<Sample> = samples
        .iter()
        .filter(|s| s.source == Source::Sidecar)
        .copied()
        .collect();
    for run in per_sidecar(&sidecars).values() {
        let mut cur: Option<StaleFile> = None;
        for s in run {
            let stale = match (s.obs, s.file) {
                (Obs::NotPublished { readopting: false }, Some(id)) => Some(id),
                _ => None,
            };
            match (&mut cur, stale) {
                (Some(c), Some(id)) if c.id == id => {
                    c.samples += 1;
                    c.until_us = s.sent_us;
                }
                (_, stale) => {
                    out.extend(cur.take().filter(StaleFile::counts));
                    cur = stale.map(|id| StaleFile {
                        sidecar: s.sidecar,
                        id,
                        from_us: s.sent_us,
                        until_us: s.sent_us,
                        samples: 1,
                    });
                }
            }
        }
        out.extend(cur.filter(StaleFile::counts));
    }
    out
}

/// The no-ID gap in `run` (one sidecar's samples by send time, see [`per_sidecar`]) that
/// begins in `[from_us, until_us]`: from the last sample showing an ID before it to the first
/// showing one after it (or the last sample, with `ended` false). None when the sidecar showed
/// an ID right before `from_us` and kept it through `until_us`, or had none right before.
pub fn gap_after(run: &[Sample], from_us: u64, until_us: u64) -> Option<Gap> {
    let before = run.iter().rposition(|s| s.sent_us < from_us)?;
    run[before].published()?;
    let lost = before
        + 1
        + run[before + 1..]
            .iter()
            .position(|s| s.published().is_none())?;
    if run[lost].sent_us > until_us {
        return None;
    }
    let from = run[lost - 1].recv_us;
    match run[lost..].iter().find(|s| s.published().is_some()) {
        Some(back) => Some(Gap {
            us: back.sent_us.saturating_sub(from),
            ended: true,
        }),
        None => Some(Gap {
            us: run.last().expect("non-empty").sent_us.saturating_sub(from),
            ended: false,
        }),
    }
}

/// A time a sidecar showed no ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    pub us: u64,
    /// False when the sidecar had no ID again by the end of the run.
    pub ended: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(sidecar: usize, sent_ms: u64, obs: Obs, file: Option<u32>) -> Sample {
        Sample {
            sidecar,
            source: Source::Sidecar,
            generation: 0,
            sent_us: sent_ms * 1000,
            recv_us: sent_ms * 1000 + 2000,
            obs,
            file,
        }
    }

    /// `id` published by `sidecar` at each of `times` (ms).
    fn held(sidecar: usize, id: u32, times: &[u64]) -> Vec<Sample> {
        times
            .iter()
            .map(|&t| s(sidecar, t, Obs::Published(id), Some(id)))
            .collect()
    }

    const NONE: Obs = Obs::NotPublished { readopting: false };

    /// Two sidecars publishing one ID at the same time are reported as an overlap.
    #[test]
    fn overlapping_histories_fail() {
        let mut h = held(0, 3, &[0, 15, 30, 45]);
        h.extend(held(1, 3, &[20, 35, 50]));
        let found = overlaps(&intervals(&h));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].id, 3);
    }

    /// One ID handed over from one sidecar to another (none in between) is no overlap, nor
    /// are two sidecars holding different IDs at once.
    #[test]
    fn handover_and_different_ids_pass() {
        let mut h = held(0, 3, &[0, 15, 30]);
        h.push(s(0, 45, NONE, None));
        h.extend(held(1, 3, &[50, 65, 80]));
        h.extend(held(2, 4, &[0, 15, 30, 45, 60]));
        assert_eq!(overlaps(&intervals(&h)), vec![]);
    }

    /// A gap in sampling (no answer) ends an interval: a sidecar seen with ID 3 before and
    /// after a pause is not assumed to have published it during the pause.
    #[test]
    fn no_answer_splits_an_interval() {
        let mut h = held(0, 3, &[0, 15]);
        h.push(s(0, 30, Obs::NoAnswer, Some(3)));
        h.extend(held(0, 3, &[3000, 3015]));
        h.extend(held(1, 3, &[100, 115, 130]));
        let iv = intervals(&h);
        assert_eq!(iv.iter().filter(|i| i.sidecar == 0).count(), 2, "{iv:?}");
        assert_eq!(overlaps(&iv), vec![]);
    }

    /// Only the certainly covered part counts: answer of the first sample to the send of the
    /// last. Intervals whose sampled ends merely fall within one request of each other pass.
    #[test]
    fn overlap_must_be_proven_by_the_certain_part() {
        // Sidecar 0: last "3" sent at 30 ms (answered 32). Sidecar 1: first "3" sent at 29 ms,
        // answered 31 ms. Certain parts [2, 30] and [31, 60]: disjoint.
        let mut h = held(0, 3, &[0, 30]);
        h.extend(held(1, 3, &[29, 45, 58]));
        assert_eq!(overlaps(&intervals(&h)), vec![]);
        // Shift sidecar 1 one request earlier: [2, 30] and [27, 58] intersect.
        let mut h = held(0, 3, &[0, 30]);
        h.extend(held(1, 3, &[25, 45, 58]));
        assert_eq!(overlaps(&intervals(&h)).len(), 1);
    }

    /// A re-adopting sidecar's ID file counts as a publish of that ID.
    #[test]
    fn readopting_file_counts_as_published() {
        let re = Obs::NotPublished { readopting: true };
        let mut h = vec![
            s(0, 0, re, Some(5)),
            s(0, 15, re, Some(5)),
            s(0, 30, re, Some(5)),
        ];
        h.extend(held(1, 5, &[10, 20, 40]));
        assert_eq!(overlaps(&intervals(&h)).len(), 1);
    }

    /// An app under `exec` that still runs with ID 3 while another slot's sidecar publishes
    /// 3 is an overlap; the same app beside its own sidecar publishing 3 is not.
    #[test]
    fn app_living_past_its_lease_overlaps() {
        let app = |sidecar, times: &[u64]| -> Vec<Sample> {
            held(sidecar, 3, times)
                .into_iter()
                .map(|s| Sample {
                    source: Source::App,
                    file: None,
                    ..s
                })
                .collect()
        };
        let mut h = held(0, 3, &[0, 15, 30]);
        h.extend(app(0, &[5, 20, 35, 50, 65, 80]));
        h.extend(held(1, 3, &[60, 75, 90]));
        let found = overlaps(&intervals(&h));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].a.source, found[0].b.source),
            (Source::Sidecar, Source::App)
        );
        assert_eq!(stale_files(&h), vec![]);
        let mut own = held(0, 3, &[0, 15, 30, 45]);
        own.extend(app(0, &[5, 20, 35]));
        assert_eq!(overlaps(&intervals(&own)), vec![]);
    }

    /// A file naming an ID while /id says none: one sample is lag, two are a failure.
    #[test]
    fn stale_file_needs_two_samples_past_the_write_lag() {
        let mut h = held(0, 2, &[0, 15]);
        h.push(s(0, 30, NONE, Some(2)));
        h.push(s(0, 45, NONE, None));
        assert_eq!(stale_files(&h), vec![]);
        // Two samples within the lag of a write in flight: not stale.
        h.push(s(0, 60, NONE, Some(2)));
        h.push(s(0, 75, NONE, Some(2)));
        assert_eq!(stale_files(&h), vec![]);
        // Past it: stale.
        h.push(s(0, 1_100, NONE, Some(2)));
        let found = stale_files(&h);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].samples, 3);
    }

    /// The fault named before an overlap is the last one that started at or before it.
    #[test]
    fn last_fault_before_an_instant() {
        let starts = [10, 20, 30];
        assert_eq!(last_at_or_before(&starts, 5), None);
        assert_eq!(last_at_or_before(&starts, 20), Some(1));
        assert_eq!(last_at_or_before(&starts, 29), Some(1));
        assert_eq!(last_at_or_before(&starts, 99), Some(2));
    }

    /// The gap after a fault runs from the last sample with an ID to the next one with an ID.
    #[test]
    fn gap_is_measured_between_published_samples() {
        let mut h = held(0, 1, &[0, 15]);
        h.push(s(0, 30, Obs::NoAnswer, Some(1)));
        h.push(s(0, 1000, NONE, None));
        h.extend(held(0, 4, &[2000, 2015]));
        let run = &per_sidecar(&h)[&0];
        let gap = gap_after(run, 20_000, 100_000).expect("a gap");
        assert_eq!(
            gap,
            Gap {
                us: 2_000_000 - 17_000,
                ended: true
            }
        );
        assert_eq!(gap_after(run, 2_010_000, 3_000_000), None);
    }
}
