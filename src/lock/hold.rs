//! The hold loop: renew the lease every ttl/3 while the command runs, pass
//! signals on, and stop the command when the lease is lost or cannot be
//! confirmed before its deadline.
//!
//! The rules are the lease core's and `exec`'s: the lease is valid locally
//! until `sent + TTL - margin` of the last confirmed acquire or renew (a
//! late reply proves nothing beyond its send instant); the command gets
//! SIGTERM `grace` before that deadline unless a renewal is confirmed first,
//! and SIGKILL at it (`supervise/deadline.rs`). After a loss (another owner, the
//! key gone, a permanent error) SIGTERM at once and SIGKILL after the grace,
//! never after the deadline. A refusal (password, ACL, certificate:
//! `Failure::Refused`) is no loss: the renewal is retried until the
//! deadline rules stop the command. A failed renewal is judged by the lease
//! core's [`lease::on_failure`], as the worker's keeper judges it; the
//! loop's phases and steps are `exec`'s (`supervise/watch.rs`).

use std::time::Instant;

use nix::sys::signal::Signal;
use redis::RedisResult;
use tracing::{debug, error, warn};

use super::LockConfig;
use super::session::Session;
use crate::boot_clock::BootInstant;
use crate::connection::{Readable, classify};
use crate::lease::{self, OnFailure, RenewOutcome};
use crate::shutdown::Signals;
use crate::supervise::child::{Child, Exit};
use crate::supervise::deadline::Deadlines;
use crate::supervise::watch::{self, Phase, WatchStep};
use crate::timing;

/// How the command ended, and why it was stopped (`None`: it exited by
/// itself or after a passed-on signal).
pub(crate) struct LockHoldEnd {
    pub(crate) exit: Exit,
    pub(crate) lost: Option<String>,
}

/// The lease as the loop knows it from the last confirmed acquire or renew.
struct Lease {
    /// Valid until `sent + validity(ttl)`: the lease core's rule, on the
    /// boot clock (it counts a suspend). The deadline rules take an
    /// [`Instant`], so the loop maps it anew on each round: after a suspend
    /// it is past at once.
    valid: BootInstant,
    /// When the next renewal is sent.
    next_renew: Instant,
    /// Redis refused the last renewal (password, ACL, certificate): named
    /// when the deadline stops the command.
    refusal: Option<String>,
}

impl Lease {
    /// The lease of an acquire or renew sent at `sent` and confirmed: valid
    /// from that send, renewed one `interval` after it; the grace rules see
    /// its validity.
    fn confirmed(sent: BootInstant, config: &LockConfig, rules: &mut Deadlines) -> Self {
        let valid = lease::validity_deadline(sent, config.ttl);
        let sent_at = Instant::now() - sent.elapsed();
        rules.observe(Some(valid.on_monotonic(Instant::now())), sent_at);
        Self {
            valid,
            next_renew: sent_at + config.renew_interval(),
            refusal: None,
        }
    }
}

/// What a renewal's reply means for the hold.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Renewal {
    /// Confirmed: the lease is valid from this renewal's send.
    Extended,
    /// The lease is gone: stop the command, for this reason.
    Lost(String),
    /// Retry after the retry base. `refused`: Redis refused this client
    /// (kept to name it when the deadline stops the command).
    Retry { error: String, refused: bool },
}

/// Judges a renewal's reply; a failure by the lease core's
/// [`lease::on_failure`].
/// Why a renewal found the lock lost: the script cannot tell a missing key from another
/// owner's, so the reason names what each means.
const LOST: &str = "the lock key no longer holds our owner string: it expired, was deleted or taken over, or Redis lost it (a restart from an older snapshot, a failover; docs/lock.md)";

fn renewal(reply: &RedisResult<RenewOutcome>) -> Renewal {
    match reply {
        Ok(RenewOutcome::Extended) => Renewal::Extended,
        // Recreated cannot happen: renew is called with recreate off.
        Ok(RenewOutcome::Lost | RenewOutcome::Recreated) => Renewal::Lost(LOST.to_owned()),
        Err(err) => match lease::on_failure(classify(err).failure) {
            OnFailure::Ends => {
                Renewal::Lost(format!("redis refused the renew script: {}", Readable(err)))
            }
            // Refused before any write of ours ran: the key stays ours
            // until Redis expires it, so only the deadline rules (SIGTERM
            // `grace` before it) stop the command.
            OnFailure::RetryRefused => Renewal::Retry {
                error: Readable(err).to_string(),
                refused: true,
            },
            OnFailure::Retry => Renewal::Retry {
                error: Readable(err).to_string(),
                refused: false,
            },
        },
    }
}

/// Why the deadline rules stop the command: the deadline `passed`, or it
/// came within the grace, with the refusal that lasted until then.
fn expired(passed: bool, refusal: Option<&str>) -> String {
    let reason = if passed {
        "the lease's validity deadline passed without a confirmed renewal"
    } else {
        "no renewal confirmed within the grace before the lease's deadline"
    };
    match refusal {
        Some(refusal) => format!("{reason}; redis refused the renew script: {refusal}"),
        None => reason.to_owned(),
    }
}

