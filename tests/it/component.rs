//! The Kustomize Component's app name: `SNOWLEASE_APP` comes from the pod
//! annotation `snowlease/app` through the downward API, which gives an empty string when the
//! annotation is missing. The sidecar's error then names the variable and that source.
//! (Rendering the Component on Deployments, StatefulSets and commands: scripts/validate-k8s.sh.)

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
