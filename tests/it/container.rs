//! The image and the pod in real containers: the image is built from the repo's
//! one recipe (`Dockerfile`, through `scripts/build-image.sh`) around the static binary the
//! suite already built (`SNOWLEASE_STATIC_BIN`), and the repo's own manifests run as pods with
//! `podman kube play`.
//!
//! Podman runs as root with its own storage under `target/podman-it/` (vfs driver: no
//! overlay mounts needed), the runc runtime (crun refuses hybrid cgroups), cgroupfs and
//! ulimits below the hard limits (`containers.conf` written there). Pods use the host's
//! network (`hostNetwork: true`): their Redis is a harness `redis-server` on the host's
//! loopback, which a pod network could not reach, and the sidecar listens on a free loopback
//! port instead of 7391. Where podman cannot run (not installed, not root, no kubectl), each
//! test says so on stderr, uncaptured, and returns: a loud skip.
//!
//! Conversions of the rendered manifests for podman 4.3, each a JSON patch of a Kustomize
//! overlay written beside the repo's (see [`PODMAN_PATCH`], [`NATIVE_SIDECAR_PATCH`]):
//! - images: both snowlease and the app's image (`registry.example.com/orders`) are the image
//!   built here; the app runs the image's binary as `snowlease sleep 1h` (no registry);
//! - `replicas: 1` (podman plays one pod per Deployment);
//! - `hostNetwork: true`, no `ports` (podman refuses port mappings with the host's network),
//!   `SNOWLEASE_LISTEN` on a free loopback port;
//! - `restartPolicy: OnFailure` (podman applies the pod's `Always` to init containers too, and
//!   restarts `install-snowlease` for ever);
//! - `REDIS_URL` as a value (podman reads `secretKeyRef` from its own secret store only);
//! - `POD_IP` as `127.0.0.1` (podman fills no `status.podIP`);
//! - probes removed (podman runs them as healthchecks on systemd timers; no systemd here);
//!   the tests read `/readyz` and `/id` themselves;
//! - the native sidecar (init container with `restartPolicy: Always`, which podman 4.3 does
//!   not know: it would wait for it to exit) becomes the first ordinary container; the app's
//!   `exec --wait` then holds the app back instead of the startupProbe;
//! - test setting, not a conversion: `SNOWLEASE_HANDOVER_DELAY=60s`, so the tombstone the
//!   release writes is still there to be read.
//!
//! podman ignores the plain sidecar's `preStop` hook: at `podman pod stop` both containers get
//! SIGTERM at once.
//!
//! The mint pod (k8s/existing-deployment-mint/, [`MINT_PATCH`]) has no binary in the app
//! container and no `exec`: the app (UID 1000, the image's `snowlease sleep 1h` standing in)
//! gets IDs through the repo's Go client, examples/go/mint.go built static and copied in.
//! Its emptyDir is made beforehand as the kubelet would (podman 4.3 would share a volume of
//! that name between pods and chown it to whichever container starts first), and the app
//! container is stopped before the pod, as Kubernetes stops native sidecars last.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use snowlease::worker_id::mint::layout::{DEFAULT_EPOCH_MS, DEFAULT_LAYOUT, Epoch, IdLayout};

use crate::harness::*;

/// The tag of the image built here (never pushed).
const IMAGE: &str = "localhost/snowlease:it";

/// Held while scripts/build-image.sh stages target/image/ (the build and the recipe test).
static STAGING: Mutex<()> = Mutex::new(());

/// Held by a pod whose emptyDir is podman's named volume `snowlease` (the plain and the native
/// sidecar pods): podman 4.3 names an emptyDir's volume after the manifest's volume, so two
/// such pods played at once race to create it ("volume already exists", seen in CI) or share
/// one, and a volume left by an earlier pod would hand its state files to the next.
static SNOWLEASE_VOLUME: Mutex<()> = Mutex::new(());

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Rootful podman with its own storage and settings, and the image built once.
struct Podman {
    dir: PathBuf,
}

