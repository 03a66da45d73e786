//! The alerts of k8s/monitoring/prometheusrule.yaml proven: the promtool unit tests
//! (scripts/test-alerts.sh, tests/alerts/), which read the rules from the manifest through
//! scripts/alert-rules.py. Without promtool (Debian package `prometheus`, installed by
//! scripts/ensure-test-deps.sh) the test says SKIPPED.

use std::path::{Path, PathBuf};
use std::process::Command;

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
