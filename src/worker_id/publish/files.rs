//! The sidecar's side of the published files ([`crate::published`] holds their format): the
//! record of a lease held now, the lock that keeps one process per ID file, and reading the
//! state file an earlier process in this pod left.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use tracing::warn;

use crate::boot_clock;
use crate::published::{StateFile, lock_path, state_path};
use crate::worker_id::state::{HeldLease, Mode, RecordedLease};

impl StateFile {
    /// The record of a lease held now (not marked `release_unconfirmed`); marked `mint` in
    /// mint mode.
    pub(crate) fn held(app: &str, held: &HeldLease, mode: Mode) -> Self {
        Self {
            app: app.to_owned(),
            worker_id: held.worker_id,
            owner: held.owner.as_str().to_owned(),
            valid_until_ms: held.valid_until_unix_ms,
            valid_until_boot_ms: Some(held.valid_until.as_millis()),
            boot_id: boot_clock::boot_id().map(str::to_owned),
            release_unconfirmed: false,
            mint: mode == Mode::Mint,
            stopped: false,
        }
    }
}

/// Takes an exclusive lock (`flock`) on `<output-file>.lock` without waiting, so
/// that two live processes never share one ID file and state file (the
/// second would re-adopt the first one's lease and publish its ID). The
/// kernel drops the lock when the holder dies, so a restarted sidecar can
/// still re-adopt. Keep the returned guard for the life of the process;
/// the lock file itself is never removed (a new process may hold it then).
///
/// Errors: [`OutputLockError::InUse`] when another live process holds it;
/// [`OutputLockError::Io`] when the lock file cannot be opened or locked.
pub(crate) fn lock_output(output_file: &Path) -> Result<File, OutputLockError> {
    let path = lock_path(output_file);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o644)
        // A FIFO or device at that path must not block the start-up.
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(&path)
        .map_err(|source| OutputLockError::Io {
            path: path.clone(),
            source,
        })?;
    if !file.metadata().is_ok_and(|m| m.is_file()) {
        return Err(OutputLockError::Io {
            path,
            source: std::io::Error::other("not a regular file"),
        });
    }
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            Err(OutputLockError::InUse(output_file.to_owned()))
        }
        Err(std::fs::TryLockError::Error(source)) => Err(OutputLockError::Io { path, source }),
    }
}

/// Why [`lock_output`] failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OutputLockError {
    /// Another live process holds the lock.
    #[error("another snowlease worker is using --output-file {}", .0.display())]
    InUse(PathBuf),
    /// The lock file cannot be opened or locked.
    #[error("cannot lock {} (the lock file beside --output-file; the folder must be writable by this user)", .path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// Reads a state file left by an earlier process in this pod; `None` when
