//! Every listener answers errors in JSON: an unknown path (404), a method a path does not
//! take (405, `Allow` kept), a body too large (413) or too slow (408), on the worker's
//! `--listen` and on `pool serve`; `pool serve`'s `/readyz` says its `state` in JSON as the
//! worker's does.

use std::io::{Read, Write};
use std::net::TcpStream;

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::harness::{RedisServer, Sidecar, secs};
use crate::pool_http::{call, serve_router};

/// `method path` on a real listener -> (status, JSON body, `Allow`).
fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, Value, Option<String>) {
    let url = format!("http://{addr}{path}");
    let response = match ureq::request(method, &url).timeout(secs(5)).call() {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(err) => panic!("{method} {path}: {err}"),
    };
    let status = response.status();
    let allow = response.header("allow").map(str::to_owned);
    let text = response.into_string().unwrap();
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{method} {path}: {status} {text:?} is not JSON: {e}"));
    (status, body, allow)
}

/// The worker's `--listen`: 404 and 405 in JSON, not an empty body; 405 keeps `Allow`.
#[test]
fn the_worker_answers_unknown_paths_and_methods_in_json() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders").spawn();
    sidecar.wait_for_lease(secs(10));
    let addr = sidecar.http_addr();
    assert_eq!(
        request(addr, "GET", "/nope"),
        (404, json!({"error": "no such route"}), None)
    );
    let (status, body, allow) = request(addr, "POST", "/id");
    assert_eq!(
        (status, body),
        (
            405,
            json!({"error": "method not allowed", "method": "POST"})
        )
    );
    assert_eq!(allow.as_deref(), Some("GET,HEAD"));
}

/// A body over 16 KiB (413) and a body that trickles past `--http-header-timeout` (408, the
/// connection closed) are answered in JSON too.
#[test]
fn bodies_refused_for_size_or_time_are_answered_in_json() {
    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag("--http-header-timeout", "200ms")
        .spawn();
    let addr = sidecar.http_addr();
    let big = "x".repeat(17 * 1024);
    let response = match ureq::post(&format!("http://{addr}/id"))
        .timeout(secs(5))
        .send_string(&big)
    {
        Ok(response) | Err(ureq::Error::Status(_, response)) => response,
        Err(err) => panic!("oversized body: {err}"),
    };
    assert_eq!(response.status(), 413);
    let body: Value = serde_json::from_str(&response.into_string().unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"error": "body too large", "limit_bytes": 16384})
    );

    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"POST /id HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        .unwrap();
    slow.set_read_timeout(Some(secs(10))).unwrap();
    let mut reply = Vec::new();
    let _ = slow.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(
        reply.starts_with("HTTP/1.1 408")
            && reply.ends_with(r#"{"error":"body not received in time"}"#),
        "{reply:?}"
    );
}

/// `pool serve`: 404 and 405 in JSON, the budget routes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_serve_answers_unknown_paths_and_methods_in_json() {
    let redis = RedisServer::start();
    let (router, _shutdown) = serve_router(&redis, &["p"], &["a"]).await;
    let answer = async |method: &str, path: &str| {
        let (status, body, _) = call(&router, method, path, Value::Null).await;
        (status, body)
    };
    assert_eq!(
        answer("GET", "/nope").await,
        (StatusCode::NOT_FOUND, json!({"error": "no such route"}))
    );
    assert_eq!(
        answer("GET", "/pools/p/leases").await,
        (
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"error": "method not allowed", "method": "GET"})
        )
    );
    assert_eq!(
        answer("DELETE", "/budgets/b/take").await,
        (
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"error": "method not allowed", "method": "DELETE"})
        )
    );
}

/// `pool serve`'s `/readyz` is JSON with a `state` in every case, as the worker's; status
/// codes as before: 200 while Redis answers, 503 while it does not, 503 from shutdown on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_serve_readyz_says_its_state_in_json() {
    let mut redis = RedisServer::start();
    let (router, shutdown) = serve_router(&redis, &["p"], &["a"]).await;
    let answer = async |method: &str, path: &str| {
        let (status, body, _) = call(&router, method, path, Value::Null).await;
        (status, body)
    };
    assert_eq!(answer("GET", "/pools/p").await.0, StatusCode::OK);
    assert_eq!(
        answer("GET", "/readyz").await,
        (StatusCode::OK, json!({"state": "ready"}))
    );
    redis.stop();
    assert_eq!(
        answer("GET", "/pools/p").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        answer("GET", "/readyz").await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"state": "redis_not_answering"})
        )
    );
    shutdown.cancel();
    assert_eq!(
        answer("GET", "/readyz").await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"state": "stopping"})
        )
    );
}
