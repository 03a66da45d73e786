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
//! deadline rules stop the command.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::time::sleep_until;
use tracing::{debug, error, warn};

use super::LockConfig;
use super::session::Session;
use crate::boot_clock::BootInstant;
use crate::connection::{Failure, Readable, classify};
use crate::lease::{self, RenewOutcome};
use crate::shutdown::Signals;
use crate::supervise::child::{Child, Exit};
use crate::supervise::deadline::Deadlines;
use crate::timing;

/// How the command ended, and why it was stopped (`None`: it exited by
/// itself or after a passed-on signal).
pub(crate) struct HoldEnd {
    pub(crate) exit: Exit,
    pub(crate) lost: Option<String>,
}

/// The stop of the command once it began: when SIGKILL is due.
struct Stopping {
    reason: String,
    kill_at: Instant,
    killed: bool,
}

/// Valid until `sent + validity(ttl)`: the lease core's rule, on the boot
/// clock (it counts a suspend). `exec`'s deadline rules take an [`Instant`],
/// so the loop maps it anew on each round: after a suspend it is past at once.
fn valid_until(sent: BootInstant, ttl: Duration) -> BootInstant {
    lease::validity_deadline(sent, ttl)
}

/// Holds the lock while `child` runs; `sent` is when the winning acquire
/// was sent. Returns once the child has exited (it is reaped).
pub(crate) async fn hold(
    session: &mut Session,
    config: &LockConfig,
    signals: &mut Signals,
    child: &mut Child,
    sent: BootInstant,
) -> HoldEnd {
    let interval = config.renew_interval();
    let retry = timing::retry_base(interval);
    let mut valid = valid_until(sent, config.ttl);
    let mut rules = Deadlines::new(config.grace);
    rules.observe(
        Some(valid.on_monotonic(Instant::now())),
        Instant::now() - sent.elapsed(),
    );
    let mut next_renew = Instant::now() + interval.saturating_sub(sent.elapsed());
    let mut stopping: Option<Stopping> = None;
    // Redis refused the last renewal (password, ACL, certificate): named
    // when the deadline stops the command.
    let mut refusal: Option<String> = None;
    loop {
        if let Some(exit) = child.reap() {
            return HoldEnd {
                exit,
                lost: stopping.map(|s| s.reason),
            };
        }
        let now = Instant::now();
        let deadline = valid.on_monotonic(now);
        match &mut stopping {
            Some(stop) if !stop.killed && now >= stop.kill_at => {
                warn!(
                    lock = session.keys().name(),
                    "command still running at the lease's deadline or after the grace; SIGKILL"
                );
                child.signal_all(Signal::SIGKILL);
                stop.killed = true;
            }
            Some(_) => {}
            // Checked before any renew: after a pause (SIGSTOP, VM freeze)
            // the deadline may have passed, and then nothing is sent.
            None if rules.expiring(Some(deadline), now) => {
                let mut reason = if now >= deadline {
                    "the lease's validity deadline passed without a confirmed renewal"
                } else {
                    "no renewal confirmed within the grace before the lease's deadline"
                }
                .to_owned();
                if let Some(refusal) = &refusal {
                    reason = format!("{reason}; redis refused the renew script: {refusal}");
                }
                stopping = Some(stop(child, &rules, reason, now, deadline));
                continue;
            }
            None if now >= next_renew => {
                // Never wait on Redis past the moment SIGTERM is due.
                let term_at = rules.term_at(Some(deadline)).unwrap_or(now);
                let limit = config
                    .call_timeout()
                    .min(term_at.saturating_duration_since(now));
                let (reply, sent) = session.renew(limit).await;
                if reply.is_ok() {
                    refusal = None;
                }
                match (reply, sent) {
                    (Ok(RenewOutcome::Extended), sent) => {
                        valid = valid_until(sent, config.ttl);
                        let sent_at = Instant::now() - sent.elapsed();
                        rules.observe(Some(valid.on_monotonic(Instant::now())), sent_at);
                        next_renew = sent_at + interval;
                        debug!(lock = session.keys().name(), "lease renewed");
                    }
                    // Recreated cannot happen: renew is called with recreate off.
                    (Ok(RenewOutcome::Lost | RenewOutcome::Recreated), _) => {
                        let reason = "the lock key no longer holds our owner string".to_owned();
                        stopping = Some(stop(child, &rules, reason, Instant::now(), deadline));
                    }
                    (Err(err), _) if !classify(&err).retried_while_held() => {
                        let reason = format!("redis refused the renew script: {}", Readable(&err));
                        stopping = Some(stop(child, &rules, reason, Instant::now(), deadline));
                    }
                    // Refused before any write of ours ran: the key stays
                    // ours until Redis expires it, so only the deadline
                    // rules (SIGTERM `grace` before it) stop the command.
                    (Err(err), _) if classify(&err) == Failure::Refused => {
                        error!(lock = session.keys().name(), error = %Readable(&err), "redis refused the renew script; retrying until the lease's deadline");
                        refusal = Some(Readable(&err).to_string());
                        next_renew = Instant::now() + retry;
                    }
                    (Err(err), _) => {
                        warn!(lock = session.keys().name(), error = %Readable(&err), "renew failed; retrying until the lease's deadline");
                        refusal = None;
                        next_renew = Instant::now() + retry;
                    }
                }
                continue;
            }
            None => {}
        }
        let wake = match &stopping {
            Some(stop) if stop.killed => now + Duration::from_millis(100),
            Some(stop) => stop.kill_at,
            None => rules
                .term_at(Some(deadline))
                .map_or(next_renew, |t| t.min(next_renew)),
        };
        tokio::select! {
            () = sleep_until(wake.into()) => {}
            Some(signal) = signals.recv() => {
                debug!(signal, "forwarding signal to the command");
                child.signal(signal);
            }
            () = child.changed() => {}
        }
    }
}

/// SIGTERM to the command's process group and every other descendant;
/// SIGKILL is due after the grace, never after `deadline`.
fn stop(
    child: &Child,
    rules: &Deadlines,
    reason: String,
    now: Instant,
    deadline: Instant,
) -> Stopping {
    let kill_at = rules.kill_at(now, Some(deadline));
    error!(
        reason = %reason,
        kill_in_ms = timing::ms(kill_at.saturating_duration_since(now)),
        "lock lost; stopping the command (SIGTERM)"
    );
    child.signal_all(Signal::SIGTERM);
    Stopping {
        reason,
        kill_at,
        killed: false,
    }
}