/// missing, unreadable, or for another app.
pub(crate) fn read_state(output_file: &Path, app: &str) -> Option<RecordedLease> {
    let text = std::fs::read(state_path(output_file)).ok()?;
    let state: StateFile = match serde_json::from_slice(&text) {
        Ok(state) => state,
        Err(err) => {
            warn!(error = %err, "ignoring unreadable state file");
            return None;
        }
    };
    (state.app == app).then(|| RecordedLease {
        valid_until_boot: state.boot_deadline().ok(),
        worker_id: state.worker_id,
        owner: state.owner,
        valid_until_ms: state.valid_until_ms,
        release_unconfirmed: state.release_unconfirmed,
        mode: Mode::recorded(state.mint),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atomic_file::write_atomic;
    use crate::boot_clock::BootInstant;
    use crate::lease;
    use crate::published::NoBootDeadline;

    #[test]
    fn state_file_sits_beside_the_id_file() {
        assert_eq!(
            state_path(Path::new("/var/run/snowlease/worker-id")),
            PathBuf::from("/var/run/snowlease/worker-id.state.json")
        );
    }

    #[test]
    fn output_lock_is_exclusive_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-id");
        let held = lock_output(&path).unwrap();
        let err = lock_output(&path).err().unwrap();
        assert!(
            matches!(&err, OutputLockError::InUse(p) if *p == path),
            "{err}"
        );
        assert!(
            err.to_string().contains("another snowlease worker"),
            "{err}"
        );
        drop(held);
        assert!(lock_output(&path).is_ok());
        assert!(lock_path(&path).exists(), "the lock file stays");
    }

    #[test]
    fn state_for_another_app_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-id");
        let record = with_boot(None, None);
        write_atomic(&state_path(&path), &serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(read_state(&path, "billing").is_none());
        assert_eq!(read_state(&path, "orders").map(|r| r.worker_id), Some(3));
    }

    /// `release_unconfirmed` is written only when set, and a file without it (an older
    /// sidecar's, or one written while the lease is held) reads as `false`.
    #[test]
    fn release_unconfirmed_is_optional() {
        let mut record = with_boot(None, None);
        let held = serde_json::to_string(&record).unwrap();
        assert!(!held.contains("release_unconfirmed"), "{held}");
        record.release_unconfirmed = true;
        let kept = serde_json::to_string(&record).unwrap();
        assert!(kept.contains(r#""release_unconfirmed":true"#), "{kept}");
        let old = r#"{"app":"orders","worker_id":3,"owner":"o#1","valid_until_ms":1}"#;
        let parsed: StateFile = serde_json::from_str(old).unwrap();
        assert!(!parsed.release_unconfirmed);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-id");
        write_atomic(&state_path(&path), kept.as_bytes()).unwrap();
        let recorded = read_state(&path, "orders").unwrap();
        assert!(recorded.release_unconfirmed);
        // Nothing of it is published, whatever its deadline says; adoption is still tried.
        // (A deadline 2 s ahead: one that would be believed without the mark.)
        let future = RecordedLease {
            valid_until_ms: crate::lease::unix_ms(std::time::SystemTime::now()) + 2_000,
            valid_until_boot: None,
            ..recorded
        };
        assert!(
            future
                .deadline(std::time::Duration::from_secs(10))
                .is_none()
        );
    }

    fn with_boot(ms: Option<u64>, boot_id: Option<&str>) -> StateFile {
        StateFile {
            app: "orders".into(),
            worker_id: 3,
            owner: "10.0.0.1#00".into(),
            valid_until_ms: 1,
            release_unconfirmed: false,
            valid_until_boot_ms: ms,
            boot_id: boot_id.map(str::to_owned),
            mint: false,
            stopped: false,
        }
    }

    #[test]
    fn boot_deadline_counts_only_under_this_boot() {
        let here = boot_clock::boot_id().unwrap();
        assert_eq!(
            with_boot(Some(5_000), Some(here)).boot_deadline(),
            Ok(BootInstant::from_millis(5_000))
        );
        let other = "00000000-0000-0000-0000-000000000000";
        let err = with_boot(Some(5_000), Some(other))
            .boot_deadline()
            .unwrap_err();
        assert!(matches!(err, NoBootDeadline::OtherBoot { .. }), "{err}");
        assert!(err.to_string().contains(other), "{err}");
        for missing in [with_boot(None, Some(here)), with_boot(Some(5_000), None)] {
            assert_eq!(missing.boot_deadline(), Err(NoBootDeadline::Missing));
        }
    }

    /// Without /proc the boot cannot be checked: the earlier of the two
    /// deadlines counts.
    #[test]
    fn without_a_boot_id_the_earlier_deadline_counts() {
        let boot = BootInstant::now() + std::time::Duration::from_secs(5);
        let wall_now = lease::unix_ms(std::time::SystemTime::now());
        let mut state = with_boot(Some(boot.as_millis()), Some("b"));
        state.valid_until_ms = wall_now + 60_000;
        let until = state.boot_deadline_under(None).unwrap();
        assert_eq!(until, BootInstant::from_millis(boot.as_millis()));
        state.valid_until_ms = wall_now + 1_000;
        let until = state.boot_deadline_under(None).unwrap();
        assert!(until < boot && until.remaining() <= std::time::Duration::from_secs(1));
        state.valid_until_ms = wall_now - 1;
        assert!(state.boot_deadline_under(None).unwrap() <= BootInstant::now());
    }

    /// A file of an older sidecar (no boot fields) reads, and a new file
    /// leaves out what it does not know.
    #[test]
    fn boot_fields_are_optional_in_the_json() {
        let old = r#"{"app":"orders","worker_id":3,"owner":"o","valid_until_ms":1}"#;
        let state: StateFile = serde_json::from_str(old).unwrap();
        assert_eq!((state.valid_until_boot_ms, state.boot_id), (None, None));
        let json = serde_json::to_string(&with_boot(Some(7), Some("b"))).unwrap();
        assert!(
            json.contains(r#""valid_until_boot_ms":7,"boot_id":"b""#),
            "{json}"
        );
    }
}
