//! Mint mode (issue 23, in progress): the sidecar mints Snowflake IDs itself for the worker
//! ID it holds, unique across handovers, clock steps and outages (docs/mint-design.md).
//! Built here, wired into the keeper next.
//!
//! # Layout
//! - [`layout`]: `--id-layout` and `--epoch`, checked; composing and taking apart IDs.
//! - [`minter`]: the pure state machine that mints between the floor, the ceiling and the
//!   lease's deadline.
//! - [`script`]: the high-water mark's keys and scripts (`mark.lua`, `reserve.lua`,
//!   `settle.lua`).
//! - `desk`: the minter shared by the keeper and the handlers, and their signals.
//! - `routes`: `GET /next` (and `?count=N`) over the shared minter.
//! - `socket`: serving those routes on a unix socket.
//! - `metrics`: IDs minted, 503s by state, the mark's lead, waits for the next ms.

pub(crate) mod desk;
pub mod layout;
pub(crate) mod metrics;
pub mod minter;
pub(crate) mod routes;
pub mod script;
pub(crate) mod socket;
