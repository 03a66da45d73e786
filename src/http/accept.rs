//! The listeners `serve_on` takes connections from: TCP (`--listen`) and a
//! unix socket (`--mint-socket`), behind one small trait so both get the
//! same connection cap, header timeout and shutdown.

use std::future::Future;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// A listener [`super::serve_on`] takes connections from.
pub(crate) trait Accept {
    /// One accepted connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection.
    fn accept_one(&self) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;

    /// Where it listens, for the log.
    fn describe(&self) -> String;
}

impl Accept for TcpListener {
    type Stream = TcpStream;

    async fn accept_one(&self) -> std::io::Result<TcpStream> {
        Ok(self.accept().await?.0)
    }

    fn describe(&self) -> String {
        self.local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string())
    }
}

/// A unix listener and the name it is reached by: the mint socket is bound under a
/// temporary name and renamed into place, so its own address names the temporary file.
pub(crate) struct PlacedUnixListener {
    /// The listener.
    pub listener: UnixListener,
    /// The socket file's final path.
    pub path: std::path::PathBuf,
}

impl Accept for PlacedUnixListener {
    type Stream = UnixStream;

    async fn accept_one(&self) -> std::io::Result<UnixStream> {
        Ok(self.listener.accept().await?.0)
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}
