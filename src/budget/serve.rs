//! `POST /budgets/{name}/take` and `POST /budgets/{name}/penalize`, merged
//! into `pool serve`'s router; their bodies, answers and metrics. Redis
//! errors answer 503: callers fail closed (do not send the request).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::limits::{PENALTY_MS, WAIT_MS};
use super::metrics::BudgetMetrics;
use super::{Budget, BudgetError, BudgetKey, Charge, Rate, Taken, limits};
use crate::connection::Redis;
use crate::http::HttpError;
use crate::http::body::{BadField, Rules};

/// What the budget routes share.
#[derive(Clone)]
pub struct BudgetService {
    inner: Arc<BudgetShared>,
}

struct BudgetShared {
    conn: Redis,
    metrics: BudgetMetrics,
    shutdown: CancellationToken,
}

impl BudgetService {
    /// The routes' state on `conn`, metrics in `registry`; `shutdown` ends
    /// waiting takes.
    pub fn new(conn: Redis, registry: &mut Registry, shutdown: CancellationToken) -> Self {
        Self {
            inner: Arc::new(BudgetShared {
                conn,
                metrics: BudgetMetrics::new(registry),
                shutdown,
            }),
        }
    }

    pub(crate) fn metrics(&self) -> &BudgetMetrics {
        &self.inner.metrics
    }
}

/// The budget routes:
///
/// - `POST /budgets/{name}/take` `{keys: [..] | key, rate: "10/s" | [..],
///   burst: n | [..], cost?: 1, wait_ms?: 0, pool?}` (`pool`: the keys
///   acquires of that pool charge, `{<pool>}:budget:<name>:<key>`): 200 `{name, allowed: true,
///   remaining, retry_after_ms: 0, reset_after_ms, at_ms}`, or 429 with the
///   same fields (`allowed: false`) and `Retry-After` (whole seconds,
///   rounded up).
/// - `POST /budgets/{name}/penalize` `{keys | key, rate, burst,
///   penalty_ms}`: 200 `{name, retry_after_ms, reset_after_ms, at_ms}`.
/// - 400 `{error, field, expected}` for bad input (nothing written), 503
///   `{error}` when Redis fails (fail closed).
pub fn routes(service: BudgetService) -> Router {
    Router::new()
        .route("/budgets/{name}/take", post(take))
        .route("/budgets/{name}/penalize", post(penalize))
        .with_state(service)
}

/// One value, or one per key.
#[derive(Debug, Clone)]
pub(crate) enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

/// What one value of a [`OneOrMany`] field is, for its error (serde's own
/// "did not match any variant" names neither the type nor the range).
pub(crate) trait OneValue: Sized {
    /// E.g. `an integer 1-1000000`.
    fn expecting() -> String;
}

impl OneValue for String {
    fn expecting() -> String {
        "a rate like \"10/s\", \"600/m\" or \"1/250ms\"".into()
    }
}

impl OneValue for u64 {
    fn expecting() -> String {
        format!("an integer {}-{}", limits::BURST.min, limits::BURST.max)
    }
}

impl<'de, T: OneValue + serde::de::DeserializeOwned> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(de)?;
        let wrong =
            || serde::de::Error::custom(format!("{}, or a list with one per key", T::expecting()));
        match value {
            serde_json::Value::Array(items) => items
                .into_iter()
                .map(|item| T::deserialize(item).map_err(|_| wrong()))
                .collect::<Result<_, _>>()
                .map(Self::Many),
            one => T::deserialize(one).map(Self::One).map_err(|_| wrong()),
        }
    }
}

impl<T: Clone> OneOrMany<T> {
    fn get(&self, i: usize, n: usize, field: &str) -> Result<T, BudgetError> {
        match self {
            Self::One(v) => Ok(v.clone()),
            Self::Many(v) if v.len() == n => Ok(v[i].clone()),
            Self::Many(v) if v.len() == 1 => Ok(v[0].clone()),
            Self::Many(v) => Err(BudgetError::bad(
                field,
                format!("one value, or one per key ({n}), not {}", v.len()),
            )),
        }
    }
}

