//! `POST /pools/{pool}/leases`: an acquire over HTTP, waiting up to
//! `wait_ms`, charged to a rate budget when the body names one.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use tracing::debug;

use super::super::ChargedAcquire;
use super::super::limits::{Range, TTL_MS};
use super::super::{AcquireRequest, Acquired, PoolError};
use super::ServeState;
use super::body::{AcquireBody, ApiError};
use crate::budget::BudgetError;
use crate::http::HttpError;

pub(super) async fn acquire(
    State(state): State<ServeState>,
    Path(pool): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let served = state.pool(&pool)?;
    state.refuse_if_evicting()?;
    let max_ttl = Range {
        max: TTL_MS.max.min(served.pool.max_lease_ms),
        ..TTL_MS
    };
    let AcquireBody {
        ttl,
        cooldown,
        wait,
        request_id,
        budget,
    } = AcquireBody::parse(&body, max_ttl)?;
    let mut req = AcquireRequest::new(ttl).cooldown(cooldown);
    if let Some(request_id) = request_id {
        req = req.request_id(request_id);
    }
    let charge = match budget.map(crate::budget::serve::charge_of) {
        None => None,
        Some(Ok(charge)) => Some(charge),
        Some(Err(err)) => {
            if let Some(budgets) = &state.inner.budgets {
                budgets.metrics().took("", "bad_input");
            }
            return Err(match err {
                BudgetError::BadInput { field, expected } => ApiError::bad(&field, expected),
                other => ApiError::bad("budget", other.to_string()),
            });
        }
    };

    let started = Instant::now();
    let shutdown = &state.inner.shutdown;
    let result = match &charge {
        None => served
            .pool
            .acquire_wait_until(&req, wait, shutdown)
            .await
            .map(ChargedAcquire::Acquired),
        Some(charge) => {
            super::super::acquire_charged_wait(&served.pool, &req, charge, wait, shutdown).await
        }
    };
    state.note(&result);
    let metrics = &state.inner.metrics;
    let took = |outcome| {
        if let (Some(charge), Some(budgets)) = (&charge, &state.inner.budgets) {
            budgets.metrics().took(&charge.budget, outcome);
        }
    };
    match result {
        Ok(ChargedAcquire::Acquired(Acquired::Leased(lease))) => {
            metrics.acquired(&served.label, "leased", started.elapsed());
            // A replay was charged when first granted: not allowed again.
            took(if lease.replayed() {
                "replayed"
            } else {
                "allowed"
            });
            debug!(pool = %pool, id = lease.id(), fence = lease.fence(), replayed = lease.replayed(), "leased");
            Ok((StatusCode::CREATED, Json(lease.view())).into_response())
        }
        Ok(ChargedAcquire::Denied(taken)) => {
            metrics.acquired(&served.label, "budget_denied", started.elapsed());
            took("denied");
            let (budget, keys) = charge
                .as_ref()
                .map_or(("", &[][..]), |c| (c.budget.as_str(), &c.keys[..]));
            Ok(crate::budget::serve::denied_response(budget, keys, &taken))
        }
        Ok(ChargedAcquire::Acquired(Acquired::Empty {
            next_due_in,
            at_ms,
            after_rollback,
        })) => {
            let outcome = if after_rollback {
                "closed_after_rollback"
            } else {
                "empty"
            };
            metrics.acquired(&served.label, outcome, started.elapsed());
            let mut answer = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "no id due")
                .with("next_due_in_ms", next_due_in.map(crate::timing::ms))
                .with("at_ms", at_ms)
                .with(
                    "detail",
                    super::super::hint::hint_words(next_due_in, after_rollback),
                )
                // Nothing due by itself: come back in a second.
                .retry_after(next_due_in.unwrap_or_default());
            if after_rollback {
                answer = answer.with("reason", "redis_rollback");
            }
            Ok(answer.into_response())
        }
        Err(err) => {
            metrics.acquired(&served.label, "error", started.elapsed());
            took(if matches!(err, PoolError::BadInput { .. }) {
                "bad_input"
            } else {
                "error"
            });
            Err(err.into())
        }
    }
}
