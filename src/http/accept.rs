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

impl Accept for UnixListener {
    type Stream = UnixStream;

    async fn accept_one(&self) -> std::io::Result<UnixStream> {
        Ok(self.accept().await?.0)
    }

    fn describe(&self) -> String {
        let addr = self.local_addr();
        let path = addr.as_ref().ok().and_then(|a| a.as_pathname());
        path.map_or_else(|| "unix socket".into(), |p| p.display().to_string())
    }
}
