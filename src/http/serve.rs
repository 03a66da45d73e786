//! Serving a router on a bound listener until shutdown: the accept loop,
//! one task per connection, the body read bounded in size and time, and
//! the drain at shutdown.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use super::accept::Accept;
use super::connections::{Connections, InRequest, Slot};
use super::limits::BODY_LIMIT;
use super::{ConnectionLimits, HttpError};
use crate::open_files;

/// Serves `router` on an already bound listener until `shutdown` fires,
/// then stops accepting, lets requests in flight finish, closes idle
/// connections and returns once every connection is closed.
///
/// Each connection is closed when it sends no complete request header
/// within `limits.header_timeout` (from connect, and from the end of the
/// previous response). At most `limits.max_connections` (lowered to fit
/// the open-file limit) are open: a connection beyond it closes the oldest
/// idle one, so a new request (the app's `GET /id`) is answered at once
/// whoever holds the others open; when none is idle (every one inside a
/// request) it waits in the listen backlog until one ends.
///
/// Errors: the listener's I/O error.
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_on(TcpListener::from_std(listener)?, router, limits, shutdown).await
}

/// [`serve`] on any [`Accept`] listener (TCP, a unix socket), with the same
/// cap, timeouts and shutdown.
///
/// Errors: the listener's I/O error.
pub(crate) async fn serve_on<L: Accept>(
    listener: L,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    // Every listener answers unknown paths and methods in JSON, like its
    // other errors.
    let router = super::with_json_fallbacks(router);
    let cap = effective_cap(limits.max_connections);
    info!(
        addr = %listener.describe(),
        max_connections = cap,
        header_timeout_ms = crate::timing::ms(limits.header_timeout),
        "http listening"
    );
    let connections = Connections::new(cap);
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept_one() => match accepted {
                Ok(stream) => stream,
                Err(err) => {
                    accept_failed(err).await;
                    continue;
                }
            },
        };
        let Some(slot) = connections.slot(&shutdown).await else {
            break;
        };
        tokio::spawn(serve_connection(
            http1.clone(),
            stream,
            router.clone(),
            limits.header_timeout,
            slot,
        ));
    }
    drop(listener);
    connections.all_closed().await;
    Ok(())
}

/// Serves `router` like [`serve`], on a thread of its own with a one-thread
/// runtime, so HTTP work (a flood of connections included) never runs on
/// the thread of the caller's tasks (the worker's renewals and the
/// unpublishing at the deadline). The receiver gets [`serve`]'s result.
///
/// Errors: the thread or its runtime cannot be started.
pub(crate) fn serve_on_own_thread(
    listener: std::net::TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<oneshot::Receiver<std::io::Result<()>>> {
    on_own_thread("http", serve(listener, router, limits, shutdown))
}

/// Runs `serving` (a server loop such as [`serve`]) to its end on a thread
/// named `name` with a one-thread runtime of its own; the receiver gets its
/// result.
///
/// Errors: the thread or its runtime cannot be started.
pub(crate) fn on_own_thread(
    name: &str,
    serving: impl Future<Output = std::io::Result<()>> + Send + 'static,
) -> std::io::Result<oneshot::Receiver<std::io::Result<()>>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done, result) = oneshot::channel();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let served = runtime.block_on(serving);
            let _ = done.send(served);
        })?;
    Ok(result)
}

/// `max_connections` lowered to leave [`open_files::RESERVED`] descriptors
/// under the soft open-file limit in force (a warning says so).
fn effective_cap(max_connections: usize) -> usize {
    let Some(soft) = open_files::soft_limit() else {
        return max_connections;
    };
    let bound = open_files::connection_bound(soft);
    if max_connections > bound {
        warn!(
            max_connections,
            open_file_limit = soft,
            lowered_to = bound,
            "--max-connections lowered to keep descriptors free for Redis and the ID files"
        );
        return bound;
    }
    max_connections
}

/// An accept error: a connection reset before it was accepted is skipped;
/// anything else (EMFILE, ENFILE, ENOMEM) is logged and retried after a
/// pause, as hyper 0.14's server did, so the loop does not spin.
async fn accept_failed(err: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        err.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    warn!(error = %err, "cannot accept an HTTP connection; retrying in 100ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Serves one connection until it ends, or until its slot is told to close
/// (evicted, or shutdown): then hyper closes it at once when idle, or after
/// the response in flight.
async fn serve_connection<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    http1: hyper::server::conn::http1::Builder,
    stream: S,
    router: Router,
    body_timeout: Duration,
    slot: Slot,
) {
    let in_request = slot.in_request.clone();
    let requests = slot.in_request.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let router = router.clone();
        let in_request = in_request.clone();
        async move {
            let request = match read_body(request, body_timeout).await {
                Ok(request) => request,
                Err(refused) => return Ok(refused),
            };
            // Only now: a client that trickles a body stays evictable.
            let _busy = InRequest::enter(&in_request);
            router.oneshot(request).await
        }
    });
    let connection = http1.serve_connection(TokioIo::new(stream), service);
    let mut connection = std::pin::pin!(connection);
    tokio::select! {
        ended = connection.as_mut() => {
            log_connection_end(ended);
            return;
        }
        () = slot.close.cancelled() => {}
    }
    // Not inside a request (idle, or a header or body still arriving):
    // dropped at once. hyper's graceful shutdown would wait for a started
    // header until the header timeout, so a client sending one byte per
    // connection would keep the cap full (and `/id` waiting) that long.
    if requests.load(Ordering::Acquire) == 0 {
        return;
    }
    connection.as_mut().graceful_shutdown();
    log_connection_end(connection.await);
}

/// Reads the whole request body (at most [`BODY_LIMIT`] bytes) within
/// `timeout`, so a client that sends a header and then trickles its body
/// holds a connection no longer than one that trickles its header. Refused
/// in JSON like every other error: 408 `{"error": "body not received in
/// time"}` (and the connection closed) when it is late, 413 `{"error":
/// "body too large", "limit_bytes"}`, 400 `{"error": "body broken off"}`
/// when the client broke off.
async fn read_body(
    request: hyper::Request<Incoming>,
    timeout: Duration,
) -> Result<axum::http::Request<axum::body::Body>, Response> {
    let (parts, body) = request.into_parts();
    let read = Limited::new(body, BODY_LIMIT).collect();
    match crate::timing::within(timeout, read).await {
        Some(Ok(body)) => Ok(axum::http::Request::from_parts(
            parts,
            body.to_bytes().into(),
        )),
        Some(Err(err)) if err.is::<LengthLimitError>() => Err(HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body too large",
        )
        .with("limit_bytes", BODY_LIMIT)
        .into_response()),
        Some(Err(_)) => {
            Err(HttpError::new(StatusCode::BAD_REQUEST, "body broken off").into_response())
        }
        None => Err((
            [(header::CONNECTION, "close")],
            HttpError::new(StatusCode::REQUEST_TIMEOUT, "body not received in time"),
        )
            .into_response()),
    }
}

fn log_connection_end(ended: Result<(), hyper::Error>) {
    if let Err(err) = ended {
        // Header timeouts and clients that went away: routine, and at the
        // cap one per connection.
        debug!(error = %err, "http connection closed");
    }
}
