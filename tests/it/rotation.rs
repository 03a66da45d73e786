//! Credentials rotated during a run: a CA bundle and certificates
//! (cert-manager's order), a certificate the client cannot verify for a while,
//! an ACL password in a mounted file. The files are read again at every
//! connection open; the worker keeps its ID through each.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::*;

const RENEWED: &str = "snowlease_renewals_total{outcome=\"renewed\"}";

/// A folder of test certificates made with openssl (EC P-256, 2 days).
struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn new() -> Certs {
        Certs {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.path(name).to_string_lossy().into_owned()
    }

    fn sh(&self, script: &str) {
        let out = Command::new("sh")
            .arg("-ec")
            .arg(script)
            .current_dir(self.dir.path())
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A CA: `<ca>.pem`, `<ca>.key`.
    fn ca(&self, ca: &str) -> &Self {
        self.sh(&format!(
            "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
               -keyout {ca}.key -out {ca}.pem -days 2 -subj /CN={ca} 2>/dev/null"
        ));
        self
    }

    /// A certificate signed by `ca`: `<name>.pem`, `<name>.key`; `server` for
    /// 127.0.0.1, else a client certificate.
    fn issue(&self, ca: &str, name: &str, server: bool) -> &Self {
        let ext = match server {
            true => "subjectAltName=IP:127.0.0.1",
            false => "extendedKeyUsage=clientAuth",
        };
        self.sh(&format!(
            "printf '{ext}\\n' > {name}.ext
             openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
               -keyout {name}.key -out {name}.csr -subj /CN={name} 2>/dev/null
             openssl x509 -req -in {name}.csr -CA {ca}.pem -CAkey {ca}.key -CAcreateserial \
               -out {name}.pem -days 2 -extfile {name}.ext 2>/dev/null"
        ));
        self
    }

    /// Writes `to` whole (a temporary file renamed over it), as a Secret
    /// volume update swaps its files: a reader never sees half a file.
    fn replace(&self, to: &str, content: &[u8]) {
        let tmp = self.path(&format!(".{to}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, self.path(to)).unwrap();
    }

    /// The concatenation of PEM files (a CA bundle).
    fn bundle(&self, parts: &[&str]) -> Vec<u8> {
        parts
            .iter()
            .flat_map(|p| std::fs::read(self.path(p)).unwrap())
            .collect()
    }
}

/// A redis-server with a plain port (for the test's own commands) and a TLS
/// port serving `cert` (`<cert>.pem`/`.key`) and trusting `client_ca` for
/// client certificates (required).
fn tls_redis(certs: &Certs, cert: &str, client_ca: &str) -> (RedisServer, String) {
    let tls_port = free_port().to_string();
    let redis = RedisServer::start_with(RedisOptions {
        args: [
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &certs.arg(&format!("{cert}.pem")),
            "--tls-key-file",
            &certs.arg(&format!("{cert}.key")),
            "--tls-ca-cert-file",
            &certs.arg(&format!("{client_ca}.pem")),
            "--tls-auth-clients",
            "yes",
        ]
        .map(String::from)
        .to_vec(),
        ..RedisOptions::default()
    });
    (redis, format!("rediss://127.0.0.1:{tls_port}"))
}

/// `CONFIG SET` of several TLS options at once (a certificate with its key).
fn config_set(redis: &RedisServer, pairs: &[(&str, String)]) {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("SET");
    for (name, value) in pairs {
        cmd.arg(*name).arg(value);
    }
    let _: () = redis.query(&mut cmd);
}

/// Closes every client connection but the caller's, so the sidecar must
/// open a new one.
fn kill_clients(redis: &RedisServer) {
    let _: i64 = redis.query(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal"));
}

/// A worker over TLS with the client files in `certs`; TTL 20 s so the
/// validity deadline leaves room for a rotation under load. The claim guard
/// is opened first (over the plain port), so the claim waits no TTL.
fn tls_worker(redis: &RedisServer, url: &str, certs: &Certs) -> Sidecar {
    let opened = guard_open(&redis.url(), "rotating", &[]);
    assert_eq!(opened.code, Some(0), "{opened:?}");
    Sidecar::worker_at(url, "rotating")
        .flag("--ttl", "20s")
        .flag("--renew-interval", "1s")
        .flag("--redis-ca-file", certs.arg("ca.pem"))
        .flag("--redis-cert-file", certs.arg("client.pem"))
        .flag("--redis-key-file", certs.arg("client.key"))
        .spawn()
}

/// Waits until the sidecar renewed at least twice more than `before`
/// (false when it stopped answering: it exited).
fn renews_again(sidecar: &Sidecar, before: f64, within: std::time::Duration) -> bool {
    poll_until(within, || match sidecar.http_get("/metrics", None) {
        (200, body) => metric_value(&body, RENEWED).is_some_and(|now| now >= before + 2.0),
        _ => false,
    })
}

/// `snowlease status` over TLS trusting only `ca_file`, with the client files.
fn status_with_ca(url: &str, certs: &Certs, ca_file: &Path) -> Run {
    let (ca, cert, key) = (
        ca_file.to_string_lossy().into_owned(),
        certs.arg("client.pem"),
        certs.arg("client.key"),
    );
    run_snowlease(
        &[
            "status",
            "--app",
            "rotating",
            "--redis-url",
            url,
            "--redis-ca-file",
            &ca,
            "--redis-cert-file",
            &cert,
            "--redis-key-file",
            &key,
        ],
        &[],
        secs(20),
    )
}

/// (a) cert-manager rotates the CA. The client's CA bundle gains CA2 and its
/// client certificate is re-issued by CA2; Redis trusts CA2 clients and serves a CA2
/// certificate; its clients are closed. The worker reconnects with the files as they are
/// now: same ID, same owner in the key, still running (it exited 1 at the reconnect with
/// "invalid peer certificate: UnknownIssuer").
#[test]
fn a_rotated_ca_is_followed_without_a_restart() {
    let certs = Certs::new();
    certs
        .ca("ca1")
        .ca("ca2")
        .issue("ca1", "server1", true)
        .issue("ca2", "server2", true)
        .issue("ca1", "client1", false)
        .issue("ca2", "client2", false);
    certs.replace("ca.pem", &certs.bundle(&["ca1.pem"]));
    certs.replace("client.pem", &certs.bundle(&["client1.pem"]));
    certs.replace("client.key", &certs.bundle(&["client1.key"]));
    certs.replace("server-cas.pem", &certs.bundle(&["ca1.pem", "ca2.pem"]));
    let (redis, url) = tls_redis(&certs, "server1", "server-cas");
    let mut worker = tls_worker(&redis, &url, &certs);
    let lease = worker.wait_for_lease(secs(20));
    let key = worker_key("rotating", lease.worker_id);
    let before = worker.metric(RENEWED).expect("renewals metric");

    // cert-manager's order: the bundle gains the new CA, then the certificates move to it.
    certs.replace("ca.pem", &certs.bundle(&["ca1.pem", "ca2.pem"]));
    certs.replace("client.pem", &certs.bundle(&["client2.pem"]));
    certs.replace("client.key", &certs.bundle(&["client2.key"]));
    config_set(
        &redis,
        &[
            ("tls-cert-file", certs.arg("server2.pem")),
            ("tls-key-file", certs.arg("server2.key")),
            ("tls-ca-cert-file", certs.arg("ca2.pem")),
        ],
    );
    // The switch is real: a client that trusts only CA1 is refused now.
    let old_ca = status_with_ca(&url, &certs, &certs.path("ca1.pem"));
    assert_eq!(old_ca.code, Some(1), "{old_ca:?}");
    assert!(
        old_ca.stderr.contains("TLS certificate error"),
        "{old_ca:?}"
    );

    kill_clients(&redis);
    assert!(
        renews_again(&worker, before, secs(15)),
        "no renewal on a new connection; running: {}; log: {:?}",
        worker.is_running(),
        worker.log_lines()
    );
    assert!(worker.is_running(), "{:?}", worker.log_lines());
    let now = worker.id().expect("ID still published");
    assert_eq!(now.worker_id, lease.worker_id);
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));
}

/// (b) During a run Redis switches to a certificate from a CA the client's
/// file does not hold. The reconnects fail with a named certificate error and are
/// retried: the worker neither exits nor unpublishes before its validity deadline; once
/// the file gains the CA (before the deadline) it renews and keeps the ID. At the first
/// connect the same error still stops the worker at once (tests::connection).
#[test]
fn an_unverifiable_certificate_during_a_run_is_retried() {
    let certs = Certs::new();
    certs
        .ca("ca1")
        .ca("ca3")
        .issue("ca1", "server1", true)
        .issue("ca3", "server3", true)
        .issue("ca1", "client", false);
    certs.replace("ca.pem", &certs.bundle(&["ca1.pem"]));
    let (redis, url) = tls_redis(&certs, "server1", "ca1");
    let mut worker = tls_worker(&redis, &url, &certs);
    let lease = worker.wait_for_lease(secs(20));
    let key = worker_key("rotating", lease.worker_id);

    config_set(
        &redis,
        &[
            ("tls-cert-file", certs.arg("server3.pem")),
            ("tls-key-file", certs.arg("server3.key")),
        ],
    );
    kill_clients(&redis);
    let refused = worker.wait_for_log("TLS certificate error", secs(15));
    assert!(
        refused,
        "no certificate error logged: {:?}",
        worker.log_lines()
    );
    // Retried, not a stop: still running and still publishing (the deadline is ~20 s away).
    assert!(worker.is_running(), "{:?}", worker.log_lines());
    assert_eq!(
        worker.id().map(|id| id.worker_id),
        Some(lease.worker_id),
        "unpublished before the validity deadline"
    );

    let before = worker.metric(RENEWED).expect("renewals metric");
    certs.replace("ca.pem", &certs.bundle(&["ca1.pem", "ca3.pem"]));
    assert!(
        renews_again(&worker, before, secs(12)),
        "no renewal after the CA file was fixed; running: {}; log: {:?}",
        worker.is_running(),
        worker.log_lines()
    );
    assert!(worker.is_running(), "{:?}", worker.log_lines());
    assert_eq!(worker.id().map(|id| id.worker_id), Some(lease.worker_id));
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));
}

