//! The files a worker-ID sidecar publishes on the pod's shared volume, as `exec`, `id` and the
//! next sidecar in the pod read them: the ID file (the decimal worker ID and a newline, at
//! [`DEFAULT_OUTPUT_FILE`] unless `--output-file`), the state file beside it ([`StateFile`],
//! `<output-file>.state.json`) and the lock file (`<output-file>.lock`). The format's one home:
//! the sidecar (`worker_id::publish::files`) writes it, `exec` and `id` read it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::boot_clock::{self, BootInstant};
use crate::lease;

/// Where the sidecar writes the ID file and `exec`/`id` read it by default (`--output-file`,
/// `--file`): on the volume the pod shares.
pub(crate) const DEFAULT_OUTPUT_FILE: &str = "/var/run/snowlease/worker-id";

/// The largest worker ID a published file may hold: IDs are 10 bits, 0-1023 (Snowflake's
/// layout; `--max-worker-id` and `--worker-ids` stay within it).
pub(crate) const WORKER_ID_LIMIT: u16 = 1023;

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
    /// The validity deadline on this node's boot clock: `valid_until_boot_ms`
    /// when the file was written under this boot. Where the boot ID cannot
    /// be read (no /proc), the earlier of that and `valid_until_ms`.
    ///
    /// Errors: [`NoBootDeadline`], why the file gives none here.
    pub(crate) fn boot_deadline(&self) -> Result<BootInstant, NoBootDeadline> {
        self.boot_deadline_under(boot_clock::boot_id())
    }

    /// [`Self::boot_deadline`] on a node whose boot ID is `here`.
    pub(crate) fn boot_deadline_under(
        &self,
        here: Option<&str>,
    ) -> Result<BootInstant, NoBootDeadline> {
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
