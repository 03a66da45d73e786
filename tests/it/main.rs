//! Integration tests: the real `snowlease` binary and library against real `redis-server` processes.
//!
//! # Layout
//! - `harness`: Redis servers, sidecar processes, polling helpers (shared by every module).
//! - `pool`: pool mode scripts and API: leases, cooldowns, fences, bad input, concurrency.

mod harness;
mod pool;