/// (b) for `lock`: the same unverifiable certificate during a run is a failed
/// renewal, retried; the command keeps running and, once the file gains the CA before the
/// lease's deadline, the lock is renewed again and the command ends on its own (exit 0).
#[test]
fn lock_retries_an_unverifiable_certificate_during_a_run() {
    let certs = Certs::new();
    certs
        .ca("ca1")
        .ca("ca3")
        .issue("ca1", "server1", true)
        .issue("ca3", "server3", true)
        .issue("ca1", "client", false);
    certs.replace("ca.pem", &certs.bundle(&["ca1.pem"]));
    let (redis, url) = tls_redis(&certs, "server1", "ca1");
    let done = certs.path("done");
    let mut lock = SidecarBuilder::new("lock")
        .name("lock rotating")
        .without("--listen")
        .flag("--name", "rotating")
        .flag("--redis-url", &url)
        .flag("--ttl", "15s")
        .flag("--redis-ca-file", certs.arg("ca.pem"))
        .flag("--redis-cert-file", certs.arg("client.pem"))
        .flag("--redis-key-file", certs.arg("client.key"))
        .env("DONE", &done)
        .switch("--")
        .switch("sh")
        .switch("-c")
        .switch("while [ ! -e \"$DONE\" ]; do sleep 0.1; done")
        .spawn();
    let key = "snowlease:lock:{rotating}";
    let owner = poll_some(secs(15), || redis.get(key)).expect("lock acquired");

    config_set(
        &redis,
        &[
            ("tls-cert-file", certs.arg("server3.pem")),
            ("tls-key-file", certs.arg("server3.key")),
        ],
    );
    kill_clients(&redis);
    // Renewed every ttl/3 (5 s): the first renewal after the switch meets the error.
    let refused = lock.wait_for_log("TLS certificate error", secs(15));
    assert!(
        refused,
        "no certificate error logged: {:?}",
        lock.log_lines()
    );
    assert!(lock.is_running(), "{:?}", lock.log_lines());
    let left_ms = redis.pttl(key);

    certs.replace("ca.pem", &certs.bundle(&["ca1.pem", "ca3.pem"]));
    let renewed = poll_until(secs(10), || redis.pttl(key) > left_ms + 1000);
    assert!(
        renewed,
        "no renewal after the CA file was fixed: {:?}",
        lock.log_lines()
    );
    assert_eq!(redis.get(key), Some(owner));
    std::fs::write(&done, "").unwrap();
    let status = lock.wait_exit(secs(15)).and_then(|s| s.code());
    assert_eq!(status, Some(0), "{:?}", lock.log_lines());
}

