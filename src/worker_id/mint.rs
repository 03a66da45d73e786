//! Mint mode: the sidecar mints Snowflake IDs itself for the worker ID it holds,
//! unique across handovers, clock steps and outages (docs/worker.md, "Mint mode";
//! docs/mint-design.md).
//!
//! Mint mode rides on the keeper as a component, as kubert's `lease::spawn` rides on its
//! lease: `spawn` starts it from the keeper's state channel and returns a `MintHandle` (the
//! routes, the socket's server) and the reserver's join handle, whose error carries the exit
//! (`MintError`). It reuses the keeper's gate (`worker_id::gate`), the timing kit's backoff
//! and the connection's error table, and names its states as the keeper does.
//!
//! # Layout
//! - [`args`]: `--mint`, `--mint-socket`, `--id-layout`, `--epoch`, `--mint-window`.
//! - [`layout`]: `--id-layout` and `--epoch`, checked; composing and taking apart IDs.
//! - [`minter`]: the pure state machine that mints between the floor, the ceiling and the
//!   lease's deadline.
//! - [`script`]: the high-water mark's keys and scripts (`mark.lua`, `reserve.lua`,
//!   `settle.lua`).
//! - this file: `spawn`, the start of the component; `MintError`, the exit it may end in.
//! - `desk`: the minter shared by the reserver and the handlers, and their signals.
//! - `reserver`: follows the keeper's state; checks the app's ID format, reads the mark,
//!   reserves (through the keeper's gate), settles.
//! - `routes`: `GET /next` (and `?count=N`) over the shared minter.
//! - `socket`: serving those routes on a unix socket.
//! - `metrics`: IDs minted, 503s by state, the mark's lead, waits for the next ms.

pub mod args;
pub(crate) mod desk;
pub mod layout;
pub(crate) mod metrics;
pub mod minter;
pub(crate) mod reserver;
pub(crate) mod routes;
pub mod script;
pub(crate) mod socket;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use self::args::MintConfig;
use self::desk::MintDesk;
use self::metrics::MintMetrics;
use self::minter::Minter;
use self::reserver::{Reserver, format_refusal};
use self::routes::MintHttp;
use self::socket::MintSocket;
use super::keys::{LeaseKeys, MintKeys};
use super::state::WorkerState;
use crate::config_error::ConfigError;
use crate::connection::Redis;
use crate::http::{self, ConnectionLimits};

/// The flags an app's recorded ID format must match (`format.lua`).
const FORMAT_FLAGS: &str = "--id-layout, --epoch, --datacenter-id";

/// Longest the mint socket's server may take to stop once `--listen`'s has been told to.
const SOCKET_STOP_LIMIT: Duration = Duration::from_secs(1);

/// Why mint mode ended the sidecar.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MintError {
    /// The app's recorded ID format (`format.lua`) is another than this sidecar's: minting in
    /// both could give one ID twice. Exit 2 ([`ConfigError`] naming the format flags), at
    /// start before the claim, or before the first mint when Redis did not answer at start.
    #[error("{0}")]
    FormatRefused(String),
}

impl From<MintError> for ConfigError {
    fn from(err: MintError) -> Self {
        match err {
            MintError::FormatRefused(why) => ConfigError::new(FORMAT_FLAGS, why),
        }
    }
}

/// What mint mode takes of the worker sidecar's settings; nothing about files.
pub(crate) struct MintParams {
    /// The validated mint flags.
    pub config: MintConfig,
    /// The app's lease keys.
    pub lease_keys: LeaseKeys,
    /// The app's mark and format keys.
    pub mint_keys: MintKeys,
    /// Bound of one Redis call: the keeper's.
    pub call_timeout: Duration,
    /// `--min-replicas-ack`: a reservation counts once that many replicas have it (the
    /// keeper's gate).
    pub min_replicas_ack: u32,
    /// `--max-clock-skew`: the wall clock is trusted for a forward re-anchor only within it.
    pub max_clock_skew: Duration,
    /// Connection cap and header timeout of the mint socket (`--listen`'s).
    pub limits: ConnectionLimits,
}

/// The keeper mint mode rides on: its state, and the signal that makes it renew at once.
pub(crate) struct KeeperLink {
    /// The keeper's state channel; the reserver follows it.
    pub state: watch::Receiver<WorkerState>,
    /// Makes the keeper renew at once (a reservation found the lease key not ours).
    pub renew_now: Arc<Notify>,
}

