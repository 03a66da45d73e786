//! The Redis connection of every mode: dead and idle-closed connections
//! replaced, slow start-up probe, TLS with a private CA, URLs never echoed,
//! bad topology input.

use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::harness::*;

const RENEWED: &str = "snowlease_renewals_total{outcome=\"renewed\"}";
const FAILED: &str = "snowlease_renewals_total{outcome=\"failed\"}";

/// `snowlease pool serve` on `url`, listening on a free loopback port, JSON logs; add its
/// pools and settings.
pub(crate) fn pool_serve_on(url: &str) -> SidecarBuilder {
    SidecarBuilder::new("pool")
        .without("--listen")
        .without("--log-format")
        .switch("serve")
        .flag("--listen", "127.0.0.1:0")
        .flag("--log-format", "json")
        .flag("--redis-url", url)
        .name("pool serve")
}

/// `snowlease pool serve --pool proxies` on `url`, reaping every 200 ms.
pub(crate) fn pool_serve(url: &str) -> Sidecar {
    pool_serve_on(url)
        .flag("--redis-timeout", "500ms")
        .flag("--reap-interval", "200ms")
        .flag("--pool", "proxies")
        // Short: after a failover acquires are closed for the max lease (the rollback gate).
        .flag("--max-lease", "2s")
        .spawn()
}

/// POSTs a lease request (1 s) to `pool serve`; the HTTP status (0 when no answer in 1 s).
pub(crate) fn acquire_over_http(serve: &Sidecar) -> u16 {
    acquire_for(serve, 1000, secs(1))
}

/// POSTs a lease request of `ttl_ms` to `pool serve`'s pool `proxies`; the HTTP status (0 when
/// no answer within `wait`).
fn acquire_for(serve: &Sidecar, ttl_ms: u64, wait: std::time::Duration) -> u16 {
    let url = format!("http://{}/pools/proxies/leases", serve.http_addr());
    match ureq::post(&url)
        .timeout(wait)
        .send_json(json!({"ttl_ms": ttl_ms}))
    {
        Ok(reply) => reply.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(_) => 0,
    }
}

fn init_pool(url: &str) {
    let init = run_snowlease(
        &["pool", "init", "--pool", "proxies", "--ids", "a,b,c"],
        &[("REDIS_URL", url)],
        secs(10),
    );
    assert_eq!(init.code, Some(0), "{init:?}");
}

/// With every existing connection frozen (new ones pass), the worker keeps its ID
/// (renewals go on over a new connection) and `pool serve` serves again.
#[test]
fn frozen_connections_are_replaced() {
    let redis = RedisServer::start();
    init_pool(&redis.url());
    let proxy = FaultProxy::for_redis(&redis);
    let worker = Sidecar::worker_at(&proxy.url(), "orders")
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .spawn();
    let lease = worker.wait_for_lease(secs(10));
    let serve = pool_serve(&proxy.url());
    assert!(poll_until(secs(10), || acquire_over_http(&serve) == 201));
    let renewed = || worker.metric(RENEWED).unwrap_or(0.0);
    let before = renewed();

    proxy.freeze_existing();
    assert!(
        poll_until(secs(8), || renewed() >= before + 2.0),
        "no renewals after the freeze"
    );
    assert_eq!(worker.id().map(|id| id.worker_id), Some(lease.worker_id));
    assert_eq!(
        worker.metric("snowlease_leases_lost_total").unwrap_or(0.0),
        0.0
    );
    assert!(
        poll_until(secs(10), || acquire_over_http(&serve) == 201),
        "pool serve never served again"
    );
    assert!(poll_until(secs(5), || serve.readyz() == 200));
}

/// With 50 ms added each way (100 ms round trips) and `--renew-interval 1s` (250 ms call
/// timeout), the start-up probe (7 round trips) passes: each step has its own timeout.
#[test]
fn slow_replies_do_not_fail_the_probe() {
    let redis = RedisServer::start();
    let proxy = FaultProxy::for_redis(&redis);
    proxy.set_mode(Mode::delay(ms(50)));
    let worker = Sidecar::worker_at(&proxy.url(), "orders")
        .flag("--ttl", "4s")
        .flag("--renew-interval", "1s")
        .flag("--claim-timeout", "15s")
        .spawn();
    worker.wait_for_lease(secs(15));
}

