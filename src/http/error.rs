//! The one JSON error answer of every listener: a status and a body with an
//! `error` field, one builder per kind of answer, so a kind reads the same
//! on every route (pool serve, the budget routes, the worker's and mint's),
//! and the one `Retry-After` writer.

use std::time::Duration;

use axum::http::{HeaderName, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{Value, json};

/// An error answer: `status` with the JSON `body` (an object with at least
/// `error`, a short fixed phrase clients may match on), and `Retry-After`
/// when it says when to come back.
#[derive(Debug, Clone)]
pub(crate) struct HttpError {
    status: StatusCode,
    body: Value,
    retry_after: Option<Duration>,
}

/// The `Retry-After` header (RFC 9110, 10.2.3) for a client to wait `wait`:
/// whole seconds rounded up, at least 1 (a 0 would have it retry at once).
/// The one writer of the header on every route.
pub(crate) fn retry_after(wait: Duration) -> [(HeaderName, String); 1] {
    let secs = crate::timing::secs_ceil(wait).max(1);
    [(header::RETRY_AFTER, secs.to_string())]
}

/// `RateLimit-Policy: "<name>";q=<quota>;w=<s>` and `RateLimit: "<name>";r=<remaining>;t=<s>`
/// as draft-ietf-httpapi-ratelimit-headers (-08 and later, structured fields) has them, and
/// as API gateways send them beside `Retry-After`: `policy` is the quota and the window it
/// refills in (whole seconds rounded up, at least 1; none: the name alone), `remaining` the
/// units that could be taken now, `reset` the time until the quota is full again (whole
/// seconds rounded up). `name` must be safe in a string item (`[A-Za-z0-9_-]` is). The one
/// writer of both fields.
pub(crate) fn ratelimit(
    name: &str,
    policy: Option<(u64, Duration)>,
    remaining: u64,
    reset: Duration,
) -> [(HeaderName, String); 2] {
    let policy = match policy {
        Some((quota, window)) => format!(
            "\"{name}\";q={quota};w={}",
            crate::timing::secs_ceil(window).max(1)
        ),
        None => format!("\"{name}\""),
    };
    let state = format!(
        "\"{name}\";r={remaining};t={}",
        crate::timing::secs_ceil(reset)
    );
    [
        (HeaderName::from_static("ratelimit-policy"), policy),
        (HeaderName::from_static("ratelimit"), state),
    ]
}

impl HttpError {
    /// `status` with `{"error": error}`; add fields with [`HttpError::with`].
    pub(crate) fn new(status: StatusCode, error: &str) -> Self {
        Self {
            status,
            body: json!({ "error": error }),
            retry_after: None,
        }
    }

    /// The answer with `Retry-After` for `wait` (see [`retry_after`]).
    pub(crate) fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }

    /// The answer with `field` set to `value` in its body.
    pub(crate) fn with(mut self, field: &str, value: impl Into<Value>) -> Self {
        self.body[field] = value.into();
        self
    }

    /// The answer with every field of `fields` (a JSON object) set in its
    /// body; anything but an object adds nothing.
    pub(crate) fn with_fields(mut self, fields: Value) -> Self {
        if let Value::Object(fields) = fields {
            for (field, value) in fields {
                self.body[field] = value;
            }
        }
        self
    }

    /// 400 `{"error": "bad input", field, expected}`: the request's `field`
    /// is outside what `expected` says; nothing was written.
    pub(crate) fn bad_input(field: &str, expected: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad input")
            .with("field", field)
            .with("expected", expected)
    }

    /// 500 `{"error": "bad key in redis", key}`: `key` holds another type
    /// (or a value the scripts never write) than its layout says. A data
    /// error for an operator to fix; Redis answered, so readiness is not
    /// touched.
    pub(crate) fn bad_key(key: &str) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "bad key in redis").with("key", key)
    }

    /// 503 `{"error": "redis unavailable"}`: Redis did not answer, or refused
    /// this client; the call may or may not have run.
    pub(crate) fn redis_unavailable() -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "redis unavailable")
    }

    /// 500 `{"error": "internal error"}`: anything else; the details go to
    /// the log, not to the client.
    pub(crate) fn internal() -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }
}

