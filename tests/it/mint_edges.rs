//! Mint mode's edges: clock settings that start-up accepts never stall minting.

use crate::clock_skew::set_offset;
use crate::harness::*;
use crate::mint_worker::{APP, faked_at, first_batch, next};

/// A clock 600 ms ahead of Redis, within `--max-clock-skew 1s`, with `--mint-window 200ms`:
/// the sidecar trusts its clock (a forward re-anchor) and asks for reservations up to the
/// clock + the window. Before, `reserve.lua` capped them at Redis' TIME + the window, below the
/// clock, so every `/next` answered `503 reserving` for good; now the cap adds the skew the
/// clock is trusted within, and the sidecar mints, and keeps minting.
#[test]
fn a_clock_ahead_within_the_skew_never_stalls_minting() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("offset");
    set_offset(&stamp, "+0.6");
    let sidecar = faked_at(&redis.url(), &stamp)
        .flag("--mint-window", "200ms")
        .flag("--max-clock-skew", "1s")
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .spawn();
    let first = first_batch(&sidecar, 16);
    assert_eq!(first.len(), 16);
    // Well past several windows: still minting.
    let end = std::time::Instant::now() + secs(3);
    let mut minted = 0;
    while std::time::Instant::now() < end {
        if let Ok(batch) = next(&sidecar, 64) {
            minted += batch.len();
        }
    }
    assert!(minted > 1000, "only {minted} IDs in 3 s");
    let last = next(&sidecar, 1);
    assert!(last.is_ok(), "{last:?}");
}

/// One raw HTTP/1.1 request to the sidecar's `--listen` port: the status line's code.
fn raw_status(sidecar: &Sidecar, method: &str, target: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(sidecar.http_addr()).unwrap();
    let head = format!("{method} {target} HTTP/1.1\r\nHost: mint\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer:?}"))
}

/// `HEAD /next` mints nothing (axum would run the GET handler and drop its IDs: counted as
/// answered, never delivered): 405. `Accept` is matched without regard to case and honours
/// `q=0`: `Text/Plain` gets text, `text/plain;q=0` JSON.
#[test]
fn head_mints_nothing_and_accept_is_negotiated() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let sidecar = crate::mint_worker::minter_at(&redis.url())
        .flag("--max-worker-id", "0")
        .spawn();
    first_batch(&sidecar, 1);
    let minted = || sidecar.metric("snowlease_ids_minted_total").unwrap();
    let before = minted();
    for _ in 0..3 {
        assert_eq!(raw_status(&sidecar, "HEAD", "/next?count=4096"), 405);
    }
    assert_eq!(minted(), before, "HEAD minted IDs");

    let (status, body) = sidecar.http_get("/next", Some("Text/Plain"));
    assert_eq!(status, 200);
    assert!(body.trim().parse::<u64>().is_ok(), "text: {body:?}");
    let (status, body) = sidecar.http_get("/next", Some("text/plain;q=0, application/json"));
    assert_eq!(status, 200);
    assert!(body.starts_with("{\"id\":"), "JSON: {body:?}");
}

/// A `--mint-socket` path of 100 bytes (107 is the most a socket address holds): bound and
/// served. Before, the temporary name `<path>.<pid>.tmp` it was bound under overflowed the
/// address and start-up failed ("path must be shorter than SUN_LEN"). Nothing but the socket
/// is left in its folder.
#[test]
fn a_mint_socket_path_of_100_bytes_is_served() {
    let redis = RedisServer::start();
    redis.open_claim_guard(APP);
    let pod = PodDir::new();
    let base = pod.path().to_string_lossy().len() + 1;
    let socket = pod.path().join("s".repeat(100 - base));
    assert_eq!(socket.as_os_str().len(), 100);
    let sidecar = crate::mint_worker::minter_at(&redis.url())
        .pod(&pod)
        .flag("--max-worker-id", "0")
        .flag("--mint-socket", socket.to_string_lossy())
        .spawn();
    first_batch(&sidecar, 1);
    let answer = crate::mint_worker::socket_get(&socket, "/next", "text/plain");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let leftovers: Vec<String> = std::fs::read_dir(pod.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