impl Podman {
    /// The shared instance with the image built, or why podman cannot run here.
    fn get() -> Result<&'static Podman, String> {
        static PODMAN: OnceLock<Result<Podman, String>> = OnceLock::new();
        PODMAN
            .get_or_init(Podman::set_up)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn set_up() -> Result<Podman, String> {
        for tool in ["podman", "kubectl"] {
            if which(tool).is_none() {
                return Err(format!("{tool} is not installed"));
            }
        }
        if !is_root() {
            return Err("not root (rootful podman with vfs storage needs root)".into());
        }
        let dir = repo().join("target/podman-it");
        fs::create_dir_all(&dir).unwrap();
        // Hard limits here: nofile 20000 where podman's default asks 1048576.
        fs::write(
            dir.join("containers.conf"),
            format!(
                "[containers]\n\
                 default_ulimits = [\"nofile=1024:1024\", \"nproc=4096:4096\"]\n\
                 log_driver = \"k8s-file\"\n\
                 [engine]\n\
                 runtime = \"runc\"\n\
                 tmp_dir = \"{}/tmp\"\n\
                 cgroup_manager = \"cgroupfs\"\n\
                 events_logger = \"file\"\n",
                dir.display()
            ),
        )
        .unwrap();
        fs::write(
            dir.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"vfs\"\ngraphroot = \"{0}/root\"\nrunroot = \"{0}/run\"\n",
                dir.display()
            ),
        )
        .unwrap();
        let podman = Podman { dir };
        let info = podman.run(&["info"], secs(60));
        if info.code != Some(0) {
            return Err(format!("`podman info` fails: {}", info.stderr));
        }
        podman.build_image();
        Ok(podman)
    }

    /// `podman args...` with this instance's settings.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("podman");
        cmd.args(args)
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"));
        cmd
    }

    fn run(&self, args: &[&str], timeout: std::time::Duration) -> Run {
        run_command(self.cmd(args), timeout)
    }

    /// Like [`Podman::run`]; panics unless it exits 0.
    fn ok(&self, args: &[&str]) -> Run {
        let run = self.run(args, secs(120));
        assert_eq!(run.code, Some(0), "podman {args:?}: {run:?}");
        run
    }

    /// scripts/build-image.sh (the Dockerfile) around the suite's static binary.
    fn build_image(&self) {
        let bin = crate::static_binary::static_bin();
        let mut build = Command::new(repo().join("scripts/build-image.sh"));
        build
            .arg("--binary")
            .arg(&bin)
            .args(["--tag", IMAGE])
            .env("SNOWLEASE_IMAGE_ENGINE", "podman")
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"));
        let run = {
            let _staging = STAGING.lock().unwrap_or_else(|e| e.into_inner());
            run_command(build, secs(300))
        };
        assert_eq!(run.code, Some(0), "build-image.sh: {run:?}");
        assert_eq!(run.stdout.lines().last(), Some(IMAGE), "{run:?}");
        // Layers of earlier builds (vfs keeps full copies).
        self.run(&["image", "prune", "-f"], secs(60));
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2).map(|uid| uid == "0"))
            .unwrap_or(false)
    })
}