/// For `pool serve`: while the server's certificate comes from a CA the file
/// lacks, acquires answer 503 (Redis unavailable) and the process stays up; once the file
/// gains the CA, the next connection uses it and acquires succeed again, without a restart
/// (it answered 503 until restarted: the file was read once).
#[test]
fn pool_serve_follows_a_fixed_ca_file_without_a_restart() {
    let certs = Certs::new();
    certs
        .ca("ca1")
        .ca("ca3")
        .issue("ca1", "server1", true)
        .issue("ca3", "server3", true)
        .issue("ca1", "client", false);
    certs.replace("ca.pem", &certs.bundle(&["ca1.pem"]));
    let (redis, url) = tls_redis(&certs, "server1", "ca1");
    let init = run_snowlease(
        &[
            "pool",
            "init",
            "--pool",
            "proxies",
            "--ids",
            "a,b,c,d",
            "--redis-url",
            &redis.url(),
        ],
        &[],
        secs(15),
    );
    assert_eq!(init.code, Some(0), "{init:?}");
    let mut serve = SidecarBuilder::new("pool")
        .without("--listen")
        .without("--log-format")
        .switch("serve")
        .flag("--listen", "127.0.0.1:0")
        .flag("--log-format", "json")
        .flag("--redis-url", &url)
        .flag("--redis-timeout", "500ms")
        .flag("--pool", "proxies")
        .flag("--redis-ca-file", certs.arg("ca.pem"))
        .flag("--redis-cert-file", certs.arg("client.pem"))
        .flag("--redis-key-file", certs.arg("client.key"))
        .name("pool serve")
        .spawn();
    let acquire = || crate::connection::acquire_over_http(&serve);
    assert!(
        poll_until(secs(15), || acquire() == 201),
        "{:?}",
        serve.log_lines()
    );

    config_set(
        &redis,
        &[
            ("tls-cert-file", certs.arg("server3.pem")),
            ("tls-key-file", certs.arg("server3.key")),
        ],
    );
    kill_clients(&redis);
    assert!(
        poll_until(secs(10), || acquire() == 503),
        "{:?}",
        serve.log_lines()
    );
    assert!(serve.wait_for_log("TLS certificate error", secs(10)));

    certs.replace("ca.pem", &certs.bundle(&["ca1.pem", "ca3.pem"]));
    assert!(
        poll_until(secs(10), || acquire() == 201),
        "no acquire after the CA file was fixed: {:?}",
        serve.log_lines()
    );
    assert!(serve.is_running());
}

