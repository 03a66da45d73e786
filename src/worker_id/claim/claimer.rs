//! [`Claimer`]: the claims of one keeper over its ID range (docs/worker.md,
//! "Claim" and "Claim windows"). Key names and script calls are built once
//! per keeper, not per claim, each window's when it is first used (a claim
//! over 1024 IDs calls one or two of 64: building all 32 windows of the
//! earlier layout cost a sidecar's first claim 90-100 us on the 2-core VM).
//! A range of at most 32 IDs is one window: the lowest free ID, as ever. A
//! larger one goes a window of at most 16 interleaved IDs per call (window
//! `w` of `n`: IDs `w, w + n, ...`), starting in the window of the ID last
//! held (else one picked by the owner string), then where the claim hint
//! points, then on in order, until an ID is taken or every window was
//! looked at.

use std::time::Duration;

use redis::{Cmd, ErrorKind, ServerErrorKind};

use super::windows::{ClaimWindow, Walk, start_window, window_of, windows};
use super::{ClaimOutcome, ClaimReply, GuardFound, LeaseKeys, claim_cmd, run_claim};
use crate::connection::{Keyspace, Redis};
use crate::identity::Owner;
use crate::timing::ttl_ms;
use crate::worker_id::range::WorkerRange;

/// One keeper's claims over its range of worker IDs (`--worker-ids`); keeps
/// what the next claim needs (built commands, the window of a call whose
/// reply was lost). Windows, `ids` and `sent` count from the range's low end
/// (offsets); lease keys, replies and the claim hint carry the real ID.
pub struct Claimer {
    keys: LeaseKeys,
    range: WorkerRange,
    /// The lease key of each ID, in ID order (index: offset from the low end).
    ids: Vec<String>,
    windows: Vec<ClaimWindow>,
    /// One server: each window's `EVALSHA` for `built_for`, built when the
    /// window is first called (a claim calls one or two of up to 64).
    cmds: Vec<Option<Cmd>>,
    built_for: Option<(String, Duration)>,
    /// Cluster: each window's keys to read (its lease keys, then the hint
    /// over 32 IDs), built when the window is first read.
    reads: Vec<Option<Vec<String>>>,
    /// The window of the last call whose reply never came, or of the ID
    /// last claimed or adopted: our key may be there, so the next claim
    /// looks there first (and adopts it while it holds our owner string).
    resume: Option<usize>,
    /// Per offset: a claim call that may write its key was sent (its reply may
    /// have been lost), so the key may hold our owner string: the stop
    /// releases these keys only, O(window) instead of O(range).
    sent: Vec<bool>,
}

impl Claimer {
    /// Claims over IDs `0..=max_worker_id` of the app `keys` name.
    pub fn new(keys: &LeaseKeys, max_worker_id: u16) -> Self {
        Self::over(keys, WorkerRange::up_to(max_worker_id))
    }

    /// Claims over the IDs of `range` of the app `keys` name: the windows of a
    /// range of its size, shifted to start at its low end.
    pub fn over(keys: &LeaseKeys, range: WorkerRange) -> Self {
        let windows = windows(range.high() - range.low());
        Self {
            keys: keys.clone(),
            range,
            ids: keys.ids(range),
            reads: vec![None; windows.len()],
            windows,
            cmds: Vec::new(),
            built_for: None,
            resume: None,
            sent: vec![false; range.len() as usize],
        }
    }

    /// The worker ID at `offset` from the range's low end.
    fn worker_id(&self, offset: usize) -> usize {
        usize::from(self.range.low()) + offset
    }