/// `--version` in the image prints the commit the binary was built from; it runs as UID
/// 65532 (`nonroot` in its /etc/passwd) with a read-only root filesystem and no network.
#[test]
fn image_runs_as_65532_read_only_and_prints_its_commit() {
    let podman = match Podman::get() {
        Ok(p) => p,
        Err(why) => return skip("image_runs_as_65532_read_only_and_prints_its_commit", &why),
    };
    let user = podman.ok(&["image", "inspect", IMAGE, "--format", "{{.Config.User}}"]);
    assert_eq!(user.stdout.trim(), "65532:65532");

    let version = podman.ok(&[
        "run",
        "--rm",
        "--read-only",
        "--network",
        "none",
        IMAGE,
        "--version",
    ]);
    let mut host = Command::new(crate::static_binary::static_bin());
    host.arg("--version");
    let host = run_command(host, secs(10));
    assert_eq!(version.stdout.trim(), host.stdout.trim());
    let commit = version
        .stdout
        .trim()
        .strip_suffix(')')
        .and_then(|v| v.rsplit_once("(commit "))
        .map(|(_, c)| c.to_owned());
    assert!(
        commit.is_some_and(|c| c.len() == 12 && c.bytes().all(|b| b.is_ascii_hexdigit())),
        "{version:?}"
    );

    // The UID of the process inside.
    let ctr = podman.ok(&[
        "run",
        "-d",
        "--read-only",
        "--network",
        "none",
        IMAGE,
        "sleep",
        "1h",
    ]);
    let ctr = ctr.stdout.trim().to_owned();
    let pid = podman.ok(&["inspect", &ctr, "--format", "{{.State.Pid}}"]);
    let status = fs::read_to_string(format!("/proc/{}/status", pid.stdout.trim())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    podman.ok(&["rm", "-f", "-t", "0", &ctr]);
    assert_eq!(
        uid.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["65532"; 4],
        "{uid}"
    );
}

/// `rediss://` from the image: the image holds the host's CA bundle where rustls looks
/// (/etc/ssl/certs/ca-certificates.crt), and that path is the one it trusts: a private CA
/// mounted there makes `status` connect; the image's own bundle (without that CA) gets a
/// certificate error, exit 1.
#[test]
fn image_trusts_redis_tls_through_its_ca_bundle() {
    let podman = match Podman::get() {
        Ok(p) => p,
        Err(why) => return skip("image_trusts_redis_tls_through_its_ca_bundle", &why),
    };
    let out = tempfile::tempdir().unwrap();
    let ctr = podman.ok(&["create", IMAGE]);
    let ctr = ctr.stdout.trim().to_owned();
    let copied = out.path().join("bundle.crt");
    podman.ok(&[
        "cp",
        &format!("{ctr}:/etc/ssl/certs/ca-certificates.crt"),
        copied.to_str().unwrap(),
    ]);
    podman.ok(&["rm", &ctr]);
    assert!(
        fs::read(&copied).unwrap() == fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap(),
        "the image's CA bundle is the host's"
    );

    let certs = tempfile::tempdir().unwrap();
    crate::connection::make_certs(certs.path());
    let file = |name: &str| certs.path().join(name).to_string_lossy().into_owned();
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
            "no",
        ]
        .map(String::from)
        .to_vec(),
        ..RedisOptions::default()
    });
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let status = |mounts: &[String]| {
        let mut args = vec!["run", "--rm", "--read-only", "--network", "host"];
        for m in mounts {
            args.extend(["-v", m]);
        }
        args.extend([IMAGE, "status", "--app", "orders", "--redis-url", &url]);
        podman.run(&args, secs(60))
    };
    let own_bundle = status(&[]);
    assert_eq!(own_bundle.code, Some(1), "{own_bundle:?}");
    assert!(
        own_bundle.stderr.contains("TLS certificate error"),
        "{own_bundle:?}"
    );
    let private_ca = status(&[format!(
        "{}:/etc/ssl/certs/ca-certificates.crt:ro",
        file("ca.pem")
    )]);
    assert_eq!(private_ca.code, Some(0), "{private_ca:?}");
}

/// The conversions every pod needs (module docs), as one JSON patch with the sidecar as
/// container 0 and the app as container 1; `test` ops fail the render when the manifests no
/// longer have that shape. Filled in by [`podman_patch`].
const PODMAN_PATCH: &str = r#"
- {op: test, path: /spec/template/spec/containers/0/name, value: snowlease}
- {op: test, path: /spec/template/spec/containers/1/name, value: "{app}"}
- {op: replace, path: /spec/replicas, value: 1}
- {op: add, path: /spec/template/spec/hostNetwork, value: true}
- {op: add, path: /spec/template/spec/restartPolicy, value: OnFailure}
- {op: test, path: /spec/template/spec/containers/0/env/1/name, value: REDIS_URL}
- {op: replace, path: /spec/template/spec/containers/0/env/1, value: {name: REDIS_URL, value: "{redis_url}"}}
- {op: test, path: /spec/template/spec/containers/0/env/2/name, value: POD_IP}
- {op: replace, path: /spec/template/spec/containers/0/env/2, value: {name: POD_IP, value: 127.0.0.1}}
- {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: SNOWLEASE_LISTEN, value: "{listen}"}}
- {op: add, path: /spec/template/spec/containers/0/env/-, value: {name: SNOWLEASE_HANDOVER_DELAY, value: 60s}}
- {op: remove, path: /spec/template/spec/containers/0/ports}
- {op: remove, path: /spec/template/spec/containers/0/startupProbe}
- {op: remove, path: /spec/template/spec/containers/0/readinessProbe}
- {op: remove, path: /spec/template/spec/containers/0/livenessProbe}
- {op: remove, path: /spec/template/spec/containers/1/ports}
- {op: replace, path: /spec/template/spec/containers/1/args, value: {app_args}}
"#;

