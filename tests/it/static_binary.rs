//! The statically linked binary (`scripts/build-static.sh`) that `install` copies into app
//! images: it runs `exec` and `id` in a root folder holding nothing but itself and a static
//! test program, so it needs no libc, libgcc or NSS from the image.
//!
//! The binary comes from `SNOWLEASE_STATIC_BIN` (set by `scripts/test.sh`, which builds it
//! before the suite); unset, the test builds it itself (minutes on a cold cache).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::*;

/// Set to `1` to let the test pass where neither `chroot` (root) nor `unshare --user --root`
/// (user namespaces) can run; it fails there otherwise.
const SKIP_ENV: &str = "SNOWLEASE_SKIP_STATIC";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The static binary: `SNOWLEASE_STATIC_BIN`, else built by `scripts/build-static.sh` (once).
pub(crate) fn static_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(find_or_build_static_bin).clone()
}

fn find_or_build_static_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("SNOWLEASE_STATIC_BIN") {
        return PathBuf::from(path);
    }
    eprintln!("static_binary: SNOWLEASE_STATIC_BIN unset, running scripts/build-static.sh");
    let run = run_command(
        Command::new(repo().join("scripts/build-static.sh")),
        secs(1800),
    );
    assert_eq!(run.code, Some(0), "build-static.sh: {run:?}");
    PathBuf::from(run.stdout.lines().last().expect("the binary's path"))
}

/// True when the ELF file has a PT_INTERP program header (needs a dynamic loader).
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..5], b"\x7fELF\x02", "a 64-bit ELF file");
    let u16_at = |o: usize| u16::from_le_bytes(elf[o..o + 2].try_into().unwrap()) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == 3 // PT_INTERP
    })
}

/// Compiles tests/static/printenv.rs statically into `dest`.
fn build_test_program(dest: &Path) {
    let mut rustc = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()));
    rustc
        .args(["--edition=2024", "-C", "target-feature=+crt-static", "-o"])
        .arg(dest)
        .arg(repo().join("tests/static/printenv.rs"));
    let run = run_command(rustc, secs(120));
    assert_eq!(run.code, Some(0), "rustc printenv.rs: {run:?}");
}

/// `program` found on this process's PATH (the command's own environment is cleared).
fn on_path(program: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(program))
}

/// The effective UID of this process (from `/proc/self/status`).
fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// `program args...` with `root` as its root folder and an empty environment: `chroot` as root,
/// else `unshare --user --map-root-user --root`.
fn in_root(root: &Path, args: &[&str]) -> Command {
    let mut cmd = if effective_uid() == Some(0) {
        let mut c = Command::new(on_path("chroot"));
        c.arg(root);
        c
    } else {
        let mut c = Command::new(on_path("unshare"));
        c.args(["--user", "--map-root-user"])
            .arg(format!("--root={}", root.display()));
        c
    };
    cmd.args(args).env_clear();
    cmd
}

/// In a root folder holding only the static snowlease and a static test program (no libc, no
/// /etc, no /proc): `id` reads the ID file and `GET /id` of a live sidecar, `exec` starts the
/// program with WORKER_ID set; `install` copies the binary byte for byte.
#[test]
fn static_binary_runs_exec_and_id_without_libc() {
    let bin = static_bin();
    let bytes = fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    assert!(
        !has_interpreter(&bytes),
        "{} is dynamically linked",
        bin.display()
    );

    let root = tempfile::tempdir().unwrap();
    fs::copy(&bin, root.path().join("snowlease")).unwrap();
    build_test_program(&root.path().join("printenv"));
    let probe = run_command(in_root(root.path(), &["/printenv"]), secs(10));
    if probe.code != Some(0) {
        if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
            skip(
                "static_binary",
                &format!("cannot enter a bare root here: {probe:?}"),
            );
            return;
        }
        panic!(
            "cannot enter a bare root (chroot / unshare --root): {probe:?}; set {SKIP_ENV}=1 to skip"
        );
    }

    let redis = RedisServer::start();
    let sidecar = Sidecar::worker(&redis, "orders")
        .flag(
            "--output-file",
            root.path().join("run/worker-id").to_string_lossy(),
        )
        .spawn();
    let lease = sidecar.wait_for_lease(secs(10));
    let id = lease.worker_id.to_string();

    let run = run_command(
        in_root(
            root.path(),
            &[
                "/snowlease",
                "id",
                "--file",
                "/run/worker-id",
                "--wait",
                "10s",
            ],
        ),
        secs(10),
    );
    assert_eq!(
        (run.code, run.stdout.trim()),
        (Some(0), id.as_str()),
        "{run:?}"
    );

    let url = format!("http://{}", sidecar.http_addr());
    let run = run_command(
        in_root(root.path(), &["/snowlease", "id", "--url", &url]),
        secs(10),
    );
    assert_eq!(
        (run.code, run.stdout.trim()),
        (Some(0), id.as_str()),
        "{run:?}"
    );

    let exec = [
        "/snowlease",
        "exec",
        "--file",
        "/run/worker-id",
        "--",
        "/printenv",
        "a1",
    ];
    let run = run_command(in_root(root.path(), &exec), secs(10));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(run.stdout.contains(&format!("WORKER_ID={id}\n")), "{run:?}");
    assert!(run.stdout.contains(r#"args=["a1"]"#), "{run:?}");

    let dest = tempfile::tempdir().unwrap();
    let mut install = Command::new(&bin);
    install.arg("install").arg(dest.path()).env_clear();
    let run = run_command(install, secs(30));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        fs::read(dest.path().join("snowlease")).unwrap() == bytes,
        "install copies the binary"
    );
}
