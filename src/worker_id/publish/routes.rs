//! The worker sidecar's routes: `/id` for the app, `/readyz` for the
//! kubelet, `/metrics` for Prometheus, plus the shared liveness routes.
//! Handlers only read the worker state; they never touch Redis.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::watch;

use crate::http::{HttpError, encode_metrics, liveness_routes};
use crate::worker_id::state::{Mode, WorkerState};

/// What the worker-mode handlers read.
#[derive(Clone)]
pub(crate) struct WorkerHttp {
    /// Application name, echoed in `/id`.
    pub app: Arc<str>,
    /// Latest worker state (written only by the worker loop).
    pub state: watch::Receiver<WorkerState>,
    /// Metrics registry, encoded on each scrape.
    pub registry: Arc<Registry>,
    /// In mint mode (`--mint`) `/id` answers 409: the worker ID is not offered.
    pub mode: Mode,
}

/// Routes of the worker sidecar. Pure: tests drive it with `oneshot`.
pub(crate) fn worker_router(http: WorkerHttp) -> Router {
    Router::new()
        .route("/id", get(worker_id))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(http)
        .merge(liveness_routes())
}

/// `GET /id`: 200 with JSON (or the bare ID for `Accept: text/plain`) while
/// the lease is within its validity deadline, judged at request time; 503
/// otherwise; 409 `{"state": "minting"}` in mint mode, whatever the lease:
/// an app minting with the worker ID would duplicate the sidecar's IDs.
async fn worker_id(State(http): State<WorkerHttp>, headers: HeaderMap) -> Response {
    if http.mode == Mode::Mint {
        return HttpError::new(
            StatusCode::CONFLICT,
            "mint mode (--mint): this sidecar mints the IDs itself and offers no worker ID; use GET /next",
        )
        .with("state", "minting")
        .into_response();
    }
    let state = http.state.borrow().clone();
    let Some(held) = state.valid_lease() else {
        return HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "no valid worker-ID lease")
            .with_fields(unpublished(&state))
            .into_response();
    };
    if crate::http::wants_text(&headers) {
        return (
            [(header::CONTENT_TYPE, "text/plain")],
            format!("{}\n", held.worker_id),
        )
            .into_response();
    }
    axum::Json(json!({
        "app": &*http.app,
        "worker_id": held.worker_id,
        "owner": held.owner.as_str(),
        "lease_expires_in_ms": crate::timing::ms(held.remaining()),
    }))
    .into_response()
}

/// `{"state": ...}` of an unpublished ID, with `opens_in_ms` while the
/// claim guard holds claims back, `clock_skew_ms` while the clock check
/// does, `maxmemory_policy`, `maxmemory` (bytes) and `reason` while Redis
/// may evict lease keys.
fn unpublished(state: &WorkerState) -> serde_json::Value {
    match state {
        WorkerState::GuardClosed(opens_at) => json!({
            "state": state_name(state),
            "opens_in_ms": crate::timing::ms(opens_at.remaining()),
        }),
        WorkerState::ClockSkewed(skew_ms) => json!({
            "state": state_name(state),
            "clock_skew_ms": skew_ms,
        }),
        WorkerState::Handover(until) => json!({
            "state": state_name(state),
            "handover_in_ms": crate::timing::ms(until.remaining()),
        }),
        WorkerState::Unacknowledged(replicas) => json!({
            "state": state_name(state),
            "min_replicas_ack": replicas,
        }),
        WorkerState::Evicting(evicting) => json!({
            "state": state_name(state),
            "maxmemory_policy": evicting.policy,
            "maxmemory": evicting.maxmemory,
            "reason": evicting.to_string(),
        }),
        _ => json!({ "state": state_name(state) }),
    }
}

/// The `state` `/readyz` (and `/id`) answers while no lease is valid; `/next` names the same
/// states alike (a unit test of the reserver keeps them equal).
pub(crate) fn state_name(state: &WorkerState) -> &'static str {
    match state {
        WorkerState::Claiming => "claiming",
        WorkerState::GuardClosed(_) => "guard_closed",
        WorkerState::ClockSkewed(_) => "clock_skew",
        WorkerState::Handover(_) => "handover",
        WorkerState::Evicting(_) => "evicting",
        WorkerState::Unacknowledged(_) => "unacknowledged",
        WorkerState::Readopting(_) => "readopting",
        WorkerState::Held(_) => "expired",
        WorkerState::Lost => "lost",
        WorkerState::Stopping => "stopping",
    }
}

/// `GET /readyz`: 200 only while a lease is valid (false from the moment
/// it is lost or shutdown starts); 503 with `{"state", "opens_in_ms"?}`.
async fn readyz(State(http): State<WorkerHttp>) -> Response {
    let state = http.state.borrow().clone();
    if state.valid_lease().is_some() {
        "ready\n".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(unpublished(&state)),
        )
            .into_response()
    }
}

async fn metrics(State(http): State<WorkerHttp>) -> Response {
    encode_metrics(&http.registry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Owner;
    use crate::worker_id::state::HeldLease;
    use axum::body::{Body, to_bytes};
    use axum::http::Request;
    use std::time::Duration;
    use tower::ServiceExt;

    fn router_with(state: WorkerState) -> Router {
        router_in(state, false)
    }

    fn router_in(state: WorkerState, mint: bool) -> Router {
        let (_tx, rx) = watch::channel(state);
        worker_router(WorkerHttp {
            app: "orders".into(),
            state: rx,
            registry: Arc::new(Registry::default()),
            mode: if mint { Mode::Mint } else { Mode::Publish },
        })
    }

    fn held(valid_for: Duration) -> WorkerState {
        WorkerState::Held(HeldLease {
            worker_id: 7,
            owner: Owner::generate("10.0.0.1"),
            claimed: crate::boot_clock::BootInstant::now(),
            valid_until: crate::boot_clock::BootInstant::now() + valid_for,
            valid_until_unix_ms: 0,
            redis_expires_ms: 0,
            app_until: None,
        })
    }

    async fn get(router: Router, path: &str, accept: &str) -> (StatusCode, String) {
        let request = Request::get(path)
            .header("accept", accept)
            .body(Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        let status = response.status();
        let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn id_answers_json_or_text_while_valid() {
        let router = router_with(held(Duration::from_secs(5)));
        let (status, body) = get(router.clone(), "/id", "application/json").await;
        assert_eq!(status, StatusCode::OK);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["worker_id"], 7);
        assert_eq!(json["app"], "orders");
        assert_eq!(
            get(router.clone(), "/id", "text/plain").await,
            (StatusCode::OK, "7\n".into())
        );
        assert_eq!(get(router, "/readyz", "*/*").await.0, StatusCode::OK);
    }

    /// Mint mode offers no worker ID, even with a valid lease: 409 naming
    /// the mode, in JSON and for text alike; readiness still follows the lease.
    #[tokio::test]
    async fn id_answers_409_in_mint_mode() {
        let router = router_in(held(Duration::from_secs(5)), true);
        for accept in ["application/json", "text/plain"] {
            let (status, body) = get(router.clone(), "/id", accept).await;
            assert_eq!(status, StatusCode::CONFLICT);
            let json: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(json["state"], "minting");
            assert!(json["error"].as_str().unwrap().contains("/next"), "{body}");
        }
        assert_eq!(get(router, "/readyz", "*/*").await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn expired_lease_is_not_published_even_without_a_new_state() {
        let router = router_with(held(Duration::ZERO));
        assert_eq!(
            get(router.clone(), "/id", "text/plain").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            get(router.clone(), "/readyz", "*/*").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(get(router, "/livez", "*/*").await.0, StatusCode::OK);
    }
}