/// The keys of a body with their limits: `key` or `keys`, `rate` and
/// `burst` once or once per key (shared with the pool's acquire with a
/// charge).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KeysBody {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    keys: Option<Vec<String>>,
    rate: OneOrMany<String>,
    burst: OneOrMany<u64>,
}

impl KeysBody {
    pub(crate) fn keys(&self) -> Result<Vec<BudgetKey>, BudgetError> {
        let names: Vec<String> = match (&self.key, &self.keys) {
            (Some(k), None) => vec![k.clone()],
            (None, Some(ks)) => ks.clone(),
            _ => return Err(BudgetError::bad("keys", "either key or keys")),
        };
        let n = names.len();
        names
            .into_iter()
            .enumerate()
            .map(|(i, key)| {
                let text = self.rate.get(i, n, "rate")?;
                let rate: Rate = text
                    .parse()
                    .map_err(|e: String| BudgetError::bad("rate", e))?;
                Ok(BudgetKey::new(key, rate, self.burst.get(i, n, "burst")?))
            })
            .collect()
    }
}

/// `POST /budgets/{name}/take`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TakeBody {
    #[serde(default)]
    pool: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    keys: Option<Vec<String>>,
    rate: OneOrMany<String>,
    burst: OneOrMany<u64>,
    #[serde(default = "one")]
    cost: u64,
    #[serde(default)]
    wait_ms: u64,
}

/// `POST /budgets/{name}/penalize`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PenalizeBody {
    #[serde(default)]
    pool: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    keys: Option<Vec<String>>,
    rate: OneOrMany<String>,
    burst: OneOrMany<u64>,
    penalty_ms: u64,
}

/// The `budget` field of a pool acquire: `{name, key | keys, rate, burst,
/// cost?}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChargeBody {
    name: String,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    keys: Option<Vec<String>>,
    rate: OneOrMany<String>,
    burst: OneOrMany<u64>,
    #[serde(default = "one")]
    cost: u64,
}

/// The charge of a pool acquire's `budget` field, checked; errors name
/// the field under `budget.` (`budget.keys[0].rate`, `budget.cost`, ...).
pub(crate) fn charge_of(value: serde_json::Value) -> Result<Charge, BudgetError> {
    let under = |err: BudgetError| match err {
        BudgetError::BadInput { field, expected } => BudgetError::BadInput {
            field: format!("budget.{field}"),
            expected,
        },
        other => other,
    };
    if !value.is_object() {
        return Err(BudgetError::bad("budget", "a JSON object"));
    }
    let body: ChargeBody = crate::http::body::parse_value("budget", value, BODY_RULES)
        .map_err(|bad| under(bad_field(bad)))?;
    if !crate::names::is_name(&body.name) {
        return Err(under(BudgetError::bad("name", crate::names::name_rule())));
    }
    let keys = KeysBody {
        key: body.key,
        keys: body.keys,
        rate: body.rate,
        burst: body.burst,
    }
    .keys()
    .and_then(|keys| super::checked_keys("", &keys).map(|_| keys))
    .map_err(under)?;
    let cost = super::checked_cost(body.cost, &keys).map_err(under)?;
    Ok(Charge {
        budget: body.name,
        keys,
        cost,
    })
}

/// The 429 of a pool acquire that the budget denied: `Retry-After`, the RateLimit fields
/// ([`ratelimit_fields`]) and `{error, budget, retry_after_ms, remaining, reset_after_ms,
/// at_ms}`.
pub(crate) fn denied_response(budget: &str, keys: &[BudgetKey], taken: &Taken) -> Response {
    let fields = ratelimit_fields(budget, keys, taken);
    let answer = HttpError::new(StatusCode::TOO_MANY_REQUESTS, "budget denied")
        .with("budget", budget)
        .with("retry_after_ms", taken.retry_after_ms)
        .with("remaining", taken.remaining)
        .with("reset_after_ms", taken.reset_after_ms)
        .with("at_ms", taken.at_ms)
        .retry_after(taken.retry_after());
    (fields, answer).into_response()
}

fn one() -> u64 {
    1
}

