//! The next-due hint of an empty acquire in words, said alike by the CLI
//! (`pool acquire`, exit 3) and the HTTP API (503 `detail`).

use std::time::Duration;

use crate::timing;

/// The next-due hint in words; `after_rollback`: the acquire found
/// acquires closed after a Redis restart or failover, or a new pool closed as
/// after one until its first record is durable ([`super::Acquired::Empty`]).
pub(crate) fn hint_words(next_due_in: Option<Duration>, after_rollback: bool) -> String {
    if after_rollback {
        let wait = next_due_in.map_or(Duration::ZERO, timing::whole_ms);
        return format!(
            "acquires are closed for {}: Redis restarted or failed over and may have come back without its last writes (an older snapshot, a replica that lagged), or the pool is new and its first record was not seen durable (its first lease could be lost so), so ids it shows free may still be leased by holders from before; their leases end by then (docs/pool.md, \"After a Redis rollback\")",
            humantime::format_duration(wait)
        );
    }
    match next_due_in {
        Some(d) => format!(
            "the next id is due in {} (sooner if a lease is released early)",
            humantime::format_duration(timing::whole_ms(d))
        ),
        None => "no id will become due by itself (every id disabled, the pool empty, or no pool of that name: `pool status` tells)".into(),
    }
}
