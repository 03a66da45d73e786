//! The open-file limit (`RLIMIT_NOFILE`): the soft limit is raised to the
//! hard one at start, the HTTP connection cap stays `RESERVED` descriptors
//! below it, and children get the limit they would have had without us.

use std::sync::OnceLock;

use nix::sys::resource::{Resource, getrlimit, rlim_t, setrlimit};
use tracing::{debug, info, warn};

/// Descriptors kept free below the soft limit for everything but HTTP
/// connections: Redis connections (one per Cluster node or Sentinel), the
/// ID, state, temporary and lock files, stdio and the runtime's own. The
/// HTTP connection cap never reaches into them (without it, a flood of idle
/// connections made every ID-file write fail with EMFILE).
pub(crate) const RESERVED: u64 = 128;

/// The soft limit found at start, before [`raise_soft_limit`] raised it;
/// children get it back (see [`with_inherited_limit`]).
static INHERITED_SOFT: OnceLock<rlim_t> = OnceLock::new();

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, for the commands that
/// run until stopped (`worker`, `pool serve`, `lock`, `exec`). Logs the
/// values (info when raised, debug when already there); a refusal is a
/// warning, never fatal: the connection cap follows whatever soft limit is
/// in force. Call once, before threads that open files start.
pub fn raise_soft_limit() {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(err) => {
            warn!(error = %err, "cannot read the open-file limit (RLIMIT_NOFILE)");
            return;
        }
    };
    let _ = INHERITED_SOFT.set(soft);
    if soft >= hard {
        debug!(soft, hard, "open-file limit already at the hard limit");
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => info!(
            from = soft,
            to = hard,
            "open-file soft limit raised to the hard limit"
        ),
        Err(err) => warn!(soft, hard, error = %err, "cannot raise the open-file soft limit"),
    }
}

/// The current soft `RLIMIT_NOFILE`; `None` when it cannot be read.
pub(crate) fn soft_limit() -> Option<u64> {
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// Most HTTP connections that fit under `soft` open files, keeping
/// [`RESERVED`] descriptors for the rest; at least 1 (a limit that low
/// leaves the sidecar short of descriptors anyway).
pub(crate) fn connection_bound(soft: u64) -> usize {
    usize::try_from(soft.saturating_sub(RESERVED))
        .unwrap_or(usize::MAX)
        .max(1)
}

/// Runs `spawn` with the soft limit the process was started with, then
/// raises it again: a child (the app under `exec`, the command under
/// `lock`) gets the limit it would have had without snowlease. Programs
/// that use select(2) break on descriptors above 1024, which is why the
/// soft limit is usually 1024 (systemd's advice: raise it only in the
/// process that needs it, and give children the original).
pub(crate) fn with_inherited_limit<T>(spawn: impl FnOnce() -> T) -> T {
    let current = getrlimit(Resource::RLIMIT_NOFILE).ok();
    let restore = match (INHERITED_SOFT.get(), current) {
        (Some(&inherited), Some((soft, hard))) if inherited < soft => {
            setrlimit(Resource::RLIMIT_NOFILE, inherited, hard)
                .ok()
                .map(|()| (soft, hard))
        }
        _ => None,
    };
    let spawned = spawn();
    if let Some((soft, hard)) = restore
        && let Err(err) = setrlimit(Resource::RLIMIT_NOFILE, soft, hard)
    {
        warn!(soft, hard, error = %err, "cannot raise the open-file soft limit again");
    }
    spawned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_bound_keeps_the_reserve_and_at_least_one() {
        assert_eq!(connection_bound(1024), 896);
        assert_eq!(connection_bound(RESERVED), 1);
        assert_eq!(connection_bound(0), 1);
    }
}