    /// The IDs whose keys a claim call of this claimer was sent for (any of
    /// them may hold the owner string it sent, also when its reply was
    /// lost), in ID order.
    pub(crate) fn sent_ids(&self) -> impl Iterator<Item = u16> + '_ {
        self.sent
            .iter()
            .enumerate()
            .filter(|(_, sent)| **sent)
            .map(|(offset, _)| u16::try_from(self.worker_id(offset)).expect("at most 1023"))
    }

    /// Adopts a key of the range that holds our owner string, else claims a
    /// free ID: the lowest free one of a range of at most 32 IDs; of a
    /// larger range the lowest free one of the first window with one (see
    /// the module docs). One server: one `claim.lua` call per window, all
    /// behind the app's guard (a closed guard pauses the whole claim).
    /// Cluster: per window a single-key `MGET` of its lease keys (one
    /// pipeline per node, at once), then `claim.lua` on one (lease key,
    /// per-ID guard) pair per call, free IDs in ID order; a closed guard
    /// (its shard lost data) skips only its ID, and so does `TRYAGAIN` (its
    /// slot is being migrated), which is the error only when no ID is taken.
    ///
    /// A transient error may hide a claim that ran; the next claim starts in
    /// the window of that call, so it finds and adopts that key instead of
    /// taking a second one. Errors: Redis errors (the first connect's
    /// included).
    pub async fn claim(
        &mut self,
        conn: &mut Redis,
        owner: &Owner,
        ttl: Duration,
    ) -> redis::RedisResult<ClaimReply> {
        let start = self
            .resume
            .unwrap_or_else(|| start_window(owner.as_str(), self.windows.len()));
        let walk = Walk::new(self.windows.len(), start);
        match conn.keyspace().await? {
            Keyspace::Whole => self.claim_whole(conn, owner, ttl, walk).await,
            Keyspace::Slots => self.claim_slots(conn, owner, ttl, walk).await,
        }
    }

    /// The call of `window` for `owner` and `ttl`, built at its first use
    /// (every window's again when the owner or TTL changed).
    fn cmd(&mut self, window: usize, owner: &Owner, ttl: Duration) -> &Cmd {
        let built = self.built_for.as_ref();
        if !built.is_some_and(|(o, t)| o == owner.as_str() && *t == ttl) {
            self.cmds = vec![None; self.windows.len()];
            self.built_for = Some((owner.as_str().to_owned(), ttl));
        }
        let (keys, windows, ids) = (&self.keys, &self.windows, &self.ids);
        let low = usize::from(self.range.low());
        self.cmds[window].get_or_insert_with(|| {
            let (guard, hint) = (keys.guard(), keys.hint());
            let this = &windows[window];
            let mut pairs: Vec<&str> = this
                .ids()
                .flat_map(|id| [ids[id].as_str(), guard.as_str()])
                .collect();
            // One window: the seed's call, no hint.
            let windowed = windows.len() > 1;
            let id = |n: usize| u16::try_from(n).expect("at most 1024 IDs");
            let first = windowed.then(|| (id(low + this.first), id(this.step)));
            if windowed {
                pairs.push(&hint);
            }
            claim_cmd(&pairs, owner, ttl, first)
        })
    }

    /// One server: a call per window until one answers other than "all
    /// held".
    async fn claim_whole(
        &mut self,
        conn: &mut Redis,
        owner: &Owner,
        ttl: Duration,
        mut walk: Walk,
    ) -> redis::RedisResult<ClaimReply> {
        let (mut wrong_type, mut calls) = (Vec::new(), 0);
        loop {
            let window = walk.current();
            self.resume = Some(window);
            for id in self.windows[window].ids() {
                self.sent[id] = true;
            }
            let (reply, hint) = run_claim(conn, self.cmd(window, owner, ttl)).await?;
            calls += 1;
            let (ids, low) = (&self.windows[window], usize::from(self.range.low()));
            wrong_type.extend(reply.wrong_type.iter().map(|i| low + ids.id(*i)));
            let outcome = match reply.outcome {
                ClaimOutcome::Claimed(i) => ClaimOutcome::Claimed(low + ids.id(i)),
                ClaimOutcome::Adopted(i) => ClaimOutcome::Adopted(low + ids.id(i)),
                ClaimOutcome::AllHeld => {
                    let hinted = hint.and_then(|id| self.window_of(id));
                    if walk.advance(hinted).is_some() {
                        continue;
                    }
                    ClaimOutcome::AllHeld
                }
                paused @ ClaimOutcome::Paused { .. } => paused,
            };
            self.resume = match outcome {
                ClaimOutcome::Claimed(_) | ClaimOutcome::Adopted(_) => Some(window),
                _ => None,
            };
            return Ok(ClaimReply {
                outcome,
                wrong_type,
                expires_ms: reply.expires_ms,
                other_shards_kept_data: false,
                calls,
            });
        }
    }

    /// Cluster: per window a read, then a call per free ID, until one is
    /// taken; paused windows do not stop the walk (other shards may have
    /// kept their data). The read is only a hint: each call decides on its
    /// own slot. Over 32 IDs the read takes the claim hint along (its own
    /// slot: no script can set it with a lease key, so the claimer sets it
    /// after a claim, without waiting for the reply).
    async fn claim_slots(
        &mut self,
        conn: &mut Redis,
        owner: &Owner,
        ttl: Duration,
        mut walk: Walk,
    ) -> redis::RedisResult<ClaimReply> {
        let mut found = Found::default();
        loop {
            self.resume = Some(walk.current());
            self.build_read(walk.current());
            let claimed = self
                .claim_slot_window(conn, owner, ttl, walk.current(), &mut found)
                .await;
            for id in found.sent.drain(..) {
                self.sent[id] = true;
            }
            if let Some(reply) = claimed? {
                if let (ClaimOutcome::Claimed(id), true) = (&reply.outcome, self.windows.len() > 1)
                {
                    self.set_hint(conn, *id, ttl);
                }
                return Ok(reply);
            }
            let hinted = found.hint.and_then(|id| self.window_of(id));
            if walk.advance(hinted).is_none() {
                self.resume = None;
                if let Some(err) = found.unstable.take() {
                    return Err(err);
                }
                return Ok(found.into_reply());
            }
        }
    }

    /// The next claim starts in the window of `worker_id` (a lease held
    /// another way: the state file's), where it adopts that key while it
    /// still holds our owner string.
    pub(crate) fn resume_at(&mut self, worker_id: u16) {
        self.resume = self.window_of(worker_id);
    }

    /// Builds the keys Cluster reads of `window` unless built: its lease
    /// keys, then over 32 IDs the hint.
    fn build_read(&mut self, window: usize) {
        let (ids, keys, this) = (&self.ids, &self.keys, &self.windows[window]);
        let windowed = self.windows.len() > 1;
        self.reads[window].get_or_insert_with(|| {
            let mut read: Vec<String> = this.ids().map(|id| ids[id].clone()).collect();
            if windowed {
                read.push(keys.hint());
            }
            read
        });
    }

    /// The window that holds a hint's `id`; None outside the range (a
    /// sidecar of the app with another range set it).
    fn window_of(&self, id: u16) -> Option<usize> {
        let offset = usize::from(id.checked_sub(self.range.low())?);
        (offset < self.ids.len()).then(|| window_of(offset, self.windows.len()))
    }

    /// Cluster: the hint names `id` for a TTL, sent on a clone of the
    /// connection without waiting (a lost hint costs a later claim a read).
    fn set_hint(&self, conn: &Redis, id: usize, ttl: Duration) {
        let (mut conn, mut set) = (conn.clone(), redis::cmd("SET"));
        set.arg(self.keys.hint()).arg(id).arg("PX").arg(ttl_ms(ttl));
        tokio::spawn(async move { set.query_async::<()>(&mut conn).await });
    }

    /// One Cluster window: the read, then a call per candidate. Some when
    /// an ID was taken or adopted.
    async fn claim_slot_window(
        &self,
        conn: &mut Redis,
        owner: &Owner,
        ttl: Duration,
        index: usize,
        found: &mut Found,
    ) -> redis::RedisResult<Option<ClaimReply>> {
        let window = &self.windows[index];
        // One single-key MGET per ID (nil for a key of another type too), one
        // pipeline per node, all at once (a multi-slot MGET, split by redis-rs,
        // failed with a result-count mismatch during a failover).
        let read = self.reads[index].as_deref().expect("built by claim_slots");
        let mut values = conn.read_each(read).await?;
        if values.len() > window.len {
            found.hint = values.pop().flatten().and_then(|v| v.parse().ok());
        }
        found.calls += 1;
        found.held |= values.iter().any(Option::is_some);
        let ours = values
            .iter()
            .position(|v| v.as_deref() == Some(owner.as_str()));
        let candidates: Vec<usize> = match ours {
            Some(index) => vec![index],
            None => (0..values.len()).filter(|i| values[*i].is_none()).collect(),
        };
        for offset in candidates.into_iter().map(|i| window.id(i)) {
            let index = self.worker_id(offset);
            let guard = self
                .keys
                .id_guard(u16::try_from(index).expect("at most 1023"));
            let pair = [&self.ids[offset], &guard];
            let cmd = claim_cmd(&pair, owner, ttl, None);
            found.sent.push(offset);
            let (reply, _) = match run_claim(conn, &cmd).await {
                Ok(reply) => reply,
                // The slot is being migrated and the pair is split between the two
                // nodes: the script did not run. Skip the ID; the claim fails with this
                // error only when it takes no other.
                Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::TryAgain) => {
                    found.unstable.get_or_insert(err);
                    continue;
                }
                Err(err) => return Err(err),
            };
            found.calls += 1;
            found
                .wrong_type
                .extend(reply.wrong_type.iter().map(|_| index));
            match reply.outcome {
                ClaimOutcome::Claimed(_) | ClaimOutcome::Adopted(_) => {
                    let outcome = match reply.outcome {
                        ClaimOutcome::Adopted(_) => ClaimOutcome::Adopted(index),
                        _ => ClaimOutcome::Claimed(index),
                    };
                    return Ok(Some(ClaimReply {
                        outcome,
                        wrong_type: std::mem::take(&mut found.wrong_type),
                        expires_ms: reply.expires_ms,
                        other_shards_kept_data: false,
                        calls: found.calls,
                    }));
                }
                ClaimOutcome::Paused { wait, guard } => found.paused(wait, guard),
                // Taken meanwhile, or another type; an open guard existed.
                ClaimOutcome::AllHeld => found.guard_existed = true,
            }
        }
        Ok(None)
    }
}