/// The running mint component, as the worker sidecar serves it.
pub(crate) struct MintHandle {
    /// What mint mode adds to `--listen`: `/next`, or its 404 naming the socket.
    on_listen: Router,
    /// The mint socket's server, on its own thread, if `--mint-socket` is set.
    socket_task: Option<oneshot::Receiver<std::io::Result<()>>>,
}

impl MintHandle {
    /// The routes mint mode adds to `--listen`. With a socket, `/next` stays off the TCP port
    /// unless `--next-on-listen`: only what shares the socket's volume mints with this
    /// worker ID.
    pub(crate) fn routes_on_listen(&self) -> Router {
        self.on_listen.clone()
    }

    /// Waits for the mint socket's server to end once the `http_stop` given to [`spawn`]
    /// fired, at most 1 s (warned).
    pub(crate) async fn socket_stopped(self) {
        if let Some(task) = self.socket_task
            && crate::timing::within(SOCKET_STOP_LIMIT, task)
                .await
                .is_none()
        {
            warn!("the mint socket did not stop within 1s");
        }
    }
}

/// Starts mint mode on the keeper's state: binds `--mint-socket` (before any Redis call),
/// checks the app's ID format (a sidecar of another format stops here, before the keeper
/// claims; when Redis does not answer, the reserver checks before the first mint), registers
/// the metrics, serves the socket until `http_stop`, and spawns the reserver. The reserver ends after the keeper's `Stopping` (recording the
/// last minted timestamp), or at once on a format refusal, when it stops the minter for good
/// and cancels `shutdown` so the keeper unpublishes and releases; its [`MintError`] is the
/// exit.
///
/// `stops`: `shutdown`, the sidecar's (cancelled on a refusal), and `http_stop`, the HTTP
/// servers' (fired after the keeper released).
///
/// Errors: the socket cannot be bound; a format refusal at start ([`ConfigError`], exit 2;
/// the socket closed and removed); the socket's thread could not start.
pub(crate) async fn spawn(
    params: MintParams,
    conn: Redis,
    keeper: KeeperLink,
    registry: &mut Registry,
    (shutdown, http_stop): (CancellationToken, CancellationToken),
) -> anyhow::Result<(MintHandle, JoinHandle<Result<(), MintError>>)> {
    let socket = match params.config.socket.as_deref() {
        Some(path) => Some(
            MintSocket::bind(path)
                .with_context(|| format!("cannot listen on --mint-socket {}", path.display()))?,
        ),
        None => None,
    };
    let mut probe = conn.clone();
    let checked = format_refusal(
        &mut probe,
        &params.mint_keys,
        &params.config,
        params.call_timeout,
    );
    let format_checked = match checked.await {
        Ok(None) => true,
        Ok(Some(why)) => {
            if let Some(socket) = socket {
                socket.close();
            }
            return Err(ConfigError::from(MintError::FormatRefused(why)).into());
        }
        Err(_) => false,
    };
    let minter = Minter::new(
        params.config.layout,
        params.config.epoch,
        params.config.window,
    );
    let metrics = Arc::new(MintMetrics::default());
    metrics.register(registry);
    let http = MintHttp {
        desk: Arc::new(MintDesk::new(minter)),
        metrics,
    };
    let on_listen = match params.config.socket.as_deref() {
        Some(path) if !params.config.next_on_listen => routes::served_on_socket_only(path),
        _ => routes::router(http.clone()),
    };
    let socket_task = match socket {
        Some(socket) => {
            let routes = routes::router(http.clone()).merge(http::liveness_routes());
            let serving = socket.serve(routes, params.limits, http_stop);
            let thread = http::on_own_thread("mint-socket", serving)
                .context("cannot start the mint socket's thread")?;
            Some(thread)
        }
        None => None,
    };
    let reserver = Reserver {
        desk: http.desk,
        metrics: http.metrics,
        conn,
        params,
        renew_now: keeper.renew_now,
        format_checked,
    };
    let task = tokio::spawn(async move {
        let ended = reserver.run(keeper.state).await;
        if ended.is_err() {
            // The sidecar stops: the keeper unpublishes and releases, then `run` exits.
            shutdown.cancel();
        }
        ended
    });
    let handle = MintHandle {
        on_listen,
        socket_task,
    };
    Ok((handle, task))
}
