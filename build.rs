//! Build script: records the git commit for `snowlease --version` and
//! `snowlease_build_info` (env `SNOWLEASE_COMMIT` wins, e.g. in an image
//! build without `.git`; "unknown" when neither is there).

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SNOWLEASE_COMMIT");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
    let commit = std::env::var("SNOWLEASE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SNOWLEASE_COMMIT={commit}");
}

fn git_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !commit.is_empty()).then_some(commit)
}
