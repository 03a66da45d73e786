//! The house's rules that a reviewer would otherwise have to remember, read from the sources:
//! Redis calls bounded through the timing kit (`src/timing.rs`), one call timeout for one-off
//! commands, flag limits in the limits tables, and comments that say why instead of citing a
//! tracker.

use std::path::{Path, PathBuf};

/// The files that own a raw tokio timeout, and why; every other file bounds a Redis call with
/// `timing::bounded` and any other wait with `timing::within`.
const TIMEOUT_OWNERS: &[(&str, &str)] = &[
    ("src/timing.rs", "the timing kit itself: bounded and within"),
    (
        "src/connection/handle.rs",
        "the connection owns each call's deadline (timeout_at) and its primary check",
    ),
    (
        "src/worker_id/keeper/claiming.rs",
        "--claim-timeout over a whole claim pass (timeout_at), not one call",
    ),
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every file under `dir` (relative to the repository) whose name ends in one of `exts`.
fn files(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![repo().join(dir)];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if exts
                .iter()
                .any(|ext| path.extension().is_some_and(|e| e == *ext))
            {
                out.push(path);
            }
        }
    }
    out.sort();
    assert!(!out.is_empty(), "no files under {dir}");
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap().display().to_string()
}

/// A Rust file's code: without its trailing `#[cfg(test)] mod tests` (tests may time out
/// anything) and without `//` comments.
fn code_of(text: &str) -> String {
    let mut end = text.len();
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let at = from + at;
        let rest = text[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod tests") || rest.starts_with("pub(crate) mod tests") {
            end = at;
            break;
        }
        from = at + 1;
    }
    text[..end]
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `code` uses a raw tokio timeout: a `time::timeout` path (`timeout_at` too), or
/// `timeout` / `timeout_at` imported from `tokio::time`.
fn raw_timeout(code: &str) -> bool {
    if code.contains("time::timeout") {
        return true;
    }
    code.split("use tokio::time::").skip(1).any(|import| {
        let import = import.split(';').next().unwrap_or("");
        import
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|word| word == "timeout" || word == "timeout_at")
    })
}

/// The names of the `const` and `static` items that `code` declares.
fn item_names(code: &str) -> Vec<&str> {
    let mut names = Vec::new();
    for keyword in ["const ", "static "] {
        for after in code.split(keyword).skip(1) {
            let name = after
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap_or("");
            names.push(name);
        }
    }
    names
}

/// The comment text of `line`: after `//` in Rust, after `--` in Lua.
fn comment_of(line: &str, lua: bool) -> Option<&str> {
    let marker = if lua { "--" } else { "//" };
    line.find(marker).map(|at| &line[at + marker.len()..])
}

/// Whether a comment cites a tracker's number: the word issue (or pr) followed by a number,
/// with or without `#`, or a bare `#` and digits.
fn cites_a_number(comment: &str) -> bool {
    let lower = comment.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || "(),;:.'\"".contains(c))
        .filter(|w| !w.is_empty())
        .collect();
    let number = |w: &str| {
        let digits = w.trim_start_matches('#');
        !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
    };
    words.iter().any(|w| w.starts_with('#') && number(w))
        || words
            .windows(2)
            .any(|pair| ["issue", "issues", "pr", "pull"].contains(&pair[0]) && number(pair[1]))
}

/// A Redis call is bounded through the timing kit; a raw `tokio::time::timeout` (or
/// `timeout_at`) outside the documented owners fails here, naming the file.
#[test]
fn raw_timeouts_live_only_in_the_files_that_own_them() {
    let mut found = Vec::new();
    for path in files("src", &["rs"]) {
        let name = relative(&path);
        let code = code_of(&std::fs::read_to_string(&path).unwrap());
        if raw_timeout(&code) && !TIMEOUT_OWNERS.iter().any(|(owner, _)| *owner == name) {
            found.push(name);
        }
    }
    assert!(
        found.is_empty(),
        "raw tokio timeouts outside the timing kit (use timing::bounded for a Redis call, \
         timing::within for any other wait): {found:?}"
    );
    for (owner, why) in TIMEOUT_OWNERS {
        let code = code_of(&std::fs::read_to_string(repo().join(owner)).unwrap());
        assert!(
            raw_timeout(&code),
            "{owner} is on the allowlist ({why}) but owns no timeout: take it off"
        );
    }
}

