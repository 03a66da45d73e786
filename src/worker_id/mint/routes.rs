//! `GET /next` and `GET /next?count=N`: IDs from the desk's minter, as JSON strings (JavaScript
//! loses integers above 2^53) or plain decimal lines; 503 naming the state without a valid
//! lease; 400 naming `count` and its range. The handlers never touch Redis.

use std::sync::Arc;

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::desk::MintDesk;
use super::metrics::MintMetrics;
use super::minter::{MintRefusal, Standby};

/// Most IDs one request may ask for (`count`): one ms of the default layout's sequence.
pub(crate) const MAX_COUNT: usize = 4096;

/// What the mint handlers use.
#[derive(Clone)]
pub(crate) struct MintHttp {
    /// The minter the keeper feeds.
    pub desk: Arc<MintDesk>,
    /// Counted on every answer.
    pub metrics: Arc<MintMetrics>,
}

/// The mint routes. Pure: tests drive it with `oneshot`; the worker's `--listen` server and
/// the unix socket ([`super::socket`]) serve it.
pub(crate) fn router(http: MintHttp) -> Router {
    // axum answers HEAD with the GET handler minus the body: here that would mint IDs and
    // drop them, so HEAD is refused.
    Router::new()
        .route("/next", get(next).head(head_refused))
        .with_state(http)
}

/// `/next` on `--listen` when `--mint-socket` serves it: 404 naming the socket, so any pod
/// that reaches the port cannot mint with this sidecar's worker ID (docs/kubernetes.md,
/// "Mint mode": least exposure). Nothing is minted.
pub(crate) fn served_on_socket_only(socket: &std::path::Path) -> Router {
    let answer = crate::http::HttpError::new(StatusCode::NOT_FOUND, "not found").with(
        "detail",
        format!(
            "GET /next is served on the mint socket {} only (--mint-socket); --next-on-listen serves it on --listen too",
            socket.display()
        ),
    );
    Router::new().route(
        "/next",
        axum::routing::any(move || std::future::ready(answer.clone().into_response())),
    )
}

/// `HEAD /next`: 405 with `Allow: GET`; nothing is minted.
async fn head_refused() -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "GET")]).into_response()
}

/// `GET /next[?count=N]`.
async fn next(
    State(http): State<MintHttp>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let count = match parse_count(query.as_deref()) {
        Ok(count) => count,
        Err(bad) => return bad.into_response(),
    };
    match http.desk.mint(count.unwrap_or(1)).await {
        Ok(minted) => {
            http.metrics.minted.inc_by(minted.ids.len() as u64);
            http.metrics.sequence_waits.inc_by(minted.sequence_waits);
            answer(
                &minted.ids,
                count.is_some(),
                crate::http::wants_text(&headers),
            )
        }
        Err(refusal) => {
            http.metrics.count_unavailable(refusal.state());
            unavailable(refusal)
        }
    }
}

/// `count` of the query: `None` when absent; [`BadCount`] when it is not an integer in
/// 1-4096 (or given twice).
fn parse_count(query: Option<&str>) -> Result<Option<usize>, BadCount> {
    let mut given = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .filter(|(name, _)| name == "count")
        .map(|(_, value)| {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_COUNT).contains(n))
        });
    match (given.next(), given.next()) {
        (None, _) => Ok(None),
        (Some(Some(count)), None) => Ok(Some(count)),
        _ => Err(BadCount),
    }
}

/// A bad `count`: 400 naming the field and its range.
struct BadCount;

impl IntoResponse for BadCount {
    fn into_response(self) -> Response {
        let expected = format!("one integer in 1-{MAX_COUNT}");
        crate::http::HttpError::bad_input("count", &expected).into_response()
    }
}

/// 200: `{"id": "<decimal>"}` for a plain `/next`, `{"ids": [...]}` with `count`; one
/// decimal per line as text. Written directly (digits need no escaping): the same bytes as
/// serde_json's compact form, without a `String` and a JSON value per ID, which made a
/// 4096-ID answer cost more than the ms its IDs come from.
fn answer(ids: &[u64], batch: bool, text: bool) -> Response {
    let mut digits = itoa::Buffer::new();
    // 19 digits at most (IDs are below 2^63), quotes and a comma each.
    let mut body = String::with_capacity(ids.len() * 22 + 16);
    if text {
        for id in ids {
            body.push_str(digits.format(*id));
            body.push('\n');
        }
        return ([(header::CONTENT_TYPE, "text/plain")], body).into_response();
    }
    let mut quoted = |body: &mut String, id: u64| {
        body.push('"');
        body.push_str(digits.format(id));
        body.push('"');
    };
    if batch {
        body.push_str(r#"{"ids":["#);
        for (n, id) in ids.iter().enumerate() {
            if n > 0 {
                body.push(',');
            }
            quoted(&mut body, *id);
        }
        body.push_str("]}");
    } else {
        body.push_str(r#"{"id":"#);
        match ids.first() {
            Some(id) => quoted(&mut body, *id),
            None => body.push_str("null"),
        }
        body.push('}');
    }
    // axum::Json's content type.
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// 503 `{"state": ...}` (plus `wait_ms` while the clock is behind the mark,
/// `min_replicas_ack` while a claim is unacknowledged, as `/readyz` says) with
/// `Retry-After` in whole seconds, at least 1.
fn unavailable(refusal: MintRefusal) -> Response {
    let mut body = json!({ "state": refusal.state() });
    let mut retry_ms = 1_000;
    match refusal {
        MintRefusal::ClockBehind { wait_ms } => {
            body["wait_ms"] = wait_ms.into();
            retry_ms = wait_ms;
        }
        MintRefusal::NoLease(Standby::Unacknowledged(replicas)) => {
            body["min_replicas_ack"] = replicas.into();
        }
        _ => {}
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        crate::http::retry_after(std::time::Duration::from_millis(retry_ms)),
        axum::Json(body),
    )
        .into_response()
}

#[cfg(test)]
mod tests;
