//! HTTP serving shared by every mode: binding the listener (`bind`,
//! dual-stack on `[::]`), the liveness routes, the metrics encoding, and
//! serving a router until shutdown (`serve`) with a connection cap
//! (`connections`) and a header timeout, set by `--max-connections` and
//! `--http-header-timeout` (`limits`), on TCP or a unix socket (`accept`).
//! Each mode's own routes live in its subtree.

mod accept;
mod bind;
mod connections;
mod limits;
mod serve;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub(crate) use accept::PlacedUnixListener;
pub(crate) use bind::bind;
pub(crate) use limits::{ConnectionLimits, HttpArgs};
pub(crate) use serve::{on_own_thread, serve, serve_on, serve_on_own_thread};

/// `/livez` and `/healthz`: 200 while the process serves HTTP; never
/// depends on Redis (a Redis outage must not restart the pod).
pub(crate) fn liveness_routes() -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/healthz", get(|| async { "ok\n" }))
}

/// Whether a request asks for plain text (`Accept` names `text/plain`, not JSON): `/id` and
/// `/next` then answer bare decimals, one a line.
pub(crate) fn wants_text(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/plain") && !accept.contains("application/json"))
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