/// Sets the ACL user `snowlease`'s password rules (`>add`, `<remove`) with full access
/// (the default user stays on for the test's own commands).
fn acl(redis: &RedisServer, rules: &[&str]) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg("snowlease")
        .arg("on")
        .arg("~*")
        .arg("&*")
        .arg("+@all");
    for rule in rules {
        cmd.arg(*rule);
    }
    let _: () = redis.query(&mut cmd);
}

/// Passwords: `--redis-password-file` (a mounted Secret) is read at every
/// connection open. The documented rotation (new password added to the ACL user, the
/// file updated, the old one removed) with the worker's connection closed: it keeps its
/// ID. `lock` and the pool CLI log in with the file's password too; the URL names only
/// the user.
#[test]
fn a_rotated_password_file_is_followed_without_a_restart() {
    let redis = RedisServer::start();
    acl(&redis, &["resetpass", ">s3cr-old"]);
    let secrets = Certs::new();
    secrets.replace("password", b"s3cr-old\n");
    let password_file = secrets.arg("password");
    // The URL names the user only (`user:` with an empty password).
    let url = format!("redis://snowlease:@127.0.0.1:{}", redis.port());
    let mut worker = Sidecar::worker_at(&url, "rotating")
        .flag("--redis-password-file", &password_file)
        .spawn();
    let lease = worker.wait_for_lease(secs(20));
    let key = worker_key("rotating", lease.worker_id);

    // Add the new password, update the Secret, remove the old password, close clients.
    acl(&redis, &[">s3cr-new"]);
    secrets.replace("password", b"s3cr-new\n");
    acl(&redis, &["<s3cr-old"]);
    let before = worker.metric(RENEWED).expect("renewals metric");
    kill_clients(&redis);
    assert!(
        renews_again(&worker, before, secs(10)),
        "no renewal with the new password; running: {}; log: {:?}",
        worker.is_running(),
        worker.log_lines()
    );
    assert!(worker.is_running(), "{:?}", worker.log_lines());
    assert_eq!(worker.id().map(|id| id.worker_id), Some(lease.worker_id));
    assert_eq!(redis.get(&key).as_deref(), Some(lease.owner.as_str()));
    assert!(
        worker.log_lines().iter().all(|l| !l.contains("s3cr")),
        "a password reached the log"
    );

    let with_file = ["--redis-url", &url, "--redis-password-file", &password_file];
    let lock = run_snowlease(
        &[
            &["lock", "--name", "report"][..],
            &with_file,
            &["--", "true"],
        ]
        .concat(),
        &[],
        secs(15),
    );
    assert_eq!(lock.code, Some(0), "{lock:?}");
    let pool = run_snowlease(
        &[
            &["pool", "init", "--pool", "proxies", "--ids", "a,b"][..],
            &with_file,
        ]
        .concat(),
        &[],
        secs(15),
    );
    assert_eq!(pool.code, Some(0), "{pool:?}");
    let status = run_snowlease(
        &[&["status", "--app", "rotating"][..], &with_file].concat(),
        &[],
        secs(15),
    );
    assert_eq!(status.code, Some(0), "{status:?}");
    for run in [&lock, &pool, &status] {
        assert!(!run.stderr.contains("s3cr"), "{run:?}");
    }
}

