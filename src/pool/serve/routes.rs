//! The routes of `pool serve` but acquire (`acquire.rs`): extend,
//! release, status, readiness, metrics, and the budget routes' guard.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tracing::{debug, info};

use super::super::{Extended, Released};
use super::ServeState;
use super::acquire::acquire;
use super::body::{ApiError, ExtendBody, ReleaseBody, lease_id};
use crate::eviction::Eviction;
use crate::http;

/// The routes of `pool serve`. Pure: tests drive it with `oneshot`.
///
/// - `POST /pools/{pool}/leases` `{ttl_ms, cooldown_ms?, wait_ms?,
///   request_id?}`: 201 `{id, token, deadline_ms, fence}`, or 503 `{error,
///   next_due_in_ms, at_ms}` with `Retry-After`.
/// - `POST /pools/{pool}/leases/{id}/extend` `{token, ttl_ms}`: 200 `{id,
///   deadline_ms, capped}` or 409 `{error, reason}`.
/// - `POST /pools/{pool}/leases/{id}/release` `{token, cooldown_ms?,
///   quarantine_ms?, reason?}`: 200 `{id, released_at_ms}` (with a
///   quarantine also `quarantined_until_ms, strikes, auto_disabled`) or
///   409 `{error, reason}`.
/// - `GET /pools/{pool}`: the status counts, quarantined and auto-disabled ids.
/// - `POST /budgets/{name}/take`, `POST /budgets/{name}/penalize`: rate
///   budgets ([`crate::budget::serve::routes`]).
/// - 404 for a pool not served, 400 naming the bad field, 503 while Redis
///   does not answer; `/livez`, `/healthz`, `/readyz`, `/metrics`.
/// - JSON for every error, also for an unknown path (404) or method (405).
pub fn router(state: ServeState) -> Router {
    let budgets = state.inner.budgets.clone().map(|budgets| {
        let guard = axum::middleware::from_fn_with_state(state.clone(), refuse_budgets_if_evicting);
        crate::budget::serve::routes(budgets).route_layer(guard)
    });
    let router = Router::new()
        .route("/pools/{pool}", get(status))
        .route("/pools/{pool}/leases", post(acquire))
        .route("/pools/{pool}/leases/{id}/extend", post(extend))
        .route("/pools/{pool}/leases/{id}/release", post(release))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
        .merge(http::liveness_routes())
        .merge(budgets.unwrap_or_default());
    http::with_json_fallbacks(router)
}

/// The budget routes answer 503 while Redis may evict keys (an evicted
/// budget key is a full budget again: a limit that does not hold), as
/// acquire does; their answers count for readiness ([`ServeState::note_answered`]).
async fn refuse_budgets_if_evicting(
    State(state): State<ServeState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match state.refuse_if_evicting() {
        Ok(()) => {
            let response = next.run(request).await;
            // Budget traffic alone must move readiness as pool traffic does: with a long
            // --reap-interval nothing else asks Redis.
            if let Some(answered) = response
                .extensions()
                .get::<crate::budget::serve::RedisAnswered>()
            {
                state.note_answered(answered.0);
            }
            response
        }
        Err(ApiError::Evicting(evicting)) => ApiError::EvictingBudgets(evicting).into_response(),
        Err(err) => err.into_response(),
    }
}

