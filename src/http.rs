//! HTTP serving shared by every mode: binding the listener (dual-stack on
//! `[::]`), the liveness routes, the metrics encoding, and serving a router
//! until shutdown. Each mode's own routes live in its subtree.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::{Ipv4Addr, SocketAddr};

use socket2::{Domain, Socket, Type};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// `/livez` and `/healthz`: 200 while the process serves HTTP; never
/// depends on Redis (a Redis outage must not restart the pod).
pub fn liveness_routes() -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/healthz", get(|| async { "ok\n" }))
}

/// Encodes a registry in the Prometheus/OpenMetrics text format.
pub fn encode_metrics(registry: &Registry) -> Response {
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
pub fn register_build_info(registry: &mut Registry) {
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

/// Serves `router` on an already bound listener until `shutdown` fires.
///
/// Errors: the listener's I/O error.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        info!(addr = %addr, "http listening");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Binds `addr` for HTTP. `[::]:port` listens on IPv6 and IPv4 alike
/// (IPV6_V6ONLY off, whatever the host's `net.ipv6.bindv6only`), so the
/// kubelet's probes reach it in IPv4, IPv6 and dual-stack pods; on a host
/// without IPv6 it falls back to `0.0.0.0:port`. Other addresses are bound
/// as given. Call inside a tokio runtime.
///
/// Errors: the bind error of `addr` (or of the IPv4 fallback).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
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

fn listen_on(addr: SocketAddr, dual_stack: bool) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    // As std and tokio do: a restarted sidecar must not wait out TIME_WAIT.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
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