/// Holds the lock while `child` runs; `sent` is when the winning acquire
/// was sent. Returns once the child has exited (it is reaped).
pub(crate) async fn hold(
    session: &mut Session,
    config: &LockConfig,
    signals: &mut Signals,
    child: &mut Child,
    sent: BootInstant,
) -> LockHoldEnd {
    let retry = timing::retry_base(config.renew_interval());
    let mut rules = Deadlines::new(config.grace);
    let mut lease = Lease::confirmed(sent, config, &mut rules);
    let mut phase = Phase::Watching;
    let mut lost: Option<String> = None;
    loop {
        if let Some(exit) = child.reap() {
            return LockHoldEnd { exit, lost };
        }
        let now = Instant::now();
        let deadline = lease.valid.on_monotonic(now);
        match watch::next(phase, &rules, Some(deadline), lease.next_renew, now) {
            WatchStep::Kill => {
                warn!(
                    lock = session.keys().name(),
                    "command still running at the lease's deadline or after the grace; SIGKILL"
                );
                child.signal_all(Signal::SIGKILL);
                phase = Phase::Killed;
            }
            WatchStep::Expiring { passed } => {
                let reason = expired(passed, lease.refusal.as_deref());
                phase = stop(child, &rules, &reason, now, deadline);
                lost = Some(reason);
            }
            WatchStep::Check => {
                // Never wait on Redis past the moment SIGTERM is due.
                let term_at = rules.term_at(Some(deadline)).unwrap_or(now);
                let limit = config
                    .call_timeout()
                    .min(term_at.saturating_duration_since(now));
                let (reply, sent) = session.renew(limit).await;
                match renewal(&reply) {
                    Renewal::Extended => {
                        lease = Lease::confirmed(sent, config, &mut rules);
                        debug!(lock = session.keys().name(), "lease renewed");
                    }
                    Renewal::Lost(reason) => {
                        phase = stop(child, &rules, &reason, Instant::now(), deadline);
                        lost = Some(reason);
                    }
                    Renewal::Retry { error, refused } => {
                        if refused {
                            error!(lock = session.keys().name(), error = %error, "redis refused the renew script; retrying until the lease's deadline");
                        } else {
                            warn!(lock = session.keys().name(), error = %error, "renew failed; retrying until the lease's deadline");
                        }
                        lease.refusal = refused.then_some(error);
                        lease.next_renew = Instant::now() + retry;
                    }
                }
            }
            WatchStep::Sleep(wake) => child.sleep_forwarding(wake, signals).await,
        }
    }
}

/// SIGTERM to the command's process group and every other descendant;
/// SIGKILL is due after the grace, never after `deadline`.
fn stop(child: &Child, rules: &Deadlines, reason: &str, now: Instant, deadline: Instant) -> Phase {
    let phase = watch::stopping(rules, now, Some(deadline));
    error!(
        reason = %reason,
        kill_in_ms = timing::ms(phase.kill_in(now)),
        "lock lost; stopping the command (SIGTERM)"
    );
    child.signal_all(Signal::SIGTERM);
    phase
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::{ErrorKind, RedisError};

    use super::*;

    /// Extended renews; another owner, or a permanent error, is a loss;
    /// a refusal and a timeout are retried, only the refusal kept.
    #[test]
    fn a_renewal_is_judged_by_the_lease_cores_rule() {
        assert_eq!(renewal(&Ok(RenewOutcome::Extended)), Renewal::Extended);
        let Renewal::Lost(reason) = renewal(&Ok(RenewOutcome::Lost)) else {
            panic!("a lost key is a loss")
        };
        assert_eq!(reason, LOST);
        let wrong_type = RedisError::from((ErrorKind::UnexpectedReturnType, "not a renew reply"));
        let Renewal::Lost(reason) = renewal(&Err(wrong_type)) else {
            panic!("a permanent error is a loss")
        };
        assert!(
            reason.starts_with("redis refused the renew script: "),
            "{reason}"
        );
        let refused = RedisError::from((ErrorKind::AuthenticationFailed, "WRONGPASS"));
        assert!(matches!(
            renewal(&Err(refused)),
            Renewal::Retry { refused: true, .. }
        ));
        let timeout = timing::timed_out(Duration::from_millis(250));
        assert_eq!(
            renewal(&Err(timeout)),
            Renewal::Retry {
                error: "redis call timed out after 250 ms".to_owned(),
                refused: false
            }
        );
    }

    /// The deadline's stop names whether it passed, and a refusal that
    /// lasted until then.
    #[test]
    fn an_expired_lease_names_the_deadline_and_a_lasting_refusal() {
        assert_eq!(
            expired(false, None),
            "no renewal confirmed within the grace before the lease's deadline"
        );
        assert_eq!(
            expired(true, Some("WRONGPASS")),
            "the lease's validity deadline passed without a confirmed renewal; \
             redis refused the renew script: WRONGPASS"
        );
    }
}