/// One bound for the Redis calls of one-off commands: `timing::COMMAND_CALL_TIMEOUT`; a
/// private `*CALL_TIMEOUT` const elsewhere fails here.
#[test]
fn call_timeouts_are_the_timing_kits() {
    let mut found = Vec::new();
    for path in files("src", &["rs"]) {
        let name = relative(&path);
        if name == "src/timing.rs" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&path).unwrap());
        for item in item_names(&code) {
            if item.ends_with("CALL_TIMEOUT") {
                found.push(format!("{name}: {item}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "private call timeouts (use timing::COMMAND_CALL_TIMEOUT): {found:?}"
    );
}

/// Comments in src/ and tests/ say why in words: no tracker numbers, which mean nothing to a
/// reader of the code and go stale when issues move.
#[test]
fn comments_cite_no_issue_numbers() {
    let mut found = Vec::new();
    for dir in ["src", "tests"] {
        for path in files(dir, &["rs", "lua"]) {
            let lua = path.extension().is_some_and(|e| e == "lua");
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                if comment_of(line, lua).is_some_and(cites_a_number) {
                    found.push(format!("{}:{}: {}", relative(&path), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "comments citing issue numbers:\n{}",
        found.join("\n")
    );
}

/// Whether `code` defines a flag limit (`DurationLimit { .. }`, `CountLimit { .. }`) or checks
/// a flag's range with bounds written in place (`check_range("--flag", ..)`).
fn limit_outside_a_table(code: &str) -> bool {
    let defines = ["DurationLimit {", "CountLimit {"]
        .iter()
        .any(|literal| code.contains(literal));
    let in_place = code
        .split("check_range(")
        .skip(1)
        .any(|args| args.trim_start().starts_with("\"--"));
    defines || in_place
}

/// Every range-checked flag has its limit in its mode's `limits.rs` table (where a unit test
/// proves its `--help` names the range) or, for flags several commands share, in
/// `src/cli/limit.rs`; a limit defined or checked in place elsewhere fails here.
#[test]
fn flag_limits_live_in_the_limits_tables() {
    let mut found = Vec::new();
    for path in files("src", &["rs"]) {
        let name = relative(&path);
        if name.ends_with("/limits.rs") || name == "src/cli/limit.rs" || name == "src/cli.rs" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&path).unwrap());
        if limit_outside_a_table(&code) {
            found.push(name);
        }
    }
    assert!(
        found.is_empty(),
        "flag limits outside the limits tables: {found:?}"
    );
}

/// The checks above catch what they claim and pass what they should.
#[test]
fn the_house_checks_read_what_they_claim() {
    assert!(raw_timeout("let x = tokio::time::timeout(d, f).await;"));
    assert!(raw_timeout(
        "use tokio::time::{Instant, timeout};\nlet x = timeout(d, f);"
    ));
    assert!(raw_timeout("use tokio::time::timeout_at;"));
    assert!(!raw_timeout(
        "use tokio::time::{Instant, sleep};\nlet t = call_timeout();"
    ));
    assert!(!raw_timeout(&code_of(
        "// tokio::time::timeout(d, f)\nfn f() {}"
    )));
    let tail = "fn f() {}\n#[cfg(test)]\nmod tests {\n use tokio::time::timeout;\n}";
    assert!(!raw_timeout(&code_of(tail)));
    assert_eq!(
        item_names("const CALL_TIMEOUT: D = X;\nstatic LOCK_CALL_TIMEOUT: D = X;"),
        ["CALL_TIMEOUT", "LOCK_CALL_TIMEOUT"]
    );
    let issue = ["iss", "ue"].concat();
    for cited in [
        format!("fixed in {issue} 12"),
        format!("({issue} #33)"),
        "see #33.".to_owned(),
        "PR 7".to_owned(),
    ] {
        assert!(cites_a_number(&cited), "{cited}");
    }
    for plain in [
        "64 windows of 16",
        "o#1 is an owner",
        "the issue's reproduction",
    ] {
        assert!(!cites_a_number(plain), "{plain}");
    }
    assert_eq!(
        comment_of("KEYS[1] -- the lease key", true),
        Some(" the lease key")
    );
    assert!(limit_outside_a_table(
        "const W: DurationLimit = DurationLimit {"
    ));
    assert!(limit_outside_a_table(
        "check_range(\n    \"--poll\",\n    poll, a, b)?;"
    ));
    assert!(!limit_outside_a_table("check_range(flag, d, lo, hi)"));
    assert!(!limit_outside_a_table("WAIT.check(self.wait)?;"));
}

/// The app side (`exec`, `id`) reads the published files through their one home,
/// `crate::published`, never through the sidecar's modules: a `worker_id::` path in src/exec
/// fails here, naming the file.
#[test]
fn the_app_side_reads_the_published_format_only() {
    let mut found = Vec::new();
    let mut paths = files("src/exec", &["rs"]);
    paths.push(repo().join("src/exec.rs"));
    for path in paths {
        let text = std::fs::read_to_string(&path).unwrap();
        if code_of(&text).contains("worker_id::") {
            found.push(relative(&path));
        }
    }
    assert!(
        found.is_empty(),
        "{found:?} import the sidecar's modules; read the format from crate::published"
    );
}

/// One meaning per name: no two structs or enums of src/ share a name (three `Session`s, two
/// `Refusal`s, `Window`s, `Phase`s, `HoldEnd`s, `Eviction`s, `Acquired`s, `Found`s, `Mode`s,
/// `Published`s, `Step`s, `Waited`s... were renamed after the module they serve; a public
/// API name such as `pool::Acquired` kept its name). Test modules may reuse names.
#[test]
fn no_two_types_share_a_name() {
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for path in files("src", &["rs"]) {
        let text = std::fs::read_to_string(&path).unwrap();
        for line in code_of(&text).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let kind = words.iter().position(|w| *w == "struct" || *w == "enum");
            let Some(at) = kind else { continue };
            // Only item declarations: the keyword opens the line or follows a visibility.
            if !words[..at]
                .iter()
                .all(|w| w.starts_with("pub") || w.starts_with("#["))
            {
                continue;
            }
            if let Some(name) = words.get(at + 1) {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                seen.entry(name).or_default().push(relative(&path));
            }
        }
    }
    let clashes: Vec<_> = seen.iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(clashes.is_empty(), "types sharing a name: {clashes:?}");
}

/// Most lines of code (tests and comments left out) one file of src/ may hold: style.md asks
/// for one concept per file, mostly 50-400 lines; the largest held 423 when this check came (blank lines not counted).
/// A file that outgrows it is split by concept, not the bound raised.
const MOST_CODE_LINES: usize = 500;

/// One concept per file: no file of src/ holds more than [`MOST_CODE_LINES`] lines of code.
#[test]
fn no_source_file_outgrows_one_concept() {
    let long: Vec<(String, usize)> = files("src", &["rs"])
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let lines = code_of(&text)
                .lines()
                .filter(|line| !line.trim().is_empty())
                .count();
            (relative(&path), lines)
        })
        .filter(|(_, lines)| *lines > MOST_CODE_LINES)
        .collect();
    assert!(
        long.is_empty(),
        "files over {MOST_CODE_LINES} lines of code: {long:?}"
    );
}