/// [`PODMAN_PATCH`] for a pod whose app container is named `app` and gets `app_args` (a YAML
/// flow list: the image's entrypoint is `snowlease`), with the sidecar on Redis `redis_url`
/// and listening on `listen` (`host:port`).
fn podman_patch(app: &str, app_args: &str, redis_url: &str, listen: &str) -> String {
    PODMAN_PATCH
        .replace("{app}", app)
        .replace("{app_args}", app_args)
        .replace("{redis_url}", redis_url)
        .replace("{listen}", listen)
}

/// The native sidecar (init container 1, `restartPolicy: Always`) as the first ordinary
/// container, applied before [`PODMAN_PATCH`].
const NATIVE_SIDECAR_PATCH: &str = r#"
- {op: test, path: /spec/template/spec/initContainers/1/restartPolicy, value: Always}
- {op: move, from: /spec/template/spec/initContainers/1, path: /spec/template/spec/containers/0}
- {op: remove, path: /spec/template/spec/containers/0/restartPolicy}
"#;

/// A pod played from the repo's overlay `folder` (under k8s/), converted for podman;
/// removed with its containers on drop.
struct Pod {
    podman: &'static Podman,
    /// The pod's name: `<prefix>orders-pod-0` (podman names a Deployment's pod so).
    name: String,
}

impl Pod {
    /// Renders `k8s/<folder>` through an overlay holding `patches` (JSON patches of the
    /// Deployment `orders`, in order) with `kubectl kustomize`, and plays it.
    fn play(podman: &'static Podman, folder: &str, prefix: &str, patches: &[String]) -> Pod {
        let overlay = tempfile::Builder::new()
            .prefix("podman-overlay-")
            .tempdir_in(repo().join("target"))
            .unwrap();
        // Kustomize takes only relative paths to other kustomizations.
        let mut kustomization = format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [../../k8s/{folder}]\nnamePrefix: {prefix}\n\
             images:\n  - {{name: registry.example.com/snowlease, newName: {image}, newTag: {tag}}}\n  \
             - {{name: registry.example.com/orders, newName: {image}, newTag: {tag}}}\npatches:\n",
            image = IMAGE.split_once(':').unwrap().0,
            tag = IMAGE.split_once(':').unwrap().1,
        );
        for patch in patches {
            kustomization.push_str("  - target: {kind: Deployment}\n    patch: |-\n");
            for line in patch.trim().lines() {
                kustomization.push_str(&format!("      {line}\n"));
            }
        }
        fs::write(overlay.path().join("kustomization.yaml"), &kustomization).unwrap();
        let mut render = Command::new("kubectl");
        render.arg("kustomize").arg(overlay.path());
        let rendered = run_command(render, secs(60));
        assert_eq!(rendered.code, Some(0), "{kustomization}\n{rendered:?}");
        let file = overlay.path().join("pod.yaml");
        fs::write(&file, &rendered.stdout).unwrap();

        let pod = Pod {
            podman,
            name: format!("{prefix}orders-pod-0"),
        };
        let play = podman.run(&["kube", "play", file.to_str().unwrap()], secs(180));
        assert_eq!(play.code, Some(0), "{}\n{play:?}", rendered.stdout);
        pod
    }

    fn container(&self, name: &str) -> String {
        format!("{}-{name}", self.name)
    }

    /// The host PID of a container's first process.
    fn pid(&self, container: &str) -> u32 {
        let run = self.podman.ok(&[
            "inspect",
            &self.container(container),
            "--format",
            "{{.State.Pid}}",
        ]);
        run.stdout.trim().parse().unwrap()
    }

    fn logs(&self, container: &str) -> String {
        let run = self
            .podman
            .run(&["logs", &self.container(container)], secs(30));
        format!("{}\n{}", run.stdout, run.stderr)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.podman
            .run(&["pod", "rm", "-f", "-t", "0", &self.name], secs(60));
    }
}

/// `KEY=value` lines of /proc/<pid>/environ.
fn environ(pid: u32) -> Vec<String> {
    fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect()
}

/// The effective UID of a process (second field of `Uid:` in /proc/<pid>/status).
fn uid_of(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Waits until the pod's sidecar holds `key` (owner from the pod's IP 127.0.0.1), and checks
/// it runs as UID 65532 on a read-only root; returns its PID.
fn sidecar_claims_hardened(podman: &Podman, pod: &Pod, redis: &RedisServer, key: &str) -> u32 {
    let claimed = poll_until(secs(60), || {
        redis.get(key).is_some_and(|o| o.starts_with("127.0.0.1#"))
    });
    assert!(
        claimed,
        "no claim: {:?}\n{}",
        redis.get(key),
        pod.logs("snowlease")
    );
    let sidecar = pod.pid("snowlease");
    assert_eq!(uid_of(sidecar), Some(65532));
    let read_only = podman.ok(&[
        "inspect",
        &pod.container("snowlease"),
        "--format",
        "{{.HostConfig.ReadonlyRootfs}}",
    ]);
    assert_eq!(read_only.stdout.trim(), "true");
    sidecar
}

