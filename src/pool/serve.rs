//! `snowlease pool serve`: the pool API over HTTP for workers in any
//! language (meant for loopback), a background reaper per pool, readiness
//! that follows Redis, and metrics. [`router`] is pure; `run` wires it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::connection::{Readable, Redis};
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::limits::{REAP_LIMIT, Range, TTL_MS};
use super::metrics::PoolMetrics;
use super::{AcquireRequest, Acquired, Extended, Pool, PoolError, PoolOptions, Released};
use crate::budget::{BudgetError, ChargedAcquire};
use crate::connection::RedisTarget;
use crate::eviction::{self, EvictingRedis, Eviction};
use crate::http;

mod body;

use body::{AcquireBody, ApiError, ExtendBody, ReleaseBody, lease_id};

/// Most reap calls (of 1000 leases each) per pool and reaper round, so a
/// huge backlog cannot hold off the status refresh for long.
const REAP_CALLS_PER_ROUND: usize = 10;
/// Shortest time between two eviction checks of `pool serve` (it follows
/// `--reap-interval` above this).
const EVICTION_CHECK_MIN: Duration = Duration::from_secs(1);
/// Bound on draining HTTP connections at shutdown.
const HTTP_STOP_LIMIT: Duration = Duration::from_secs(1);

/// Validated settings of `pool serve`.
#[derive(Debug, Clone)]
pub(crate) struct ServeConfig {
    pub(crate) pools: Vec<String>,
    pub(crate) redis: RedisTarget,
    pub(crate) redis_timeout: Duration,
    pub(crate) allow_evicting_redis: bool,
    pub(crate) listen: SocketAddr,
    pub(crate) http: http::ConnectionLimits,
    pub(crate) reap_interval: Duration,
    pub(crate) reap_cooldown: Duration,
    pub(crate) max_lease: Duration,
}

/// What the handlers share: the served pools, metrics, readiness.
#[derive(Clone)]
pub struct ServeState {
    inner: Arc<Inner>,
}

struct Inner {
    pools: HashMap<String, Served>,
    metrics: PoolMetrics,
    registry: Registry,
    /// The rate budget routes, on the pools' connection (none without a pool).
    budgets: Option<crate::budget::serve::BudgetService>,
    /// True once Redis answered, false from the first call it did not.
    redis_up: AtomicBool,
    /// The eviction check's last answer.
    evicting: Mutex<Eviction>,
    shutdown: CancellationToken,
}

struct Served {
    pool: Pool,
    label: Arc<str>,
}

impl ServeState {
    /// State for serving `pools`; `shutdown` ends waiting acquires and makes
    /// `/readyz` answer 503. Unready until Redis first answers. It does not
    /// check Redis' eviction setting itself: `run` does, and refuses
    /// acquire and extend until its first check answered.
    pub fn new(pools: Vec<Pool>, shutdown: CancellationToken) -> Self {
        let labels: Vec<Arc<str>> = pools.iter().map(|p| Arc::from(p.name())).collect();
        let mut registry = Registry::default();
        let metrics = PoolMetrics::new(&mut registry, &labels);
        http::register_build_info(&mut registry);
        let budgets = pools.first().map(|p| {
            crate::budget::serve::BudgetService::new(
                p.conn().clone(),
                &mut registry,
                shutdown.clone(),
            )
        });
        let pools = pools
            .into_iter()
            .zip(labels)
            .map(|(pool, label)| (pool.name().to_owned(), Served { pool, label }))
            .collect();
        Self {
            inner: Arc::new(Inner {
                pools,
                metrics,
                registry,
                budgets,
                redis_up: AtomicBool::new(false),
                // The router alone trusts its caller; run() marks it
                // unchecked until its eviction loop answers.
                evicting: Mutex::new(Eviction::Safe),
                shutdown,
            }),
        }
    }

    fn pool(&self, name: &str) -> Result<&Served, ApiError> {
        self.inner
            .pools
            .get(name)
            .ok_or_else(|| ApiError::UnknownPool(name.to_owned()))
    }

    /// Records whether Redis answered (any reply but a Redis error counts).
    fn note<T>(&self, result: &Result<T, PoolError>) {
        let up = !matches!(result, Err(PoolError::Redis(_)));
        if self.inner.redis_up.swap(up, Ordering::Relaxed) != up {
            match result {
                Err(err) => warn!(error = %err, "redis not answering; not ready"),
                Ok(_) => info!("redis answers; ready"),
            }
        }
    }

    /// Refuses with 503 while Redis may evict keys, or before the first
    /// eviction check answered (acquire and extend).
    fn refuse_if_evicting(&self) -> Result<(), ApiError> {
        match self.eviction() {
            Eviction::Safe => Ok(()),
            Eviction::Evicting(evicting) => Err(ApiError::Evicting(evicting)),
            Eviction::Unchecked => Err(ApiError::Pool(PoolError::Redis(
                (redis::ErrorKind::Io, "eviction check not answered yet").into(),
            ))),
        }
    }

