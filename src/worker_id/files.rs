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
use crate::boot_clock::{self, BootInstant};
use crate::lease;

/// Contents of the state file beside the ID file (`<output-file>.state.json`).
/// Fields added later are optional, so files of older sidecars still read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct StateFile {
    /// Application name.
    pub app: String,
    /// The worker ID.
    pub worker_id: u16,
    /// Owner string stored in the lease key (for re-adoption in this pod).
    pub owner: String,
    /// Unix time in ms until which the lease is valid, erring early; a
    /// reader seeing a past value knows the ID is stale (sidecar crashed).
    /// Wall clock: for people, and for re-adoption without
    /// `valid_until_boot_ms`; `exec` and `id` do not judge it (an NTP step
    /// would move it).
    pub valid_until_ms: u64,
    /// `true` once the sidecar stopped publishing the ID (loss, a refused
    /// renewal at the deadline, shutdown) without a confirmed release: the
    /// key may still hold `owner`, so the next sidecar on this volume
    /// re-adopts it at once (owner-checked) instead of waiting up to a TTL.
    /// Never a sign that the ID is published. Absent (`false`) while the
    /// lease is held; the file is removed once the release is confirmed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release_unconfirmed: bool,
    /// The same deadline on CLOCK_BOOTTIME: ms since boot, rounded down
    /// ([`BootInstant::as_millis`]); meaningful only under `boot_id`. The
    /// deadline `exec` and `id` judge: no wall-clock step moves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until_boot_ms: Option<u64>,
    /// The kernel's boot ID when the file was written
    /// ([`boot_clock::boot_id`]; shared by every container on the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// `true` when the sidecar mints the IDs itself (`--mint`): no ID file is written, and
    /// `exec` and `id` refuse to run on the worker ID (two minters would share it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mint: bool,
    /// `true` (with `release_unconfirmed`) when the sidecar stopped publishing
    /// because it is stopping (SIGTERM, SIGINT): `exec` then says the ID was
    /// released, not lost.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

impl StateFile {
    /// The record of a lease held now (not marked `release_unconfirmed`); `mint` in mint
    /// mode.
    pub(crate) fn held(app: &str, held: &HeldLease, mint: bool) -> Self {
        Self {
            app: app.to_owned(),
            worker_id: held.worker_id,
            owner: held.owner.as_str().to_owned(),
            valid_until_ms: held.valid_until_unix_ms,
            valid_until_boot_ms: Some(held.valid_until.as_millis()),
            boot_id: boot_clock::boot_id().map(str::to_owned),
            release_unconfirmed: false,
            mint,
            stopped: false,
        }
    }

    /// The validity deadline on this node's boot clock: `valid_until_boot_ms`
    /// when the file was written under this boot. Where the boot ID cannot
    /// be read (no /proc), the earlier of that and `valid_until_ms`.
    ///
    /// Errors: [`NoBootDeadline`], why the file gives none here.
    pub(crate) fn boot_deadline(&self) -> Result<BootInstant, NoBootDeadline> {
        self.boot_deadline_under(boot_clock::boot_id())
    }

    /// [`Self::boot_deadline`] on a node whose boot ID is `here`.
    fn boot_deadline_under(&self, here: Option<&str>) -> Result<BootInstant, NoBootDeadline> {
        let (Some(ms), Some(written)) = (self.valid_until_boot_ms, self.boot_id.as_deref()) else {
            return Err(NoBootDeadline::Missing);
        };
        let until = BootInstant::from_millis(ms);
        match here {
            Some(here) if here == written => Ok(until),
            Some(here) => Err(NoBootDeadline::OtherBoot {
                written: written.to_owned(),
                here: here.to_owned(),
            }),
            // No /proc (a bare chroot): the boot cannot be told apart, so the
            // earlier deadline counts: after a reboot the wall-clock one has
            // passed, after a wall-clock step the boot-clock one holds.
            None => {
                let now = BootInstant::now();
                let wall = now + lease::until_unix_ms(self.valid_until_ms).unwrap_or_default();
                Ok(until.min(wall))
            }
        }
    }
}

/// Why a state file gives no deadline on this node's boot clock.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoBootDeadline {
    /// Written by a sidecar that did not record it (older version).
    #[error("the state file has no valid_until_boot_ms and boot_id (written by an older sidecar?)")]
    Missing,
    /// Written under another boot (another node, or before a reboot).
    #[error(
        "the state file was written under boot ID {written}, this node's is {here}: its deadline means nothing here"
    )]
    OtherBoot {
        /// The file's `boot_id`.
        written: String,
        /// This node's.
        here: String,
    },
}

/// Path of the state file for an ID file: `<output-file>.state.json`.
pub(crate) fn state_path(output_file: &Path) -> PathBuf {
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
        mint: state.mint,
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