/// The release at the pod's stop: `key` is a tombstone for SNOWLEASE_HANDOVER_DELAY (60 s),
/// not a key left for a TTL.
fn assert_released(redis: &RedisServer, key: &str, pod: &Pod) {
    let (value, pttl) = redis.get_with_pttl(key);
    assert!(
        value
            .as_deref()
            .is_some_and(|v| v.starts_with("released:127.0.0.1#")),
        "{value:?}\n{}",
        pod.logs("snowlease")
    );
    assert!((1..=60_000).contains(&pttl), "tombstone PTTL {pttl}");
}

/// "<container> <exited> <exit code>" of every container of the pod.
fn exit_states(podman: &Podman, pod: &Pod) -> Vec<String> {
    let states = podman.ok(&[
        "ps",
        "-a",
        "--filter",
        &format!("pod={}", pod.name),
        "--format",
        "{{.Names}} {{.Exited}} {{.ExitCode}}",
    ]);
    states.stdout.lines().map(str::to_owned).collect()
}

/// The pod runs as it would in a cluster: `install-snowlease` copied the binary, the sidecar
/// (UID 65532, read-only root) claims ID 0, the app started by `snowlease exec` has
/// WORKER_ID=0, `snowlease id --url` answers from the app container; `podman pod stop`
/// releases the ID (a tombstone) and every container exits well inside the grace period.
fn run_pod(test: &str, folder: &str, prefix: &str, first: Option<&str>) {
    let podman = match Podman::get() {
        Ok(p) => p,
        Err(why) => return skip(test, &why),
    };
    let _volume = SNOWLEASE_VOLUME.lock().unwrap_or_else(|e| e.into_inner());
    podman.run(&["volume", "rm", "-f", "snowlease"], secs(60));
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut patches: Vec<String> = first.iter().map(|p| p.to_string()).collect();
    patches.push(podman_patch(
        "app",
        "[/usr/local/bin/snowlease, sleep, 1h]",
        &redis.url(),
        &listen,
    ));
    let pod = Pod::play(podman, folder, prefix, &patches);

    let key = "snowflake:worker:orders:0";
    sidecar_claims_hardened(podman, &pod, &redis, key);

    let copied = tempfile::tempdir().unwrap();
    let dest = copied.path().join("snowlease");
    podman.ok(&[
        "cp",
        &format!("{}:/var/run/snowlease/bin/snowlease", pod.container("app")),
        dest.to_str().unwrap(),
    ]);
    assert!(
        fs::read(&dest).unwrap() == fs::read(crate::static_binary::static_bin()).unwrap(),
        "install-snowlease copied the image's binary"
    );

    // `exec` (the app container's first process) starts the app as its child.
    let exec = pod.pid("app");
    let env = poll_some(secs(60), || {
        child_pids(nix::unistd::Pid::from_raw(exec as i32))
            .first()
            .map(|child| environ(child.as_raw() as u32))
            .filter(|env| env.iter().any(|v| v.starts_with("WORKER_ID=")))
    });
    let env = env.unwrap_or_else(|| panic!("no app with WORKER_ID\n{}", pod.logs("app")));
    assert!(env.contains(&"WORKER_ID=0".to_owned()), "{env:?}");

    let id = podman.ok(&[
        "exec",
        &pod.container("app"),
        "/var/run/snowlease/bin/snowlease",
        "id",
        "--url",
        &format!("http://{listen}"),
    ]);
    assert_eq!(id.stdout.trim(), "0");

    let started = Instant::now();
    podman.ok(&["pod", "stop", "-t", "30", &pod.name]);
    let took = started.elapsed();
    assert_released(&redis, key, &pod);
    let states = exit_states(podman, &pod);
    let states: Vec<&str> = states.iter().map(String::as_str).collect();
    let sidecar_state = format!("{} true 0", pod.container("snowlease"));
    // The app (`snowlease sleep`) dies of the SIGTERM `exec` passed on: 128 + 15. Or, where
    // both containers get SIGTERM at once (the plain sidecar: podman ignores the preStop hook
    // that holds the sidecar), `exec` may see the release first and stop the app: 75.
    let app_stopped = |code: u8| format!("{} true {code}", pod.container("app"));
    assert!(states.contains(&sidecar_state.as_str()), "{states:?}");
    assert!(
        states.contains(&app_stopped(143).as_str()) || states.contains(&app_stopped(75).as_str()),
        "{states:?}"
    );
    assert!(states.iter().all(|s| s.contains(" true ")), "{states:?}");
    // Well inside the 30 s grace period: nothing waited for SIGKILL.
    assert!(took < secs(20), "pod stop took {took:?}");
}