    fn eviction(&self) -> Eviction {
        self.inner.evicting.lock().expect("not poisoned").clone()
    }

    /// Records the eviction check's answer; logs when it changes.
    fn note_eviction(&self, now: Option<EvictingRedis>) {
        let before = std::mem::replace(
            &mut *self.inner.evicting.lock().expect("not poisoned"),
            Eviction::from(now.clone()),
        );
        match (before.evicting(), now) {
            (None, Some(evicting)) => {
                error!(policy = %evicting.policy, error = %evicting, "not ready: no lease is granted or extended")
            }
            (Some(_), None) => info!("redis no longer evicts keys; leases are granted again"),
            _ => {}
        }
    }

    /// One reaper round for `name`: reclaim expired leases (up to
    /// [`REAP_CALLS_PER_ROUND`] calls), then refresh its gauges.
    async fn reap_round(&self, name: &str, cooldown: Duration) {
        let Ok(served) = self.pool(name) else { return };
        for _ in 0..REAP_CALLS_PER_ROUND {
            let result = served.pool.reap(REAP_LIMIT.max as usize, cooldown).await;
            self.note(&result);
            match result {
                Ok(reaped) => {
                    if !reaped.ids.is_empty() {
                        info!(pool = name, count = reaped.ids.len(), ids = ?reaped.ids, "reclaimed expired leases");
                        self.inner
                            .metrics
                            .reaped(&served.label, reaped.ids.len() as u64);
                    }
                    if reaped.still_expired == 0 {
                        break;
                    }
                }
                Err(err) => {
                    debug!(pool = name, error = %err, "reap failed");
                    return;
                }
            }
        }
        let status = served.pool.status().await;
        self.note(&status);
        if let Ok(status) = status {
            self.inner.metrics.set_status(&served.label, &status);
        }
    }
}

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
pub fn router(state: ServeState) -> Router {
    let budgets = state.inner.budgets.clone().map(|budgets| {
        let guard = axum::middleware::from_fn_with_state(state.clone(), refuse_budgets_if_evicting);
        crate::budget::serve::routes(budgets).route_layer(guard)
    });
    Router::new()
        .route("/pools/{pool}", get(status))
        .route("/pools/{pool}/leases", post(acquire))
        .route("/pools/{pool}/leases/{id}/extend", post(extend))
        .route("/pools/{pool}/leases/{id}/release", post(release))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
        .merge(http::liveness_routes())
        .merge(budgets.unwrap_or_default())
}

/// The budget routes answer 503 while Redis may evict keys (an evicted
/// budget key is a full budget again: a limit that does not hold), as
/// acquire does.
async fn refuse_budgets_if_evicting(
    State(state): State<ServeState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match state.refuse_if_evicting() {
        Ok(()) => next.run(request).await,
        Err(err) => err.into_response(),
    }
}

/// Serves the pools of `config` until `shutdown` fires: binds the
/// listener, starts one reaper per pool, then drains HTTP (bounded).
///
/// Errors: the listener cannot bind; the HTTP server fails.
pub(crate) async fn run(config: ServeConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listener = http::bind(config.listen)
        .with_context(|| format!("cannot listen on --listen {}", config.listen))?;
    if !config.listen.ip().is_loopback() {
        warn!(listen = %config.listen, "not a loopback address: whoever reaches it can take and release leases");
    }
    let conn = config.redis.connect(config.redis_timeout)?;
    let options = PoolOptions {
        max_lease: config.max_lease,
    };
    let pools = config
        .pools
        .iter()
        .map(|name| Pool::new(conn.clone(), name, options))
        .collect::<Result<Vec<_>, _>>()?;
    for pool in &pools {
        tokio::spawn(warn_if_missing(pool.clone()));
    }
    let state = ServeState::new(pools, shutdown.clone());
    let checker = if config.allow_evicting_redis {
        warn!(
            "--allow-evicting-redis: maxmemory-policy is not checked; on a Redis that evicts keys one id can be leased twice"
        );
        None
    } else {
        *state.inner.evicting.lock().expect("not poisoned") = Eviction::Unchecked;
        let every = config.reap_interval.max(EVICTION_CHECK_MIN);
        Some(tokio::spawn(eviction_loop(
            state.clone(),
            conn.clone(),
            every,
        )))
    };
    info!(pools = ?config.pools, redis = %config.redis, reap_interval = ?config.reap_interval, "serving pools");

    let reapers: Vec<_> = config
        .pools
        .iter()
        .map(|name| {
            tokio::spawn(reap_loop(
                state.clone(),
                name.clone(),
                config.reap_interval,
                config.reap_cooldown,
            ))
        })
        .collect();
    let http_stop = CancellationToken::new();
    // On this thread (unlike the worker's): the requests are the work here,
    // and the reapers and eviction checks are fine to share it with them.
    let mut http_task = tokio::spawn(http::serve(
        listener,
        router(state),
        config.http,
        http_stop.clone(),
    ));
    tokio::select! {
        () = shutdown.cancelled() => {}
        ended = &mut http_task => {
            shutdown.cancel();
            return match ended {
                Ok(Ok(())) => Err(anyhow::anyhow!("http server stopped")),
                Ok(Err(err)) => Err(err).context("http server"),
                Err(err) => Err(err).context("http server"),
            };
        }
    }
    // Reapers and waiting acquires end at the cancel; then HTTP drains.
    for reaper in reapers.into_iter().chain(checker) {
        let _ = reaper.await;
    }
    http_stop.cancel();
    if tokio::time::timeout(HTTP_STOP_LIMIT, http_task)
        .await
        .is_err()
    {
        warn!("http server did not stop within 1s");
    }
    info!("stopped");
    Ok(())
}

