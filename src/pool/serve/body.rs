//! The request bodies and error answers of `pool serve`: each body read by
//! the one reader of every route ([`crate::http::body`]) into a serde struct,
//! then checked against the ranges of [`limits`]; errors answered through
//! [`HttpError`]'s builders, for bad input the `field` and what it accepts
//! (`expected`).

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tracing::warn;

use crate::http::HttpError;
use crate::http::body::{self, Rules};
use crate::pool::limits::{self, COOLDOWN_MS, QUARANTINE_MS, Range, TTL_MS, WAIT_MS};
use crate::pool::{LostReason, PoolError, Quarantine};

/// An HTTP error answer, as JSON with an `error` field.
#[derive(Debug)]
pub(super) enum ApiError {
    UnknownPool(String),
    BadInput {
        field: String,
        expected: String,
    },
    Lost(LostReason),
    Pool(PoolError),
    /// Redis may evict keys: no lease is granted or prolonged.
    Evicting(crate::eviction::EvictingRedis),
    /// Redis may evict keys: no budget is charged (the message names what a
    /// budget risks: a reset to full, not a lease).
    EvictingBudgets(crate::eviction::EvictingRedis),
}

impl ApiError {
    pub(super) fn bad(field: &str, expected: impl Into<String>) -> Self {
        Self::BadInput {
            field: field.to_owned(),
            expected: expected.into(),
        }
    }
}