/// `router` answering, like every other error, in JSON what it has no route
/// for: 404 `{"error": "no such route"}` for an unknown path, 405 `{"error":
/// "method not allowed", "method"}` for a known path's other methods
/// (axum keeps its `Allow` header). Applied once the router holds every
/// route: axum sets the 405 answer on the routes registered so far.
pub(crate) fn with_json_fallbacks(router: Router) -> Router {
    router
        .fallback(no_such_route)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn no_such_route() -> HttpError {
    HttpError::new(StatusCode::NOT_FOUND, "no such route")
}

async fn method_not_allowed(method: Method) -> HttpError {
    HttpError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        .with("method", method.as_str())
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        match self.retry_after {
            Some(wait) => (self.status, retry_after(wait), Json(self.body)).into_response(),
            None => (self.status, Json(self.body)).into_response(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(err: HttpError) -> (StatusCode, Value) {
        let response = err.into_response();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// The RateLimit fields: the window at least 1 s and rounded up, the reset rounded up, a
    /// policy without quota the name alone.
    #[test]
    fn ratelimit_fields_round_up_to_whole_seconds() {
        let ms = Duration::from_millis;
        let [(p, policy), (r, state)] = ratelimit("crawl", Some((3, ms(1500))), 2, ms(999));
        assert_eq!((p.as_str(), r.as_str()), ("ratelimit-policy", "ratelimit"));
        assert_eq!(policy, "\"crawl\";q=3;w=2");
        assert_eq!(state, "\"crawl\";r=2;t=1");
        let [(_, policy), (_, state)] = ratelimit("b", None, 0, Duration::ZERO);
        assert_eq!(
            (policy.as_str(), state.as_str()),
            ("\"b\"", "\"b\";r=0;t=0")
        );
        let [(_, policy), _] = ratelimit("b", Some((1, ms(10))), 1, ms(10));
        assert_eq!(policy, "\"b\";q=1;w=1", "at least 1 s");
    }

    /// Whole seconds, rounded up, at least 1: the rule of every route that
    /// says when to come back (an empty pool, a budget's denial, mint).
    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let secs = |ms: u64| retry_after(Duration::from_millis(ms))[0].1.clone();
        assert_eq!(retry_after(Duration::ZERO)[0].0, header::RETRY_AFTER);
        for (ms, want) in [(0, "1"), (1, "1"), (1000, "1"), (1001, "2"), (59_001, "60")] {
            assert_eq!(secs(ms), want, "{ms} ms");
        }
    }

    /// Unknown paths and other methods answer JSON; the `Allow` header stays.
    #[tokio::test]
    async fn unknown_paths_and_methods_answer_json() {
        use tower::ServiceExt;
        let router =
            with_json_fallbacks(Router::new().route("/id", axum::routing::get(|| async { "7" })));
        let call = |method: &str, path: &str| {
            let request = axum::http::Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::empty())
                .unwrap();
            router.clone().oneshot(request)
        };
        let response = call("POST", "/id").await.unwrap();
        let allow = response.headers().get("allow").cloned();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&bytes).unwrap(),
            json!({"error": "method not allowed", "method": "POST"})
        );
        assert_eq!(allow.unwrap(), "GET,HEAD");
        let response = call("GET", "/nope").await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn each_answer_is_its_status_and_json() {
        assert_eq!(
            answer(HttpError::bad_input("ttl_ms", "an integer 1-600000")).await,
            (
                StatusCode::BAD_REQUEST,
                json!({"error": "bad input", "field": "ttl_ms", "expected": "an integer 1-600000"})
            )
        );
        assert_eq!(
            answer(HttpError::bad_key("{p}:requests")).await,
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "bad key in redis", "key": "{p}:requests"})
            )
        );
        assert_eq!(
            answer(
                HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "no lease")
                    .with_fields(json!({"state": "claiming", "opens_in_ms": 5}))
                    .with_fields(json!(7))
            )
            .await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "no lease", "state": "claiming", "opens_in_ms": 5})
            )
        );
        assert_eq!(
            answer(HttpError::redis_unavailable()).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "redis unavailable"})
            )
        );
    }
}
