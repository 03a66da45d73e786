//! The alerts of k8s/monitoring/prometheusrule.yaml proven: the promtool unit tests
//! (scripts/test-alerts.sh, tests/alerts/), and one alert on a real Prometheus server scraping
//! a real sidecar. Both read the rules from the manifest through scripts/alert-rules.py.
//! Without promtool or prometheus (Debian package `prometheus`, installed by
//! scripts/ensure-test-deps.sh) the tests say SKIPPED.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Instant;

use serde_json::Value;

use crate::harness::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `program` on PATH, or None.
fn find(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// scripts/test-alerts.sh passes: every alert of the manifest fires on the series it is for
/// (labels and annotations as expected) and stays silent on a healthy series and on a near
/// miss (one below the threshold, shorter than its `for:`, a counter reset); and each of the
/// script's broken copies of the rules fails a test.
#[test]
fn promtool_unit_tests_pass_for_every_alert() {
    if find("promtool").is_none() {
        return skip(
            "alerts::promtool_unit_tests_pass_for_every_alert",
            "promtool not on PATH (Debian package prometheus)",
        );
    }
    let run = run_command(
        Command::new(repo().join("scripts/test-alerts.sh")),
        secs(300),
    );
    assert_eq!(
        run.code,
        Some(0),
        "scripts/test-alerts.sh failed (timed out: {}):\n{}\n{}",
        run.timed_out,
        run.stdout,
        run.stderr
    );
}

/// The window that replaces the manifest's `[5m]` in the live test: failures stop counting
/// 20 s after Redis answers again, so the test sees the alert resolve in seconds, not minutes.
const RANGE: &str = "20s";

/// SnowleaseRenewFailing on a real Prometheus (1 s scrape and evaluation intervals) scraping a
/// real sidecar (TTL 30 s, renew every 1 s): silent while Redis answers, firing (labels,
/// annotations, a value of at least 3) once Redis is stopped (SIGSTOP) and renew attempts
/// time out, resolved once Redis runs again, with the lease kept throughout. The expression is
/// the manifest's, with only its range `[5m]` rewritten to [`RANGE`]
/// (`scripts/alert-rules.py --range`); the alert has no `for:`.
#[test]
fn renew_failing_fires_on_a_real_prometheus_and_resolves() {
    let Some(prometheus) = find("prometheus") else {
        return skip(
            "alerts::renew_failing_fires_on_a_real_prometheus_and_resolves",
            "prometheus not on PATH (Debian package prometheus)",
        );
    };
    let redis = RedisServer::start();
    redis.open_claim_guard("alerts");
    let sidecar = Sidecar::worker(&redis, "alerts")
        .flag("--ttl", "30s")
        .flag("--renew-interval", "1s")
        .spawn();
    let lease = sidecar.wait_for_lease(secs(15));

    let dir = tempfile::Builder::new()
        .prefix("snowlease-prometheus-")
        .tempdir()
        .unwrap();
    let rules = run_command(
        {
            let mut cmd = Command::new("python3");
            cmd.arg(repo().join("scripts/alert-rules.py")).args([
                "--alert",
                "SnowleaseRenewFailing",
                "--range",
                RANGE,
            ]);
            cmd
        },
        secs(30),
    );
    assert_eq!(rules.code, Some(0), "alert-rules.py: {rules:?}");
    fs::write(dir.path().join("rules.yaml"), &rules.stdout).unwrap();
    // namespace and pod: the target labels the PodMonitor gives a pod's series.
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files: [rules.yaml]\n\
         scrape_configs:\n  - job_name: snowlease\n    static_configs:\n      \
         - targets: ['{}']\n        labels: {{namespace: test, pod: alerts-0}}\n",
        sidecar.http_addr()
    );
    fs::write(dir.path().join("prometheus.yml"), config).unwrap();
    let prom = PrometheusServer::start(&prometheus, dir.path());

    // Healthy: scraped samples of the counter, then an evaluation of the rule after them
    // (health "ok"), and no alert.
    let q = format!(r#"increase(snowlease_renewals_total{{outcome="failed"}}[{RANGE}])"#);
    let before = poll_some(secs(20), || {
        let scraped = prom.query(&q).is_some_and(|r| !r.is_empty());
        scraped.then(|| prom.rule_evaluation("SnowleaseRenewFailing"))
    })
    .unwrap_or_else(|| panic!("Prometheus never scraped the sidecar: {:?}", prom.query(&q)));
    let health = poll_some(secs(10), || {
        prom.rule_evaluation("SnowleaseRenewFailing")
            .filter(|now| Some(now) != before.as_ref())
    })
    .unwrap_or_else(|| panic!("rule not evaluated: {}", prom.get("/api/v1/rules")));
    assert_eq!(health.0, "ok", "{}", prom.get("/api/v1/rules"));
    let alerts = prom.alerts();
    assert!(alerts.is_empty(), "alerts while Redis answers: {alerts:?}");

    redis.pause();
    let paused = Instant::now();
    let alert = poll_some(secs(25), || {
        prom.alerts()
            .into_iter()
            .find(|a| a["labels"]["alertname"] == "SnowleaseRenewFailing" && a["state"] == "firing")
    })
    .unwrap_or_else(|| {
        panic!(
            "no firing alert within 25 s of SIGSTOP; alerts: {:?}; failed renewals: {:?}",
            prom.alerts(),
            sidecar.metric(r#"snowlease_renewals_total{outcome="failed"}"#)
        )
    });
    eprintln!("alerts: firing {:?} after SIGSTOP", paused.elapsed());
    assert_eq!(alert["labels"]["severity"], "warning");
    assert_eq!(alert["labels"]["namespace"], "test");
    assert_eq!(alert["labels"]["pod"], "alerts-0");
    assert_eq!(
        alert["annotations"]["summary"],
        "snowlease renewals failing in test/alerts-0"
    );
    let value: f64 = alert["value"].as_str().unwrap().parse().unwrap();
    assert!(value >= 3.0, "value {value}");
    assert!(
        alert["annotations"]["description"]
            .as_str()
            .unwrap()
            .ends_with(" failed renew attempts in 5 minutes; the lease will be lost at its deadline unless Redis answers."),
        "{alert}"
    );

    redis.resume();
    let resumed = Instant::now();
    assert!(
        poll_until(secs(40), || prom.alerts().is_empty()),
        "still firing 40 s after SIGCONT: {:?}",
        prom.alerts()
    );
    eprintln!("alerts: resolved {:?} after SIGCONT", resumed.elapsed());
    assert_eq!(
        sidecar.id().map(|id| id.worker_id),
        Some(lease.worker_id),
        "the lease must have outlived the outage (TTL 30 s)"
    );
}

/// A `prometheus` server on a free loopback port with its config and TSDB in `dir`; killed on
/// drop, its log printed when the test panics.
struct PrometheusServer {
    child: Child,
    addr: String,
    log: PathBuf,
    http: ureq::Agent,
}

impl PrometheusServer {
    /// Starts `bin` with `dir/prometheus.yml` and waits (20 s) until `/-/ready` answers 200;
    /// tries other ports if the server exits first (its port taken).
    fn start(bin: &Path, dir: &Path) -> PrometheusServer {
        let log = dir.join("prometheus.log");
        let http = ureq::AgentBuilder::new().timeout(secs(2)).build();
        for _ in 0..5 {
            let addr = format!("127.0.0.1:{}", free_port());
            let mut child = Command::new(bin)
                .arg(format!(
                    "--config.file={}",
                    dir.join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(fs::File::create(&log).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
            let ready = poll_until(secs(20), || {
                matches!(child.try_wait(), Ok(Some(_)))
                    || http.get(&format!("http://{addr}/-/ready")).call().is_ok()
            });
            if ready && matches!(child.try_wait(), Ok(None)) {
                return PrometheusServer {
                    child,
                    addr,
                    log,
                    http,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
            if !ready {
                break;
            }
            thread::sleep(ms(100));
        }
        panic!(
            "prometheus did not start; log:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
    }

    /// `GET path` -> the JSON body (Value::Null when there is no answer).
    fn get(&self, path: &str) -> Value {
        self.http
            .get(&format!("http://{}{path}", self.addr))
            .call()
            .ok()
            .and_then(|r| r.into_json().ok())
            .unwrap_or(Value::Null)
    }

    /// The active (pending or firing) alerts of `/api/v1/alerts`.
    fn alerts(&self) -> Vec<Value> {
        match &self.get("/api/v1/alerts")["data"]["alerts"] {
            Value::Array(alerts) => alerts.clone(),
            other => panic!("/api/v1/alerts: {other}"),
        }
    }

    /// The result of an instant query, None on an error.
    fn query(&self, promql: &str) -> Option<Vec<Value>> {
        let reply = self
            .http
            .get(&format!("http://{}/api/v1/query", self.addr))
            .query("query", promql)
            .call()
            .ok()?
            .into_json::<Value>()
            .ok()?;
        reply["data"]["result"].as_array().cloned()
    }

    /// (`health`, `lastEvaluation`) of alerting rule `alert` once evaluated, else None.
    fn rule_evaluation(&self, alert: &str) -> Option<(String, String)> {
        let rules = self.get("/api/v1/rules");
        let rule = rules["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .find(|r| r["name"] == alert)?;
        let at = rule["lastEvaluation"].as_str()?;
        // Go's zero time: not evaluated yet.
        if at.starts_with("0001-") {
            return None;
        }
        Some((rule["health"].as_str()?.to_owned(), at.to_owned()))
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if thread::panicking() {
            eprintln!(
                "===== prometheus {} log =====\n{}",
                self.addr,
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}
