//! The open connections under the cap: a place per connection, and at
//! the cap the oldest idle one told to close so a new request is answered.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How often a connection waiting at the cap looks again for an idle one.
const RECHECK: Duration = Duration::from_millis(100);

/// The open connections, oldest first, and the permits that cap them.
pub(super) struct Connections {
    permits: Arc<Semaphore>,
    cap: usize,
    open: Arc<Mutex<BTreeMap<u64, Tracked>>>,
    next: AtomicU64,
}

/// What the accept loop knows of one open connection.
struct Tracked {
    in_request: Arc<AtomicUsize>,
    close: CancellationToken,
}

/// One connection's place under the cap; dropping it frees the place.
pub(super) struct Slot {
    key: u64,
    open: Arc<Mutex<BTreeMap<u64, Tracked>>>,
    pub(super) in_request: Arc<AtomicUsize>,
    pub(super) close: CancellationToken,
    _permit: OwnedSemaphorePermit,
}

impl Connections {
    pub(super) fn new(cap: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(cap)),
            cap,
            open: Arc::default(),
            next: AtomicU64::new(0),
        }
    }

    /// A place for a connection just accepted: at once below the cap; at
    /// the cap, once the oldest idle connection (told to close here) or any
    /// other one has closed. While every connection is inside a request it
    /// looks again every [`RECHECK`]: one may have ended its request and be
    /// idle. `None` when `shutdown` fires first.
    pub(super) async fn slot(&self, shutdown: &CancellationToken) -> Option<Slot> {
        let permit = loop {
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                break permit;
            }
            self.close_oldest_idle();
            tokio::select! {
                () = shutdown.cancelled() => return None,
                permit = self.permits.clone().acquire_owned() => break permit.ok()?,
                () = tokio::time::sleep(RECHECK) => {}
            }
        };
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let tracked = Tracked {
            in_request: Arc::default(),
            close: shutdown.child_token(),
        };
        let slot = Slot {
            key,
            open: self.open.clone(),
            in_request: tracked.in_request.clone(),
            close: tracked.close.clone(),
            _permit: permit,
        };
        lock(&self.open).insert(key, tracked);
        Some(slot)
    }

    /// Tells the oldest connection that is not inside a request (waiting
    /// for a header, or kept alive between requests) and not already
    /// closing to close.
    fn close_oldest_idle(&self) {
        let open = lock(&self.open);
        let oldest = open
            .values()
            .find(|c| c.in_request.load(Ordering::Acquire) == 0 && !c.close.is_cancelled());
        if let Some(oldest) = oldest {
            debug!(
                open = open.len(),
                "connection cap reached; closing the oldest idle connection"
            );
            oldest.close.cancel();
        }
    }

    /// Waits until every connection has closed.
    pub(super) async fn all_closed(&self) {
        let all = u32::try_from(self.cap).unwrap_or(u32::MAX);
        let _ = self.permits.acquire_many(all).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.open).remove(&self.key);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing panics while holding it; a poisoned map is still consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Marks a connection as inside a request while alive: such a connection
/// is never closed to make room.
pub(super) struct InRequest(Arc<AtomicUsize>);

impl InRequest {
    pub(super) fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count.clone())
    }
}

impl Drop for InRequest {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn at_the_cap_the_oldest_idle_connection_is_told_to_close() {
        let connections = Connections::new(2);
        let shutdown = CancellationToken::new();
        let busy = connections.slot(&shutdown).await.unwrap();
        let _in_request = InRequest::enter(&busy.in_request);
        let idle = connections.slot(&shutdown).await.unwrap();
        let idle_close = idle.close.clone();
        let third = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { connections.slot(&shutdown).await.map(|s| s.key) }
        });
        idle_close.cancelled().await;
        assert!(
            !busy.close.is_cancelled(),
            "a connection inside a request stays"
        );
        assert!(!third.is_finished(), "waits until the idle one has closed");
        drop(idle);
        assert_eq!(third.await.unwrap(), Some(2));
    }

    #[tokio::test]
    async fn at_the_cap_with_every_connection_busy_a_new_one_waits_for_shutdown() {
        let connections = Connections::new(1);
        let shutdown = CancellationToken::new();
        let busy = connections.slot(&shutdown).await.unwrap();
        let _in_request = InRequest::enter(&busy.in_request);
        let waiting = connections.slot(&shutdown);
        let stop = async {
            tokio::time::sleep(RECHECK * 3).await;
            shutdown.cancel();
        };
        let (slot, ()) = tokio::join!(waiting, stop);
        assert!(slot.is_none());
        assert!(
            busy.close.is_cancelled(),
            "shutdown closes every connection"
        );
    }
}