/// Reads a JSON body by the one reader's rules ([`crate::http::body`]);
/// the budget routes have no words of their own for their fields beyond
/// those their types give (`OneOrMany`'s "or a list with one per key").
pub(crate) fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, BudgetError> {
    crate::http::body::parse(bytes, BODY_RULES).map_err(bad_field)
}

/// The budget bodies' fields in words, so a value of the wrong type (`"wait_ms": 1.5`,
/// `"cost": "2"`, a key that is not a string) or a missing `penalty_ms` names the range as a
/// value out of range does, not serde's type names. `rate` and `burst` say it themselves
/// ([`OneValue`]).
const BODY_RULES: Rules<'static> = Rules {
    required: &[],
    expected: &|field, _| match field {
        "cost" => Some(super::limits::COST.expected()),
        "wait_ms" => Some(WAIT_MS.expected()),
        "penalty_ms" => Some(PENALTY_MS.expected()),
        "pool" | "name" => Some(crate::names::name_rule()),
        "key" => Some(limits::key_rule()),
        "keys" => Some(format!(
            "a list of {}-{} keys of {}",
            super::limits::KEYS_PER_CALL.min,
            super::limits::KEYS_PER_CALL.max,
            limits::key_rule()
        )),
        f if f.starts_with("keys[") => Some(limits::key_rule()),
        _ => None,
    },
};

fn bad_field(bad: BadField) -> BudgetError {
    BudgetError::bad(bad.field, bad.expected)
}

/// Whether Redis answered a budget call, on its response for `pool serve`'s readiness: true
/// for a reply (also a key of another type: Redis answered), false when Redis did not serve;
/// absent when no call was made (bad input).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RedisAnswered(pub(crate) bool);

/// `response` marked with [`RedisAnswered`].
fn answered(mut response: Response, up: bool) -> Response {
    response.extensions_mut().insert(RedisAnswered(up));
    response
}

/// A budget answer: 400 for bad input, 503 when Redis does not serve
/// (fail closed), 500 naming a key of another type, 500 for the rest.
fn error_response(err: BudgetError) -> Response {
    let heard = match &err {
        BudgetError::Redis(err) if crate::connection::is_unavailable(err) => Some(false),
        BudgetError::WrongKeyType { .. } => Some(true),
        _ => None,
    };
    let response = match err {
        BudgetError::BadInput { field, expected } => HttpError::bad_input(&field, &expected),
        BudgetError::Redis(err) if crate::connection::is_unavailable(&err) => {
            warn!(error = %crate::connection::Readable(&err), "budget call failed");
            HttpError::redis_unavailable()
        }
        BudgetError::WrongKeyType { key, .. } => {
            warn!(key = %key, "budget key has the wrong type");
            HttpError::bad_key(&key)
        }
        other => {
            warn!(error = %other, "budget call failed");
            HttpError::internal()
        }
    }
    .into_response();
    match heard {
        Some(up) => answered(response, up),
        None => response,
    }
}

/// 200 for an allowed take, 429 with `Retry-After` for a denied one; both with the
/// `RateLimit-Policy` and `RateLimit` fields ([`ratelimit_fields`]).
pub(crate) fn take_response(name: &str, keys: &[BudgetKey], taken: &Taken) -> Response {
    let body = Json(super::cli::take_json(name, taken));
    let fields = ratelimit_fields(name, keys, taken);
    if taken.allowed {
        return (StatusCode::OK, fields, body).into_response();
    }
    (
        StatusCode::TOO_MANY_REQUESTS,
        fields,
        crate::http::retry_after(taken.retry_after()),
        body,
    )
        .into_response()
}

