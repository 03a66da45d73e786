//! `snowlease pool serve`: the pool API over HTTP for workers in any
//! language (meant for loopback), a background reaper per pool, readiness
//! that follows Redis, and metrics. This file holds the shared state and
//! `run`, which wires it; the routes are in `routes` (pure, [`router`]) and
//! `acquire`, the reaper and eviction loops in `background`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::metrics::PoolMetrics;
use super::{Pool, PoolError, PoolOptions};
use crate::connection::RedisTarget;
use crate::eviction::{EvictingRedis, Eviction};
use crate::http;

mod acquire;
mod background;
mod body;
mod routes;

pub use routes::router;

use background::{eviction_loop, reap_loop, warn_if_missing};
use body::ApiError;

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

/// The bound of `/readyz`'s `TIME` while Redis is marked as not answering: 500 ms, within
/// the kubelet's default probe timeout of 1 s (Kubernetes docs, "Configure Liveness,
/// Readiness and Startup Probes").
pub(crate) const READYZ_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

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
    /// The last reaper round's data error (a key of the wrong type), said once at warn
    /// until it changes or a round succeeds.
    reap_error: Mutex<Option<String>>,
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
            .map(|(pool, label)| {
                let reap_error = Mutex::new(None);
                (
                    pool.name().to_owned(),
                    Served {
                        pool,
                        label,
                        reap_error,
                    },
                )
            })
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

    /// Records whether Redis answered: any reply counts, also an error about
    /// the data (a key of the wrong type is the caller's answer, not Redis
    /// down); only [`PoolError::is_redis_unavailable`] makes it unready.
    fn note<T>(&self, result: &Result<T, PoolError>) {
        let down = result
            .as_ref()
            .err()
            .filter(|err| err.is_redis_unavailable());
        self.set_answering(down.map(|err| err as &dyn std::fmt::Display));
    }

    /// The one writer of the readiness mark: `None` when Redis answered, else why it did not;
    /// a change is logged once.
    fn set_answering(&self, not_answering: Option<&dyn std::fmt::Display>) {
        let up = not_answering.is_none();
        if self.inner.redis_up.swap(up, Ordering::Relaxed) != up {
            match not_answering {
                Some(err) => warn!(error = %err, "redis not answering; not ready"),
                None => info!("redis answers; ready"),
            }
        }
    }

    /// While Redis is marked as not answering, asks it once (`TIME`, bounded by
    /// [`READYZ_CHECK_TIMEOUT`]) and marks it answering when it does: `/readyz` turns ready again
    /// without waiting for a request or the next reaper round (up to `--reap-interval`). True
    /// when Redis is (now) marked answering.
    pub(crate) async fn recheck_redis(&self) -> bool {
        if self.inner.redis_up.load(Ordering::Relaxed) {
            return true;
        }
        let Some(served) = self.inner.pools.values().next() else {
            return false;
        };
        let mut conn = served.pool.conn().clone();
        // TIME, not PING: the documented ACL rules of pool serve allow it (a PING was refused
        // and logged in ACL LOG). Within a kubelet probe's default timeout (1 s).
        let time = redis::cmd("TIME");
        let answered = crate::timing::bounded(
            READYZ_CHECK_TIMEOUT,
            time.query_async::<redis::Value>(&mut conn),
        )
        .await;
        let down = answered.err().filter(crate::connection::is_unavailable);
        let why = down.as_ref().map(crate::connection::Readable);
        self.set_answering(why.as_ref().map(|why| why as &dyn std::fmt::Display));
        down.is_none()
    }

    /// Records whether a budget call found Redis answering (see [`ServeState::note`]).
    fn note_answered(&self, up: bool) {
        self.set_answering(
            (!up).then_some(&"a budget call got no answer" as &dyn std::fmt::Display),
        );
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
    if crate::timing::within(HTTP_STOP_LIMIT, http_task)
        .await
        .is_none()
    {
        warn!("http server did not stop within 1s");
    }
    info!("stopped");
    Ok(())
}