impl From<PoolError> for ApiError {
    fn from(err: PoolError) -> Self {
        match err {
            PoolError::BadInput { field, expected } => Self::BadInput { field, expected },
            other => Self::Pool(other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let evicting = |detail: String| {
            HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "redis may evict keys")
                .with("detail", detail)
        };
        match self {
            Self::UnknownPool(pool) => {
                HttpError::new(StatusCode::NOT_FOUND, "unknown pool").with("pool", pool)
            }
            Self::BadInput { field, expected } => HttpError::bad_input(&field, &expected),
            Self::Lost(reason) => HttpError::new(StatusCode::CONFLICT, "lease lost")
                .with("reason", reason.as_str())
                .with("detail", reason.describe()),
            Self::Evicting(err) => evicting(err.to_string()),
            Self::EvictingBudgets(err) => {
                evicting(crate::eviction::EvictingBudgets(err).to_string())
            }
            Self::Pool(err) => {
                warn!(error = %err, "pool call failed");
                match err {
                    err if err.is_redis_unavailable() => HttpError::redis_unavailable(),
                    PoolError::WrongKeyType { key, .. } => HttpError::bad_key(&key),
                    _ => HttpError::internal(),
                }
            }
        }
        .into_response()
    }
}

/// The body of `POST /pools/{pool}/leases`, checked.
#[derive(Debug)]
pub(super) struct AcquireBody {
    /// `ttl_ms` (required), within the pool's `max_lease_ms`.
    pub(super) ttl: Duration,
    /// `cooldown_ms`, default 0.
    pub(super) cooldown: Duration,
    /// `wait_ms`, default 0; a new pool's first acquire waits for its
    /// first record at least 5 s even so (`Pool::acquire_wait`).
    pub(super) wait: Duration,
    /// `request_id`, a name ([`limits::name_rule`]).
    pub(super) request_id: Option<String>,
    /// `budget`: a charge made with the acquire (checked by
    /// [`crate::budget::serve::charge_of`]).
    pub(super) budget: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireFields {
    ttl_ms: Option<u64>,
    cooldown_ms: Option<u64>,
    wait_ms: Option<u64>,
    request_id: Option<String>,
    budget: Option<Value>,
}

impl AcquireBody {
    /// Errors: [`ApiError::BadInput`] naming the first bad field.
    pub(super) fn parse(bytes: &[u8], ttl_ms: Range) -> Result<Self, ApiError> {
        let kinds = [
            int(ttl_ms),
            int(COOLDOWN_MS),
            int(WAIT_MS),
            string("request_id"),
            Kind::Object("budget"),
        ];
        let f: AcquireFields = fields(bytes, &kinds, &[required_int(ttl_ms)])?;
        Ok(Self {
            ttl: millis(ttl_ms, f.ttl_ms.unwrap_or_default())?,
            cooldown: millis(COOLDOWN_MS, f.cooldown_ms.unwrap_or(0))?,
            wait: millis(WAIT_MS, f.wait_ms.unwrap_or(0))?,
            request_id: name("request_id", f.request_id)?,
            budget: f.budget,
        })
    }
}

/// The body of `POST /pools/{pool}/leases/{id}/extend`, checked.
#[derive(Debug)]
pub(super) struct ExtendBody {
    /// `token` (required).
    pub(super) token: String,
    /// `ttl_ms` (required).
    pub(super) ttl: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExtendFields {
    token: Option<String>,
    ttl_ms: Option<u64>,
}

impl ExtendBody {
    /// Errors: [`ApiError::BadInput`] naming the first bad field.
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let kinds = [string("token"), int(TTL_MS)];
        let f: ExtendFields = fields(bytes, &kinds, &[required_token(), required_int(TTL_MS)])?;
        Ok(Self {
            token: token(f.token)?,
            ttl: millis(TTL_MS, f.ttl_ms.unwrap_or_default())?,
        })
    }
}

/// The body of `POST /pools/{pool}/leases/{id}/release`, checked.
#[derive(Debug)]
pub(super) struct ReleaseBody {
    /// `token` (required).
    pub(super) token: String,
    /// `cooldown_ms`, default 0.
    pub(super) cooldown: Duration,
    /// `quarantine_ms` and `reason` (which needs `quarantine_ms`).
    pub(super) quarantine: Option<Quarantine>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleaseFields {
    token: Option<String>,
    cooldown_ms: Option<u64>,
    quarantine_ms: Option<u64>,
    reason: Option<String>,
}

impl ReleaseBody {
    /// Errors: [`ApiError::BadInput`] naming the first bad field.
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        let kinds = [
            string("token"),
            int(COOLDOWN_MS),
            int(QUARANTINE_MS),
            string("reason"),
        ];
        let f: ReleaseFields = fields(bytes, &kinds, &[required_token()])?;
        let token = token(f.token)?;
        let cooldown = millis(COOLDOWN_MS, f.cooldown_ms.unwrap_or(0))?;
        let duration = f
            .quarantine_ms
            .map(|ms| millis(QUARANTINE_MS, ms))
            .transpose()?;
        if f.reason.as_deref().is_some_and(|r| !limits::is_reason(r)) {
            return Err(ApiError::bad("reason", limits::reason_rule()));
        }
        let quarantine = match (duration, f.reason) {
            (Some(duration), reason) => Some(Quarantine {
                duration,
                reason: reason.unwrap_or_default(),
            }),
            (None, Some(_)) => return Err(ApiError::bad("reason", "only with quarantine_ms")),
            (None, None) => None,
        };
        Ok(Self {
            token,
            cooldown,
            quarantine,
        })
    }
}

/// A field of a body and what it accepts, for the error of a value of the
/// wrong type. The text is written only for an error answer: building it on
/// every request cost allocations on the hot path of `pool serve`.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Int(Range),
    RequiredInt(Range),
    Str(&'static str),
    Object(&'static str),
    RequiredToken,
}

impl Kind {
    fn field(self) -> &'static str {
        match self {
            Self::Int(range) | Self::RequiredInt(range) => range.field,
            Self::Str(field) | Self::Object(field) => field,
            Self::RequiredToken => "token",
        }
    }

    fn expected(self) -> String {
        match self {
            Self::Int(range) => range.expected(),
            Self::RequiredInt(range) => format!("{} (required)", range.expected()),
            Self::Str(_) => "a string".to_owned(),
            Self::Object(_) => "a JSON object".to_owned(),
            Self::RequiredToken => format!("a string of {} (required)", limits::token_rule()),
        }
    }
}

fn int(range: Range) -> Kind {
    Kind::Int(range)
}

fn string(field: &'static str) -> Kind {
    Kind::Str(field)
}

fn required_int(range: Range) -> Kind {
    Kind::RequiredInt(range)
}

fn required_token() -> Kind {
    Kind::RequiredToken
}

/// Reads the body by the one reader's rules ([`crate::http::body`]) into
/// `T`, in this route's words: `kinds` lists `T`'s fields (what a value of
/// the wrong type is told), `required` the fields that must be given.
fn fields<T: DeserializeOwned>(
    bytes: &[u8],
    kinds: &[Kind],
    required: &[Kind],
) -> Result<T, ApiError> {
    // At most two required fields (token, ttl_ms): no allocation per request.
    debug_assert!(required.len() <= 2, "more required fields than names");
    let mut names = [""; 2];
    for (name, kind) in names.iter_mut().zip(required) {
        *name = kind.field();
    }
    let expected = |field: &str, missing: bool| {
        let list = if missing { required } else { kinds };
        list.iter()
            .find(|kind| kind.field() == field)
            .map(|kind| kind.expected())
    };
    let rules = Rules {
        required: &names[..required.len().min(names.len())],
        expected: &expected,
    };
    body::parse(bytes, rules).map_err(|bad| ApiError::BadInput {
        field: bad.field,
        expected: bad.expected,
    })
}

/// `ms` of `range.field` as a duration, within `range`.
fn millis(range: Range, ms: u64) -> Result<Duration, ApiError> {
    if range.allows(ms) {
        Ok(Duration::from_millis(ms))
    } else {
        Err(ApiError::bad(range.field, range.expected()))
    }
}

/// A name field (a request id), when given.
fn name(field: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    match value {
        Some(s) if !limits::is_name(&s) => Err(ApiError::bad(field, limits::name_rule())),
        other => Ok(other),
    }
}

/// The lease token ([`limits::token_rule`]).
fn token(value: Option<String>) -> Result<String, ApiError> {
    match value {
        Some(token) if limits::is_token(&token) => Ok(token),
        _ => Err(ApiError::bad("token", required_token().expected())),
    }
}

pub(super) fn lease_id(id: &str) -> Result<(), ApiError> {
    limits::name("id", id).map_err(ApiError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Range = TTL_MS;

    /// The field and expected text of a refused body.
    fn refused<T: std::fmt::Debug>(result: Result<T, ApiError>) -> (String, String) {
        match result {
            Err(ApiError::BadInput { field, expected }) => (field, expected),
            other => panic!("{other:?}"),
        }
    }

    fn acquire(text: &str) -> (String, String) {
        refused(AcquireBody::parse(text.as_bytes(), TTL))
    }

    #[test]
    fn an_unknown_field_is_named() {
        let (field, expected) = acquire(r#"{"ttl_ms": 5, "ttl": 5}"#);
        assert_eq!(
            (field.as_str(), expected.as_str()),
            ("ttl", "no such field")
        );
        let body = br#"{"token": "t", "ttl_ms": 5, "reason": "x"}"#;
        assert_eq!(refused(ExtendBody::parse(body)).0, "reason");
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_field_and_range() {
        for text in [
            r#"{"ttl_ms": 1.5}"#,
            r#"{"ttl_ms": "5"}"#,
            r#"{"ttl_ms": -1}"#,
        ] {
            let (field, expected) = acquire(text);
            assert_eq!(
                (field.as_str(), expected.as_str()),
                ("ttl_ms", "an integer 1-600000"),
                "{text}"
            );
        }
        let (field, expected) = acquire(r#"{"ttl_ms": 5, "request_id": 7}"#);
        assert_eq!(
            (field.as_str(), expected.as_str()),
            ("request_id", "a string")
        );
        let (field, _) = refused(ReleaseBody::parse(br#"{"token": 7}"#));
        assert_eq!(field, "token");
        // Not an object at all: the body is named.
        assert_eq!(acquire("[1]").0, "body");
        assert_eq!(acquire("{").0, "body");
    }

    #[test]
    fn a_value_out_of_range_names_its_field_and_range() {
        assert_eq!(
            acquire(r#"{"ttl_ms": 0}"#),
            ("ttl_ms".into(), "an integer 1-600000".into())
        );
        let pool_max = Range { max: 1000, ..TTL };
        let (field, expected) = refused(AcquireBody::parse(br#"{"ttl_ms": 1001}"#, pool_max));
        assert_eq!(
            (field.as_str(), expected.as_str()),
            ("ttl_ms", "an integer 1-1000")
        );
        let (field, expected) = acquire(r#"{"ttl_ms": 5, "wait_ms": 60001}"#);
        assert_eq!(
            (field.as_str(), expected.as_str()),
            ("wait_ms", "an integer 0-60000")
        );
        let body = br#"{"token": "t", "quarantine_ms": 2592000001}"#;
        assert_eq!(refused(ReleaseBody::parse(body)).0, "quarantine_ms");
        assert_eq!(refused(ReleaseBody::parse(br#"{"token": ""}"#)).0, "token");
        let body = br#"{"token": "t", "reason": "no quarantine"}"#;
        assert_eq!(
            refused(ReleaseBody::parse(body)),
            ("reason".into(), "only with quarantine_ms".into())
        );
    }

    #[test]
    fn a_missing_required_field_is_named_before_an_unknown_one() {
        for text in ["", "{}", r#"{"ttl_ms": null}"#, r#"{"ttl": 5}"#] {
            let (field, expected) = acquire(text);
            assert_eq!(field, "ttl_ms", "{text}");
            assert!(expected.ends_with("(required)"), "{text}: {expected}");
        }
        assert_eq!(refused(ExtendBody::parse(br#"{"token": "t"}"#)).0, "ttl_ms");
        assert_eq!(refused(ReleaseBody::parse(b"{}")).0, "token");
    }

    #[test]
    fn good_bodies_take_defaults_for_absent_and_null_fields() {
        let body = AcquireBody::parse(br#"{"ttl_ms": 5, "cooldown_ms": null}"#, TTL).unwrap();
        assert_eq!(
            (body.ttl, body.cooldown, body.wait),
            (Duration::from_millis(5), Duration::ZERO, Duration::ZERO)
        );
        let body =
            ReleaseBody::parse(br#"{"token": "t", "quarantine_ms": 60000, "reason": "banned"}"#)
                .unwrap();
        let quarantine = body.quarantine.unwrap();
        assert_eq!(
            (quarantine.duration, quarantine.reason.as_str()),
            (Duration::from_secs(60), "banned")
        );
    }
}