/// Passwords on Sentinel and Cluster: the same rotation for a user of this
/// test on every data node of the shared topology, only that user's connections closed
/// (`CLIENT KILL USER`). The Sentinel lookup and the Cluster client are built again with
/// the file's password: the worker keeps its ID.
#[test]
fn a_rotated_password_file_is_followed_on_sentinel_and_cluster() {
    for topo in [Topo::Sentinel, Topo::Cluster] {
        let deployment = Deployment::start(topo);
        let (user, app) = match topo {
            Topo::Sentinel => ("rotation-sentinel", "rotating-sentinel"),
            _ => ("rotation-cluster", "rotating-cluster"),
        };
        // The sum of the integer replies (the clients `CLIENT KILL` closed).
        let on_every_node = |args: &[&str]| -> i64 {
            let mut killed = 0;
            for node in deployment.data_nodes() {
                let reply: redis::Value = node.query(redis::cmd(args[0]).arg(&args[1..]));
                if let redis::Value::Int(n) = reply {
                    killed += n;
                }
            }
            killed
        };
        let acl =
            |rule: &str| on_every_node(&["ACL", "SETUSER", user, "on", "~*", "&*", "+@all", rule]);
        acl("resetpass");
        acl(">s3cr-old");
        let secrets = Certs::new();
        secrets.replace("password", b"s3cr-old\n");
        let url = deployment.url().replacen("://", &format!("://{user}:@"), 1);
        deployment.open_guard(app, 31);
        // Renewals 3 s apart: redis-rs' Cluster client repairs its node connections in the
        // background meanwhile (with the password it was built with).
        let mut worker = Sidecar::worker_at(&url, app)
            .flag("--ttl", "12s")
            .flag("--renew-interval", "3s")
            .flag("--redis-password-file", secrets.arg("password"))
            .spawn();
        let lease = worker.wait_for_lease(secs(20));
        let key = worker_key(app, lease.worker_id);
        let before = worker.metric(RENEWED).expect("renewals metric");

        acl(">s3cr-new");
        secrets.replace("password", b"s3cr-new\n");
        acl("<s3cr-old");
        let killed = on_every_node(&["CLIENT", "KILL", "USER", user]);
        assert!(
            killed > 0,
            "{topo:?}: the worker had no connection to close"
        );
        assert!(
            renews_again(&worker, before, secs(20)),
            "{topo:?}: no renewal with the new password; running: {}; log: {:?}",
            worker.is_running(),
            worker.log_lines()
        );
        assert!(worker.is_running(), "{topo:?}: {:?}", worker.log_lines());
        assert_eq!(worker.id().map(|id| id.worker_id), Some(lease.worker_id));
        assert_eq!(deployment.get(&key).as_deref(), Some(lease.owner.as_str()));
        worker.signal(Signal::SIGTERM);
        assert!(
            worker.wait_exit(secs(15)).is_some(),
            "{topo:?}: no exit at SIGTERM"
        );
    }
}