/// k8s/plain-sidecar/ (the sidecar as an ordinary container) in podman, as [`run_pod`] says.
#[test]
fn plain_sidecar_pod_runs_in_podman() {
    run_pod(
        "plain_sidecar_pod_runs_in_podman",
        "plain-sidecar",
        "plain-",
        None,
    );
}

/// k8s/ (the native sidecar), converted to an ordinary container for podman 4.3, as
/// [`run_pod`] says.
#[test]
fn native_sidecar_pod_converted_runs_in_podman() {
    run_pod(
        "native_sidecar_pod_converted_runs_in_podman",
        "",
        "native-",
        Some(NATIVE_SIDECAR_PATCH),
    );
}

/// The mint sidecar of k8s/existing-deployment-mint/ (init container 0, `restartPolicy:
/// Always`) as the first ordinary container, applied before [`PODMAN_PATCH`]; the app
/// container's readinessProbe (its own `/health`) goes as the sidecar's probes do. The
/// emptyDir `snowlease` becomes [`MINT_VOLUME`]: podman 4.3 names an emptyDir's volume after
/// the manifest's volume, so two pods played at once with a volume `snowlease` would share
/// one, and it chowns a new volume to whichever container starts first (the app, UID 1000,
/// at times: then the sidecar cannot write there); the test makes that volume beforehand as
/// the kubelet makes the emptyDir of a pod with an fsGroup (see [`kubelet_volume`]).
const MINT_PATCH: &str = r#"
- {op: test, path: /spec/template/spec/initContainers/0/name, value: snowlease}
- {op: test, path: /spec/template/spec/initContainers/0/restartPolicy, value: Always}
- {op: move, from: /spec/template/spec/initContainers/0, path: /spec/template/spec/containers/0}
- {op: remove, path: /spec/template/spec/containers/0/restartPolicy}
- {op: test, path: /spec/template/spec/initContainers, value: []}
- {op: remove, path: /spec/template/spec/initContainers}
- {op: remove, path: /spec/template/spec/containers/1/readinessProbe}
- {op: test, path: /spec/template/spec/volumes/0/name, value: snowlease}
- {op: replace, path: /spec/template/spec/volumes/0/name, value: mint-snowlease}
- {op: test, path: /spec/template/spec/containers/0/volumeMounts/0/name, value: snowlease}
- {op: replace, path: /spec/template/spec/containers/0/volumeMounts/0/name, value: mint-snowlease}
- {op: test, path: /spec/template/spec/containers/1/volumeMounts/1/name, value: snowlease}
- {op: replace, path: /spec/template/spec/containers/1/volumeMounts/1/name, value: mint-snowlease}
"#;

/// The podman volume the mint pod's emptyDir `snowlease` is renamed to ([`MINT_PATCH`]).
const MINT_VOLUME: &str = "mint-snowlease";

/// A podman volume made as the kubelet makes an emptyDir for a pod with fsGroup `fs_group`
/// (root-owned, group `fs_group`, setgid, mode 2777, as tests/it/component.rs does), with
/// podman's chown-on-first-mount off (`uid`/`gid` options); removed on drop, after the pod.
struct KubeletVolume {
    podman: &'static Podman,
    name: &'static str,
}

/// See [`KubeletVolume`]; a volume of that name left by an earlier run is removed first.
fn kubelet_volume(podman: &'static Podman, name: &'static str, fs_group: u32) -> KubeletVolume {
    use std::os::unix::fs::PermissionsExt;
    podman.run(&["volume", "rm", "-f", name], secs(60));
    podman.ok(&[
        "volume",
        "create",
        "-o",
        &format!("o=uid=0,gid={fs_group}"),
        name,
    ]);
    let volume = KubeletVolume { podman, name };
    let dir = podman.ok(&["volume", "inspect", name, "--format", "{{.Mountpoint}}"]);
    fs::set_permissions(dir.stdout.trim(), fs::Permissions::from_mode(0o2777)).unwrap();
    volume
}

