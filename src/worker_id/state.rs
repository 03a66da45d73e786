//! The worker-ID lease state as its readers see it: the ID file
//! publisher, HTTP and metrics read [`WorkerState`] from a `watch` channel
//! that only the keeper writes; [`RecordedLease`] is what the state file
//! of an earlier process in this pod says.

use std::time::Duration;

use crate::boot_clock::BootInstant;

use crate::identity::Owner;
use crate::lease;

/// What the sidecar can say about its lease right now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WorkerState {
    /// No lease yet; claiming.
    Claiming,
    /// Start-up with a lease recorded by an earlier process in this pod,
    /// valid (by its record, erring early) until the given instant; being
    /// re-adopted. Not published over HTTP, but the ID file may stay until
    /// that instant so a sidecar restart does not stop the app.
    Readopting(BootInstant),
    /// Claims are held back by the claim guard (on Cluster: the guards of
    /// every free ID) until about this instant: first use, or Redis (a
    /// shard) lost its data.
    GuardClosed(BootInstant),
    /// An ID was claimed (the key is ours) but is not published: this
    /// node's wall clock differs from Redis' TIME by this many ms (local -
    /// Redis), beyond `--max-clock-skew`. Claims go on until it is back.
    ClockSkewed(i64),
    /// An ID was claimed (the key is ours) but its last use in the other
    /// mode may go on until about this instant: an app under `exec` that
    /// an earlier process in this pod handed it to (before minting with
    /// it), or IDs minted up to its high-water mark (before handing it to
    /// an app). Not published, not minted with; claims go on until then.
    Handover(BootInstant),
    /// An ID was claimed (the key is ours) but fewer replicas than
    /// `--min-replicas-ack` (the number given) acknowledged it in time
    /// (`WAIT`): not published, since a failover could lose it; claims go
    /// on and re-adopt the key.
    Unacknowledged(u32),
    /// No ID claimed or published: Redis may evict lease keys
    /// ([`crate::eviction`]); claims go on (and are refused) until it is
    /// set to `noeviction`.
    Evicting(crate::eviction::EvictingRedis),
    /// A lease confirmed by Redis, valid until `valid_until`.
    Held(HeldLease),
    /// The lease was lost; about to reclaim or exit.
    Lost,
    /// Shutdown started: nothing is published any more.
    Stopping,
}

impl WorkerState {
    /// The lease, only while it is still within its local validity deadline.
    pub(crate) fn valid_lease(&self) -> Option<&HeldLease> {
        match self {
            Self::Held(held) if held.is_valid() => Some(held),
            _ => None,
        }
    }
}

/// A held worker-ID lease as the publishers see it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HeldLease {
    /// The worker ID (0..=max_worker_id).
    pub worker_id: u16,
    /// Owner string stored in the key.
    pub owner: Owner,
    /// When the claim (or re-adoption) that began this lease was sent: a renewal keeps it, a
    /// new claim changes it, even of the same worker ID. Mint mode starts a new minting
    /// session only for a new claim (a renewal must not forget the floor it read).
    pub claimed: BootInstant,
    /// Deadline of local validity (sent + TTL - margin) on the boot clock.
    pub valid_until: BootInstant,
    /// The same deadline in Unix ms (wall clock, erring early), for files.
    pub valid_until_unix_ms: u64,
    /// Redis time (ms) at which the key expires after the last confirmed
    /// claim or renew: a renew re-creates a missing key only before it,
    /// less the margin ([`crate::lease::recreate_before`]).
    pub redis_expires_ms: u64,
    /// Re-adopted from a record of an earlier process in this pod that
    /// published the ID to the app ([`RecordedLease::app_deadline`]): the
    /// app may run on it until then, so it is not minted with before.
    pub app_until: Option<BootInstant>,
}

/// What the sidecar does with the worker ID it holds: the one switch between the modes,
/// passed to the keeper's gate, the file publisher and the routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Publishes it to the app (ID file, `GET /id`).
    Publish,
    /// Mints the Snowflake IDs itself (`--mint`).
    Mint,
}

impl Mode {
    /// The mode a state file records (its `mint` field).
    pub(crate) fn recorded(mint: bool) -> Self {
        if mint { Self::Mint } else { Self::Publish }
    }
}

impl HeldLease {
    /// True while the local validity deadline is in the future.
    pub(crate) fn is_valid(&self) -> bool {
        BootInstant::now() < self.valid_until
    }

    /// Time left until the validity deadline (zero once passed).
    pub(crate) fn remaining(&self) -> Duration {
        self.valid_until.remaining()
    }
}

