//! What Redis must allow before the keeper claims: the lease scripts under
//! this client's ACL (probed once per process) and a `maxmemory-policy`
//! that never evicts lease keys (checked every claim round and renewal).

use std::time::Duration;

use tracing::debug;

use super::Worker;
use crate::connection::{Failure, Readable, classify};
use crate::eviction::{self, EvictingRedis, Eviction};
use crate::lease;
use crate::timing::bounded;
use crate::worker_id::claim;

/// Round trips of the start-up probe: `claim::load` (1) and `lease::probe`
/// (2 script loads, 2 renews, 1 release), plus one for a NOSCRIPT reload.
const PROBE_ROUND_TRIPS: u32 = 7;

/// What the keeper learnt of Redis' setup so far.
#[derive(Debug, Default)]
pub(super) struct Setup {
    /// The ACL probe passed; once per process: the ACL check does not
    /// change on a reclaim.
    pub(super) probed: bool,
    /// The last answer of the eviction check, which stands while Redis
    /// does not answer.
    eviction: Eviction,
}

/// What a check that failed with `failure` means after the answer `last`:
/// `true` when the last answer "safe" stands (the call after it meets the
/// same trouble), `false` when the error must be returned.
fn stands_through(last: &Eviction, failure: Failure) -> bool {
    matches!(last, Eviction::Safe) && failure == Failure::Transient
}

// === impl Worker ===

impl Worker {
    /// Runs the lease scripts on a key of this process ([`lease::probe`]),
    /// so a missing ACL permission shows at start, not at the first renew.
    pub(super) async fn probe(&mut self) -> redis::RedisResult<()> {
        let key = self.keys().probe(self.ours.owner.nonce());
        let conn = &mut self.conn;
        let owner = &self.ours.owner;
        let wait = self.params.min_replicas_ack > 0;
        let steps = async {
            claim::load(conn).await?;
            lease::probe(conn, &key, owner).await?;
            if wait {
                // WAIT 0: answers at once; only the ACL is checked.
                conn.wait_replicas(&key, 0, Duration::from_millis(1))
                    .await
                    .map_err(lease::step(
                        "WAIT refused (needs +wait for --min-replicas-ack)",
                    ))?;
            }
            Ok(())
        };
        // Each round trip has its own call timeout (the connection's); this
        // only bounds the whole (on a slow link 7 round trips never fit one).
        bounded(
            self.params.settings.call_timeout() * PROBE_ROUND_TRIPS,
            steps,
        )
        .await
    }

    /// Whether Redis may evict lease keys ([`eviction::check`], one bounded
    /// `INFO memory`); never asked with `--allow-evicting-redis`. When Redis
    /// does not answer, a last answer of "safe" stands (the call after it
    /// meets the same trouble); with no such answer the error is returned.
    pub(super) async fn evicting(&mut self) -> redis::RedisResult<Option<EvictingRedis>> {
        if self.params.allow_evicting_redis {
            return Ok(None);
        }
        let answer = bounded(
            self.params.settings.call_timeout(),
            eviction::check(&mut self.conn),
        )
        .await;
        match answer {
            Ok(evicting) => {
                self.setup.eviction = Eviction::from(evicting.clone());
                Ok(evicting)
            }
            Err(err) if stands_through(&self.setup.eviction, classify(&err).failure) => {
                debug!(error = %Readable(&err), "eviction check not answered; the last answer stands");
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a "safe" answer stands through a check Redis did not answer; a
    /// refusal, or no answer yet, is an error the caller handles.
    #[test]
    fn only_a_safe_answer_stands_through_a_transient_failure() {
        let evicting = Eviction::Evicting(EvictingRedis {
            policy: "allkeys-lru".into(),
            maxmemory: 1 << 20,
        });
        assert!(stands_through(&Eviction::Safe, Failure::Transient));
        assert!(!stands_through(&Eviction::Safe, Failure::Refused));
        assert!(!stands_through(&Eviction::Safe, Failure::Permanent));
        assert!(!stands_through(&Eviction::Unchecked, Failure::Transient));
        assert!(!stands_through(&evicting, Failure::Transient));
    }
}