/// A server that closes idle connections (`timeout 1`) costs no failed renewal:
/// the command that never left is sent again at once on a new connection.
#[test]
fn idle_timeout_is_not_a_failed_renewal() {
    let redis = RedisServer::start_with(RedisOptions {
        args: vec!["--timeout".into(), "1".into()],
        ..RedisOptions::default()
    });
    let worker = Sidecar::worker(&redis, "orders")
        .flag("--ttl", "6s")
        .flag("--renew-interval", "2500ms")
        .spawn();
    worker.wait_for_lease(secs(15));
    assert!(poll_until(secs(15), || worker
        .metric(RENEWED)
        .unwrap_or(0.0)
        >= 3.0));
    let closed: u64 = redis
        .info_field("stats", "total_connections_received")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        closed >= 3,
        "the server closed no idle connection ({closed} accepted)"
    );
    assert_eq!(worker.metric(FAILED).unwrap_or(0.0), 0.0);
    assert_eq!(worker.count_log("renew failed"), 0);
}

/// A request that crosses a close after an idle spell (a server's `timeout`, a NAT or load
/// balancer dropping idle connections) is sent again at once on a new connection: the proxy
/// holds the renew sent after 2 s of silence and resets the connection under it, three times;
/// no renewal fails.
#[test]
fn a_request_cut_off_after_an_idle_spell_is_sent_again() {
    let redis = RedisServer::start();
    assert_eq!(guard_open(&redis.url(), "orders", &[]).code, Some(0));
    let proxy = FaultProxy::for_redis(&redis);
    let worker = Sidecar::worker_at(&proxy.url(), "orders")
        .flag("--ttl", "10s")
        .flag("--renew-interval", "2s")
        .spawn();
    worker.wait_for_lease(secs(10));
    let renewed = || worker.metric(RENEWED).unwrap_or(0.0);
    for round in 0..3 {
        let before = renewed();
        assert!(
            poll_until(secs(5), || renewed() > before),
            "round {round}: no renewal"
        );
        // Past the eviction check (`INFO memory`) that follows a renewal: no event tells its
        // reply came; the check below proves the held request is the renew.
        std::thread::sleep(ms(500));
        let before = renewed();
        proxy.freeze_existing();
        let held = proxy
            .wait_queued_up(1, secs(5))
            .unwrap_or_else(|| panic!("round {round}: no request held"));
        // The renew's EVALSHA (SHA, key, owner) is over 100 bytes; `INFO memory` is 26.
        assert!(held.queued_up > 60, "round {round}: held {held:?}");
        proxy.set_conn_mode(held.id, Mode::Reset);
        assert!(
            poll_until(secs(5), || renewed() > before),
            "round {round}: no renewal after the reset"
        );
    }
    assert_eq!(worker.metric(FAILED).unwrap_or(0.0), 0.0);
    assert_eq!(worker.count_log("renew failed"), 0);
}

/// `pool serve` never sends an acquire a second time: after 2 s of silence an acquire reaches
/// Redis and runs, its reply is lost and the connection reset. Sent again, it would lease a
/// second id (the first one leased to a token nobody has) and answer 201 for it; it answers
/// an error, and Redis holds the one lease the acquire made.
#[test]
fn pool_serve_does_not_repeat_an_acquire_whose_reply_was_lost() {
    let redis = RedisServer::start();
    init_pool(&redis.url());
    let proxy = FaultProxy::for_redis(&redis);
    let serve = pool_serve_on(&proxy.url())
        .flag("--redis-timeout", "2s")
        // No reaper round in the silence before the acquire.
        .flag("--reap-interval", "1h")
        .flag("--pool", "proxies")
        .spawn();
    assert!(poll_until(secs(10), || serve.readyz() == 200));
    let leases = || redis.query::<u64>(redis::cmd("ZCARD").arg("{proxies}:leases"));
    let acquire = || acquire_for(&serve, 60_000, secs(5));
    // A first acquire loads the script (else the one below meets NOSCRIPT, which runs nothing).
    assert_eq!(acquire(), 201);
    // The silence itself is what is tested (a resend needs 1 s of it): no event to wait for.
    std::thread::sleep(ms(2000));
    proxy.set_mode(Mode::DropReplies);
    let status = std::thread::scope(|scope| {
        let acquire = scope.spawn(acquire);
        let ran = poll_until(secs(5), || leases() == 2);
        proxy.release();
        for conn in proxy.open_connections() {
            proxy.set_conn_mode(conn.id, Mode::Reset);
        }
        assert!(ran, "the acquire ran in Redis");
        acquire.join().unwrap()
    });
    // Any resend came before that answer.
    assert_ne!(status, 201, "an acquire sent again leased a second id");
    assert_eq!(leases(), 2, "one acquire, one lease");
}

