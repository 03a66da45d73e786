//! The keeper's stop: end the state channel, wait until the publisher has
//! removed the files, and only then remove every key holding our owner
//! string, so no two processes publish one ID.

use std::future::Future;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::{Stopped, Worker, WorkerError};
use crate::connection::{Readable, Redis};
use crate::identity::Owner;
use crate::lease;
use crate::timing::{bounded, ms};
use crate::worker_id::state::WorkerState;

/// Upper bound for the compare-and-delete at shutdown; Kubernetes' default
/// grace period is 30 s, and a Redis outage must not stretch the stop.
const RELEASE_LIMIT: Duration = Duration::from_secs(1);

// === impl Worker ===

impl Worker {
    /// Stops after `result` (the ID held at shutdown, or why the loop
    /// ended): says `Stopping`, drops the state sender so the publisher
    /// unpublishes and ends, awaits `unpublished`, then releases every key
    /// of ours, also one a claim left whose reply was lost.
    pub(super) async fn drain(
        self,
        result: Result<Option<u16>, WorkerError>,
        unpublished: impl Future<Output = ()>,
    ) -> Stopped {
        self.set_state(WorkerState::Stopping);
        let keys = self.ours.keys(
            &self.keys(),
            self.params.settings.worker_ids,
            self.claimer.sent_ids(),
        );
        let Self {
            state,
            mut release_conn,
            ours,
            params,
            ..
        } = self;
        drop(state);
        unpublished.await;
        let held = result.as_ref().ok().copied().flatten();
        let released = release(
            &mut release_conn,
            &keys,
            &ours.owner,
            held,
            params.handover_delay,
            RELEASE_LIMIT,
        )
        .await;
        Stopped {
            owner: ours.owner,
            released,
            result: result.map(drop),
        }
    }
}

/// Removes every key in `keys` that holds `owner`, bounded by `limit`: one
/// call on one server, one per hash slot on Cluster. The lease held at the
/// stop (`held`), and a claim that ran while its reply was lost. The logs
/// say only what is known: a reply that did not come in time may hide a
/// release that ran. Each key becomes a tombstone for `handover` (see
/// [`lease::release_keys`]). No keys (no claim round started): nothing
/// sent, nothing logged.
///
/// Returns whether Redis confirmed that no key holds `owner` any more (no
/// keys: nothing can); `false` when it refused or did not answer in time.
async fn release(
    conn: &mut Redis,
    keys: &[String],
    owner: &Owner,
    held: Option<u16>,
    handover: Duration,
    limit: Duration,
) -> bool {
    if keys.is_empty() {
        return true;
    }
    let release = |mut conn: Redis, keys: Vec<String>| {
        let owner = owner.clone();
        async move { lease::release_keys(&mut conn, &keys, &owner, handover).await }
    };
    let outcome = bounded(limit, async {
        let counts = conn.per_slot(keys, release).await?;
        Ok::<u64, redis::RedisError>(counts.iter().sum())
    })
    .await;
    let confirmed = outcome.is_ok();
    match (outcome, held) {
        (Ok(0), Some(worker_id)) => warn!(
            worker_id,
            "lease not released: the key no longer holds our owner string"
        ),
        (Ok(0), None) => debug!("no lease key holds our owner string"),
        (Ok(count), Some(worker_id)) => info!(worker_id, count, "lease released"),
        (Ok(count), None) => info!(count, "lease keys a lost claim reply left released"),
        (Err(err), Some(worker_id)) if err.is_timeout() => warn!(
            worker_id,
            limit_ms = ms(limit),
            "lease release not confirmed in time; if it did not run, the key expires after its TTL"
        ),
        (Err(err), Some(worker_id)) => warn!(
            worker_id,
            error = %Readable(&err),
            "lease release not confirmed; if it did not run, the key expires after its TTL"
        ),
        (_, None) => info!(
            "release of keys a lost claim reply may have left not confirmed; they expire after their TTL"
        ),
    }
    confirmed
}
