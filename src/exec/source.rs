//! Reads the worker ID the sidecar publishes, from the ID file (with its
//! state file) or from `GET /id`, and says until when it may be used.
//!
//! An ID counts as published only while the sidecar says so: the ID file
//! exists and, when the state file beside it exists, that file names the
//! same ID with a deadline still in the future (a sidecar killed with
//! SIGKILL leaves its ID file behind, but not a fresh deadline).
//!
//! The deadline judged is the state file's `valid_until_boot_ms`, on the
//! boot clock the sidecar measured it on (same `boot_id`), never the
//! wall-clock `valid_until_ms`: an NTP step back would keep the app running
//! past the lease, a step ahead would stop a healthy one. A state file
//! without it is no published ID. Every re-read of one record gives the
//! same instant, so a re-read never moves a timer later.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::boot_clock::BootInstant;
use crate::published::{StateFile, WORKER_ID_LIMIT, state_path};

/// Where the sidecar publishes the worker ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The ID file (`--output-file` of the sidecar); the state file sits beside it.
    File(PathBuf),
    /// Base URL of the sidecar's HTTP server (`/id` is appended), or the
    /// full `/id` URL.
    Url(url::Url),
}

/// A published worker ID and how long it may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PublishedId {
    /// The worker ID.
    pub worker_id: u16,
    /// Deadline on the boot clock after which the ID is stale unless read
    /// again; `None` when the source gives none (an ID file without state
    /// file).
    pub valid_until: Option<BootInstant>,
}

impl PublishedId {
    /// True while the deadline (if any) is in the future.
    pub(crate) fn is_fresh(&self) -> bool {
        self.valid_until.is_none_or(|t| BootInstant::now() < t)
    }
}

/// What one read of the source found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reading {
    /// A fresh ID.
    Published(PublishedId),
    /// No ID is published; the reason is for logs.
    Absent(String),
    /// No ID is published because the sidecar stopped in order (SIGTERM) and
    /// gave it up: not a loss. The reason is for logs.
    Released(String),
    /// The source could not be read (sidecar HTTP down, timeout); the last
    /// fresh reading still holds until its deadline.
    Unreachable(String),
    /// The sidecar mints the IDs itself (`--mint`): it offers no worker ID
    /// (no ID file, `/id` answers 409), and one used here would be minted
    /// with twice.
    Minting,
}

impl Source {
    /// Base URL checks for `--url`: `http://host[:port][/prefix]`.
    ///
    /// Errors: a message naming what is wrong.
    /// The text is never echoed whole: it may carry a password.
    pub(crate) fn parse_url(text: &str) -> Result<url::Url, String> {
        let url = url::Url::parse(text).map_err(|e| format!("cannot parse it: {e}"))?;
        let mut shown = url.clone();
        // Cannot fail for http(s) URLs with a host; the checks below refuse the rest.
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        let shown = shown.as_str();
        if url.scheme() != "http" {
            return Err(format!(
                "{shown:?}: only http:// is supported (the sidecar in the same pod)"
            ));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!("{shown:?}: no host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(format!(
                "{shown:?} (user info left out here): no user or password allowed; the sidecar's /id needs none"
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{shown:?}: no query or fragment allowed"));
        }
        Ok(url)
    }

    /// Reads the source once; `timeout` bounds an HTTP request.
    pub(crate) fn read(&self, timeout: Duration) -> Reading {
        match self {
            Self::File(path) => read_file(path),
            Self::Url(base) => read_url(base, timeout),
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Url(url) => write!(f, "{}", id_url(url)),
        }
    }
}

/// Parses the ID file's contents: a decimal ID as the sidecar writes it (no
/// sign, no leading zero) and one newline.
fn parse_id(text: &str) -> Option<u16> {
    let digits = text.strip_suffix('\n')?;
    let canonical = digits == "0" || !digits.starts_with('0');
    if digits.is_empty() || !canonical || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|id| *id <= WORKER_ID_LIMIT)
}

