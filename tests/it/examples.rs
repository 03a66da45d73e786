//! The examples under examples/ (Java, Node.js, Python) against a live sidecar: each prints the
//! published worker ID read from the ID file, falls back to `GET /id`, and refuses to mint
//! (exit 3, nothing on stdout) when neither has an ID. An example whose interpreter is missing
//! is skipped with a loud message (`.ci/run` installs them from Debian's packages).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::*;

/// One example: a display name, the interpreter and its arguments before the env.
struct Example {
    name: &'static str,
    program: &'static str,
    args: &'static [&'static str],
}

const EXAMPLES: [Example; 3] = [
    Example {
        name: "python",
        program: "python3",
        args: &["examples/python/worker_id.py"],
    },
    Example {
        name: "node",
        program: "node",
        args: &["examples/node/worker_id.js"],
    },
    // Compiled once by `javac` (see `java_classes`); the JVM then only runs it.
    Example {
        name: "java",
        program: "java",
        args: &["-XX:TieredStopAtLevel=1", "WorkerId"],
    },
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `program` on PATH, or None.
fn find(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Compiles examples/java/WorkerId.java into a temporary folder, once for all runs (the
/// launcher's source-file mode would compile it again on every run, seconds of CPU each).
fn java_classes() -> Option<tempfile::TempDir> {
    let javac = find("javac")?;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(javac);
    cmd.arg("-d")
        .arg(dir.path())
        .arg(repo().join("examples/java/WorkerId.java"));
    let out = run_command(cmd, secs(120));
    assert_eq!(out.code, Some(0), "javac WorkerId.java: {out:?}");
    Some(dir)
}

/// Runs `example` in `cwd` with WORKER_ID_FILE=`file` and WORKER_ID_URL=`url`.
fn run(example: &Example, interpreter: &Path, cwd: &Path, file: &Path, url: &str) -> Run {
    let mut cmd = Command::new(interpreter);
    cmd.args(example.args)
        .current_dir(cwd)
        .env("WORKER_ID_FILE", file)
        .env("WORKER_ID_URL", url);
    // The JVM starts slowly on a loaded 2-core machine.
    run_command(cmd, secs(120))
}

/// The `worker_id=` and `source=` fields of an example's output line, and its Snowflake ID.
fn parse(run: &Run) -> (u32, String, u64) {
    let field = |name: &str| {
        run.stdout
            .split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {run:?}"))
            .to_string()
    };
    (
        field("worker_id=").parse().unwrap(),
        field("source="),
        field("snowflake=").parse().unwrap(),
    )
}

/// The examples whose interpreter is here: (example, interpreter, working folder); the Java
/// classes live in `classes`.
fn present(classes: &Option<tempfile::TempDir>) -> Vec<(&'static Example, PathBuf, PathBuf)> {
    EXAMPLES
        .iter()
        .filter_map(|e| match (find(e.program), e.name) {
            (Some(_), "java") if classes.is_none() => {
                eprintln!(
                    "!!! SKIPPED example java: `javac` not on PATH (.ci/run installs it) !!!"
                );
                None
            }
            (Some(path), "java") => Some((e, path, classes.as_ref().unwrap().path().into())),
            (Some(path), _) => Some((e, path, repo().to_path_buf())),
            (None, _) => {
                eprintln!(
                    "!!! SKIPPED example {}: `{}` not on PATH (install it; .ci/run does) !!!",
                    e.name, e.program
                );
                None
            }
        })
        .collect()
}

/// Each example prints the sidecar's worker ID read from the ID file, mints a Snowflake ID
/// carrying it (bits 12-21), falls back to `GET /id` when the file is missing, and refuses to
/// mint (exit 3, empty stdout) once the sidecar released the ID and stopped.
#[test]
fn examples_read_the_published_id_and_refuse_without_one() {
    let classes = java_classes();
    let present = present(&classes);
    let redis = RedisServer::start();
    // Skip ID 0, so a reader that ignored the ID would not pass by accident.
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(worker_key("orders", 0))
            .arg("other#1"),
    );
    let mut sidecar = Sidecar::worker(&redis, "orders").spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    assert_ne!(lease.worker_id, 0);
    let url = format!("http://{}", sidecar.http_addr());
    let file = sidecar.output_file().to_path_buf();
    let missing = sidecar.pod().path().join("no-such-file");
    // /id can answer a little before the ID file and its state file are
    // written (the keeper publishes to both, the file on its own I/O): the
    // file case below needs both on disk.
    let mut state = file.clone().into_os_string();
    state.push(".state.json");
    let written = poll_until(secs(5), || {
        let id = std::fs::read_to_string(&file).unwrap_or_default();
        id.trim() == lease.worker_id.to_string() && Path::new(&state).exists()
    });
    assert!(written, "the ID file and its state file were never written");

    for (example, interpreter, cwd) in &present {
        for (path, source) in [(&file, "file"), (&missing, "http")] {
            let out = run(example, interpreter, cwd, path, &url);
            assert_eq!(out.code, Some(0), "{}: {out:?}", example.name);
            let (worker_id, got_source, snowflake) = parse(&out);
            assert_eq!(worker_id, lease.worker_id, "{}: {out:?}", example.name);
            assert_eq!(got_source, source, "{}: {out:?}", example.name);
            assert_eq!((snowflake >> 12) & 0x3ff, u64::from(lease.worker_id));
        }
    }

    sidecar.signal(Signal::SIGTERM);
    assert_eq!(sidecar.wait_exit(secs(5)).and_then(|s| s.code()), Some(0));
    for (example, interpreter, cwd) in &present {
        let out = run(example, interpreter, cwd, &file, &url);
        assert_eq!(out.code, Some(3), "{}: {out:?}", example.name);
        assert_eq!(out.stdout, "", "{}: minted nothing", example.name);
        assert!(
            out.stderr.contains("refusing to mint"),
            "{}: {out:?}",
            example.name
        );
    }
}

/// Each example judges the state file by its boot-clock deadline, as `exec` does: a
/// wall-clock deadline 30 s past with the boot one ahead (wall clock stepped ahead)
/// is published; a wall-clock deadline 30 s ahead with the boot one past (stepped back), a
/// state file without the boot deadline, or one from another boot, is not.
#[test]
fn examples_judge_the_boot_clock_deadline() {
    use snowlease::boot_clock::{BootInstant, boot_id};
    let classes = java_classes();
    let present = present(&classes);
    let pod = PodDir::new();
    let file = pod.worker_id_file();
    std::fs::write(&file, "5\n").unwrap();
    let dead = format!("http://127.0.0.1:{}", free_port());
    let now_boot = BootInstant::now().as_millis();
    let here = boot_id().unwrap();
    let cases = [
        (unix_ms() - 30_000, Some(now_boot + 60_000), here, true),
        (
            unix_ms() + 30_000,
            Some(now_boot.saturating_sub(1_000)),
            here,
            false,
        ),
        (unix_ms() + 30_000, None, here, false),
        (
            unix_ms() + 30_000,
            Some(now_boot + 60_000),
            "00000000-0000-0000-0000-000000000000",
            false,
        ),
    ];
    for (wall, boot, boot_id, published) in cases {
        let mut state = serde_json::json!({
            "app": "orders", "worker_id": 5, "owner": "o#1", "valid_until_ms": wall,
            "boot_id": boot_id,
        });
        if let Some(boot) = boot {
            state["valid_until_boot_ms"] = boot.into();
        }
        std::fs::write(format!("{}.state.json", file.display()), state.to_string()).unwrap();
        for (example, interpreter, cwd) in &present {
            let out = run(example, interpreter, cwd, &file, &dead);
            match published {
                true => {
                    assert_eq!(out.code, Some(0), "{} {state}: {out:?}", example.name);
                    assert_eq!(parse(&out).0, 5, "{}: {out:?}", example.name);
                }
                false => assert_eq!(out.code, Some(3), "{} {state}: {out:?}", example.name),
            }
        }
    }
}
