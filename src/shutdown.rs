//! One shutdown source: the stop signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT,
//! SIGUSR1, SIGUSR2) as a tokio stream (`Signals`). `worker` and `pool
//! serve` turn it into a token every task watches ([`listen`]: a second
//! signal aborts at once, exit 130, `crate::exit::ABORTED`); `exec` and
//! `lock` read it directly, to end their wait or pass each signal on to
//! their command.

use nix::libc::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The signals that stop the process cleanly. Besides SIGTERM and SIGINT,
/// these are the ones whose default action kills the process: without a
/// handler a stray `kill -HUP` would skip unpublishing and the release.
pub(crate) const SHUTDOWN_SIGNALS: [i32; 6] = [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2];

/// The stop signals as they arrive, in order (a signal that arrives again
/// before the first was read may count once, as with any signal handler).
pub(crate) struct Signals {
    rx: mpsc::UnboundedReceiver<i32>,
}

impl Signals {
    /// Installs handlers for [`SHUTDOWN_SIGNALS`]. Call inside a tokio
    /// runtime.
    ///
    /// Handlers are installed explicitly, so this also works as PID 1 in a
    /// container, where the kernel ignores signals without a handler.
    ///
    /// Errors: when a handler cannot be registered.
    pub(crate) fn install() -> std::io::Result<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        for number in SHUTDOWN_SIGNALS {
            // Registered here, not in the task: a signal right after start counts.
            let mut stream = signal(SignalKind::from_raw(number))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while stream.recv().await.is_some() && tx.send(number).is_ok() {}
            });
        }
        Ok(Self { rx })
    }

    /// The next stop signal (its number). Cancel-safe: a signal is never
    /// lost when a `select!` drops this future.
    pub(crate) async fn recv(&mut self) -> Option<i32> {
        self.rx.recv().await
    }
}

/// Installs the shutdown signal handlers and returns the token the first
/// signal cancels; a second signal aborts without cleanup (exit 130).
/// Call inside a tokio runtime.
///
/// Errors: when the handlers cannot be registered.
pub fn listen() -> std::io::Result<CancellationToken> {
    let mut signals = Signals::install()?;
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        if let Some(signal) = signals.recv().await {
            info!(signal = signal_name(signal), "shutdown requested");
            cancel.cancel();
        }
        if let Some(signal) = signals.recv().await {
            warn!(
                signal = signal_name(signal),
                "second signal; aborting without cleanup"
            );
            std::process::exit(crate::exit::ABORTED.into());
        }
    });
    Ok(token)
}

/// The name of a stop signal (`"other"` for any other number).
pub(crate) fn signal_name(signal: i32) -> &'static str {
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
