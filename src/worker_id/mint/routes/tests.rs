//! `/next` through `oneshot`, on the real boot clock with a minter fed as the keeper would.

use super::*;
use crate::boot_clock::BootInstant;
use crate::worker_id::mint::layout::{
    DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Epoch, IdLayout, wall_now_ms,
};
use crate::worker_id::mint::minter::{Anchor, Grant, LeaseTicket, MintWindow, Minter};
use axum::body::{Body, to_bytes};
use axum::http::Request;
use std::time::Duration;
use tower::ServiceExt;

fn layout(text: &str) -> (IdLayout, Epoch) {
    let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), wall_now_ms()).unwrap();
    (IdLayout::parse(text).unwrap(), epoch)
}

/// A desk on `layout` whose lease (worker 7) has the mark `floor_ahead_ms` from now and a
/// reservation `ceiling_ahead_ms` from now (ms, signed), valid for `valid_ms`; `None`: no
/// lease, claiming.
fn desk(layout_text: &str, lease: Option<(i64, i64, u64)>) -> Arc<MintDesk> {
    desk_and_ticket(layout_text, lease).0
}

/// [`desk`], and the ticket of its lease.
fn desk_and_ticket(
    layout_text: &str,
    lease: Option<(i64, i64, u64)>,
) -> (Arc<MintDesk>, Option<LeaseTicket>) {
    let (layout, epoch) = layout(layout_text);
    let window = MintWindow {
        ahead_ms: 5_000,
        low_water_ms: 2_000,
    };
    let mut minter = Minter::new(layout, epoch, window);
    let mut ticket = None;
    if let Some((floor_ahead, ceiling_ahead, valid_ms)) = lease {
        let (boot, wall) = (BootInstant::now().as_millis(), wall_now_ms());
        let at = |ahead: i64| wall.saturating_add_signed(ahead);
        let started = minter.start(Grant {
            worker_id: 7,
            anchor: Anchor {
                boot_ms: boot,
                unix_ms: wall,
            },
            floor_unix_ms: at(floor_ahead),
            valid_until_boot_ms: boot + valid_ms,
        });
        minter.raise_ceiling(started, at(ceiling_ahead));
        ticket = Some(started);
    }
    (Arc::new(MintDesk::new(minter)), ticket)
}

fn serve(desk: &Arc<MintDesk>) -> (Router, Arc<MintMetrics>) {
    let metrics = Arc::new(MintMetrics::default());
    let http = MintHttp {
        desk: desk.clone(),
        metrics: metrics.clone(),
    };
    (router(http), metrics)
}

const HELD: Option<(i64, i64, u64)> = Some((-100, 60_000, 60_000));

async fn get(router: &Router, path: &str, accept: &str) -> (StatusCode, HeaderMap, String) {
    let request = Request::get(path)
        .header("accept", accept)
        .body(Body::empty())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap()
}

fn decimal(value: &serde_json::Value) -> u64 {
    value.as_str().expect("a string").parse().unwrap()
}

/// One ID as a JSON string by default, plain decimal as text; the worker bits are the lease's.
#[tokio::test]
async fn next_answers_one_id_as_a_json_string_or_text() {
    let (router, metrics) = serve(&desk(DEFAULT_LAYOUT, HELD));
    let (status, _, body) = get(&router, "/next", "application/json").await;
    assert_eq!(status, StatusCode::OK);
    let first = decimal(&json(&body)["id"]);
    let (layout, epoch) = layout(DEFAULT_LAYOUT);
    let parts = layout.decompose(epoch, first);
    assert_eq!(parts.worker_id, 7);
    assert!(parts.unix_ms.abs_diff(wall_now_ms()) < 1_000, "{parts:?}");
    let (status, _, body) = get(&router, "/next", "text/plain").await;
    assert_eq!(status, StatusCode::OK);
    let second: u64 = body.strip_suffix('\n').unwrap().parse().unwrap();
    assert!(second > first);
    assert_eq!(metrics.minted.get(), 2);
}

