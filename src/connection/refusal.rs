//! Why a Redis closed a new connection at once. Redis refuses a client
//! beyond `maxclients` by writing `-ERR max number of clients reached` and
//! closing (networking.c, `acceptCommonHandler`); redis-rs reads that line
//! as the reply to its own set-up commands and reports only the close
//! ("Connection reset by peer", "broken pipe"), so the cause is asked again
//! on a bare TCP connection (plain `redis://` only: over TLS Redis writes it
//! inside the session).

use std::time::Duration;

use crate::timing::within;
use redis::RedisError;
use tokio::net::TcpStream;

/// How long the probe waits for the server's first line: Redis writes its
/// refusal as soon as it accepts.
const PROBE_READ: Duration = Duration::from_millis(500);

/// The error line (without `-`) the server at `host:port` writes to a new
/// connection before any request, if any; None when it writes nothing
/// within [`PROBE_READ`] (connect bounded by `limit`).
pub(super) async fn why_closed(host: &str, port: u16, limit: Duration) -> Option<String> {
    let stream = within(limit, TcpStream::connect((host, port)))
        .await?
        .ok()?;
    let mut buf = [0u8; 256];
    let read = async {
        loop {
            stream.readable().await?;
            match stream.try_read(&mut buf) {
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => continue,
                done => return done,
            }
        }
    };
    let n = within(PROBE_READ.min(limit), read).await?.ok()?;
    let text = String::from_utf8_lossy(&buf[..n]);
    let line = text.strip_prefix('-')?.lines().next()?.trim();
    (!line.is_empty()).then(|| line.to_owned())
}

/// A transient error (I/O kind, like the close it explains) that names what
/// the server said instead of the close, e.g. `127.0.0.1:6379 refused the
/// connection: ERR max number of clients reached (Redis maxclients)`.
pub(super) fn refused(host: &str, port: u16, said: &str) -> RedisError {
    let hint = match said.contains("max number of clients") {
        true => " (Redis maxclients)",
        false => "",
    };
    let node = match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("{node} refused the connection: {said}{hint}"),
    )
    .into()
}
