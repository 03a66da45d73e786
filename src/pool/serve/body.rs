//! The request bodies and error answers of `pool serve`: a JSON object
//! taken apart field by field, and errors as JSON with an `error` field.

use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tracing::warn;

use crate::pool::limits::{self, Range};
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
        let (status, body) = match self {
            Self::UnknownPool(pool) => (
                StatusCode::NOT_FOUND,
                json!({ "error": "unknown pool", "pool": pool }),
            ),
            Self::BadInput { field, expected } => (
                StatusCode::BAD_REQUEST,
                json!({ "error": "bad input", "field": field, "expected": expected }),
            ),
            Self::Lost(reason) => (
                StatusCode::CONFLICT,
                json!({ "error": "lease lost", "reason": reason.as_str(), "detail": reason.describe() }),
            ),
            Self::Evicting(err) => (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({ "error": "redis may evict keys", "detail": err.to_string() }),
            ),
            Self::Pool(err) => {
                warn!(error = %err, "pool call failed");
                match err {
                    PoolError::Redis(_) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        json!({ "error": "redis unavailable" }),
                    ),
                    PoolError::WrongKeyType { key, .. } => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({ "error": "pool key has the wrong type", "key": key }),
                    ),
                    _ => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({ "error": "internal error" }),
                    ),
                }
            }
        };
        (status, Json(body)).into_response()
    }
}

/// A JSON object request body, taken apart field by field so every error
/// names its field; unknown fields are refused (a typo is not a default).
pub(super) struct Body(Map<String, Value>);

impl Body {
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, ApiError> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(Map::new()));
        }
        match serde_json::from_slice(bytes) {
            Ok(Value::Object(map)) => Ok(Self(map)),
            _ => Err(ApiError::bad("body", "a JSON object")),
        }
    }

    /// The integer field `range.field` (ms) within `range`; absent or null
    /// means `default`.
    pub(super) fn int(&mut self, range: Range, default: Option<u64>) -> Result<Duration, ApiError> {
        let field = range.field;
        let expected = || range.expected();
        let ms = match self.0.remove(field) {
            None | Some(Value::Null) => {
                default.ok_or_else(|| ApiError::bad(field, format!("{} (required)", expected())))?
            }
            Some(value) => value
                .as_u64()
                .filter(|n| range.allows(*n))
                .ok_or_else(|| ApiError::bad(field, expected()))?,
        };
        Ok(Duration::from_millis(ms))
    }

    /// A string field; absent or null is `None`.
    pub(super) fn string(&mut self, field: &str) -> Result<Option<String>, ApiError> {
        match self.0.remove(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::bad(field, "a string")),
        }
    }

    pub(super) fn token(&mut self) -> Result<String, ApiError> {
        match self.string("token")? {
            Some(token) if limits::is_token(&token) => Ok(token),
            _ => Err(ApiError::bad(
                "token",
                format!("a string of {} (required)", limits::token_rule()),
            )),
        }
    }

    /// `quarantine_ms` and `reason` of a release: `None` without
    /// `quarantine_ms`; a reason needs it.
    pub(super) fn quarantine(&mut self) -> Result<Option<Quarantine>, ApiError> {
        let field = limits::QUARANTINE_MS.field;
        let duration = match self.0.get(field) {
            None | Some(Value::Null) => {
                self.0.remove(field);
                None
            }
            Some(_) => Some(self.int(limits::QUARANTINE_MS, None)?),
        };
        let reason = match self.string("reason")? {
            Some(r) if !limits::is_reason(&r) => {
                return Err(ApiError::bad("reason", limits::reason_rule()));
            }
            other => other,
        };
        match (duration, reason) {
            (Some(duration), reason) => Ok(Some(Quarantine {
                duration,
                reason: reason.unwrap_or_default(),
            })),
            (None, Some(_)) => Err(ApiError::bad("reason", "only with quarantine_ms")),
            (None, None) => Ok(None),
        }
    }

    /// An optional name field (a request id).
    pub(super) fn name(&mut self, field: &str) -> Result<Option<String>, ApiError> {
        match self.string(field)? {
            Some(s) if !limits::is_name(&s) => Err(ApiError::bad(field, limits::name_rule())),
            other => Ok(other),
        }
    }

    pub(super) fn finish(self) -> Result<(), ApiError> {
        match self.0.keys().next() {
            Some(field) => Err(ApiError::bad(field, "no such field")),
            None => Ok(()),
        }
    }
}

pub(super) fn lease_id(id: &str) -> Result<(), ApiError> {
    limits::name("id", id).map_err(ApiError::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_name_the_bad_field() {
        let field = |text: &str, f: fn(&mut Body) -> Result<(), ApiError>| {
            let mut body = match Body::parse(text.as_bytes()) {
                Ok(body) => body,
                Err(ApiError::BadInput { field, .. }) => return field,
                Err(other) => panic!("{other:?}"),
            };
            match f(&mut body).and_then(|()| body.finish()) {
                Err(ApiError::BadInput { field, .. }) => field,
                other => panic!("{text}: {other:?}"),
            }
        };
        let ttl = |b: &mut Body| b.int(limits::TTL_MS, None).map(drop);
        assert_eq!(field("[1]", ttl), "body");
        assert_eq!(field("{}", ttl), "ttl_ms");
        assert_eq!(field(r#"{"ttl_ms": 0}"#, ttl), "ttl_ms");
        assert_eq!(field(r#"{"ttl_ms": 1.5}"#, ttl), "ttl_ms");
        assert_eq!(field(r#"{"ttl_ms": "5"}"#, ttl), "ttl_ms");
        assert_eq!(field(r#"{"ttl_ms": 5, "ttl": 5}"#, ttl), "ttl");
        let token = |b: &mut Body| b.token().map(drop);
        assert_eq!(field(r#"{"token": ""}"#, token), "token");
        assert_eq!(field(r#"{"token": 7}"#, token), "token");
    }
}