/// `count=N`: N strictly increasing IDs, `{"ids": [...]}` or one per line; 4096 at once
/// spans milliseconds as needed.
#[tokio::test]
async fn count_answers_a_batch_in_increasing_order() {
    let (router, metrics) = serve(&desk(DEFAULT_LAYOUT, HELD));
    let (status, _, body) = get(&router, "/next?count=5", "*/*").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<u64> = json(&body)["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(decimal)
        .collect();
    assert_eq!(ids.len(), 5);
    let (_, _, body) = get(&router, "/next?count=4096", "text/plain").await;
    let more: Vec<u64> = body.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(more.len(), 4096);
    let all: Vec<u64> = ids.into_iter().chain(more).collect();
    assert!(all.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(metrics.minted.get(), 4101);
}

/// 2 sequence bits: a batch of 10 waits for the next ms twice at least, counted.
#[tokio::test]
async fn an_exhausted_sequence_waits_for_the_next_ms_and_counts_it() {
    let (router, metrics) = serve(&desk("41:10:2", HELD));
    let (status, _, body) = get(&router, "/next?count=10", "text/plain").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<u64> = body.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(ids.len(), 10);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert!(
        metrics.sequence_waits.get() >= 2,
        "{}",
        metrics.sequence_waits.get()
    );
}

/// A bad `count` is a 400 naming the field and its range; nothing is minted.
#[tokio::test]
async fn a_bad_count_is_refused_naming_the_field_and_range() {
    let (router, metrics) = serve(&desk(DEFAULT_LAYOUT, HELD));
    for query in [
        "count=0",
        "count=4097",
        "count=x",
        "count=",
        "count=-1",
        "count=1&count=2",
    ] {
        let (status, _, body) = get(&router, &format!("/next?{query}"), "*/*").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        let body = json(&body);
        assert_eq!(body["field"], "count", "{query}");
        assert_eq!(body["expected"], "one integer in 1-4096");
    }
    assert_eq!(metrics.minted.get(), 0);
    assert_eq!(get(&router, "/next?other=1", "*/*").await.0, StatusCode::OK);
}

async fn refused(desk: &Arc<MintDesk>) -> (String, String, serde_json::Value) {
    let (router, metrics) = serve(desk);
    let (status, headers, body) = get(&router, "/next?count=3", "text/plain").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body = json(&body);
    assert!(
        body.get("id").is_none() && body.get("ids").is_none(),
        "{body}"
    );
    let state = body["state"].as_str().unwrap().to_string();
    let unavailable = metrics
        .unavailable
        .get_or_create(&super::super::metrics::StateLabel {
            state: UNAVAILABLE.iter().find(|s| **s == state).unwrap(),
        });
    assert_eq!(unavailable.get(), 1);
    let retry = headers[header::RETRY_AFTER].to_str().unwrap().to_string();
    (state, retry, body)
}

use super::super::metrics::UNAVAILABLE_STATES as UNAVAILABLE;

/// Without a valid lease: 503 naming the state, with Retry-After, never an ID: claiming; the
/// clock behind the previous holder's mark (wait and Retry-After to pass it); the deadline
/// passed; the ceiling reached with no reservation coming.
#[tokio::test]
async fn without_a_valid_lease_503_names_the_state_and_never_an_id() {
    assert_eq!(refused(&desk(DEFAULT_LAYOUT, None)).await.0, "claiming");
    let (state, retry, body) = refused(&desk(DEFAULT_LAYOUT, Some((30_000, 40_000, 60_000)))).await;
    assert_eq!(state, "clock_behind");
    let wait_ms = body["wait_ms"].as_u64().unwrap();
    assert!(wait_ms > 29_000 && wait_ms <= 30_001, "{body}");
    assert_eq!(
        retry,
        wait_ms.div_ceil(1000).to_string(),
        "whole seconds, rounded up"
    );
    let (state, retry, _) = refused(&desk(DEFAULT_LAYOUT, Some((-100, 60_000, 0)))).await;
    assert_eq!((state.as_str(), retry.as_str()), ("expired", "1"));
    let (state, _, _) = refused(&desk(DEFAULT_LAYOUT, Some((-100, -100, 60_000)))).await;
    assert_eq!(state, "reserving");
}

/// At the ceiling a request asks the keeper to reserve and is answered once it has, not at
/// the end of its wait (tokio's clock is paused: it moves only when every task waits, and
/// the keeper's raise comes first).
#[tokio::test(start_paused = true)]
async fn at_the_ceiling_a_request_waits_for_the_keepers_reservation() {
    let (desk, ticket) = desk_and_ticket(DEFAULT_LAYOUT, Some((-100, -100, 60_000)));
    let keeper = tokio::spawn({
        let desk = desk.clone();
        async move {
            desk.reservation_wanted().await;
            let due = desk.read(|m| m.reservation_due(BootInstant::now().as_millis()));
            desk.update(|m| m.raise_ceiling(ticket.unwrap(), due.unwrap()));
        }
    });
    let (router, _) = serve(&desk);
    let started = tokio::time::Instant::now();
    let (status, _, _) = get(&router, "/next", "*/*").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::ZERO, "answered at the raise");
    keeper.await.unwrap();
}

/// The answers written by hand are byte for byte what serde_json writes for the same IDs
/// (the largest 63-bit ID included), with axum::Json's content type; text is one decimal a
/// line.
#[tokio::test]
async fn answers_are_serde_jsons_bytes() {
    let ids = [0, 7, 1_234_567_890_123, i64::MAX as u64];
    let strings: Vec<String> = ids.iter().map(u64::to_string).collect();
    let body = |response: Response| async {
        let headers = response.headers().clone();
        let bytes = to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (headers, String::from_utf8(bytes.to_vec()).unwrap())
    };
    let (headers, batch) = body(answer(&ids, true, false)).await;
    assert_eq!(headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(batch, json!({ "ids": strings }).to_string());
    let (_, one) = body(answer(&ids[3..], false, false)).await;
    assert_eq!(one, json!({ "id": strings[3] }).to_string());
    let (_, none) = body(answer(&[], false, false)).await;
    assert_eq!(none, json!({ "id": null }).to_string());
    let (headers, text) = body(answer(&ids, true, true)).await;
    assert_eq!(headers[header::CONTENT_TYPE], "text/plain");
    assert_eq!(text, strings.join("\n") + "\n");
}

/// An unacknowledged claim's 503 names the replicas it waits for, as `/readyz` does.
#[tokio::test]
async fn an_unacknowledged_claim_names_the_replicas() {
    let response = unavailable(MintRefusal::NoLease(Standby::Unacknowledged(2)));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = to_bytes(response.into_body(), 1 << 20).await.unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"state": "unacknowledged", "min_replicas_ack": 2})
    );
}
