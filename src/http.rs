//! HTTP serving shared by every mode: binding the listener (dual-stack on
//! `[::]`), the liveness routes, the metrics encoding, and serving a router
//! until shutdown with a connection cap and a header timeout (`--max-connections`,
//! `--http-header-timeout`), on TCP or a unix socket. Each mode's own routes
//! live in its subtree.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{Domain, Socket, Type};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use crate::cli::{ConfigError, check_range, parse_duration};
use crate::open_files;

/// `/livez` and `/healthz`: 200 while the process serves HTTP; never
/// depends on Redis (a Redis outage must not restart the pod).
pub(crate) fn liveness_routes() -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/healthz", get(|| async { "ok\n" }))
}

/// Encodes a registry in the Prometheus/OpenMetrics text format.
pub(crate) fn encode_metrics(registry: &Registry) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Labels of `snowlease_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// Registers `snowlease_build_info{version,commit} 1` (the commit from
/// build.rs), so dashboards can tell which build runs where.
pub(crate) fn register_build_info(registry: &mut Registry) {
    let info = Family::<BuildLabels, Gauge>::default();
    info.get_or_create(&BuildLabels {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("SNOWLEASE_COMMIT"),
    })
    .set(1);
    registry.register(
        "snowlease_build_info",
        "Version and commit of this binary; always 1",
        info,
    );
}

/// `--max-connections` and `--http-header-timeout`, shared by every HTTP
/// listener (the worker sidecar, `pool serve`).
#[derive(Debug, Clone, Copy, Args)]
pub struct HttpArgs {
    /// Most HTTP connections open at once (1-65536), also kept 128 below the open-file limit; at the cap a new connection closes the oldest idle one.
    #[arg(long, env = "SNOWLEASE_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: u32,

    /// Longest a connection may go without a complete request header (100ms-10m): from connect, and between keep-alive requests.
    #[arg(long, env = "SNOWLEASE_HTTP_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub http_header_timeout: Duration,
}

/// `--max-connections` by default: far more than a pod's app, kubelet and
/// Prometheus open (a handful), and about 3 MB of idle connections.
pub(crate) const DEFAULT_MAX_CONNECTIONS: u32 = 512;

/// Largest request body (bytes): the JSON bodies of `pool serve` are well
/// under 1 KiB (ids and tokens of at most 128 characters, a reason of at
/// most 200 bytes), and the worker's routes take none. At the cap of 512
/// connections, bodies in flight hold 8 MiB at most.
pub(crate) const BODY_LIMIT: usize = 16 * 1024;

/// Largest `--max-connections`.
pub(crate) const MAX_CONNECTIONS_LIMIT: u32 = 65_536;

/// The validated [`HttpArgs`]: what [`serve`] enforces on each connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most connections served at once, 1-65536 (lowered at serve time to
    /// fit the open-file limit, [`open_files::connection_bound`]).
    pub max_connections: usize,
    /// Longest wait for a complete request header, counted from connect
    /// and from the end of the previous response (the keep-alive idle
    /// timeout), 100 ms-10 min.
    pub header_timeout: Duration,
}

impl Default for ConnectionLimits {
    /// The flags' defaults: 512 connections, 5 s.
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS as usize,
            header_timeout: Duration::from_secs(5),
        }
    }
}

impl HttpArgs {
    /// Checks both ranges; the first violation names its flag.
    pub fn validate(&self) -> Result<ConnectionLimits, ConfigError> {
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.max_connections) {
            return Err(ConfigError::new(
                "--max-connections",
                format!(
                    "{} is outside 1-{MAX_CONNECTIONS_LIMIT}",
                    self.max_connections
                ),
            ));
        }
        check_range(
            "--http-header-timeout",
            self.http_header_timeout,
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        Ok(ConnectionLimits {
            max_connections: self.max_connections as usize,
            header_timeout: self.http_header_timeout,
        })
    }
}

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

/// A listener [`serve_on`] takes connections from: TCP (`--listen`) or a unix socket
/// (`--mint-socket`).
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

/// [`serve`] on any [`Accept`] listener, with the same cap, timeouts and shutdown.
pub(crate) async fn serve_on<L: Accept>(
    listener: L,
    router: Router,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
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
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done, result) = oneshot::channel();
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let served = runtime.block_on(serve(listener, router, limits, shutdown));
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
/// holds a connection no longer than one that trickles its header. Refused:
/// 408 (and the connection closed) when it is late, 413 when too large, 400
/// when the client broke off.
async fn read_body(
    request: hyper::Request<Incoming>,
    timeout: Duration,
) -> Result<axum::http::Request<axum::body::Body>, Response> {
    let (parts, body) = request.into_parts();
    let read = Limited::new(body, BODY_LIMIT).collect();
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(body)) => Ok(axum::http::Request::from_parts(
            parts,
            body.to_bytes().into(),
        )),
        Ok(Err(err)) if err.is::<LengthLimitError>() => {
            Err(StatusCode::PAYLOAD_TOO_LARGE.into_response())
        }
        Ok(Err(_)) => Err(StatusCode::BAD_REQUEST.into_response()),
        Err(_) => {
            Err((StatusCode::REQUEST_TIMEOUT, [(header::CONNECTION, "close")]).into_response())
        }
    }
}

fn log_connection_end(ended: Result<(), hyper::Error>) {
    if let Err(err) = ended {
        // Header timeouts and clients that went away: routine, and at the
        // cap one per connection.
        debug!(error = %err, "http connection closed");
    }
}

/// How often a connection waiting at the cap looks again for an idle one.
const RECHECK: Duration = Duration::from_millis(100);

/// The open connections, oldest first, and the permits that cap them.
struct Connections {
    permits: Arc<Semaphore>,
    cap: usize,
    open: Arc<Mutex<BTreeMap<u64, Tracked>>>,
    next: AtomicU64,
}

/// What the accept loop knows of one open connection.
struct Tracked {
    in_request: Arc<AtomicUsize>,
    close: CancellationToken,
}

/// One connection's place under the cap; dropping it frees the place.
struct Slot {
    key: u64,
    open: Arc<Mutex<BTreeMap<u64, Tracked>>>,
    in_request: Arc<AtomicUsize>,
    close: CancellationToken,
    _permit: OwnedSemaphorePermit,
}

impl Connections {
    fn new(cap: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(cap)),
            cap,
            open: Arc::default(),
            next: AtomicU64::new(0),
        }
    }

    /// A place for a connection just accepted: at once below the cap; at
    /// the cap, once the oldest idle connection (told to close here) or any
    /// other one has closed. While every connection is inside a request it
    /// looks again every [`RECHECK`]: one may have ended its request and be
    /// idle. `None` when `shutdown` fires first.
    async fn slot(&self, shutdown: &CancellationToken) -> Option<Slot> {
        let permit = loop {
            if let Ok(permit) = self.permits.clone().try_acquire_owned() {
                break permit;
            }
            self.close_oldest_idle();
            tokio::select! {
                () = shutdown.cancelled() => return None,
                permit = self.permits.clone().acquire_owned() => break permit.ok()?,
                () = tokio::time::sleep(RECHECK) => {}
            }
        };
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let tracked = Tracked {
            in_request: Arc::default(),
            close: shutdown.child_token(),
        };
        let slot = Slot {
            key,
            open: self.open.clone(),
            in_request: tracked.in_request.clone(),
            close: tracked.close.clone(),
            _permit: permit,
        };
        lock(&self.open).insert(key, tracked);
        Some(slot)
    }

    /// Tells the oldest connection that is not inside a request (waiting
    /// for a header, or kept alive between requests) and not already
    /// closing to close.
    fn close_oldest_idle(&self) {
        let open = lock(&self.open);
        let oldest = open
            .values()
            .find(|c| c.in_request.load(Ordering::Acquire) == 0 && !c.close.is_cancelled());
        if let Some(oldest) = oldest {
            debug!(
                open = open.len(),
                "connection cap reached; closing the oldest idle connection"
            );
            oldest.close.cancel();
        }
    }

    /// Waits until every connection has closed.
    async fn all_closed(&self) {
        let all = u32::try_from(self.cap).unwrap_or(u32::MAX);
        let _ = self.permits.acquire_many(all).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.open).remove(&self.key);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing panics while holding it; a poisoned map is still consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Marks a connection as inside a request while alive: such a connection
/// is never closed to make room.
struct InRequest(Arc<AtomicUsize>);

impl InRequest {
    fn enter(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self(count.clone())
    }
}

impl Drop for InRequest {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Binds `addr` for HTTP (a non-blocking std listener, for [`serve`] or
/// [`serve_on_own_thread`]). `[::]:port` listens on IPv6 and IPv4 alike
/// (IPV6_V6ONLY off, whatever the host's `net.ipv6.bindv6only`), so the
/// kubelet's probes reach it in IPv4, IPv6 and dual-stack pods; on a host
/// without IPv6 it falls back to `0.0.0.0:port`. Other addresses are bound
/// as given.
///
/// Errors: the bind error of `addr` (or of the IPv4 fallback).
pub(crate) fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let dual = match addr {
        SocketAddr::V6(v6) if v6.ip().is_unspecified() => true,
        _ => return listen_on(addr, false),
    };
    match listen_on(addr, dual) {
        Err(err) if no_ipv6(&err) => {
            let fallback = SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port()));
            warn!(error = %err, addr = %fallback, "no IPv6 on this host; listening on IPv4 only");
            listen_on(fallback, false)
        }
        bound => bound,
    }
}

fn listen_on(addr: SocketAddr, dual_stack: bool) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    // As std and tokio do: a restarted sidecar must not wait out TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// The errors of a host or container without IPv6 (kernel `ipv6.disable=1`,
/// or no IPv6 address at all).
fn no_ipv6(err: &std::io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(nix::libc::EAFNOSUPPORT | nix::libc::EADDRNOTAVAIL | nix::libc::EPROTONOSUPPORT)
    )
}

/// Test helper: every metric family in `text` (the `/metrics` encoding) is named in
/// Prometheus base units: no name part `ms`, `millis`, `milliseconds`, `us`, `micros`,
/// `minutes` or `hours` (time goes in `_seconds`). Returns the family names it checked.
#[cfg(test)]
pub(crate) fn assert_base_units(text: &str) -> Vec<String> {
    const NOT_BASE: [&str; 7] = [
        "ms",
        "millis",
        "milliseconds",
        "us",
        "micros",
        "minutes",
        "hours",
    ];
    let names: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    for name in &names {
        assert!(
            !name.split('_').any(|part| NOT_BASE.contains(&part)),
            "{name} is not in base units (seconds)"
        );
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn at_the_cap_the_oldest_idle_connection_is_told_to_close() {
        let connections = Connections::new(2);
        let shutdown = CancellationToken::new();
        let busy = connections.slot(&shutdown).await.unwrap();
        let _in_request = InRequest::enter(&busy.in_request);
        let idle = connections.slot(&shutdown).await.unwrap();
        let idle_close = idle.close.clone();
        let third = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { connections.slot(&shutdown).await.map(|s| s.key) }
        });
        idle_close.cancelled().await;
        assert!(
            !busy.close.is_cancelled(),
            "a connection inside a request stays"
        );
        assert!(!third.is_finished(), "waits until the idle one has closed");
        drop(idle);
        assert_eq!(third.await.unwrap(), Some(2));
    }

    #[tokio::test]
    async fn at_the_cap_with_every_connection_busy_a_new_one_waits_for_shutdown() {
        let connections = Connections::new(1);
        let shutdown = CancellationToken::new();
        let busy = connections.slot(&shutdown).await.unwrap();
        let _in_request = InRequest::enter(&busy.in_request);
        let waiting = connections.slot(&shutdown);
        let stop = async {
            tokio::time::sleep(RECHECK * 3).await;
            shutdown.cancel();
        };
        let (slot, ()) = tokio::join!(waiting, stop);
        assert!(slot.is_none());
        assert!(
            busy.close.is_cancelled(),
            "shutdown closes every connection"
        );
    }

    #[test]
    fn flags_out_of_range_name_their_flag() {
        let args = |max_connections, http_header_timeout| HttpArgs {
            max_connections,
            http_header_timeout,
        };
        let cases = [
            (args(0, Duration::from_secs(5)), "--max-connections"),
            (args(65_537, Duration::from_secs(5)), "--max-connections"),
            (
                args(512, Duration::from_millis(99)),
                "--http-header-timeout",
            ),
            (args(512, Duration::from_secs(601)), "--http-header-timeout"),
        ];
        for (args, flag) in cases {
            assert_eq!(args.validate().unwrap_err().flag, flag, "{args:?}");
        }
        let limits = args(65_536, Duration::from_secs(600)).validate().unwrap();
        assert_eq!(limits.max_connections, 65_536);
    }
}