/// A lease recorded in the pod-local state file, to be re-adopted at start.
#[derive(Debug, Clone)]
pub(crate) struct RecordedLease {
    /// Worker ID the previous process held.
    pub worker_id: u16,
    /// Its owner string; adopted only if the key still holds exactly this.
    pub owner: String,
    /// Unix ms until which the earlier process held it, erring early.
    pub valid_until_ms: u64,
    /// The same deadline on the boot clock, when the record was written
    /// under this boot ([`super::publish::files::StateFile::boot_deadline`]).
    pub valid_until_boot: Option<BootInstant>,
    /// The earlier process stopped publishing it without a confirmed
    /// release (`StateFile::release_unconfirmed`): no ID file of it stands.
    pub release_unconfirmed: bool,
    /// What the earlier process did with it: published it, or minted with it (`--mint`).
    pub mode: Mode,
}

impl RecordedLease {
    /// Until when an app under `exec` may still run on the ID, when the
    /// earlier process published it (not in mint mode): its recorded
    /// deadline, which `exec` stops the app before, also when it had
    /// stopped publishing since (`release_unconfirmed`: `exec` notices only
    /// at its next poll). `None` when minted with, or once passed; a
    /// deadline more than one validity span away was never written by a
    /// sidecar and counts as one span from now.
    pub(crate) fn app_deadline(&self, ttl: Duration) -> Option<BootInstant> {
        if self.mode == Mode::Mint {
            return None;
        }
        let (now, until) = self.recorded_until()?;
        (until > now).then(|| until.min(now + lease::validity(ttl)))
    }

    /// Now and the recorded deadline on the boot clock: `valid_until_boot`, else the
    /// wall-clock record mapped onto it (`None` once that has passed).
    fn recorded_until(&self) -> Option<(BootInstant, BootInstant)> {
        let now = BootInstant::now();
        let until = match self.valid_until_boot {
            Some(until) => until,
            None => now + lease::until_unix_ms(self.valid_until_ms)?,
        };
        Some((now, until))
    }

    /// The recorded deadline on the boot clock (from the wall-clock record
    /// when the file has none for this boot). `None` once passed, when the
    /// earlier process had already unpublished it, and when it lies more
    /// than one validity span (TTL - margin) away: no process ever wrote
    /// that (each write counts from a send that is already past), so the
    /// record was edited or its wall clock stepped, and nothing in it says
    /// how old the lease is; capping it at now + one span would keep the ID
    /// file up to the restart's delay past the key's expiry, when another
    /// pod may claim it. Re-adoption is still tried: the key may be ours.
    pub(crate) fn deadline(&self, ttl: Duration) -> Option<BootInstant> {
        if self.release_unconfirmed {
            return None;
        }
        let (now, until) = self.recorded_until()?;
        (until > now && until <= now + lease::validity(ttl)).then_some(until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(valid_until_ms: u64, valid_until_boot: Option<BootInstant>) -> RecordedLease {
        RecordedLease {
            mode: Mode::Publish,
            worker_id: 3,
            owner: "10.0.0.1#00".into(),
            valid_until_ms,
            valid_until_boot,
            release_unconfirmed: false,
        }
    }

    /// The boot-clock deadline wins over the wall-clock one (a stepped
    /// clock moves only the latter); a deadline beyond one validity span is
    /// not believed at all.
    #[test]
    fn recorded_deadline_prefers_the_boot_clock_and_distrusts_a_far_one() {
        let ttl = Duration::from_secs(10);
        let wall_now = lease::unix_ms(std::time::SystemTime::now());
        let soon = BootInstant::now() + Duration::from_secs(2);
        // Wall record 30 s ahead (clock stepped back when written): the boot deadline rules.
        assert_eq!(
            recorded(wall_now + 30_000, Some(soon)).deadline(ttl),
            Some(soon)
        );
        // Wall record passed (clock stepped ahead): still valid by the boot clock.
        assert_eq!(recorded(0, Some(soon)).deadline(ttl), Some(soon));
        let passed = BootInstant::now() - Duration::from_millis(1);
        assert_eq!(
            recorded(wall_now + 30_000, Some(passed)).deadline(ttl),
            None
        );
        // Without a boot deadline the wall one counts, when it is plausible.
        let near = recorded(wall_now + 2_000, None).deadline(ttl).unwrap();
        assert!(near <= BootInstant::now() + Duration::from_secs(2));
        // Beyond TTL - margin (an edit, a stepped clock): not believed.
        assert_eq!(recorded(wall_now + 60_000, None).deadline(ttl), None);
        let far = BootInstant::now() + Duration::from_secs(60);
        assert_eq!(recorded(wall_now + 60_000, Some(far)).deadline(ttl), None);
        let just_beyond = BootInstant::now() + lease::validity(ttl) + Duration::from_millis(200);
        assert_eq!(recorded(wall_now, Some(just_beyond)).deadline(ttl), None);
        assert_eq!(
            recorded(wall_now.saturating_sub(1), None).deadline(ttl),
            None
        );
    }
}
