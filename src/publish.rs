//! Publishes the worker ID to the app beside the sidecar: the ID file and
//! the state file on a shared volume, each written atomically, and removed
//! the moment the lease is no longer provably held; one process per ID file
//! (a lock file beside it).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::sleep_until;
use tracing::{error, warn};

use crate::worker::{HeldLease, RecordedLease, WorkerState};

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

/// Takes an exclusive `flock` on `<output-file>.lock` without waiting, so
/// that two live processes never share one ID file and state file (the
/// second would re-adopt the first one's lease and publish its ID). The
/// kernel drops the lock when the holder dies, so a restarted sidecar can
/// still re-adopt. Keep the returned guard for the life of the process;
/// the lock file itself is never removed (a new process may hold it then).
///
/// Errors: [`OutputLockError::InUse`] when another live process holds it;
/// [`OutputLockError::Io`] when the lock file cannot be opened or locked.
pub fn lock_output(output_file: &Path) -> Result<Flock<File>, OutputLockError> {
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
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| match errno {
        Errno::EWOULDBLOCK => OutputLockError::InUse(output_file.to_owned()),
        errno => OutputLockError::Io {
            path,
            source: errno.into(),
        },
    })
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

/// Writes `contents` to `path` so that readers see the old file or the new
/// one, never a torn or empty one: a temporary file in the same folder,
/// fsync, rename over `path`.
///
/// Errors: any I/O error; `path` is then unchanged.
pub fn write_atomic(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    // 0644: the app container may run as another user than the sidecar.
    write_atomic_from(path, 0o644, &mut &contents[..])
}

/// [`write_atomic`] with the file mode and the contents from a reader.
///
/// Errors: any I/O error; `path` is then unchanged.
pub fn write_atomic_from(path: &Path, mode: u32, contents: &mut impl Read) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".snowlease-")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    std::io::copy(contents, &mut tmp)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
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
    })
}

/// Keeps the files in step with the worker state until shutdown: writes
/// them while a lease is valid, removes the ID file at the validity deadline
/// even if no new state arrives, removes both at loss and at shutdown.
pub async fn run_publisher(
    mut state: watch::Receiver<WorkerState>,
    output_file: PathBuf,
    app: String,
) {
    let files = Files {
        id: output_file.clone(),
        state: state_path(&output_file),
    };
    let mut published: Option<u16> = None;
    loop {
        let current = state.borrow_and_update().clone();
        match current {
            WorkerState::Held(held) if held.is_valid() => {
                files.publish(&app, &held, &mut published);
                tokio::select! {
                    changed = state.changed() => if changed.is_err() { break },
                    _ = sleep_until(held.valid_until) => files.unpublish_id(&mut published),
                }
                continue;
            }
            // The earlier process's ID file stays while its record is
            // valid: no one else can hold the key before then, and a
            // sidecar restart must not make the app see the ID vanish.
            WorkerState::Readopting(until) if until > tokio::time::Instant::now() => {
                tokio::select! {
                    changed = state.changed() => if changed.is_err() { break },
                    _ = sleep_until(until) => files.unpublish_id(&mut published),
                }
                continue;
            }
            WorkerState::Stopping => break,
            WorkerState::Lost => {
                files.unpublish_id(&mut published);
                files.remove(&files.state);
            }
            // Claiming keeps the state file: it is the re-adoption record.
            _ => files.unpublish_id(&mut published),
        }
        if state.changed().await.is_err() {
            break;
        }
    }
    files.unpublish_id(&mut published);
    files.remove(&files.state);
}

struct Files {
    id: PathBuf,
    state: PathBuf,
}

impl Files {
    fn publish(&self, app: &str, held: &HeldLease, published: &mut Option<u16>) {
        let record = StateFile {
            app: app.to_owned(),
            worker_id: held.worker_id,
            owner: held.owner.as_str().to_owned(),
            valid_until_ms: held.valid_until_unix_ms,
        };
        let json = serde_json::to_vec(&record).expect("state serialises");
        // State first: a crash between the two leaves a record, not an ID.
        if let Err(err) = write_atomic(&self.state, &json) {
            error!(path = %self.state.display(), error = %err, "cannot write state file");
        }
        // Checked at every renew, not only when the ID changes: a tmp
        // cleaner or an operator may have removed or replaced the file.
        let contents = format!("{}\n", held.worker_id);
        if std::fs::read(&self.id).ok().as_deref() == Some(contents.as_bytes()) {
            *published = Some(held.worker_id);
            return;
        }
        if *published == Some(held.worker_id) {
            warn!(path = %self.id.display(), "worker ID file was removed or changed; writing it again");
        }
        match write_atomic(&self.id, contents.as_bytes()) {
            Ok(()) => *published = Some(held.worker_id),
            Err(err) => {
                error!(path = %self.id.display(), error = %err, "cannot write worker ID file")
            }
        }
    }

    fn unpublish_id(&self, published: &mut Option<u16>) {
        self.remove(&self.id);
        *published = None;
    }

    fn remove(&self, path: &Path) {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => error!(path = %path.display(), error = %err, "cannot remove file"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn write_atomic_replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-id");
        write_atomic(&path, b"7\n").unwrap();
        write_atomic(&path, b"12\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"12\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
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
        };
        write_atomic(&state_path(&path), &serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(read_state(&path, "billing").is_none());
        assert_eq!(read_state(&path, "orders").map(|r| r.worker_id), Some(3));
    }
}
