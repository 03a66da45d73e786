//! The files of one pod's sidecar on the shared volume: the ID file (the
//! decimal ID and a newline), the state file beside it ([`StateFile`], read
//! by the next sidecar in the pod and by `exec`), and the lock file that
//! keeps one process per ID file.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::state::{HeldLease, RecordedLease};

/// Contents of the state file beside the ID file (`<output-file>.state.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StateFile {
    /// Application name.
    pub app: String,
    /// The worker ID.
    pub worker_id: u16,
    /// Owner string stored in the lease key (for re-adoption in this pod).
    pub owner: String,
    /// Unix time in ms until which the lease is valid, erring early; a
    /// reader seeing a past value knows the ID is stale (sidecar crashed).
    pub valid_until_ms: u64,
    /// `true` once the sidecar stopped publishing the ID (loss, a refused
    /// renewal at the deadline, shutdown) without a confirmed release: the
    /// key may still hold `owner`, so the next sidecar on this volume
    /// re-adopts it at once (owner-checked) instead of waiting up to a TTL.
    /// Never a sign that the ID is published. Absent (`false`) while the
    /// lease is held; the file is removed once the release is confirmed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release_unconfirmed: bool,
}

impl StateFile {
    /// The record of a lease held now (not marked `release_unconfirmed`).
    pub(crate) fn held(app: &str, held: &HeldLease) -> Self {
        Self {
            app: app.to_owned(),
            worker_id: held.worker_id,
            owner: held.owner.as_str().to_owned(),
            valid_until_ms: held.valid_until_unix_ms,
            release_unconfirmed: false,
        }
    }
}

/// Path of the state file for an ID file: `<output-file>.state.json`.
pub fn state_path(output_file: &Path) -> PathBuf {
    with_suffix(output_file, ".state.json")
}

/// Path of the lock file for an ID file: `<output-file>.lock`.
pub(crate) fn lock_path(output_file: &Path) -> PathBuf {
    with_suffix(output_file, ".lock")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
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
pub fn lock_output(output_file: &Path) -> Result<File, OutputLockError> {
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
pub enum OutputLockError {
    /// Another live process holds the lock.
    #[error("another snowlease worker is using --output-file {}", .0.display())]
    InUse(PathBuf),
    /// The lock file cannot be opened or locked.
    #[error("cannot lock {}", .path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// Reads a state file left by an earlier process in this pod; `None` when
/// missing, unreadable, or for another app.
pub fn read_state(output_file: &Path, app: &str) -> Option<RecordedLease> {
    let text = std::fs::read(state_path(output_file)).ok()?;
    let state: StateFile = match serde_json::from_slice(&text) {
        Ok(state) => state,
        Err(err) => {
            warn!(error = %err, "ignoring unreadable state file");
            return None;
        }
    };
    (state.app == app).then_some(RecordedLease {
        worker_id: state.worker_id,
        owner: state.owner,
        valid_until_ms: state.valid_until_ms,
        release_unconfirmed: state.release_unconfirmed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atomic_file::write_atomic;

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
        let record = StateFile {
            app: "orders".into(),
            worker_id: 3,
            owner: "10.0.0.1#00".into(),
            valid_until_ms: 1,
            release_unconfirmed: false,
        };
        write_atomic(&state_path(&path), &serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(read_state(&path, "billing").is_none());
        assert_eq!(read_state(&path, "orders").map(|r| r.worker_id), Some(3));
    }

    /// `release_unconfirmed` is written only when set, and a file without it (an older
    /// sidecar's, or one written while the lease is held) reads as `false`.
    #[test]
    fn release_unconfirmed_is_optional() {
        let mut record = StateFile {
            app: "orders".into(),
            worker_id: 3,
            owner: "10.0.0.1#00".into(),
            valid_until_ms: 1,
            release_unconfirmed: false,
        };
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
        let future = RecordedLease {
            valid_until_ms: u64::MAX / 2,
            ..recorded
        };
        assert!(
            future
                .deadline(std::time::Duration::from_secs(10))
                .is_none()
        );
    }
}