impl Drop for KubeletVolume {
    fn drop(&mut self) {
        self.podman
            .run(&["volume", "rm", "-f", self.name], secs(60));
    }
}

/// examples/go/mint.go built static (`CGO_ENABLED=0`: Go's own resolver, no libc) into
/// `dir`, so it runs in the scratch image; its path, or why not (no `go`).
fn static_go_mint_client(dir: &Path) -> Result<PathBuf, String> {
    let go = which("go").ok_or("go is not installed (.ci/run installs golang-go)")?;
    let binary = dir.join("mint");
    let mut build = Command::new(go);
    build
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(repo().join("examples/go/mint.go"))
        .env("CGO_ENABLED", "0")
        // The build cache beside cargo's (as tests/it/examples.rs): warm after the first run.
        .env("GOCACHE", repo().join("target/go-build"));
    let run = run_command(build, secs(300));
    assert_eq!(run.code, Some(0), "go build mint.go: {run:?}");
    Ok(binary)
}

/// The effective GID of a process (second field of `Gid:` in /proc/<pid>/status).
fn gid_of(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Gid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// k8s/existing-deployment-mint/ (the snowlease-mint component on a stock Deployment with
/// fsGroup 1000) in podman: the sidecar (UID 65532, group 1000 copied from the fsGroup,
/// read-only root) claims worker ID 0 and creates the socket (mode 0660) on the shared
/// volume; in the app container (UID 1000, the volume mounted read-only) the repo's Go client
/// (examples/go/mint.go, built static and copied in with `podman cp`: the image is scratch)
/// gets IDs of worker 0 over /var/run/snowlease/mint.sock, its default; the same client as a
/// user outside the group is refused. The app reaches the socket through group 1000, its
/// own runAsGroup and the fsGroup here: podman 4.3 adds no fsGroup to the containers' groups
/// (tests/it/component.rs covers an app whose only way in is the fsGroup). With the app
/// stopped first, `podman pod stop` settles and releases: the settled record holds the last
/// minted timestamp and the lease key is a tombstone.
#[test]
fn mint_pod_serves_ids_to_the_app_over_the_socket_in_podman() {
    let test = "mint_pod_serves_ids_to_the_app_over_the_socket_in_podman";
    let podman = match Podman::get() {
        Ok(p) => p,
        Err(why) => return skip(test, &why),
    };
    let client_dir = tempfile::tempdir().unwrap();
    let client = match static_go_mint_client(client_dir.path()) {
        Ok(c) => c,
        Err(why) => return skip(test, &why),
    };
    let redis = RedisServer::start();
    redis.open_claim_guard("orders");
    let listen = format!("127.0.0.1:{}", free_port());
    let _volume = kubelet_volume(podman, MINT_VOLUME, 1000);
    let patches = [
        MINT_PATCH.to_owned(),
        podman_patch("orders", "[sleep, 1h]", &redis.url(), &listen),
    ];
    let pod = Pod::play(podman, "existing-deployment-mint", "mint-", &patches);

    let key = "snowflake:worker:orders:0";
    let sidecar = sidecar_claims_hardened(podman, &pod, &redis, key);
    let app = pod.pid("orders");
    // The socket's group: the sidecar's (runAsGroup, the fsGroup copied) and the app's.
    assert_eq!(gid_of(sidecar), Some(1000));
    assert_eq!((uid_of(app), gid_of(app)), (Some(1000), Some(1000)));

    let app_mount = podman.ok(&[
        "inspect",
        &pod.container("orders"),
        "--format",
        "{{range .Mounts}}{{if eq .Destination \"/var/run/snowlease\"}}{{.RW}}{{end}}{{end}}",
    ]);
    assert_eq!(
        app_mount.stdout.trim(),
        "false",
        "the app's mount is read-only"
    );

    // The socket as the app container sees it.
    let socket = format!("/proc/{app}/root/var/run/snowlease/mint.sock");
    let socket = poll_some(secs(30), || fs::metadata(&socket).ok())
        .unwrap_or_else(|| panic!("no socket\n{}", pod.logs("snowlease")));
    {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        assert!(socket.file_type().is_socket());
        assert_eq!(
            (socket.mode() & 0o777, socket.uid(), socket.gid()),
            (0o660, 65532, 1000)
        );
    }

    podman.ok(&[
        "cp",
        client.to_str().unwrap(),
        &format!("{}:/usr/local/bin/mint", pod.container("orders")),
    ]);
    let minted = podman.ok(&[
        "exec",
        &pod.container("orders"),
        "/usr/local/bin/mint",
        "--wait",
        "10",
        "5",
    ]);
    let ids: Vec<u64> = minted.stdout.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(ids.len(), 5, "{minted:?}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(
        ids.iter().all(|id| crate::mint_worker::worker_of(*id) == 0),
        "{ids:?}"
    );

    // Outside the socket's group: refused (the client's exit 3 once --wait is spent).
    let outsider = podman.run(
        &[
            "exec",
            "--user",
            "2000:2000",
            &pod.container("orders"),
            "/usr/local/bin/mint",
            "--wait",
            "0",
            "1",
        ],
        secs(30),
    );
    assert_eq!(outsider.code, Some(3), "{outsider:?}");
    assert!(
        outsider.stderr.contains("permission denied"),
        "{outsider:?}"
    );

    // Kubernetes' order: the app containers first, the native sidecar once they are gone
    // (docs/kubernetes.md: the app stops first, then the sidecar settles and releases). The
    // stand-in app (`snowlease sleep`, PID 1 of its container without a SIGTERM handler)
    // ignores SIGTERM: SIGKILL after 2 s, exit 137.
    podman.ok(&["stop", "-t", "2", &pod.container("orders")]);
    let started = Instant::now();
    podman.ok(&["pod", "stop", "-t", "30", &pod.name]);
    let took = started.elapsed();
    let settled_key = "snowflake:worker:orders:settled:{snowflake:worker:orders:0}";
    let settled: u64 = redis
        .get(settled_key)
        .unwrap_or_else(|| panic!("no settled record\n{}", pod.logs("snowlease")))
        .parse()
        .unwrap();
    let epoch = Epoch::parse(&DEFAULT_EPOCH_MS.to_string(), unix_ms()).unwrap();
    let layout = IdLayout::parse(DEFAULT_LAYOUT).unwrap();
    let last = layout.decompose(epoch, *ids.last().unwrap()).unix_ms;
    assert!(settled >= last, "settled {settled}, last ID at {last}");
    assert_released(&redis, key, &pod);
    let states = exit_states(podman, &pod);
    let states: Vec<&str> = states.iter().map(String::as_str).collect();
    let sidecar_state = format!("{} true 0", pod.container("snowlease"));
    let app_state = format!("{} true 137", pod.container("orders"));
    assert!(states.contains(&sidecar_state.as_str()), "{states:?}");
    assert!(states.contains(&app_state.as_str()), "{states:?}");
    assert!(states.iter().all(|s| s.contains(" true ")), "{states:?}");
    // Well inside the 30 s grace period: the sidecar settled at SIGTERM.
    assert!(took < secs(20), "pod stop took {took:?}");
}

/// The recipe pulls nothing (`FROM scratch` only) and gets every file it copies: each `COPY`
/// source is let through `.dockerignore` (an allow-list after `*`) and exists once
/// `scripts/build-image.sh --stage-only` staged target/image/; nothing else is let through.
/// Needs no podman.
#[test]
fn image_recipe_copies_what_the_context_lets_through() {
    let dockerfile = fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let bases: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("FROM "))
        .collect();
    assert_eq!(bases, ["scratch"]);
    let copied: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words[..words.len() - 1].to_vec()
        })
        .collect();
    let ignore = fs::read_to_string(repo().join(".dockerignore")).unwrap();
    let allowed: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .collect();
    let mut sorted = (copied.clone(), allowed.clone());
    sorted.0.sort();
    sorted.1.sort();
    assert_eq!(
        sorted.0, sorted.1,
        "COPY sources and .dockerignore's allow-list"
    );

    let mut stage = Command::new(repo().join("scripts/build-image.sh"));
    stage
        .arg("--binary")
        .arg(crate::static_binary::static_bin())
        .arg("--stage-only");
    let _staging = STAGING.lock().unwrap_or_else(|e| e.into_inner());
    let run = run_command(stage, secs(60));
    assert_eq!(run.code, Some(0), "{run:?}");
    for file in copied {
        assert!(
            repo().join(file).is_file(),
            "{file} is missing after staging"
        );
    }
}