/// Asks Redis whether it may evict keys; an unanswered check keeps the
/// last answer (readiness follows Redis' answers through [`ServeState::note`]).
async fn check_eviction(state: &ServeState, conn: &mut Redis) {
    match eviction::check(conn).await {
        Ok(now) => state.note_eviction(now),
        Err(err) => debug!(error = %Readable(&err), "eviction check failed"),
    }
}

/// Re-checks the eviction setting every `every` until shutdown
/// (`CONFIG SET` can change it at run time).
async fn eviction_loop(state: ServeState, mut conn: Redis, every: Duration) {
    let shutdown = state.inner.shutdown.clone();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = check_eviction(&state, &mut conn) => {}
        }
    }
}

/// Logs a warning when `pool` has no key in Redis (never created, or a typo
/// in `--pool`): it is served anyway, acquires answer 503 until it has ids.
/// Other errors (Redis down) are left to the requests and readiness.
async fn warn_if_missing(pool: Pool) {
    if let Err(PoolError::NoPool { pool }) = pool.strikes().await {
        warn!(
            pool,
            "pool does not exist in Redis (a typo in --pool? create it with `snowlease pool init`); acquires answer 503 until it has ids"
        );
    }
}

/// Reaps `name` every `every` until shutdown; a round in flight is dropped
/// at shutdown (a reap is safe to cut: it runs whole in Redis or not).
async fn reap_loop(state: ServeState, name: String, every: Duration, cooldown: Duration) {
    let shutdown = state.inner.shutdown.clone();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = state.reap_round(&name, cooldown) => {}
        }
    }
}

async fn acquire(
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
            crate::budget::acquire_charged_wait(&served.pool, &req, charge, wait, shutdown).await
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
            let budget = charge.as_ref().map_or("", |c| c.budget.as_str());
            Ok(crate::budget::serve::denied_response(budget, &taken))
        }
        Ok(ChargedAcquire::Acquired(Acquired::Empty { next_due_in, at_ms })) => {
            metrics.acquired(&served.label, "empty", started.elapsed());
            let next_due_in_ms = next_due_in.map(crate::timing::ms);
            let body = json!({
                "error": "no id due",
                "next_due_in_ms": next_due_in_ms,
                "at_ms": at_ms,
                "detail": super::hint::hint_words(next_due_in),
            });
            let retry_after = retry_after_secs(next_due_in).to_string();
            Ok((
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, retry_after)],
                Json(body),
            )
                .into_response())
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

/// `Retry-After` of an empty acquire: the hint in whole seconds, rounded
/// up, at least 1 (also when nothing will come due by itself).
fn retry_after_secs(next_due_in: Option<Duration>) -> u64 {
    next_due_in.map_or(1, crate::timing::secs_ceil).max(1)
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

/// 200 once Redis answered; 503 while it does not, while it may evict
/// keys, and from shutdown on.
async fn readyz(State(state): State<ServeState>) -> Response {
    if state.inner.shutdown.is_cancelled() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: shutting down\n",
        )
            .into_response()
    } else if !state.inner.redis_up.load(Ordering::Relaxed) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: redis not answering\n",
        )
            .into_response()
    } else if let Eviction::Evicting(evicting) = state.eviction() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {evicting}\n"),
        )
            .into_response()
    } else if state.eviction() == Eviction::Unchecked {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: maxmemory-policy not checked yet\n",
        )
            .into_response()
    } else {
        "ready\n".into_response()
    }
}

async fn metrics(State(state): State<ServeState>) -> Response {
    http::encode_metrics(&state.inner.registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let ms = Duration::from_millis;
        assert_eq!(retry_after_secs(Some(ms(0))), 1);
        assert_eq!(retry_after_secs(Some(ms(1))), 1);
        assert_eq!(retry_after_secs(Some(ms(1000))), 1);
        assert_eq!(retry_after_secs(Some(ms(1001))), 2);
        assert_eq!(retry_after_secs(None), 1);
    }
}