/// Credential files that cannot be used are refused at start, exit 2, the
/// message naming the flag (never the file's content), and nothing is written.
#[test]
fn unusable_credential_files_are_refused_at_start() {
    let redis = RedisServer::start();
    let files = Certs::new();
    files.replace("empty", b"");
    files.replace("two-lines", b"s3cr-a\ns3cr-b\n");
    files.replace("not-pem", b"s3cr-not-pem\n");
    let plain = format!("redis://127.0.0.1:{}", redis.port());
    let tls = format!("rediss://127.0.0.1:{}", redis.port());
    let cases: [(&str, &str, String, &str); 5] = [
        (
            &plain,
            "--redis-password-file",
            files.arg("empty"),
            "is empty",
        ),
        (
            &plain,
            "--redis-password-file",
            files.arg("two-lines"),
            "more than one line",
        ),
        (
            &plain,
            "--redis-password-file",
            files.arg("missing"),
            "cannot read",
        ),
        (&tls, "--redis-ca-file", files.arg("missing"), "cannot read"),
        (
            &tls,
            "--redis-ca-file",
            files.arg("not-pem"),
            "holds no certificate",
        ),
    ];
    for (url, flag, path, says) in cases {
        for command in [
            &["status", "--app", "a"][..],
            &["pool", "status", "--pool", "p"],
        ] {
            let run = run_snowlease(
                &[command, &["--redis-url", url, flag, &path]].concat(),
                &[],
                secs(15),
            );
            assert_eq!(run.code, Some(2), "{command:?} {flag} {path}: {run:?}");
            assert!(
                run.stderr.contains(flag) && run.stderr.contains(says),
                "{command:?} {flag} {path}: {run:?}"
            );
            assert!(!run.stderr.contains("s3cr"), "{run:?}");
        }
        let mut worker = Sidecar::worker_at(url, "refused").flag(flag, &path).spawn();
        let status = worker.wait_exit(secs(15)).and_then(|s| s.code());
        assert_eq!(status, Some(2), "{flag} {path}: {:?}", worker.log_lines());
        assert!(!worker.output_file().exists());
    }
    assert_eq!(redis.dbsize(), 0, "nothing written: {:?}", redis.keys("*"));
}
