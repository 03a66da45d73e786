//! First use in a pod: default listen ports off the ports apps and common sidecars take in a
//! shared pod network namespace (the same in `--help` and docs/); `snowlease sleep`, the
//! preStop hook of k8s/plain-sidecar/.

use crate::harness::*;

/// Ports an app or a common sidecar listens on by default (docs/worker.md, "Why port 7391").
fn taken_by_others(port: u16) -> bool {
    matches!(port,
        80 | 443 | 3000 | 5000 | 8000 | 8080 | 8081 | 8443 | 9000   // app defaults
        | 9090..=9999                                              // Prometheus and exporters
        | 15000..=15090                                            // Istio / Envoy
        | 4140..=4191                                              // Linkerd
        | 3500 | 50001                                             // Dapr
        | 8200                                                     // Vault agent
        | 8300..=8600                                              // Consul
        | 4317 | 4318 | 8888 | 13133                               // OpenTelemetry collector
        | 30000..=65535) // NodePorts and the ephemeral range
}

/// The `[default: ADDR]` of `--listen` in `snowlease <args> --help`.
fn help_default_listen(args: &[&str]) -> String {
    let mut argv = args.to_vec();
    argv.push("--help");
    let run = run_snowlease(&argv, &[], secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    let flag = run
        .stdout
        .split("--listen")
        .nth(1)
        .expect("--listen in --help");
    let default = flag
        .split("[default: ")
        .nth(1)
        .expect("a default for --listen");
    // The value may hold brackets itself (`[::]:7391`): the line ends with the closing one.
    let line = default.lines().next().unwrap().trim_end();
    line.strip_suffix(']').expect("[default: ...]").to_string()
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// `worker` and `pool serve` listen by default on ports no common app or sidecar uses, on
/// different ports, and docs/flags.md and docs/pool.md state exactly these defaults.
#[test]
fn default_listen_ports_avoid_app_and_sidecar_ports() {
    let worker = help_default_listen(&["worker"]);
    let serve = help_default_listen(&["pool", "serve"]);
    for addr in [&worker, &serve] {
        assert!(!taken_by_others(port_of(addr)), "{addr} is a common port");
    }
    assert_ne!(port_of(&worker), port_of(&serve));
    let doc = |name: &str| {
        let path = format!("{}/docs/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).expect(&path)
    };
    assert!(
        doc("flags.md").contains(&format!("| `--listen` | `SNOWLEASE_LISTEN` | `{worker}` |")),
        "docs/flags.md's flag table names {worker}"
    );
    assert!(
        doc("pool.md").contains(&format!("default `{serve}`")),
        "docs/pool.md names the pool serve default {serve}"
    );
}

/// `snowlease sleep 300ms` waits that long and exits 0; a duration outside 0s-1h or one that
/// does not parse exits 2 at once, naming the argument.
#[test]
fn sleep_waits_then_exits_zero() {
    let started = std::time::Instant::now();
    let run = run_snowlease(&["sleep", "300ms"], &[], secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(started.elapsed() >= ms(300), "{:?}", started.elapsed());

    for bad in ["2h", "soon"] {
        let started = std::time::Instant::now();
        let run = run_snowlease(&["sleep", bad], &[], secs(10));
        assert_eq!(run.code, Some(2), "{bad}: {run:?}");
        assert!(run.stderr.contains("DURATION"), "{bad}: {run:?}");
        assert!(started.elapsed() < secs(5), "{bad}: refused at once");
    }
}

/// README.md's short tour, pasted into bash as written (the block under "A short tour"): it
/// starts its own redis-server on a free port, never touches 6379, and every step prints
/// what the README says (the ID, `/id`, the command under `exec`, `status` naming the Redis,
/// two minted IDs over the socket); the sidecars and the Redis are gone at the end.
#[test]
fn readme_tour_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let tour = readme
        .split("## A short tour")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("\n```").next())
        .expect("a sh block under 'A short tour'");
    assert!(
        !tour.contains("6379"),
        "the tour must not use port 6379: {tour}"
    );
    if std::net::TcpListener::bind("0.0.0.0:7391").is_err() {
        return skip(
            "readme_tour_runs_as_written",
            "port 7391 (the tour's /id) is taken here",
        );
    }
    for tool in ["python3", "curl", "redis-cli", "redis-server"] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return skip(
                "readme_tour_runs_as_written",
                &format!("{tool} is not installed"),
            );
        }
    }
    // The tour's own paths: nothing of an earlier run (a stale state file) is re-adopted.
    let _ = std::fs::remove_dir_all("/tmp/snowlease");
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    // A failing step ends the script; the trap then stops what it started, so no sidecar
    // keeps the output pipes open.
    let script = format!(
        "set -e\ncleanup() {{ kill $(jobs -p) 2>/dev/null || true; [ -n \"${{port:-}}\" ] && redis-cli -p \"$port\" shutdown nosave >/dev/null 2>&1 || true; }}\ntrap cleanup EXIT\n{tour}\n"
    );
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new("bash");
    cmd.args(["-c", &script])
        .current_dir(cwd.path())
        .env("PATH", path)
        .env_remove("REDIS_URL")
        .env("SNOWLEASE_LOG", "warn");
    let run = run_command(cmd, secs(120));
    assert_eq!(run.code, Some(0), "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    let has = |prefix: &str| lines.iter().any(|l| l.starts_with(prefix));
    assert!(has(r#"{"already_open":false,"#), "{run:?}");
    // guard open names the Redis it opened the guard in (no password; the tour has none).
    assert!(
        run.stdout.contains(r#""redis":"redis://127.0.0.1:"#),
        "{run:?}"
    );
    assert!(lines.contains(&"0"), "snowlease id prints 0: {run:?}");
    assert!(
        has(r#"{"app":"orders""#) && run.stdout.contains(r#""worker_id":0"#),
        "{run:?}"
    );
    assert!(lines.contains(&"orders runs with WORKER_ID=0"), "{run:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("app orders: ") && l.contains(" in redis://127.0.0.1:")),
        "{run:?}"
    );
    assert!(has(r#"{"ids":[""#), "{run:?}");
}