/// A URL that does not parse cleanly exits 2, suggests percent-encoding and
/// echoes no part of it.
#[test]
fn unclean_url_exits_2_without_echo() {
    for url in [
        "redis://:s3cr@t#frag@redis.example:6379",
        "redis://:s3cr@t@redis.example:6379",
        "redis://u:s3cr?t@redis.example:6379",
    ] {
        let run = run_snowlease(&["status", "--app", "a", "--redis-url", url], &[], secs(10));
        assert_eq!(run.code, Some(2), "{run:?}");
        assert!(run.stderr.contains("percent-encode"), "{run:?}");
        assert!(
            !run.stderr.contains("s3cr") && !run.stderr.contains("example"),
            "{run:?}"
        );
    }
}

/// Makes a CA, a server certificate for 127.0.0.1 and a client certificate with openssl.
pub(crate) fn make_certs(dir: &Path) {
    let sh = |script: &str| {
        let out = Command::new("sh")
            .arg("-ec")
            .arg(script)
            .current_dir(dir)
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    sh(&format!(
        "openssl req -x509 {key} -keyout ca.key -out ca.pem -days 2 -subj /CN=snowlease-test-ca 2>/dev/null
         printf 'subjectAltName=IP:127.0.0.1\\n' > server.ext
         printf 'extendedKeyUsage=clientAuth\\n' > client.ext
         for n in server client; do
           openssl req {key} -keyout $n.key -out $n.csr -subj /CN=$n 2>/dev/null
           openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem -days 2 \
             -extfile $n.ext 2>/dev/null
         done"
    ));
}

/// `rediss://` to a server whose certificate comes from a private CA and that
/// requires client certificates. Untrusted or missing client certificate: a named
/// configuration error, exit 1 at once; `--redis-ca-file` or `SSL_CERT_FILE` trust the CA.
#[test]
fn tls_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let file = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let tls_port = free_port().to_string();
    let _redis = RedisServer::start_with(RedisOptions {
        args: [
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &file("server.pem"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.pem"),
            "--tls-auth-clients",
            "yes",
        ]
        .map(String::from)
        .to_vec(),
        ..RedisOptions::default()
    });
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let status = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["status", "--app", "orders", "--redis-url", &url];
        args.extend(extra);
        run_snowlease(&args, env, secs(20))
    };
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let client = ["--redis-cert-file", &cert, "--redis-key-file", &key];

    let untrusted = status(&client, &[]);
    assert_eq!(untrusted.code, Some(1), "{untrusted:?}");
    assert!(
        untrusted.stderr.contains("TLS certificate error"),
        "{untrusted:?}"
    );
    let no_client_cert = status(&["--redis-ca-file", &ca], &[]);
    assert_eq!(no_client_cert.code, Some(1), "{no_client_cert:?}");
    assert!(
        no_client_cert.stderr.contains("TLS certificate error"),
        "{no_client_cert:?}"
    );

    let with_ca = status(&[&client[..], &["--redis-ca-file", &ca]].concat(), &[]);
    assert_eq!(with_ca.code, Some(0), "{with_ca:?}");
    let with_env = status(&client, &[("SSL_CERT_FILE", &ca)]);
    assert_eq!(with_env.code, Some(0), "{with_env:?}");

    // The worker stops at once (exit 1), not after --claim-timeout.
    let pod = PodDir::new();
    let out = pod.worker_id_file().to_string_lossy().into_owned();
    let started = std::time::Instant::now();
    let worker = run_snowlease(
        &[
            "worker",
            "--app",
            "a",
            "--listen",
            "127.0.0.1:0",
            "--redis-url",
            &url,
            "--output-file",
            &out,
            "--claim-timeout",
            "60s",
        ],
        &[],
        secs(30),
    );
    assert_eq!(worker.code, Some(1), "{worker:?}");
    assert!(started.elapsed() < secs(20), "{worker:?}");
    assert!(
        worker.stderr.contains("TLS certificate error"),
        "{worker:?}"
    );
}

