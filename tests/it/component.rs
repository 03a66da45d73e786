//! The Kustomize Component's app name: `SNOWLEASE_APP` comes from the pod
//! annotation `snowlease/app` through the downward API, which gives an empty string when the
//! annotation is missing. The sidecar's error then names the variable and that source.
//! (Rendering the Component on Deployments, StatefulSets and commands: scripts/validate-k8s.sh.)
//! The mint Component's socket: the app reaches it through the pod's fsGroup, read-only
//! mount and all; without that group it cannot.

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::*;

/// An empty `SNOWLEASE_APP` (as a missing annotation gives) stops `worker` with exit 2 and a
/// message naming `--app`, `SNOWLEASE_APP` and the annotation; `--app ""` on the command line
/// without the variable is told only the allowed form.
#[test]
fn empty_app_name_from_the_env_names_snowlease_app_and_its_source() {
    let pod = PodDir::new();
    let out = pod.worker_id_file().to_string_lossy().into_owned();
    let args = [
        "worker",
        "--redis-url",
        "redis://127.0.0.1:1",
        "--output-file",
        &out,
    ];
    let from_env = run_snowlease(&args, &[("SNOWLEASE_APP", "")], secs(10));
    assert_eq!(from_env.code, Some(2), "{from_env:?}");
    for part in [
        "--app",
        "environment variable SNOWLEASE_APP",
        "pod annotation snowlease/app",
    ] {
        assert!(from_env.stderr.contains(part), "{part}: {from_env:?}");
    }

    let flag = [&args[..], &["--app", ""]].concat();
    let from_flag = run_snowlease(&flag, &[], secs(10));
    assert_eq!(from_flag.code, Some(2), "{from_flag:?}");
    assert!(from_flag.stderr.contains("--app"), "{from_flag:?}");
    assert!(!from_flag.stderr.contains("SNOWLEASE_APP"), "{from_flag:?}");
    assert!(!pod.worker_id_file().exists(), "nothing written");
}

/// The group the mint component's pod shares (its `fsGroup`), and the app's own user.
const FS_GROUP: u32 = 4242;
const APP_USER: u32 = 1000;

/// `cmd` run as the app container runs: as `APP_USER`, with the pod's fsGroup among its
/// groups when `fs_group` (`setpriv`).
fn as_app(fs_group: bool, cmd: &[&OsStr]) -> Command {
    let mut setpriv = Command::new("setpriv");
    let user = APP_USER.to_string();
    setpriv.args(["--reuid", &user, "--regid", &user]);
    match fs_group {
        true => setpriv.args(["--groups", &FS_GROUP.to_string()]),
        false => setpriv.arg("--clear-groups"),
    };
    setpriv.args(cmd);
    setpriv
}

/// A `python3` that the app's user can run (one under /root, as pyenv's, is not), or None.
fn python_for_the_app() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("python3"))
        .filter(|p| p.is_file())
        .find(|p| {
            let probe = as_app(false, &[p.as_os_str(), "-c".as_ref(), "pass".as_ref()]);
            run_command(probe, secs(10)).code == Some(0)
        })
}

/// The pod of k8s/components/snowlease-mint/ as processes (root only: users and mounts):
/// the volume as the kubelet makes an emptyDir for a pod with an fsGroup (group-owned by it,
/// setgid, mode 2777), the sidecar as UID 65532 with the fsGroup as its group (mint.yaml's
/// copy) and supplementary group. The socket it creates (mode 0660) belongs to the fsGroup,
/// so the app (another UID, the fsGroup among its groups, as the kubelet gives every
/// container) gets IDs with examples/python/mint.py, also through a read-only mount of the
/// volume (as the component mounts it); without the fsGroup, connecting is refused
/// (EACCES) and the client exits 3 with nothing on stdout.
#[test]
fn mint_socket_reaches_the_app_through_the_pods_fs_group() {
    let skip = |why: &str| {
        skip(
            "component::mint_socket_reaches_the_app_through_the_pods_fs_group",
            why,
        )
    };
    // The effective UID owns /proc/self.
    if std::fs::metadata("/proc/self").map(|m| m.uid()).ok() != Some(0) {
        return skip("not root (it switches users and mounts)");
    }
    let Some(python) = python_for_the_app() else {
        return skip("no setpriv, or no python3 that UID 1000 may run");
    };
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let pod = PodDir::new();
    let volume = pod.path();
    std::os::unix::fs::chown(volume, None, Some(FS_GROUP)).unwrap();
    std::fs::set_permissions(volume, std::fs::Permissions::from_mode(0o2777)).unwrap();
    let socket = volume.join("mint.sock");
    let group = FS_GROUP.to_string();
    let sidecar = Sidecar::worker(&redis, "orders")
        .pod(&pod)
        .wrap(&[
            "setpriv", "--reuid", "65532", "--regid", &group, "--groups", &group,
        ])
        .switch("--mint")
        .flag("--mint-window", "500ms")
        .flag("--mint-socket", socket.to_string_lossy())
        .spawn();
    // /next is on the socket only (not on --listen): minting once it answers there.
    let next = || crate::mint_worker::socket_get(&socket, "/next", "text/plain");
    let answered = poll_until(secs(15), || {
        sidecar.readyz() == 200 && next().starts_with("HTTP/1.1 200")
    });
    assert!(answered, "no /next: {:?} {}", sidecar.get_id(), next());
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (65532, FS_GROUP, 0o660)
    );

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/mint.py");
    let client: [&OsStr; 5] = [
        python.as_os_str(),
        example.as_os_str(),
        "--wait".as_ref(),
        "0".as_ref(),
        "3".as_ref(),
    ];
    let mint = |fs_group: bool, socket: &Path| {
        let mut cmd = as_app(fs_group, &client);
        cmd.env("SNOWLEASE_MINT_SOCKET", socket);
        run_command(cmd, secs(30))
    };
    let with_group = mint(true, &socket);
    assert_eq!(with_group.code, Some(0), "{with_group:?}");
    assert_eq!(with_group.stdout.lines().count(), 3, "{with_group:?}");

    // The component's read-only mount: connecting writes nothing to the file system.
    let mount = tempfile::tempdir().unwrap();
    let app = as_app(true, &client);
    let mut read_only = Command::new("unshare");
    read_only
        .args(["--mount", "--", "sh", "-c"])
        .arg("mount --bind -o ro \"$1\" \"$2\" && shift 2 && exec \"$@\"")
        .arg("sh")
        .arg(volume)
        .arg(mount.path())
        .arg(app.get_program())
        .args(app.get_args())
        .env("SNOWLEASE_MINT_SOCKET", mount.path().join("mint.sock"));
    let read_only = run_command(read_only, secs(30));
    assert_eq!(read_only.code, Some(0), "{read_only:?}");
    assert_eq!(read_only.stdout.lines().count(), 3, "{read_only:?}");

    let without = mint(false, &socket);
    assert_eq!(without.code, Some(3), "{without:?}");
    assert_eq!(without.stdout, "", "{without:?}");
    assert!(without.stderr.contains("Permission denied"), "{without:?}");
}
