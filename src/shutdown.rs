//! One shutdown source: SIGTERM or SIGINT cancels a token that every task
//! watches; a second signal aborts at once (exit 130).

use futures::StreamExt;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Installs the SIGTERM/SIGINT handlers and returns the token they cancel.
///
/// Handlers are installed explicitly, so this also works as PID 1 in a
/// container, where the kernel ignores signals without a handler.
///
/// Errors: when the handlers cannot be registered.
pub fn listen() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    let cancel = token.clone();
    tokio::spawn(async move {
        if let Some(signal) = signals.next().await {
            info!(signal = signal_name(signal), "shutdown requested");
            cancel.cancel();
        }
        if let Some(signal) = signals.next().await {
            warn!(
                signal = signal_name(signal),
                "second signal; aborting without cleanup"
            );
            std::process::exit(130);
        }
    });
    Ok(token)
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        _ => "other",
    }
}
