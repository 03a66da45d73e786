//! Mint mode: the sidecar mints Snowflake IDs itself for the worker ID it holds,
//! unique across handovers, clock steps and outages (docs/worker.md, "Mint mode";
//! docs/mint-design.md).
//!
//! # Layout
//! - [`args`]: `--mint`, `--mint-socket`, `--id-layout`, `--epoch`, `--mint-window`.
//! - [`layout`]: `--id-layout` and `--epoch`, checked; composing and taking apart IDs.
//! - [`minter`]: the pure state machine that mints between the floor, the ceiling and the
//!   lease's deadline.
//! - [`script`]: the high-water mark's keys and scripts (`mark.lua`, `reserve.lua`,
//!   `settle.lua`).
//! - `desk`: the minter shared by the reserver and the handlers, and their signals.
//! - `reserver`: follows the keeper's state; reads the mark, reserves, settles.
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

use prometheus_client::registry::Registry;

use self::args::MintConfig;
use self::desk::MintDesk;
use self::metrics::MintMetrics;
use self::minter::Minter;
use self::routes::MintHttp;

/// The shared pieces of one mint-mode sidecar: the desk the reserver feeds and the
/// handlers mint from, and the metrics both count in.
pub(crate) struct Mint {
    /// The validated flags.
    pub config: MintConfig,
    /// Desk and metrics, as the handlers take them.
    pub http: MintHttp,
}

impl Mint {
    /// A desk with nothing minting yet (`503 claiming`), its metrics registered.
    pub(crate) fn new(config: MintConfig, registry: &mut Registry) -> Self {
        let minter = Minter::new(config.layout, config.epoch, config.window);
        let metrics = Arc::new(MintMetrics::default());
        metrics.register(registry);
        Self {
            config,
            http: MintHttp {
                desk: Arc::new(MintDesk::new(minter)),
                metrics,
            },
        }
    }
}
