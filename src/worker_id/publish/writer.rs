//! The ID file publisher: keeps the ID file and the state file in step
//! with the worker state, and removes the ID file the moment the lease is
//! no longer provably held (at the validity deadline even when the keeper
//! says nothing). The state file outlives the ID file: it is the record the
//! next sidecar on this volume re-adopts from, marked `release_unconfirmed`
//! once nothing is published; the caller removes it after a confirmed
//! release.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use crate::boot_clock::{BootInstant, sleep_until};
use tokio::sync::watch;
use tracing::{error, warn};

use crate::atomic_file::{Folder, Stamp};
use crate::published::{StateFile, state_path};
use crate::worker_id::state::{HeldLease, Mode, WorkerState};

/// Keeps the files in step with the worker state until shutdown: writes
/// them while a lease is valid, removes the ID file at the validity deadline
/// even if no new state arrives, at loss and at shutdown, and then marks
/// the state file `release_unconfirmed` (never removes it).
///
/// `folder` is the folder of `output_file`, kept open: every write, check
/// and removal goes relative to it, so a write needs one new descriptor
/// (the temporary file) and a check none.
///
/// In mint mode only the state file is written, marked `mint`:
/// the worker ID is not offered to the app (it would mint with it twice),
/// and an ID file an earlier process left is removed.
pub(crate) async fn run_publisher(
    mut state: watch::Receiver<WorkerState>,
    folder: Folder,
    output_file: &Path,
    app: String,
    mode: Mode,
) {
    let name = |path: &Path| path.file_name().map(OsStr::to_owned).unwrap_or_default();
    let mut files = Files {
        folder,
        id: name(output_file),
        state: name(&state_path(output_file)),
        published: None,
        record: None,
        mode,
        stopped: false,
    };
    loop {
        let current = state.borrow_and_update().clone();
        match current {
            WorkerState::Held(held) if held.is_valid() => {
                files.publish(&app, &held);
                tokio::select! {
                    changed = state.changed() => if changed.is_err() { break },
                    _ = sleep_until(held.valid_until) => files.unpublish(),
                }
                continue;
            }
            // The earlier process's ID file stays while its record is
            // valid: no one else can hold the key before then, and a
            // sidecar restart must not make the app see the ID vanish.
            WorkerState::Readopting(until) if until > BootInstant::now() => {
                tokio::select! {
                    changed = state.changed() => if changed.is_err() { break },
                    _ = sleep_until(until) => files.unpublish(),
                }
                continue;
            }
            WorkerState::Stopping => break,
            // Claiming keeps the state file: it is the re-adoption record.
            _ => files.unpublish(),
        }
        if state.changed().await.is_err() {
            break;
        }
    }
    // The keeper says Stopping just before it ends the channel: an orderly stop.
    files.stopped = matches!(*state.borrow(), WorkerState::Stopping);
    files.unpublish();
}

struct Files {
    folder: Folder,
    id: OsString,
    state: OsString,
    /// The ID file as written last, as far as this process knows.
    published: Option<Published>,
    /// The state file this process wrote last.
    record: Option<StateFile>,
    /// Mint mode: the state file only, never an ID file.
    mode: Mode,
    /// The sidecar is stopping: the record it leaves is marked `stopped`.
    stopped: bool,
}

/// The ID file as written last: which ID, and the stamp that tells whether
/// the file is still the one written.
#[derive(Clone, Copy)]
struct Published {
    worker_id: u16,
    stamp: Stamp,
}

impl Files {
    fn publish(&mut self, app: &str, held: &HeldLease) {
        // State first: a crash between the two leaves a record, not an ID.
        // No ID without its deadline beside it: a reader takes an ID file
        // without a state file as published with no deadline at all.
        if !self.write_state(StateFile::held(app, held, self.mode)) {
            self.unpublish();
            return;
        }
        if self.mode == Mode::Mint {
            self.remove_id_file();
            return;
        }
        // Checked at every renew, not only when the ID changes: a tmp
        // cleaner or an operator may have removed or replaced the file.
        // A stat, not a read: it needs no descriptor.
        let current = self.folder.stamp(&self.id).ok();
        match self.published {
            Some(p) if p.worker_id == held.worker_id && Some(p.stamp) == current => return,
            Some(p) if p.worker_id == held.worker_id => {
                warn!(path = %self.path(&self.id).display(), "worker ID file was removed or changed; writing it again");
            }
            _ => {}
        }
        let contents = format!("{}\n", held.worker_id);
        self.published = match self.write(&self.id, contents.as_bytes()) {
            Ok(stamp) => Some(Published {
                worker_id: held.worker_id,
                stamp,
            }),
            Err(err) => {
                error!(path = %self.path(&self.id).display(), error = %err, "cannot write worker ID file");
                None
            }
        };
    }

    /// Removes the ID file, then marks this process's record: the ID is
    /// not published, and its key may still hold our owner string.
    fn unpublish(&mut self) {
        self.remove_id_file();
        if let Some(record) = self.record.clone().filter(|r| !r.release_unconfirmed) {
            let _ = self.write_state(StateFile {
                release_unconfirmed: true,
                stopped: self.stopped,
                ..record
            });
        }
    }

    /// Removes the ID file (a missing one is no error).
    fn remove_id_file(&mut self) {
        match self.folder.remove(&self.id) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                error!(path = %self.path(&self.id).display(), error = %err, "cannot remove file")
            }
        }
        self.published = None;
    }

    /// Writes the record; false (logged) when it could not be written.
    fn write_state(&mut self, record: StateFile) -> bool {
        let json = serde_json::to_vec(&record).expect("state serialises");
        let written = self.write(&self.state, &json);
        if let Err(err) = &written {
            error!(path = %self.path(&self.state).display(), error = %err, "cannot write state file; the ID is not published");
        }
        self.record = Some(record);
        written.is_ok()
    }

    fn write(&self, name: &OsStr, contents: &[u8]) -> std::io::Result<Stamp> {
        // 0644: the app container may run as another user than the sidecar.
        self.folder.write_atomic(name, 0o644, &mut &contents[..])
    }

    /// The full path of `name`, for messages.
    fn path(&self, name: &OsStr) -> std::path::PathBuf {
        self.folder.path().join(name)
    }
}

/// Removes the state file beside `output_file` after the release of its
/// lease was confirmed (or nothing of it can be ours); a missing file is
/// no error.
pub(crate) fn remove_state(output_file: &Path) {
    let path = state_path(output_file);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => error!(path = %path.display(), error = %err, "cannot remove file"),
    }
}