/// What a Cluster claim found in the windows it looked at.
#[derive(Default)]
struct Found {
    calls: u32,
    wrong_type: Vec<usize>,
    /// Soonest opening and most telling finding of the closed guards.
    paused: Option<(Duration, GuardFound)>,
    /// A lease key of the app exists.
    held: bool,
    /// A guard was found set (open, or closed as set before).
    guard_existed: bool,
    /// The ID the claim hint named at the last read.
    hint: Option<u16>,
    /// A free ID skipped: its slot is being migrated (`TRYAGAIN`).
    unstable: Option<redis::RedisError>,
    /// Offsets of the IDs a claim call was sent for in the window at hand.
    sent: Vec<usize>,
}

impl Found {
    fn paused(&mut self, wait: Duration, guard: GuardFound) {
        self.guard_existed |= guard != GuardFound::Missing;
        self.paused = Some(match self.paused {
            None => (wait, guard),
            Some((w, g)) => (w.min(wait), g.more_telling(guard)),
        });
    }

    /// No ID taken: paused behind the soonest guard, else all held.
    fn into_reply(self) -> ClaimReply {
        let outcome = match self.paused {
            Some((wait, guard)) => ClaimOutcome::Paused { wait, guard },
            None => ClaimOutcome::AllHeld,
        };
        let missing = matches!(
            outcome,
            ClaimOutcome::Paused {
                guard: GuardFound::Missing,
                ..
            }
        );
        ClaimReply {
            outcome,
            wrong_type: self.wrong_type,
            expires_ms: 0,
            other_shards_kept_data: missing && (self.held || self.guard_existed),
            calls: self.calls,
        }
    }
}

/// One claim over `0..=max_worker_id` by a [`Claimer`] of its own (tests and
/// one-off callers; a keeper keeps its claimer). See [`Claimer::claim`].
///
/// Errors: Redis errors (the first connect's included).
pub async fn claim_lowest(
    conn: &mut Redis,
    keys: &LeaseKeys,
    max_worker_id: u16,
    owner: &Owner,
    ttl: Duration,
) -> redis::RedisResult<ClaimReply> {
    Claimer::new(keys, max_worker_id)
        .claim(conn, owner, ttl)
        .await
}
