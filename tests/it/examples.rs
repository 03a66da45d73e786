//! The examples under examples/ against a live sidecar. The worker-ID readers (Java, Node.js,
//! Python) print the published worker ID read from the ID file, fall back to `GET /id`, and
//! refuse to mint (exit 3, nothing on stdout) when neither has an ID. The mint clients (Go,
//! Java, Node.js, Python) print the IDs of `GET /next` over `--mint-socket`, retry 503s for
//! `--wait`, and exit 3 with nothing on stdout when none came. An example whose interpreter or
//! compiler is missing is skipped with a loud message (`.ci/run` installs them from Debian's
//! packages).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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
fn present(
    classes: &Option<tempfile::TempDir>,
    test: &str,
) -> Vec<(&'static Example, PathBuf, PathBuf)> {
    EXAMPLES
        .iter()
        .filter_map(|e| match (find(e.program), e.name) {
            (Some(_), "java") if classes.is_none() => {
                skip(
                    &format!("examples::{test} (java)"),
                    "`javac` not on PATH (scripts/test.sh installs it as root)",
                );
                None
            }
            (Some(path), "java") => Some((e, path, classes.as_ref().unwrap().path().into())),
            (Some(path), _) => Some((e, path, repo().to_path_buf())),
            (None, _) => {
                skip(
                    &format!("examples::{test} ({})", e.name),
                    &format!(
                        "`{}` not on PATH (scripts/test.sh installs it as root)",
                        e.program
                    ),
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
    let test = "examples_read_the_published_id_and_refuse_without_one";
    let classes = java_classes();
    let present = present(&classes, test);
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
    let test = "examples_judge_the_boot_clock_deadline";
    use snowlease::boot_clock::{BootInstant, boot_id};
    let classes = java_classes();
    let present = present(&classes, test);
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

/// A mint example ready to run: its name and the command line before its own arguments.
struct MintExample {
    name: &'static str,
    argv: Vec<OsString>,
}

/// The mint examples whose interpreter or compiler is here; the Go and Java ones are built
/// into `build` first (once: `go build`, `javac`). The others are skipped loudly.
fn mint_examples(build: &Path) -> Vec<MintExample> {
    let skip = |name: &str, tool: &str| {
        skip(
            &format!(
                "examples::mint_examples_print_increasing_ids_of_the_sidecars_worker_id ({name})"
            ),
            &format!("`{tool}` not on PATH (scripts/test.sh installs it as root)"),
        )
    };
    let mut found = Vec::new();
    for (name, program, script) in [
        ("python", "python3", "examples/python/mint.py"),
        ("node", "node", "examples/node/mint.js"),
    ] {
        match find(program) {
            Some(path) => found.push(MintExample {
                name,
                argv: vec![path.into(), repo().join(script).into()],
            }),
            None => skip(name, program),
        }
    }
    match (find("javac"), find("java")) {
        (Some(javac), Some(java)) => {
            let mut cmd = Command::new(javac);
            cmd.arg("-d")
                .arg(build)
                .arg(repo().join("examples/java/Mint.java"));
            let out = run_command(cmd, secs(120));
            assert_eq!(out.code, Some(0), "javac Mint.java: {out:?}");
            let argv = [java.into(), "-XX:TieredStopAtLevel=1".into(), "-cp".into()];
            found.push(MintExample {
                name: "java",
                argv: [&argv[..], &[build.into(), "Mint".into()]].concat(),
            });
        }
        _ => skip("java", "javac"),
    }
    match find("go") {
        Some(go) => {
            let binary = build.join("mint-go");
            let mut cmd = Command::new(go);
            cmd.arg("build")
                .arg("-o")
                .arg(&binary)
                .arg(repo().join("examples/go/mint.go"))
                // The build cache beside cargo's: warm after the first run.
                .env("GOCACHE", repo().join("target/go-build"));
            let out = run_command(cmd, secs(300));
            assert_eq!(out.code, Some(0), "go build mint.go: {out:?}");
            found.push(MintExample {
                name: "go",
                argv: vec![binary.into()],
            });
        }
        None => skip("go", "go"),
    }
    found
}

/// Runs `example` with SNOWLEASE_MINT_SOCKET=`socket` and `args`; how long it took.
fn run_mint(example: &MintExample, socket: &Path, args: &[&str]) -> (Run, Duration) {
    let mut cmd = Command::new(&example.argv[0]);
    cmd.args(&example.argv[1..])
        .args(args)
        .env("SNOWLEASE_MINT_SOCKET", socket);
    let started = Instant::now();
    // The JVM starts slowly on a loaded 2-core machine.
    let out = run_command(cmd, secs(120));
    (out, started.elapsed())
}

/// A mint-mode sidecar for worker IDs 0-`max_worker_id` serving `/next` on `<pod>/mint.sock`
/// (TTL 2 s from the harness, a window that fits below it), and that socket's path.
fn minter(redis: &RedisServer, max_worker_id: u16) -> (Sidecar, PathBuf) {
    let pod = PodDir::new();
    let socket = pod.path().join("mint.sock");
    let sidecar = Sidecar::worker(redis, "orders")
        .pod(&pod)
        .flag("--max-worker-id", max_worker_id.to_string())
        .switch("--mint")
        .flag("--mint-window", "500ms")
        .flag("--mint-socket", socket.to_string_lossy())
        .switch("--next-on-listen")
        .spawn();
    (sidecar, socket)
}

/// The IDs an example printed, one a line; panics on anything else.
fn printed_ids(name: &str, out: &Run) -> Vec<u64> {
    assert_eq!(out.code, Some(0), "{name}: {out:?}");
    out.stdout
        .lines()
        .map(|l| l.parse().unwrap_or_else(|e| panic!("{name}: {l:?}: {e}")))
        .collect()
}

/// The worker bits of an ID in the default layout 41:10:12 (bits 12-21), computed here
/// rather than by the code under test.
fn worker_bits(id: u64) -> u64 {
    (id >> 12) & 0x3ff
}

/// Each mint example prints exactly COUNT IDs, one a line, strictly increasing (within a run
/// and from one run to the next), whose worker bits are the sidecar's worker ID (its state
/// file); 5000 IDs take two requests (at most 4096 each).
#[test]
fn mint_examples_print_increasing_ids_of_the_sidecars_worker_id() {
    let build = tempfile::tempdir().unwrap();
    let examples = mint_examples(build.path());
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    // Skip worker ID 0, so worker bits of 0 would not pass by accident.
    let _: () = redis.query(
        redis::cmd("SET")
            .arg(worker_key("orders", 0))
            .arg("other#1"),
    );
    let (sidecar, socket) = minter(&redis, 31);
    let answered = poll_until(secs(15), || sidecar.http_get("/next", None).0 == 200);
    assert!(answered, "no /next: {:?}", sidecar.http_get("/next", None));
    let state = sidecar.read_state().expect("a state file");
    let worker_id = state["worker_id"].as_u64().expect("worker_id");
    assert_ne!(worker_id, 0);

    let mut newest = 0;
    for example in &examples {
        for count in [1, 5000] {
            let (out, took) = run_mint(example, &socket, &[&count.to_string()]);
            let ids = printed_ids(example.name, &out);
            eprintln!("mint example {} {count}: {took:?}", example.name);
            assert_eq!(ids.len(), count, "{}: {out:?}", example.name);
            assert!(
                ids[0] > newest,
                "{}: not above the run before",
                example.name
            );
            assert!(
                ids.windows(2).all(|w| w[0] < w[1]),
                "{}: not increasing",
                example.name
            );
            assert!(
                ids.iter().all(|id| worker_bits(*id) == worker_id),
                "{}: worker bits other than {worker_id}",
                example.name
            );
            newest = *ids.last().unwrap();
        }
    }
}

/// `snowlease_mint_unavailable_total{state="claiming"}` of `sidecar`: its 503s while it
/// looks for a free worker ID.
fn claiming_answers(sidecar: &Sidecar) -> f64 {
    sidecar
        .metric(r#"snowlease_mint_unavailable_total{state="claiming"}"#)
        .unwrap_or(0.0)
}

/// With a sidecar that has no lease (its only worker ID held by another owner: 503
/// `claiming`), each mint example retries after Retry-After (1 s) until `--wait 2` is spent,
/// then exits 3 with nothing on stdout and the last answer on stderr; with no socket at all,
/// likewise. Started with `--wait 60` while the ID is held, each gets its IDs once the ID is
/// freed and the sidecar claims it.
#[test]
fn mint_examples_retry_503_then_give_up_or_get_ids() {
    let build = tempfile::tempdir().unwrap();
    let examples = mint_examples(build.path());
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let held = worker_key("orders", 0);
    let _: () = redis.query(redis::cmd("SET").arg(&held).arg("other#1"));
    let (sidecar, socket) = minter(&redis, 0);
    let refused = poll_until(secs(15), || {
        sidecar.http_get("/next", None).1.contains("claiming")
    });
    assert!(
        refused,
        "not claiming: {:?}",
        sidecar.http_get("/next", None)
    );

    let missing = sidecar.pod().path().join("no.sock");
    for example in &examples {
        let before = claiming_answers(&sidecar);
        let (out, took) = run_mint(example, &socket, &["--wait", "2", "3"]);
        let tries = claiming_answers(&sidecar) - before;
        eprintln!(
            "mint example {} --wait 2 on 503: {took:?}, {tries} tries",
            example.name
        );
        assert_eq!(out.code, Some(3), "{}: {out:?}", example.name);
        assert_eq!(out.stdout, "", "{}: printed nothing", example.name);
        assert!(
            out.stderr.contains("no IDs") && out.stderr.contains("claiming"),
            "{}: {out:?}",
            example.name
        );
        assert!(tries >= 2.0, "{}: retried: {tries} tries", example.name);
        assert!(took >= secs(2), "{}: gave up early: {took:?}", example.name);

        let (out, _) = run_mint(example, &missing, &["--wait", "0", "3"]);
        assert_eq!(out.code, Some(3), "{}: {out:?}", example.name);
        assert_eq!(out.stdout, "", "{}: printed nothing", example.name);
        assert!(out.stderr.contains("no.sock"), "{}: {out:?}", example.name);
    }

    // All at once; the ID is freed once the sidecar refused as many requests as there are
    // examples (each asks at start and then once a second).
    let before = claiming_answers(&sidecar);
    let started = Instant::now();
    let runs: Vec<_> = examples
        .iter()
        .map(|example| {
            let (argv, socket) = (example.argv.clone(), socket.clone());
            let example = MintExample {
                name: example.name,
                argv,
            };
            std::thread::spawn(move || run_mint(&example, &socket, &["--wait", "60", "10"]))
        })
        .collect();
    let all_refused = poll_until(secs(60), || {
        claiming_answers(&sidecar) - before >= examples.len() as f64
    });
    assert!(all_refused, "the examples never asked");
    let freed = started.elapsed();
    let _: () = redis.query(redis::cmd("DEL").arg(&held));
    for (example, run) in examples.iter().zip(runs) {
        let (out, took) = run.join().unwrap();
        eprintln!(
            "mint example {} until the ID was freed ({freed:?}): {took:?}",
            example.name
        );
        assert_eq!(printed_ids(example.name, &out).len(), 10, "{out:?}");
    }
}
