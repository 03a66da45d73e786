//! One shutdown source: SIGTERM, SIGINT (or SIGHUP, SIGQUIT, SIGUSR1,
//! SIGUSR2) cancels a token that every task watches; a second signal aborts
//! at once (exit 130, `crate::exit::ABORTED`).

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The signals that stop the process cleanly. Besides SIGTERM and SIGINT,
/// these are the ones whose default action kills the process: without a
/// handler a stray `kill -HUP` would skip unpublishing and the release.
pub(crate) const SHUTDOWN_SIGNALS: [i32; 6] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

/// Installs the shutdown signal handlers and returns the token they cancel.
/// Call inside a tokio runtime.
///
/// Handlers are installed explicitly, so this also works as PID 1 in a
/// container, where the kernel ignores signals without a handler.
///
/// Errors: when the handlers cannot be registered.
pub fn listen() -> std::io::Result<CancellationToken> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    for number in SHUTDOWN_SIGNALS {
        // Registered here, not in the task: a signal right after start counts.
        let mut stream = signal(SignalKind::from_raw(number))?;
        let tx = tx.clone();
        tokio::spawn(
            async move { while stream.recv().await.is_some() && tx.send(number).is_ok() {} },
        );
    }
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        if let Some(signal) = rx.recv().await {
            info!(signal = signal_name(signal), "shutdown requested");
            cancel.cancel();
        }
        if let Some(signal) = rx.recv().await {
            warn!(
                signal = signal_name(signal),
                "second signal; aborting without cleanup"
            );
            std::process::exit(crate::exit::ABORTED.into());
        }
    });
    Ok(token)
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGHUP => "SIGHUP",
        SIGQUIT => "SIGQUIT",
        SIGUSR1 => "SIGUSR1",
        SIGUSR2 => "SIGUSR2",
        _ => "other",
    }
}
