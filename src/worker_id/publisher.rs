//! The ID file publisher: keeps the ID file and the state file in step
//! with the worker state, and removes the ID file the moment the lease is
//! no longer provably held (at the validity deadline even when the keeper
//! says nothing).

use std::path::{Path, PathBuf};

use crate::boot_clock::{BootInstant, boot_id, sleep_until};
use tokio::sync::watch;
use tracing::{error, warn};

use super::files::{StateFile, state_path};
use super::state::{HeldLease, WorkerState};
use crate::atomic_file::write_atomic;

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
            WorkerState::Readopting(until) if until > BootInstant::now() => {
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
            valid_until_boot_ms: Some(held.valid_until.as_millis()),
            boot_id: boot_id().map(str::to_owned),
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
