//! HTTP serving shared by every mode: binding the listener (`bind`,
//! dual-stack on `[::]`), the liveness routes, the metrics encoding, and
//! serving a router until shutdown (`serve`) with a connection cap
//! (`connections`) and a header timeout, set by `--max-connections` and
//! `--http-header-timeout` (`limits`), on TCP or a unix socket (`accept`),
//! the one reader of JSON request bodies (`body`), and the one JSON error
//! answer with the one `Retry-After` writer (`error`).
//! Each mode's own routes live in its subtree.

mod accept;
mod bind;
pub(crate) mod body;
mod connections;
mod error;
pub(crate) mod json;
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
pub(crate) use error::{HttpError, ratelimit, retry_after, with_json_fallbacks};
pub(crate) use limits::{ConnectionLimits, HttpArgs};
pub(crate) use serve::{on_own_thread, serve, serve_on, serve_on_own_thread};

/// `/livez` and `/healthz`: 200 while the process serves HTTP; never
/// depends on Redis (a Redis outage must not restart the pod).
pub(crate) fn liveness_routes() -> Router {
    Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/healthz", get(|| async { "ok\n" }))
}

/// Whether a request asks for plain text: `/id` and `/next` then answer bare decimals, one a
/// line. Content negotiation as RFC 9110 (12.5.1) has it: media ranges compared without
/// regard to case, each type weighed by the `q` of the most specific range that matches it
/// (`text/plain` before `text/*` before `*/*`), `q=0` meaning "not acceptable". Text only when
/// `text/plain` weighs more than `application/json` (so no `Accept`, `*/*` or a tie keep JSON).
pub(crate) fn wants_text(headers: &axum::http::HeaderMap) -> bool {
    let Some(accept) = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let ranges: Vec<mime::Mime> = accept
        .split(',')
        .filter_map(|range| range.trim().parse().ok())
        .collect();
    let text = weight(&ranges, &mime::TEXT_PLAIN);
    text > 0.0 && text > weight(&ranges, &mime::APPLICATION_JSON)
}

/// The `q` (0-1) that `ranges` give `wanted`: that of the most specific matching range, 0
/// when none matches.
fn weight(ranges: &[mime::Mime], wanted: &mime::Mime) -> f32 {
    let specificity = |range: &mime::Mime| match (range.type_(), range.subtype()) {
        (t, s) if t == wanted.type_() && s == wanted.subtype() => Some(2),
        (t, mime::STAR) if t == wanted.type_() => Some(1),
        (mime::STAR, mime::STAR) => Some(0),
        _ => None,
    };
    ranges
        .iter()
        .filter_map(|range| {
            let q = range
                .get_param("q")
                .map_or(Some(1.0), |q| q.as_str().parse::<f32>().ok())?;
            Some((specificity(range)?, q.clamp(0.0, 1.0)))
        })
        .max_by_key(|(specificity, _)| *specificity)
        .map_or(0.0, |(_, q)| q)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn text_for(accept: &str) -> bool {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(header::ACCEPT, accept.parse().unwrap());
        wants_text(&headers)
    }

    /// `Accept` is read as RFC 9110 has it: case-insensitive types, `q` weights (0: not
    /// acceptable), the most specific range deciding; JSON unless text weighs more.
    #[test]
    fn accept_is_negotiated_by_type_and_weight() {
        for (accept, text) in [
            ("text/plain", true),
            ("Text/Plain", true),
            ("TEXT/PLAIN; charset=utf-8", true),
            ("text/plain;q=0", false),
            ("text/plain; q=0, */*", false),
            ("text/plain, application/json;q=0.5", true),
            ("application/json, text/plain", false),
            ("text/*", true),
            ("text/*;q=0.3, application/json;q=0.2", true),
            ("*/*", false),
            ("application/json", false),
            ("garbage", false),
            ("", false),
        ] {
            assert_eq!(text_for(accept), text, "{accept:?}");
        }
        assert!(
            !wants_text(&axum::http::HeaderMap::new()),
            "no Accept: JSON"
        );
    }
}