/// Largest ID or state file read: both are a few dozen bytes; a bigger one
/// (or `/dev/zero`) is not the sidecar's.
const FILE_LIMIT: u64 = 4096;

/// The file's bytes, if it is a regular file of at most [`FILE_LIMIT`]
/// bytes: a FIFO or a device would block or never end.
fn read_small(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    // Checked before opening: opening a FIFO blocks until a writer comes.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() || meta.len() > FILE_LIMIT {
        return Err(std::io::Error::other(format!(
            "not a regular file of at most {FILE_LIMIT} bytes"
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(FILE_LIMIT)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn read_file(path: &std::path::Path) -> Reading {
    let text = match read_small(path).map(String::from_utf8) {
        Ok(Ok(text)) => text,
        Ok(Err(_)) => return Reading::Absent("ID file is not UTF-8 text".into()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return without_id_file(path),
        Err(err) => return Reading::Absent(format!("cannot read the ID file: {err}")),
    };
    let Some(worker_id) = parse_id(&text) else {
        return Reading::Absent(format!("ID file holds {text:?}, not a worker ID"));
    };
    // Read after the ID file: the sidecar writes the state file first, so a
    // state naming another ID means the ID in hand was lost meanwhile.
    let state = match read_small(&state_path(path)) {
        Ok(bytes) => bytes,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Reading::Published(PublishedId {
                worker_id,
                valid_until: None,
            });
        }
        Err(err) => return Reading::Absent(format!("cannot read the state file: {err}")),
    };
    let state: StateFile = match serde_json::from_slice(&state) {
        Ok(state) => state,
        Err(err) => return Reading::Absent(format!("unreadable state file: {err}")),
    };
    if state.worker_id != worker_id {
        return Reading::Absent(format!(
            "state file names worker ID {}, ID file {worker_id}",
            state.worker_id
        ));
    }
    // Written after the ID file's removal: a reader that saw the file just
    // before it went must not take the ID as published.
    if state.release_unconfirmed {
        return Reading::Absent("the sidecar stopped publishing the ID".into());
    }
    let valid_until = match state.boot_deadline() {
        Ok(until) => until,
        Err(why) => return Reading::Absent(format!("not published: {why}")),
    };
    let now = BootInstant::now();
    if valid_until <= now {
        return Reading::Absent(format!(
            "stale: the state file's deadline passed {} ms ago (sidecar gone?)",
            crate::timing::ms(now.saturating_duration_since(valid_until))
        ));
    }
    Reading::Published(PublishedId {
        worker_id,
        valid_until: Some(valid_until),
    })
}

/// No ID file at `path`: the state file beside it tells why. None: the
/// sidecar released the ID and confirmed it (or never published one);
/// `stopped`: it is stopping and gave the ID up; `mint`: it mints the IDs
/// itself and writes no ID file; else nothing is published.
fn without_id_file(path: &std::path::Path) -> Reading {
    let state = match read_small(&state_path(path)) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            // A sidecar writes both files first when it publishes: none yet means it still
            // claims (a closed claim guard, all IDs held) or never ran, as well as released.
            return Reading::Released(
                "no ID file and no state file: no sidecar has published an ID here yet (still claiming, or waiting for a closed claim guard), or it released the ID".into(),
            );
        }
        other => other
            .ok()
            .and_then(|b| serde_json::from_slice::<StateFile>(&b).ok()),
    };
    match state {
        Some(state) if state.mint => Reading::Minting,
        Some(state) if state.stopped => {
            Reading::Released("the sidecar is stopping and gave the ID up".into())
        }
        _ => Reading::Absent("no ID file".into()),
    }
}

/// `<base>/id`, keeping a path prefix of the base URL; a URL that already
/// ends in `/id` (copied from the `/id` table of docs/worker.md) is taken as it is.
fn id_url(base: &url::Url) -> String {
    let base = base.as_str().trim_end_matches('/');
    if base.ends_with("/id") {
        base.to_owned()
    } else {
        format!("{base}/id")
    }
}

#[derive(Deserialize)]
struct IdBody {
    worker_id: u16,
    lease_expires_in_ms: u64,
}

/// The `state` field of a 503 body from `/id`.
fn state_of(body: &[u8]) -> Option<&str> {
    #[derive(Deserialize)]
    struct Unpublished<'a> {
        state: &'a str,
    }
    serde_json::from_slice::<Unpublished>(body)
        .ok()
        .map(|b| b.state)
}

fn read_url(base: &url::Url, timeout: Duration) -> Reading {
    let sent = BootInstant::now();
    let (status, body) = match http_get(&id_url(base), timeout) {
        Ok(reply) => reply,
        // The URL is said once, by whoever reports the reading.
        Err(err) => return Reading::Unreachable(format!("GET failed: {err}")),
    };
    match status {
        200 => match serde_json::from_slice::<IdBody>(&body) {
            Ok(id) if id.worker_id <= WORKER_ID_LIMIT => Reading::Published(PublishedId {
                worker_id: id.worker_id,
                // From the moment the request was sent: errs early.
                valid_until: Some(sent + Duration::from_millis(id.lease_expires_in_ms)),
            }),
            _ => Reading::Absent("GET: unexpected body".to_owned()),
        },
        // A restarted sidecar re-checking the lease it recorded: not a loss
        // yet, so the last reading holds until its own deadline.
        503 if state_of(&body) == Some("readopting") => {
            Reading::Unreachable("sidecar is re-adopting its recorded lease".into())
        }
        503 if state_of(&body) == Some("stopping") => {
            Reading::Released("the sidecar is stopping and gave the ID up".into())
        }
        503 => Reading::Absent("sidecar answers 503: no valid lease".into()),
        409 if state_of(&body) == Some("minting") => Reading::Minting,
        other => Reading::Unreachable(format!("GET: status {other}")),
    }
}

/// `GET <url>` with `Accept: application/json` through ureq (no TLS: the
/// sidecar is in the same pod); the status and at most 64 KiB of body,
/// error statuses included. Errors: connection, timeout, I/O, as text.
fn http_get(url: &str, timeout: Duration) -> Result<(u16, Vec<u8>), String> {
    let agent = ureq::AgentBuilder::new().timeout(timeout).build();
    let response = match agent.get(url).set("Accept", "application/json").call() {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        // ureq's text starts with the URL, which the caller names.
        Err(ureq::Error::Transport(err)) => {
            let mut text = err.kind().to_string();
            let source = std::error::Error::source(&err).map(|s| s.to_string());
            for part in [err.message().map(str::to_owned), source]
                .into_iter()
                .flatten()
            {
                text = format!("{text}: {part}");
            }
            return Err(text);
        }
    };
    let status = response.status();
    let mut body = Vec::new();
    response
        .into_reader()
        .take(64 * 1024)
        .read_to_end(&mut body)
        .map_err(|err| err.to_string())?;
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atomic_file::write_atomic;
    use crate::boot_clock::boot_id;
    use crate::lease::unix_ms;
    use std::time::SystemTime;

    /// A state file for `worker_id` valid until `boot` on this boot's clock,
    /// with the wall-clock deadline `wall_ms` (not judged).
    fn state_at(worker_id: u16, wall_ms: u64, boot: Option<BootInstant>) -> Vec<u8> {
        serde_json::to_vec(&StateFile {
            app: "orders".into(),
            worker_id,
            owner: "10.0.0.1#00".into(),
            valid_until_ms: wall_ms,
            valid_until_boot_ms: boot.map(BootInstant::as_millis),
            boot_id: boot_id().map(str::to_owned),
            release_unconfirmed: false,
            mint: false,
            stopped: false,
        })
        .unwrap()
    }

    /// A state file as the sidecar writes it: both deadlines `left` ahead.
    fn state(worker_id: u16, left: Duration) -> Vec<u8> {
        let wall = unix_ms(SystemTime::now()) + crate::timing::ms(left);
        state_at(worker_id, wall, Some(BootInstant::now() + left))
    }

    #[test]
    fn id_file_contents_must_be_one_decimal_id() {
        assert_eq!(parse_id("7\n"), Some(7));
        assert_eq!(parse_id("0\n"), Some(0));
        assert_eq!(parse_id("1023\n"), Some(1023));
        let bad = [
            "", "\n", "7", "1023", "01\n", "+7\n", "7\n\n", " 7\n", "-1\n", "1024\n",
        ];
        for bad in bad.into_iter().chain(["x\n"]) {
            assert_eq!(parse_id(bad), None, "{bad:?}");
        }
    }

    /// A FIFO (would block), a device (`/dev/zero` never ends) and a big file are refused at
    /// once as no ID file.
    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'7'; 5000]).unwrap();
        for path in [
            fifo.as_path(),
            std::path::Path::new("/dev/zero"),
            big.as_path(),
        ] {
            let Reading::Absent(why) = read_file(path) else {
                panic!("{path:?} read as an ID")
            };
            assert!(why.contains("not a regular file"), "{path:?}: {why}");
        }
    }

    /// A user or password in `--url` is refused, and the message leaves it out.
    #[test]
    fn url_user_info_is_refused_without_being_shown() {
        let err = Source::parse_url("http://u:pw5ecret@127.0.0.1:7391/id").unwrap_err();
        assert!(err.contains("no user or password"), "{err}");
        assert!(!err.contains("pw5ecret") && !err.contains("u:"), "{err}");
        let err = Source::parse_url("ftp://u:pw5ecret@host/").unwrap_err();
        assert!(!err.contains("pw5ecret"), "{err}");
        let err = Source::parse_url("http://u:pw5ecret@[::1/").unwrap_err();
        assert!(!err.contains("pw5ecret"), "{err}");
    }

    #[test]
    fn fresh_state_gives_a_deadline_and_stale_or_other_id_gives_none() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("worker-id");
        // Neither file: nothing published (a confirmed release looks the same).
        assert!(matches!(read_file(&file), Reading::Released(_)));
        write_atomic(&file, b"7\n").unwrap();
        let Reading::Published(p) = read_file(&file) else {
            panic!("an ID file alone is published")
        };
        assert_eq!((p.worker_id, p.valid_until), (7, None));

        write_atomic(&state_path(&file), &state(7, Duration::from_secs(5))).unwrap();
        let Reading::Published(p) = read_file(&file) else {
            panic!("fresh state")
        };
        let left = p.valid_until.unwrap().remaining();
        assert!(left > Duration::from_secs(4) && left <= Duration::from_secs(5));

        let passed = BootInstant::now() - Duration::from_millis(1);
        write_atomic(&state_path(&file), &state_at(7, 0, Some(passed))).unwrap();
        assert!(matches!(read_file(&file), Reading::Absent(r) if r.contains("stale")));
        write_atomic(&state_path(&file), &state(9, Duration::from_secs(5))).unwrap();
        assert!(matches!(read_file(&file), Reading::Absent(_)));
        // The record the sidecar keeps after it stopped publishing while its
        // release is unconfirmed (`release_unconfirmed`).
        let mut kept: StateFile =
            serde_json::from_slice(&state(7, Duration::from_secs(5))).unwrap();
        kept.release_unconfirmed = true;
        write_atomic(&state_path(&file), &serde_json::to_vec(&kept).unwrap()).unwrap();
        assert!(matches!(read_file(&file), Reading::Absent(r) if r.contains("stopped publishing")));
    }

    /// A mint-mode sidecar writes a state file with `mint` and no ID file:
    /// that reads as minting, not as an ID not yet published; any other
    /// state file without an ID file is still "no ID file" (no state file
    /// either: released).
    #[test]
    fn a_mint_mode_state_file_without_an_id_file_reads_as_minting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("worker-id");
        assert!(matches!(read_file(&file), Reading::Released(_)));
        let mut record: StateFile =
            serde_json::from_slice(&state(7, Duration::from_secs(5))).unwrap();
        write_atomic(&state_path(&file), &serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(matches!(read_file(&file), Reading::Absent(r) if r == "no ID file"));
        record.mint = true;
        write_atomic(&state_path(&file), &serde_json::to_vec(&record).unwrap()).unwrap();
        assert_eq!(read_file(&file), Reading::Minting);
        // A sidecar that is stopping marks its record: released, not lost.
        (record.mint, record.release_unconfirmed, record.stopped) = (false, true, true);
        write_atomic(&state_path(&file), &serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(matches!(read_file(&file), Reading::Released(_)));
    }

    /// Only the boot-clock deadline counts: a wall-clock deadline in the
    /// past (clock stepped ahead) or far ahead (stepped back) changes
    /// nothing, a state file without the boot deadline publishes nothing,
    /// and re-reading one record never gives a later deadline.
    #[test]
    fn the_wall_clock_deadline_is_not_judged() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("worker-id");
        write_atomic(&file, b"7\n").unwrap();
        let boot = BootInstant::now() + Duration::from_secs(5);
        let wall_now = unix_ms(SystemTime::now());
        let mut seen = Vec::new();
        for wall_ms in [0, wall_now - 30_000, wall_now + 5_000, wall_now + 30_000] {
            write_atomic(&state_path(&file), &state_at(7, wall_ms, Some(boot))).unwrap();
            for _ in 0..3 {
                let Reading::Published(p) = read_file(&file) else {
                    panic!("valid by the boot clock, wall {wall_ms}")
                };
                seen.push(p.valid_until.unwrap());
            }
        }
        let expected = BootInstant::from_millis(boot.as_millis());
        assert!(seen.iter().all(|t| *t == expected), "{seen:?}");

        let passed = BootInstant::now() - Duration::from_millis(1);
        write_atomic(
            &state_path(&file),
            &state_at(7, wall_now + 30_000, Some(passed)),
        )
        .unwrap();
        assert!(matches!(read_file(&file), Reading::Absent(r) if r.contains("stale")));

        write_atomic(&state_path(&file), &state_at(7, wall_now + 30_000, None)).unwrap();
        let Reading::Absent(why) = read_file(&file) else {
            panic!("no boot deadline, no ID")
        };
        assert!(why.contains("valid_until_boot_ms"), "{why}");

        let mut other =
            serde_json::from_slice::<StateFile>(&state(7, Duration::from_secs(5))).unwrap();
        other.boot_id = Some("00000000-0000-0000-0000-000000000000".into());
        write_atomic(&state_path(&file), &serde_json::to_vec(&other).unwrap()).unwrap();
        let Reading::Absent(why) = read_file(&file) else {
            panic!("another boot's deadline, no ID")
        };
        assert!(why.contains("boot ID"), "{why}");
    }

    #[test]
    fn only_plain_http_urls_are_accepted() {
        let url = Source::parse_url("http://127.0.0.1:8080/").unwrap();
        assert_eq!(id_url(&url), "http://127.0.0.1:8080/id");
        let prefixed = Source::parse_url("http://localhost:8080/snowlease").unwrap();
        assert_eq!(id_url(&prefixed), "http://localhost:8080/snowlease/id");
        let full = Source::parse_url("http://127.0.0.1:8080/id").unwrap();
        assert_eq!(id_url(&full), "http://127.0.0.1:8080/id");
        for bad in ["https://x:1", "ftp://x", "http://", "x", "http://h/?a=1"] {
            assert!(Source::parse_url(bad).is_err(), "{bad}");
        }
    }
}
