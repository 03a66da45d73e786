//! The next-due hint of an empty acquire in words, said alike by the CLI
//! (`pool acquire`, exit 3) and the HTTP API (503 `detail`).

use std::time::Duration;

use crate::timing;

/// The next-due hint in words.
pub(crate) fn hint_words(next_due_in: Option<Duration>) -> String {
    match next_due_in {
        Some(d) => format!(
            "the next id is due in {} (sooner if a lease is released early)",
            humantime::format_duration(timing::whole_ms(d))
        ),
        None => "no id will become due by itself (every id disabled, the pool empty, or no pool of that name: `pool status` tells)".into(),
    }
}
