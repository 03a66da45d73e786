//! snowlease: a sidecar that leases Snowflake worker IDs (and resource
//! pools) in Redis and publishes them to the app beside it.
//!
//! The one safety property (docs/worker.md, "How the worker-ID sidecar behaves"): no two processes
//! publish the same worker ID of an app at the same instant.
//!
//! # Layout
//! One subtree per mode:
//! - [`worker_id`]: worker-ID mode: the sidecar (claim, renew, publish) and `status`.
//! - [`pool`]: pool mode: leased resource ids with tokens, deadlines, fences, cooldowns.
//! - [`budget`]: rate budgets beside the pool: GCRA per domain or account, several keys all or nothing.
//! - [`exec`]: the app side: `exec` runs the app only while an ID is published; `id`, `install`.
//! - [`lock`]: `lock`: a distributed mutex around a command (lease core + `supervise`).
//!
//! Shared by the modes:
//! - [`lease`]: the lease core: owner-checked renew and release of one key; validity math.
//! - [`cli`]: shared flag groups (Redis URL, log format), duration and range parsers, limit types.
//! - `config_error`: the stage-two validation error (exit 2), naming its flag.
//! - [`exit`]: the exit codes of every command, one table.
//! - [`failure`]: how a failed command ends: the error-to-code map and the last line.
//! - [`connection`]: the Redis connection, URL redaction, error classification, the decoder
//!   of the scripts' error replies.
//! - `eviction`: the Redis setting leases rely on (`maxmemory-policy noeviction`), checked.
//! - `published`: the files a worker-ID sidecar publishes (ID file, state file, lock file), the format `exec` and `id` read.
//! - `persistence`: whether Redis' RDB/AOF settings can bring it back older (`CONFIG GET`), for advice.
//! - [`identity`]: the owner identity and the per-process owner string.
//! - `http`: serving a router, liveness routes, metrics encoding; the one HTTP kit of every
//!   listener: body reader, JSON error answers, `Retry-After`.
//! - [`atomic_file`]: files written whole or not at all.
//! - [`boot_clock`]: lease deadlines on CLOCK_BOOTTIME (counts suspended time; no wall-clock step moves it) and the boot ID; timers only wake.
//! - [`logging`]: log lines that never block: a bounded, lossy queue to stderr.
//! - `names`: the rules pool and budget share: names and ids, integer ranges of script arguments.
//! - [`open_files`]: the open-file limit: raised at start, the HTTP connection cap kept below it.
//! - [`shutdown`]: SIGTERM, SIGINT (and HUP, QUIT, USR1, USR2) into one cancellation token.
//! - `supervise`: the command `exec` and `lock` run: its process group, signals, deadline rules, and the watch loop's phases and steps.
//! - `timing`: bounded Redis calls and other bounded waits (the owner of timeouts), ms conversions, the retry base, one backoff with one jitter.

// `pub` only for what main, tests and benches reach; a `pub` item no path
// exports is flagged, so visibility never hides dead code from the compiler.
#![warn(unreachable_pub)]

pub mod atomic_file;
pub mod boot_clock;
pub mod budget;
pub mod cli;
pub(crate) mod config_error;
pub mod connection;
pub(crate) mod eviction;
pub mod exec;
pub mod exit;
pub mod failure;
pub(crate) mod http;
pub mod identity;
pub mod lease;
pub mod lock;
pub mod logging;
pub(crate) mod names;
pub mod open_files;
pub mod persistence;
pub mod pool;
pub(crate) mod published;
pub mod shutdown;
pub(crate) mod supervise;
pub(crate) mod timing;
pub mod worker_id;
