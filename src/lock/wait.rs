//! Waiting for a lock: acquire attempts until `--wait` has passed, with the
//! waiters' capped, jittered backoff between them ([`crate::timing::wait_pause`]).

use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::acquire::LockAcquired;
use super::session::Session;
use crate::boot_clock::BootInstant;
use crate::connection::{Readable, classify};
use crate::lease::node;
use crate::shutdown::Signals;
use crate::supervise::child;
use crate::timing;

/// How the wait for the lock ended.
#[derive(Debug)]
pub(crate) enum LockWaited {
    /// Ours: the fencing token, and when the winning attempt was sent (the
    /// validity is counted from there).
    Acquired { fence: u64, sent: BootInstant },
    /// Not acquired within `--wait`: why the last attempt failed, and
    /// whether it found the lock held (false: Redis did not answer).
    NotAcquired(String, bool),
    /// A signal that stops `lock` arrived first.
    Signal(i32),
}

/// Tries to acquire until `wait` has passed (once when `wait` is zero),
/// sleeping between attempts as the pool's waiters do
/// ([`timing::wait_pause`]: doubling from 10 ms up to 500 ms, jittered,
/// never past the holder's expiry hint nor past `wait`).
///
/// Returns also whether the key may be ours: true once an acquire failed
/// after it was sent (it may have run with its reply lost, or up to a
/// refused command), so the caller must release it.
///
/// A stop signal ([`child::ends_wait`]) ends the wait between attempts.
///
/// Errors: a permanent Redis error (ACL refusal, wrong key type).
pub(crate) async fn wait(
    session: &mut Session,
    wait: Duration,
    limit: Duration,
    signals: &mut Signals,
) -> (redis::RedisResult<LockWaited>, bool) {
    let deadline = Instant::now() + wait;
    let mut maybe_held = false;
    let mut probed = false;
    let mut logged = false;
    let mut logged_closed = false;
    let mut attempt = 0u32;
    loop {
        // The validity counts from the acquire's send, after any probe.
        let mut sent = BootInstant::now();
        let reply = if probed {
            session.acquire(limit).await
        } else {
            match session.probe(limit).await {
                Ok(()) => {
                    probed = true;
                    sent = BootInstant::now();
                    session.acquire(limit).await
                }
                Err(err) => Err(err),
            }
        };
        let held = matches!(
            reply,
            Ok(LockAcquired::Held(_) | LockAcquired::Closed(_) | LockAcquired::New { .. })
        );
        let (reason, hint) = match reply {
            Ok(LockAcquired::New { record, wait }) => {
                // What is left of --wait, but time for one snapshot even with a short one.
                let left = deadline.saturating_duration_since(Instant::now());
                if session
                    .open_first_use(record, node::first_use_limit(left))
                    .await
                {
                    // Open now: tried again at once, even past --wait.
                    continue;
                }
                (
                    format!(
                        "a new lock whose first record was not seen durable: closed (for {} ms where Redis cannot say; else until an attempt sees it durable: docs/lock.md, \"First use\")",
                        timing::ms(wait)
                    ),
                    Some(wait.min(Duration::from_secs(1))),
                )
            }
            Ok(LockAcquired::Ours { fence }) => {
                return (Ok(LockWaited::Acquired { fence, sent }), true);
            }
            Ok(LockAcquired::Held(expires_in)) => (
                match expires_in {
                    Some(t) => format!(
                        "held by another owner (its lease runs {} ms more unless its holder renews it)",
                        timing::ms(t)
                    ),
                    None => "held by a key without expiry (set by hand?)".to_owned(),
                },
                expires_in,
            ),
            Ok(LockAcquired::Closed(wait)) => {
                let reason = format!(
                    "closed for {} ms: Redis restarted or failed over and may have come back without its last writes (an older snapshot, a replica that lagged), so a holder from before may still run, or the lock is new and Redis would not say whether its first record is durable; the lock opens once any such holder's TTL has run out (docs/lock.md, \"After a Redis rollback\", \"First use\")",
                    timing::ms(wait)
                );
                if !logged_closed {
                    warn!(
                        lock = session.keys().name(),
                        wait_ms = timing::ms(wait),
                        "lock acquires closed after a Redis restart or failover (it may have rolled back), or for a new lock whose first record could not be seen durable; they open in wait_ms, and --wait decides whether this waits for it as for a holder"
                    );
                    logged_closed = true;
                }
                (reason, Some(wait))
            }
            Err(err) => {
                // Our script may have run: all of it with the reply lost, or
                // up to a refused command (scripts are not rolled back).
                maybe_held |= probed;
                if !classify(&err).retried_at_start() {
                    return (Err(err), maybe_held);
                }
                warn!(lock = session.keys().name(), attempt, error = %Readable(&err), "acquire failed");
                (format!("redis unavailable: {}", Readable(&err)), None)
            }
        };
        let now = Instant::now();
        if now >= deadline {
            return (Ok(LockWaited::NotAcquired(reason, held)), maybe_held);
        }
        if !logged {
            info!(lock = session.keys().name(), reason = %reason, "waiting for the lock");
            logged = true;
        }
        let pause = timing::wait_pause(hint, attempt, deadline - now, &mut rand::rng());
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            Some(signal) = signals.recv() => if child::ends_wait(signal) {
                return (Ok(LockWaited::Signal(signal)), maybe_held);
            },
        }
        attempt = attempt.saturating_add(1);
    }
}
