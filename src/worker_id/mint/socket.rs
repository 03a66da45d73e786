//! The mint routes on a unix socket (`--mint-socket`), e.g. on a volume the pod's containers
//! share, served like `--listen` (connection cap, header timeout): created with mode 0660
//! under its final name in one step, a stale socket file replaced, a live one or any other
//! file refused, and removed again at shutdown.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use axum::Router;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::http::{self, ConnectionLimits};

/// Mode of the socket file: the pod's user and group may connect (connecting needs write
/// permission), nobody else.
const MODE: u32 = 0o660;

/// A bound unix socket for the mint routes.
#[derive(Debug)]
pub(crate) struct MintSocket {
    listener: UnixListener,
    path: PathBuf,
    /// The socket file's inode: at shutdown only this file is removed, not one that a later
    /// process bound under the same name.
    inode: u64,
}

impl MintSocket {
    /// Binds `path`: refused (`AlreadyExists`) while another process listens there or when
    /// it is not a socket; a stale socket file (nobody listening) is replaced. The socket is
    /// bound under a temporary name beside it, given mode 0660, then renamed into place, so
    /// it is never reachable with a wider mode. The temporary name is random (two containers
    /// that both run as PID 1 share no name) and reached through `/proc/self/fd/<the
    /// folder>/`, so it fits the 108 bytes of a socket address (`sun_path`, unix(7)) whatever
    /// the folder's path; only `path` itself must (clients connect to it).
    pub(crate) fn bind(path: &Path) -> io::Result<Self> {
        check_replaceable(path)?;
        let folder = match path.parent() {
            Some(folder) if !folder.as_os_str().is_empty() => folder,
            _ => Path::new("."),
        };
        let name = format!(".snowlease-{:016x}.tmp", rand::random::<u64>());
        // Held open until the rename: the /proc path names this folder through it.
        let handle = std::fs::File::open(folder)?;
        let through_proc = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd()));
        let temporary = if through_proc.is_dir() {
            through_proc.join(&name)
        } else {
            folder.join(&name)
        };
        let listener = UnixListener::bind(&temporary)?;
        let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(MODE))
            .and_then(|()| std::fs::rename(&temporary, path));
        if let Err(err) = placed {
            let _ = std::fs::remove_file(&temporary);
            return Err(err);
        }
        listener.set_nonblocking(true)?;
        let inode = std::fs::symlink_metadata(path)?.ino();
        Ok(Self {
            listener,
            path: path.to_owned(),
            inode,
        })
    }

    /// Serves `router` as `--listen` is served ([`http::serve_on`]: the same connection cap
    /// and header timeout) until `shutdown` fires and the connections in flight end, then
    /// removes the socket file (when it is still this one).
    ///
    /// Errors: the listener's I/O error.
    pub(crate) async fn serve(
        self,
        router: Router,
        limits: ConnectionLimits,
        shutdown: CancellationToken,
    ) -> io::Result<()> {
        let listener = http::PlacedUnixListener {
            listener: tokio::net::UnixListener::from_std(self.listener)?,
            path: self.path.clone(),
        };
        let served = http::serve_on(listener, router, limits, shutdown).await;
        remove_if_ours(&self.path, self.inode);
        served
    }
}

impl MintSocket {
    /// Closes the socket without serving it and removes its file (when it is still this
    /// one): a start that stops before serving leaves no socket behind.
    pub(crate) fn close(self) {
        drop(self.listener);
        remove_if_ours(&self.path, self.inode);
    }
}

/// Removes the socket file at `path` when it is still the one bound (`inode`), not one a
/// later process bound under the same name.
fn remove_if_ours(path: &Path, inode: u64) {
    let ours = std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == inode);
    if ours && let Err(err) = std::fs::remove_file(path) {
        warn!(path = %path.display(), error = %err, "cannot remove the mint socket");
    }
}

/// Ok when `path` is free or a socket nobody listens on.
fn check_replaceable(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    let refuse = |why: &str| Err(io::Error::new(io::ErrorKind::AlreadyExists, why.to_owned()));
    if !meta.file_type().is_socket() {
        return refuse("exists and is not a socket; not replaced");
    }
    match UnixStream::connect(path) {
        Ok(_) => refuse("another process is listening on it"),
        Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => Ok(()),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker_id::mint::desk::MintDesk;
    use crate::worker_id::mint::layout::{DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Epoch, IdLayout};
    use crate::worker_id::mint::metrics::MintMetrics;
    use crate::worker_id::mint::minter::{MintWindow, Minter};
    use crate::worker_id::mint::routes::{MintHttp, router};
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::time::Duration;

    /// One request over the socket, as an app would send it (a blocking client thread).
    async fn request(path: &Path, target: &str) -> String {
        let (path, target) = (path.to_owned(), target.to_owned());
        tokio::task::spawn_blocking(move || {
            let mut stream = UnixStream::connect(path).unwrap();
            let head = format!("GET {target} HTTP/1.1\r\nHost: mint\r\nConnection: close\r\n\r\n");
            stream.write_all(head.as_bytes()).unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            answer
        })
        .await
        .unwrap()
    }

    /// A stale socket file is replaced by one of mode 0660 that answers `/next` (here 503
    /// `claiming`: no lease yet) under the header timeout; a live socket and a plain file are
    /// refused; the file goes at shutdown.
    #[tokio::test]
    async fn the_socket_replaces_a_stale_one_answers_and_is_removed_at_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mint.sock");
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists(), "a stale socket file");

        let socket = MintSocket::bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660);
        let refused = MintSocket::bind(&path).unwrap_err();
        assert!(refused.to_string().contains("another process"), "{refused}");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "x").unwrap();
        let refused = MintSocket::bind(&plain).unwrap_err();
        assert!(refused.to_string().contains("not a socket"), "{refused}");

        let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), u64::MAX).unwrap();
        let window = MintWindow {
            ahead_ms: 5_000,
            low_water_ms: 2_000,
        };
        let minter = Minter::new(IdLayout::parse(DEFAULT_LAYOUT).unwrap(), epoch, window);
        let http = MintHttp {
            desk: Arc::new(MintDesk::new(minter)),
            metrics: Arc::new(MintMetrics::default()),
        };
        let shutdown = CancellationToken::new();
        let limits = ConnectionLimits {
            max_connections: 8,
            header_timeout: Duration::from_millis(200),
        };
        let served = tokio::spawn(socket.serve(router(http), limits, shutdown.clone()));
        let answer = request(&path, "/next").await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains(r#"{"state":"claiming"}"#), "{answer}");
        assert!(
            request(&path, "/next?count=0")
                .await
                .starts_with("HTTP/1.1 400")
        );
        // A client that never sends its header is closed at the header timeout.
        let silent = UnixStream::connect(&path).unwrap();
        let started = std::time::Instant::now();
        let closed = tokio::task::spawn_blocking(move || (&silent).read(&mut [0; 64]).unwrap());
        assert_eq!(closed.await.unwrap(), 0, "closed without an answer");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(150) && took < Duration::from_secs(2),
            "{took:?}"
        );
        shutdown.cancel();
        served.await.unwrap().unwrap();
        assert!(!path.exists(), "removed at shutdown");
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(leftovers, 1, "only the plain file; no temporary socket");
    }
}
