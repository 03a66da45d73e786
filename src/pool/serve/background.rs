//! What `pool serve` runs beside the requests: a reaper per pool, the
//! eviction re-check, and the warning for a pool missing in Redis.

use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tracing::{debug, info, warn};

use super::super::limits::REAP_LIMIT;
use super::super::{Pool, PoolError};
use super::ServeState;
use crate::connection::{Readable, Redis};
use crate::eviction;

/// Most reap calls (of 1000 leases each) per pool and reaper round, so a
/// huge backlog cannot hold off the status refresh for long.
const REAP_CALLS_PER_ROUND: usize = 10;

impl ServeState {
    /// One reaper round for `name`: reclaim expired leases (up to
    /// [`REAP_CALLS_PER_ROUND`] calls), then refresh its gauges.
    async fn reap_round(&self, name: &str, cooldown: Duration) {
        let Ok(served) = self.pool(name) else { return };
        for _ in 0..REAP_CALLS_PER_ROUND {
            let result = served.pool.reap(REAP_LIMIT.max as usize, cooldown).await;
            self.note(&result);
            match result {
                Ok(reaped) => {
                    served.reap_error.lock().unwrap().take();
                    if !reaped.ids.is_empty() {
                        info!(pool = name, count = reaped.ids.len(), ids = ?reaped.ids, "reclaimed expired leases");
                        self.inner
                            .metrics
                            .reaped(&served.label, reaped.ids.len() as u64);
                    }
                    if reaped.still_expired == 0 {
                        break;
                    }
                }
                // An outage is said by note() when readiness changes; a data error (a key
                // of the wrong type) would fail every round unseen at debug: warn once.
                Err(err) if err.is_redis_unavailable() => {
                    debug!(pool = name, error = %err, "reap failed");
                    return;
                }
                Err(err) => {
                    let text = err.to_string();
                    let mut last = served.reap_error.lock().unwrap();
                    if last.as_deref() != Some(text.as_str()) {
                        warn!(pool = name, error = %text, "reap failed; every round fails the same way until the key is fixed");
                        *last = Some(text);
                    }
                    return;
                }
            }
        }
        let status = served.pool.status().await;
        self.note(&status);
        if let Ok(status) = status {
            self.inner.metrics.set_status(&served.label, &status);
        }
    }
}

/// Asks Redis whether it may evict keys; an unanswered check keeps the
/// last answer (readiness follows Redis' answers through [`ServeState::note`]).
async fn check_eviction(state: &ServeState, conn: &mut Redis) {
    match eviction::check(conn).await {
        Ok(now) => state.note_eviction(now),
        Err(err) => debug!(error = %Readable(&err), "eviction check failed"),
    }
}

/// Re-checks the eviction setting every `every` until shutdown
/// (`CONFIG SET` can change it at run time).
pub(super) async fn eviction_loop(state: ServeState, mut conn: Redis, every: Duration) {
    let shutdown = state.inner.shutdown.clone();
    let mut tick = ticks(every);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = check_eviction(&state, &mut conn) => {}
        }
    }
}

/// The ticks of a background loop: every `every`, a late round delaying
/// the next rather than bunching them.
fn ticks(every: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick
}

/// Logs a warning when `pool` has no key in Redis (never created, or a typo
/// in `--pool`): it is served anyway, acquires answer 503 until it has ids.
/// Other errors (Redis down) are left to the requests and readiness.
pub(super) async fn warn_if_missing(pool: Pool) {
    if let Err(PoolError::NoPool { pool }) = pool.strikes().await {
        warn!(
            pool,
            "pool does not exist in Redis (a typo in --pool? create it with `snowlease pool init`); acquires answer 503 until it has ids"
        );
    }
}

/// Reaps `name` every `every` until shutdown; a round in flight is dropped
/// at shutdown (a reap is safe to cut: it runs whole in Redis or not).
pub(super) async fn reap_loop(
    state: ServeState,
    name: String,
    every: Duration,
    cooldown: Duration,
) {
    let shutdown = state.inner.shutdown.clone();
    let mut tick = ticks(every);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = state.reap_round(&name, cooldown) => {}
        }
    }
}
