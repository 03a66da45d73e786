//! Integration tests: the real `snowlease` binary against real `redis-server` processes.
//!
//! # Layout
//! - `harness`: Redis servers, sidecar processes, polling helpers (shared by every module).
//! - `worker`: worker mode: claim, publish, release, re-adoption, bad input.
//! - `worker_faults`: worker mode under faults: SIGKILL, SIGSTOP, Redis restart, overwrites.
//! - `pool`: pool mode scripts and API: leases, cooldowns, fences, bad input, concurrency.
//! - `pool_cli`: `snowlease pool ...` as a process: JSON output, exit codes 0/2/3/4, id files.
//! - `pool_http`: `pool serve`: the router via `oneshot`, and the process (reaper, SIGTERM).

mod acl;
mod breaker;
mod exec;
mod harness;
mod pool;
mod pool_cli;
mod pool_http;
mod status;
mod worker;
mod worker_faults;