async fn extend(
    State(state): State<ServeState>,
    Path((pool, id)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let served = state.pool(&pool)?;
    state.refuse_if_evicting()?;
    lease_id(&id)?;
    let ExtendBody { token, ttl } = ExtendBody::parse(&body)?;
    let result = served.pool.extend_lease(&id, &token, ttl).await;
    state.note(&result);
    let metrics = &state.inner.metrics;
    match result {
        Ok(Extended::Extended {
            deadline_ms,
            capped,
            ..
        }) => {
            metrics.extended(&served.label, if capped { "capped" } else { "extended" });
            Ok(
                Json(json!({ "id": id, "deadline_ms": deadline_ms, "capped": capped }))
                    .into_response(),
            )
        }
        Ok(Extended::NotOwner { reason, .. }) => {
            metrics.extended(&served.label, reason.as_str());
            Err(ApiError::Lost(reason))
        }
        Err(err) => {
            metrics.extended(&served.label, "error");
            Err(err.into())
        }
    }
}

async fn release(
    State(state): State<ServeState>,
    Path((pool, id)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let served = state.pool(&pool)?;
    lease_id(&id)?;
    let ReleaseBody {
        token,
        cooldown,
        quarantine,
    } = ReleaseBody::parse(&body)?;
    let result = match &quarantine {
        Some(q) => served.pool.quarantine_lease(&id, &token, q).await,
        None => served.pool.release_lease(&id, &token, cooldown).await,
    };
    state.note(&result);
    let metrics = &state.inner.metrics;
    match result {
        Ok(Released::Released { at_ms }) => {
            metrics.released(&served.label, "released");
            debug!(pool = %pool, id = %id, "released");
            Ok(Json(json!({ "id": id, "released_at_ms": at_ms })).into_response())
        }
        Ok(Released::Quarantined {
            at_ms,
            until_ms,
            strikes,
            auto_disabled,
        }) => {
            metrics.released(&served.label, "released");
            metrics.quarantined(&served.label);
            info!(pool = %pool, id = %id, until_ms, strikes, auto_disabled, "quarantined");
            Ok(Json(json!({
                "id": id, "released_at_ms": at_ms, "quarantined_until_ms": until_ms,
                "strikes": strikes, "auto_disabled": auto_disabled,
            }))
            .into_response())
        }
        Ok(Released::NotOwner { reason, .. }) => {
            metrics.released(&served.label, reason.as_str());
            Err(ApiError::Lost(reason))
        }
        Err(err) => {
            metrics.released(&served.label, "error");
            Err(err.into())
        }
    }
}

async fn status(
    State(state): State<ServeState>,
    Path(pool): Path<String>,
) -> Result<Response, ApiError> {
    let served = state.pool(&pool)?;
    let result = served.pool.status().await;
    state.note(&result);
    let status = result?;
    state.inner.metrics.set_status(&served.label, &status);
    let mut body = serde_json::to_value(status).unwrap_or_default();
    body["pool"] = pool.into();
    Ok(Json(body).into_response())
}

/// 200 `{"state": "ready"}` once Redis answered; 503 with the `state` that
/// keeps it unready: `stopping` from shutdown on, `redis_not_answering`,
/// `evicting` (with `maxmemory_policy`, `maxmemory` in bytes and `reason`,
/// as the worker's `/readyz` says it), `eviction_unchecked` before the first
/// eviction check answered.
async fn readyz(State(state): State<ServeState>) -> Response {
    let unready = |body: serde_json::Value| (StatusCode::SERVICE_UNAVAILABLE, Json(body));
    if state.inner.shutdown.is_cancelled() {
        return unready(json!({ "state": "stopping" })).into_response();
    }
    // Asked again here while marked down: a server without traffic must not stay unready
    // for up to --reap-interval after Redis answers again.
    if !state.recheck_redis().await {
        return unready(json!({ "state": "redis_not_answering" })).into_response();
    }
    match state.eviction() {
        Eviction::Evicting(evicting) => unready(json!({
            "state": "evicting",
            "maxmemory_policy": evicting.policy,
            "maxmemory": evicting.maxmemory,
            "reason": evicting.to_string(),
        }))
        .into_response(),
        Eviction::Unchecked => unready(json!({ "state": "eviction_unchecked" })).into_response(),
        Eviction::Safe => Json(json!({ "state": "ready" })).into_response(),
    }
}

async fn metrics(State(state): State<ServeState>) -> Response {
    http::encode_metrics(&state.inner.registry)
}
