//! The ID file publisher: keeps the ID file and the state file in step
//! with the worker state, and removes the ID file the moment the lease is
//! no longer provably held (at the validity deadline even when the keeper
//! says nothing). The state file outlives the ID file: it is the record the
//! next sidecar on this volume re-adopts from, marked `release_unconfirmed`
//! once nothing is published; the caller removes it after a confirmed
//! release.

use std::path::{Path, PathBuf};

use crate::boot_clock::{BootInstant, boot_id, sleep_until};
use tokio::sync::watch;
use tracing::{error, warn};

use super::files::{StateFile, state_path};
use super::state::{HeldLease, WorkerState};
use crate::atomic_file::write_atomic;

/// Keeps the files in step with the worker state until shutdown: writes
/// them while a lease is valid, removes the ID file at the validity deadline
/// even if no new state arrives, at loss and at shutdown, and then marks
/// the state file `release_unconfirmed` (never removes it).
pub async fn run_publisher(
    mut state: watch::Receiver<WorkerState>,
    output_file: PathBuf,
    app: String,
) {
    let mut files = Files {
        state: state_path(&output_file),
        id: output_file,
        published: None,
        record: None,
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
    files.unpublish();
}

struct Files {
    id: PathBuf,
    state: PathBuf,
    /// The ID in the ID file, as far as this process knows.
    published: Option<u16>,
    /// The state file this process wrote last.
    record: Option<StateFile>,
}

impl Files {
    fn publish(&mut self, app: &str, held: &HeldLease) {
        let record = StateFile {
            app: app.to_owned(),
            worker_id: held.worker_id,
            owner: held.owner.as_str().to_owned(),
            valid_until_ms: held.valid_until_unix_ms,
            valid_until_boot_ms: Some(held.valid_until.as_millis()),
            boot_id: boot_id().map(str::to_owned),
            release_unconfirmed: false,
        };
        // State first: a crash between the two leaves a record, not an ID.
        self.write_state(record);
        // Checked at every renew, not only when the ID changes: a tmp
        // cleaner or an operator may have removed or replaced the file.
        let contents = format!("{}\n", held.worker_id);
        if std::fs::read(&self.id).ok().as_deref() == Some(contents.as_bytes()) {
            self.published = Some(held.worker_id);
            return;
        }
        if self.published == Some(held.worker_id) {
            warn!(path = %self.id.display(), "worker ID file was removed or changed; writing it again");
        }
        match write_atomic(&self.id, contents.as_bytes()) {
            Ok(()) => self.published = Some(held.worker_id),
            Err(err) => {
                error!(path = %self.id.display(), error = %err, "cannot write worker ID file")
            }
        }
    }

    /// Removes the ID file, then marks this process's record: the ID is
    /// not published, and its key may still hold our owner string.
    fn unpublish(&mut self) {
        match std::fs::remove_file(&self.id) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => error!(path = %self.id.display(), error = %err, "cannot remove file"),
        }
        self.published = None;
        if let Some(record) = self.record.clone().filter(|r| !r.release_unconfirmed) {
            self.write_state(StateFile {
                release_unconfirmed: true,
                ..record
            });
        }
    }

    fn write_state(&mut self, record: StateFile) {
        let json = serde_json::to_vec(&record).expect("state serialises");
        if let Err(err) = write_atomic(&self.state, &json) {
            error!(path = %self.state.display(), error = %err, "cannot write state file");
        }
        self.record = Some(record);
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
