//! HTTP serving shared by every mode: the liveness routes, the metrics
//! encoding, and serving a router on a listener bound by the caller until
//! shutdown. Each mode's own routes live in its subtree.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::info;

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