/// Bad topology input, for `worker` (which writes keys and files), `status` and `pool init`: a
/// Sentinel URL naming a master no Sentinel knows, a Sentinel URL at a plain server, a cluster
/// URL at a plain server and several hosts of one plain server exit 1 (docs/operations.md: a
/// topology that does not match the URL); Sentinels that are all down exit 3 in `worker` at
/// `--claim-timeout` (1 in the others). Each message names the cause, readiness stays off while
/// the worker runs, and nothing is written: no key, no ID file, no state file.
#[test]
fn a_topology_that_does_not_match_is_named() {
    let redis = RedisServer::start();
    let sentinel = Deployment::start(Topo::Sentinel);
    let (sentinels, _master) = sentinel
        .url()
        .rsplit_once('/')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .unwrap();
    let plain = format!("127.0.0.1:{}", redis.port());
    let nobody = format!("127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    let cases = [
        (
            format!("{sentinels}/nosuchmaster"),
            1,
            "no Sentinel knows the master",
        ),
        (
            format!("redis+sentinel://{plain}/mymaster"),
            1,
            "does not point to a sentinel",
        ),
        (format!("redis+cluster://{plain}"), 1, "not a Cluster node"),
        (format!("redis://{plain},{plain}"), 1, "not a Cluster node"),
        (
            format!("redis+sentinel://{nobody}/mymaster"),
            3,
            "no Sentinel answers",
        ),
    ];
    for (url, code, cause) in cases {
        let mut worker = Sidecar::worker_at(&url, "mismatch")
            .flag("--claim-timeout", "2s")
            .spawn();
        while worker.is_running() {
            if worker.count_log("http listening") > 0 {
                assert_ne!(worker.readyz(), 200, "{url}: ready");
            }
            std::thread::sleep(ms(50));
        }
        let exit = worker.wait_exit(secs(15)).expect("exits");
        let log = worker.log_lines().join("\n");
        assert_eq!(exit.code(), Some(code), "{url}: {log}");
        assert!(
            log.contains(cause),
            "{url}: the error names the cause ({cause}): {log}"
        );
        assert_eq!(
            worker.count_log("release"),
            0,
            "{url}: no claim ran, so no release is tried or logged: {log}"
        );
        assert!(!worker.output_file().exists(), "{url}: ID file written");
        assert!(!worker.state_file().exists(), "{url}: state file written");

        let status = run_snowlease(
            &["status", "--app", "mismatch", "--redis-url", &url],
            &[],
            secs(20),
        );
        assert_eq!(status.code, Some(1), "{url}: {status:?}");
        assert!(status.stderr.contains(cause), "{url}: {status:?}");
        // Said once, without redis-rs' kind names: the URL was repeated after
        // "- InvalidClientConfig: ".
        crate::acl::assert_no_kind_names(&status.stderr);
        crate::acl::assert_no_kind_names(&log);
        assert!(
            status.stderr.matches("nosuchmaster").count() <= 1,
            "{url}: the URL once: {status:?}"
        );
        let init = run_snowlease(
            &["pool", "init", "--pool", "mismatch", "--ids", "a"],
            &[("REDIS_URL", &url)],
            secs(20),
        );
        assert_eq!(init.code, Some(1), "{url}: {init:?}");
        assert!(init.stderr.contains(cause), "{url}: {init:?}");
        crate::acl::assert_no_kind_names(&init.stderr);
    }
    assert_eq!(redis.dbsize(), 0, "a key on the plain server");
    assert_eq!(sentinel.keys("*mismatch*"), Vec::<String>::new());
}

/// The sidecar's sockets to Redis carry a keepalive timer (`/proc/net/tcp`
/// timer kind 2), so a peer that vanished is noticed on an idle connection too.
#[test]
fn sockets_to_redis_have_keepalive() {
    let redis = RedisServer::start();
    let worker = Sidecar::worker(&redis, "orders").spawn();
    worker.wait_for_lease(secs(10));
    let port = format!(":{:04X}", redis.port());
    let timers = || -> Vec<String> {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                // Client side: the remote address is Redis; state 01 = established.
                (cols[2].ends_with(&port) && cols[3] == "01").then(|| cols[5].to_owned())
            })
            .collect()
    };
    assert!(
        poll_until(secs(5), || {
            let t = timers();
            !t.is_empty()
                && t.iter()
                    .all(|timer| timer.starts_with("02:") || timer.starts_with("01:"))
        }),
        "timers of the sockets to redis: {:?}",
        timers()
    );
    assert!(timers().iter().any(|timer| timer.starts_with("02:")));
}
