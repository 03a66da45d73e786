//! The documentation's links hold: every relative link in README.md and docs/*.md names a file
//! that exists and, with `#anchor`, a heading of that file; every `runbook_url` under k8s/
//! names a heading of a file under docs/. Anchors follow GitHub's rules: lowercase,
//! punctuation dropped, each space a `-`, a repeated heading gets `-1`, `-2`, ...

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Lines of `markdown` outside ``` fences, numbered from 1.
fn prose_lines(markdown: &str) -> Vec<(usize, &str)> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence {
            lines.push((i + 1, line));
        }
    }
    lines
}

/// GitHub's anchor of a heading's text: lowercase; letters, digits, `_` and `-` kept, each
/// space turned into `-`, everything else (backticks, `:`, `,`, `(`, `.`) dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of every ATX heading (`#` to `######`) of `markdown`; a repeated anchor gets
/// `-1`, `-2`, ... as on GitHub.
fn anchors(markdown: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = HashSet::new();
    for (_, line) in prose_lines(markdown) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        let Some(text) = line[hashes..].strip_prefix(' ') else {
            continue;
        };
        if !(1..=6).contains(&hashes) {
            continue;
        }
        let base = slug(text);
        let n = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    anchors
}

/// Targets of the inline links `[text](target)` of `markdown` outside code fences and
/// code spans, with their line numbers.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose_lines(markdown) {
        // Drop code spans: text between backticks is not a link.
        let prose: String = line
            .split('`')
            .enumerate()
            .filter(|(i, _)| i % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(start) = rest.find("](") {
            rest = &rest[start + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            found.push((number, rest[..end].to_string()));
            rest = &rest[end..];
        }
    }
    found
}

/// Why `target` (a path relative to `base`, maybe with `#anchor`) does not resolve, if it
/// does not: the file is missing, or the anchor is no heading of that Markdown file.
fn broken(base: &Path, target: &str, this_file: &Path) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file: PathBuf = if path.is_empty() {
        this_file.to_path_buf()
    } else {
        base.join(path)
    };
    if !file.exists() {
        return Some(format!("no file {}", file.display()));
    }
    let anchor = anchor?;
    if file.extension().and_then(|e| e.to_str()) != Some("md") {
        return Some(format!(
            "#{anchor} on {}, which is not Markdown",
            file.display()
        ));
    }
    if !anchors(&read(&file)).contains(anchor) {
        return Some(format!("no heading #{anchor} in {}", file.display()));
    }
    None
}

/// README.md and every Markdown file under docs/.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn anchors_follow_github_rules() {
    let text = "# Lock: `snowlease lock`\n## HTTP API: `snowlease pool serve`\n\
                ```sh\n# not a heading\n```\n### Deploy, step by step\n\
                ## What happens on each fault\n## What happens on each fault\n#not-a-heading\n";
    let expected: HashSet<String> = [
        "lock-snowlease-lock",
        "http-api-snowlease-pool-serve",
        "deploy-step-by-step",
        "what-happens-on-each-fault",
        "what-happens-on-each-fault-1",
    ]
    .map(String::from)
    .into();
    assert_eq!(anchors(text), expected);
}

#[test]
fn broken_links_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.md");
    std::fs::write(
        &a,
        "# Title\n\nSee [b](b.md#there), [c](c.md), [t](#title), `[x](y.md)`.\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("b.md"), "# Elsewhere\n").unwrap();
    let text = read(&a);
    let found: Vec<(usize, String)> = links(&text);
    assert_eq!(
        found.iter().map(|(_, t)| t.as_str()).collect::<Vec<_>>(),
        ["b.md#there", "c.md", "#title"]
    );
    let why = |t: &str| broken(dir.path(), t, &a);
    assert!(why("b.md#there").unwrap().contains("no heading #there"));
    assert!(why("c.md").unwrap().contains("no file"));
    assert_eq!(why("#title"), None);
    assert_eq!(why("b.md#elsewhere"), None);
}

/// Every relative link of README.md and docs/*.md resolves to a file and heading.
#[test]
fn relative_links_in_readme_and_docs_resolve() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            if let Some(why) = broken(file.parent().unwrap(), &target, &file) {
                problems.push(format!("{}:{line}: ({target}) {why}", file.display()));
            }
        }
    }
    assert!(
        checked >= 20,
        "only {checked} links found: the link parser is broken"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

/// Every alert under k8s/ carries a `runbook_url` (a path from the repository root), and
/// each names a heading of a file under docs/.
#[test]
fn runbook_urls_name_headings_of_the_docs() {
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in files_under(&root().join("k8s")) {
        let text = read(&file);
        let alerts = text.matches("- alert:").count();
        let urls: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("runbook_url:"))
            .map(|v| v.trim().trim_matches('"'))
            .collect();
        if urls.len() != alerts {
            problems.push(format!(
                "{}: {alerts} alerts, {} runbook_url",
                file.display(),
                urls.len()
            ));
        }
        for url in urls {
            checked += 1;
            if !url.starts_with("docs/") || !url.contains('#') {
                problems.push(format!("{}: {url} is no docs/ section", file.display()));
            } else if let Some(why) = broken(root(), url, &file) {
                problems.push(format!("{}: {url}: {why}", file.display()));
            }
        }
    }
    assert!(checked > 0, "no runbook_url under k8s/");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// CI and new users find the test command in README.md.
#[test]
fn readme_names_the_test_command() {
    assert!(read(&root().join("README.md")).contains("\n./scripts/test.sh\n"));
}
