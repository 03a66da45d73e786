//! Integration tests: the real `snowlease` binary against real `redis-server` processes.
//! Every test module, one line each:

/// ACL users with exactly the documented rules: start-up probe, refusals named.
mod acl;
/// The alerts of k8s/monitoring: promtool unit tests for each; one fires and resolves on a
/// real Prometheus scraping a real sidecar.
mod alerts;
/// A key of the wrong type: named on every surface (library, HTTP, CLI), never Redis down.
mod bad_keys;
/// The rollback promise broken on purpose, third round: first uses said durable too early
/// (the unfixed ones ignored: docs/rollback-design.md, "What is still not covered").
mod break3;
/// Rate budgets: accuracy under 100 clients, keys all or nothing, expiry, CLI, Cluster, Sentinel.
mod budget;
/// Rate budgets broken on purpose: penalties with other limits, bad keys, Redis faults.
mod budget_break;
/// The budget routes of `pool serve`: 200/429 + Retry-After, penalize, 400, 503, metrics.
mod budget_http;
/// Pool acquire with a budget charge: atomic, denial leases nothing, replays not charged twice.
mod budget_pool;
/// Claims over more than 32 IDs broken on purpose: re-adoption across windows, mixed ranges.
mod claim_break;
/// Claims over 1024 IDs under real faults: exhaustion, other types, Cluster nodes stopped,
/// Redis restarted empty, a slot migrated.
mod claim_faults;
/// `claim.lua`'s contract: (lease key, guard) pairs, shared and per-ID guards.
mod claim_script;
/// Claims over 1024 IDs in 64 windows of 16: lowest free of a window, the hint, 64 at once.
mod claim_windows;
/// `--version`, `--help`, completions and the man page.
mod cli;
/// `--max-clock-skew` under libfaketime: a new ID waits for the clock, a held one stays.
mod clock_skew;
/// The Components: an empty SNOWLEASE_APP names its source; the mint socket via the fsGroup.
mod component;
/// The Redis connection: dead and idle-closed connections, slow probe, TLS, URLs, mismatches.
mod connection;
/// The image (Dockerfile) and the pods of k8s/ in real containers: podman, kube play, TLS.
mod container;
/// A demoted primary behind Sentinel: lock and pool count no write made there.
mod demoted_primary;
/// Links in README.md and docs/, and the alerts' runbook_url, name files and headings that exist.
mod docs;
/// One worker ID never published twice under faults found by adversarial testing.
mod double_publish;
/// A Redis that may evict keys: no lease held on it (worker, pool CLI, pool serve).
mod eviction;
/// The examples under examples/ against a live sidecar: ID readers; mint clients, 503 retries.
mod examples;
/// `exec` and `id`: the app runs only while an ID is published; stopped by the deadline.
mod exec;
/// A store's first record where Redis cannot say whether it is durable (no `+bgsave`).
mod first_record;
/// First use in a pod: default listen ports against common app and sidecar ports, `sleep`.
mod first_use;
/// First use broken on purpose: snapshots that started but never finished, or never forked.
mod first_use_break;
/// The first-use wait: only the record's shard; long snapshots add up across attempts.
mod first_use_wait;
/// A claim whose reply was lost is adopted (the handover tombstone: `scenarios`).
mod handover;
/// Redis servers, sidecar processes, polling helpers (shared by every module).
mod harness;
/// The harness's fault proxy (every mode) and Sentinel/Cluster topologies, proven.
mod harness_selftest;
/// The house's rules read from the sources: Redis calls bounded through the timing kit, one
/// command call timeout, flag limits in their tables, no issue numbers in comments.
mod house;
/// Every listener answers errors in JSON: unknown paths (404), methods (405), bodies (413, 408).
mod http_errors;
/// Idle HTTP connection floods under an open-file limit of 1024; header timeout; RLIMIT_NOFILE.
mod http_flood;
/// `snowlease lock`: mutual exclusion, fences, pauses, Redis down, exit codes, signals.
mod lock;
/// Mint mode under adversarial use: another `--epoch` or `--id-layout` refused, an unreadable mark.
mod mint_break;
/// Mint mode's edges: a clock ahead within the skew never stalls minting.
mod mint_edges;
/// Mint mode through Redis restarted empty, a Cluster shard emptied, a Sentinel failover with
/// `--min-replicas-ack`: the guard covers a lost mark; no ID twice.
mod mint_faults;
/// The mint guarantee on real Redis with minters on fake clocks: handovers to a clock 30 s
/// behind, a paused old holder.
mod mint_handover;
/// Mint mode's scripts: the high-water mark, reservations, the settled record; Cluster slots.
mod mint_script;
/// `worker --mint` as a process: `/next` over TCP and the socket, `/id` 409, handovers (clean,
/// SIGKILL, to a clock behind), clock steps while minting.
mod mint_worker;
/// A node that stops being the primary (REPLICAOF, a DNS-name failover): every mode leaves
/// it; a `maxclients` refusal named.
mod node_role;
/// A Redis whose persistence can roll back: named by `status` and the sidecar's start log;
/// `CONFIG` refused says nothing.
mod persistence;
/// Pool mode scripts and API: leases, cooldowns, fences, bad input, concurrency.
mod pool;
/// `snowlease pool ...` as a process: JSON output, exit codes 0/2/3/4, id files.
mod pool_cli;
/// Pool mode on a Redis Cluster: the pool tests there, `pool add`/`pool serve`, a failover.
mod pool_cluster;
/// A new pool's first use: its durability wait within the caller's wait (CLI, HTTP).
mod pool_first_use;
/// `pool serve`: the router via `oneshot`, and the process (reaper, SIGTERM).
mod pool_http;
/// The pool limits table against the scripts: both refuse the same at every boundary.
mod pool_limits;
/// Pool quarantine and strikes: the end to the ms, strikes, the state table, bad input.
mod pool_quarantine;
/// Pool acquires after Redis rolled back (CLI, router, replay, charged): closed for the max
/// lease, fence lifted.
mod pool_rollback;
/// Pool lease rules broken once: replay after extend, cap, next-due hint, cooldowns.
mod pool_rules;
/// The published deadline: the margin before the key's expiry; `exec`/`id` under wall-clock steps.
mod published_deadline;
/// Redis refusing a holder (password rotated, ACL revoked): ID kept until the deadline, re-adopted.
mod refusals;
/// `--worker-ids`: two regions on two Redis servers never share an ID; re-adoption outside
/// the range refused; overlapping ranges on one Redis logged, counted, shown by `status`;
/// `range/record.lua`; guard open and concurrent claims over a range.
mod regions;
/// Attempts to break `--worker-ids` and the ranges record.
mod regions_break;
/// Renewals under a black-holed or slow connection, and re-adoption after data loss.
mod renewal_faults;
/// `--min-replicas-ack` on Sentinel with the replica stopped: no publish, unpublish by deadline.
mod replica_ack;
/// Redis rolls back (crash-restart from a snapshot, failover to a lagging replica): worker, mint.
mod rollback;
/// The rollback promise broken on purpose: known limits, ignored (docs/rollback-design.md).
mod rollback_break;
/// Credentials rotated during a run: CA bundle and certificates, a password file.
mod rotation;
/// Worker scenarios written once, run on standalone, Sentinel and Cluster (33 on 32 IDs, signals).
mod scenarios;
/// The worker's start-up line: the Redis outage its lease settings ride through.
mod sizing;
/// The statically linked binary runs `exec` and `id` in a bare root folder.
mod static_binary;
/// `snowlease status`: holders, the claim guard, wrong types, JSON.
mod status;
/// Every mode on Sentinel and Cluster topologies: failovers, a stale Sentinel outvoted, a
/// demoted primary left, bad topology input.
mod topologies;
/// Worker mode on standalone: publishing, files, logs, guard open, bad input.
mod worker;
/// Worker mode on Redis Cluster: per-ID guards, a killed primary, a migration, an empty shard.
mod worker_cluster;
/// Worker mode under Redis faults: restart empty, paused, down at SIGTERM; --on-loss exit.
mod worker_faults;
/// Worker stop: every key of ours removed; logs that say what is true; renew-interval floor.
mod worker_stop;
