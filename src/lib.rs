//! snowlease: a sidecar that leases Snowflake worker IDs (and resource
//! pools) in Redis and publishes them to the app beside it.
//!
//! The one safety property (README, "How the worker-ID sidecar behaves"): no two processes
//! publish the same worker ID of an app at the same instant.
//!
//! # Layout
//! - [`config`]: flags with env twins, validated into typed configs.
//! - [`store`]: the Redis connection, URL redaction, error classification.
//! - [`identity`]: the owner identity and the per-process owner string.
//! - [`lease`]: the lease core: key names, claim (lowest free ID), renew, release; validity math.
//! - [`worker`]: worker-ID mode: lowest free ID, renew loop, loss, reclaim.
//! - [`publish`]: the ID file and state file, written atomically.
//! - [`http`]: `/id`, `/livez`, `/readyz`, `/metrics`.
//! - [`metrics`]: Prometheus metrics of the worker mode.
//! - [`shutdown`]: SIGTERM, SIGINT (and HUP, QUIT, USR1, USR2) into one cancellation token.
//! - [`sidecar`]: wiring of worker mode and its shutdown order.
//! - [`pool`]: pool mode: leased resource ids with tokens, deadlines, fences, cooldowns.
//! - [`exec`]: the app side: `exec` runs the app only while an ID is published; `id`, `install`.
//! - [`status`]: read-only view of an app's leases in Redis.

pub mod config;
pub mod exec;
pub mod http;
pub mod identity;
pub mod lease;
pub mod metrics;
pub mod pool;
pub mod publish;
pub mod shutdown;
pub mod sidecar;
pub mod status;
pub mod store;
pub mod worker;