/// The RateLimit fields of a budget answer ([`crate::http::ratelimit`]): GCRA maps onto a
/// quota per window, the quota being the burst and the window the time a spent burst takes
/// to refill (burst / rate); `r` is `remaining`, `t` `reset_after_ms`. With several keys the
/// policy is the key with the smallest burst, `r` the smallest over the keys and `t` the
/// latest (one reply carries no more). The name is the budget's.
pub(crate) fn ratelimit_fields(
    name: &str,
    keys: &[BudgetKey],
    taken: &Taken,
) -> [(header::HeaderName, String); 2] {
    let policy = keys.iter().min_by_key(|k| k.limit.burst).map(|k| {
        let rate = &k.limit.rate;
        // Exact in ns, rounded up once to s by the writer (1000.3 ms is 2 s, not 1).
        let refill_ns =
            u128::from(k.limit.burst) * rate.period.as_nanos() / u128::from(rate.count.max(1));
        let refill = Duration::from_nanos(u64::try_from(refill_ns).unwrap_or(u64::MAX));
        (k.limit.burst, refill)
    });
    crate::http::ratelimit(
        name,
        policy,
        taken.remaining,
        Duration::from_millis(taken.reset_after_ms),
    )
}

/// The budget `name`, in `pool`'s keys when given.
fn open(service: &BudgetService, pool: Option<&str>, name: &str) -> Result<Budget, BudgetError> {
    let conn = service.inner.conn.clone();
    match pool {
        Some(pool) => Budget::in_pool(conn, pool, name),
        None => Budget::new(conn, name),
    }
}

async fn take(
    State(service): State<BudgetService>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let metrics = service.metrics();
    let result = async {
        let body: TakeBody = parse(&body)?;
        let budget = open(&service, body.pool.as_deref(), &name)?;
        let keys = KeysBody {
            key: body.key,
            keys: body.keys,
            rate: body.rate,
            burst: body.burst,
        }
        .keys()?;
        let wait = limits::int("wait_ms", body.wait_ms, WAIT_MS)?;
        let shutdown = &service.inner.shutdown;
        let taken = budget
            .take_wait(&keys, body.cost, Duration::from_millis(wait), shutdown)
            .await?;
        Ok((keys, taken))
    }
    .await;
    match result {
        Ok((keys, taken)) => {
            metrics.took(&name, if taken.allowed { "allowed" } else { "denied" });
            answered(take_response(&name, &keys, &taken), true)
        }
        Err(err) => {
            let outcome = match err {
                BudgetError::BadInput { .. } => "bad_input",
                _ => "error",
            };
            metrics.took(&name, outcome);
            error_response(err)
        }
    }
}

async fn penalize(
    State(service): State<BudgetService>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let result = async {
        let body: PenalizeBody = parse(&body)?;
        let budget = open(&service, body.pool.as_deref(), &name)?;
        let keys = KeysBody {
            key: body.key,
            keys: body.keys,
            rate: body.rate,
            burst: body.burst,
        }
        .keys()?;
        let penalty = limits::int("penalty_ms", body.penalty_ms, PENALTY_MS)?;
        budget.penalize(&keys, Duration::from_millis(penalty)).await
    }
    .await;
    match result {
        Ok(p) => {
            service.metrics().penalized(&name);
            let mut value = serde_json::to_value(p).unwrap_or_default();
            value["name"] = name.into();
            answered(Json(value).into_response(), true)
        }
        Err(err) => error_response(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_take_one_limit_or_one_per_key() {
        let body: KeysBody =
            parse(br#"{"keys":["a","b"],"rate":["10/s","1/s"],"burst":5}"#).unwrap();
        let keys = body.keys().unwrap();
        assert_eq!(keys[1].limit.rate.to_string(), "1/s");
        assert_eq!(keys[1].limit.burst, 5);
        let take: TakeBody = parse(br#"{"key":"a","rate":"1/s","burst":1}"#).unwrap();
        assert_eq!((take.cost, take.wait_ms), (1, 0));
        let err = parse::<TakeBody>(br#"{"key":"a","rate":"1/s","burst":1,"costs":1}"#);
        assert!(err.unwrap_err().to_string().contains("costs"));
        let err = parse::<TakeBody>(br#"{"key":"a","rate":"1/s","burst":"x"}"#);
        assert!(err.unwrap_err().to_string().starts_with("invalid burst"));
        let three =
            parse::<KeysBody>(br#"{"keys":["a","b"],"rate":["1/s","2/s","3/s"],"burst":1}"#);
        assert!(
            three
                .unwrap()
                .keys()
                .unwrap_err()
                .to_string()
                .starts_with("invalid rate")
        );
    }
}
