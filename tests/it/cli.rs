//! Command-line habits: `--version` with the commit, `--help` with the exit codes and the log
//! variable, shell completions and the man page from the same flag definitions.

use crate::harness::*;

/// `--version` names the version and the commit it was built from.
#[test]
fn version_shows_the_commit() {
    let run = run_snowlease(&["--version"], &[], secs(5));
    assert_eq!(run.code, Some(0), "{run:?}");
    assert!(
        run.stdout
            .starts_with(&format!("snowlease {} (commit ", env!("CARGO_PKG_VERSION"))),
        "{run:?}"
    );
}

/// `worker --help` lists the exit codes and `SNOWLEASE_LOG`.
#[test]
fn worker_help_lists_exit_codes_and_the_log_variable() {
    let run = run_snowlease(&["worker", "--help"], &[], secs(5));
    assert_eq!(run.code, Some(0), "{run:?}");
    for needle in ["SNOWLEASE_LOG", "Exit codes", "  3 ", "  4 ", "  75 "] {
        assert!(
            run.stdout.contains(needle),
            "{needle:?} missing: {}",
            run.stdout
        );
    }
}

/// `status`, `id`, `guard` and `guard open --help` end with the exit-code table the others have
/// (they had none).
#[test]
fn every_command_help_lists_exit_codes() {
    for args in [
        &["status", "--help"][..],
        &["id", "--help"],
        &["guard", "--help"],
        &["guard", "open", "--help"],
        &["lock", "--help"],
        &["pool", "--help"],
    ] {
        let run = run_snowlease(args, &[], secs(5));
        assert_eq!(run.code, Some(0), "{args:?}: {run:?}");
        for needle in ["Exit codes", "  2 ", "  5 "] {
            assert!(run.stdout.contains(needle), "{args:?}: {needle:?} missing");
        }
    }
}

/// Exit 5 in `--help` names every command that gives it: `exec` and `id` refuse a minting
/// sidecar, `mint carry-over` an old app that still holds IDs (the line named `guard open`
/// only); `pool reap --help` says it ends quarantines too.
#[test]
fn help_names_every_source_of_exit_5_and_what_reap_returns() {
    for args in [&["id", "--help"][..], &["exec", "--help"]] {
        let run = run_snowlease(args, &[], secs(5));
        let line = run
            .stdout
            .split("\n  5 ")
            .nth(1)
            .and_then(|rest| rest.split("\n  6 ").next())
            .unwrap_or_else(|| panic!("{args:?}: no exit 5: {}", run.stdout));
        for needle in ["guard open", "mint mode", "mint carry-over"] {
            assert!(
                line.contains(needle),
                "{args:?}: {needle:?} missing: {line}"
            );
        }
    }
    let run = run_snowlease(&["pool", "reap", "--help"], &[], secs(5));
    assert!(run.stdout.contains("ended quarantine"), "{}", run.stdout);
}

/// `pool acquire --help` names the reclaim cooldown for what it is: the cooldown of expired
/// leases the call reclaims, not one after the caller's lease (`--cooldown` read as that,
/// once); the old name is still read but not shown.
#[test]
fn acquire_help_explains_the_reclaim_cooldown() {
    let run = run_snowlease(&["pool", "acquire", "--help"], &[], secs(5));
    assert_eq!(run.code, Some(0), "{run:?}");
    let help = &run.stdout;
    assert!(help.contains("--reclaim-cooldown <"), "{help}");
    assert!(
        help.contains("Not a cooldown after your own lease"),
        "{help}"
    );
    assert!(!help.contains("--cooldown <"), "{help}");
}

/// First-hour mistakes get messages that say what to do: a bad value from an
/// environment variable names the variable (clap named only the flag), at parse time and at
/// range check; the usage line never shows optional flags as required; `--listen 7391` gets an
/// example; `exec ./app` without `--` gets a hint.
#[test]
fn first_hour_mistakes_are_explained() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let run = run_snowlease(args, env, secs(5));
        assert_eq!(run.code, Some(2), "{args:?}: {run:?}");
        run.stderr
    };
    for value in ["abc", "0s"] {
        let err = run(&["worker", "--app", "x"], &[("SNOWLEASE_TTL", value)]);
        assert!(
            err.contains("SNOWLEASE_TTL") && err.contains("--ttl"),
            "{value}: {err}"
        );
    }
    let typed = run(&["worker", "--app", "x", "--ttl", "abc"], &[]);
    assert!(!typed.contains("SNOWLEASE_TTL"), "{typed}");
    let typed_env = [("SNOWLEASE_TTL", "30s")];
    let typed = run(&["worker", "--app", "x", "--ttl", "0s"], &typed_env);
    assert!(
        !typed.contains("SNOWLEASE_TTL"),
        "typed, not from env: {typed}"
    );
    for args in [
        &["worker", "--redis-url", "redis://127.0.0.1:1"][..],
        &["worker", "--output-file", "/tmp/x/worker-id"],
        &["status", "--redis-url", "redis://127.0.0.1:1"],
    ] {
        let err = run(args, &[]);
        let usage = err.lines().find(|l| l.starts_with("Usage:")).unwrap_or("");
        assert!(usage.contains("[OPTIONS] --app <APP>"), "{args:?}: {err}");
        assert!(
            !usage.contains("--redis-url") && !usage.contains("--output-file"),
            "{err}"
        );
    }
    let err = run(&["worker", "--app", "x", "--listen", "7391"], &[]);
    assert!(err.contains("0.0.0.0:7391"), "{err}");
    let err = run(&["exec", "./app"], &[]);
    assert!(
        err.contains("put `--` before the command") && err.contains("-- ./app"),
        "{err}"
    );
}

/// `id --url` says the sidecar's URL once (it said it three times), with the cause.
#[test]
fn id_url_error_says_the_url_once() {
    let url = format!("http://127.0.0.1:{}", free_port());
    let run = run_snowlease(&["id", "--url", &url], &[], secs(10));
    assert_eq!(run.code, Some(3), "{run:?}");
    assert_eq!(run.stderr.matches(&url).count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("refused"), "{}", run.stderr);
}

/// `completions <shell>` prints a script that names the subcommands; `man` prints roff.
#[test]
fn completions_and_man_page_come_from_the_flags() {
    for shell in ["bash", "zsh", "fish"] {
        let run = run_snowlease(&["completions", shell], &[], secs(5));
        assert_eq!(run.code, Some(0), "{run:?}");
        assert!(
            run.stdout.contains("worker") && run.stdout.contains("pool"),
            "{shell}"
        );
    }
    let run = run_snowlease(&["completions", "tcsh"], &[], secs(5));
    assert_eq!(run.code, Some(2), "unknown shell is bad input: {run:?}");
    let man = run_snowlease(&["man"], &[], secs(5));
    assert_eq!(man.code, Some(0), "{man:?}");
    assert!(
        man.stdout.contains(".TH snowlease 1") && man.stdout.contains("worker"),
        "{man:?}"
    );
    // Each page the top page's SEE ALSO names, with its flags.
    for (names, title, flag) in [
        (&["worker"][..], ".TH snowlease-worker 1", "\\-\\-ttl"),
        (
            &["pool", "acquire"][..],
            ".TH snowlease-pool-acquire 1",
            "\\-\\-pool",
        ),
    ] {
        let page = run_snowlease(&[&["man"][..], names].concat(), &[], secs(5));
        assert_eq!(page.code, Some(0), "{page:?}");
        assert!(
            page.stdout.contains(title) && page.stdout.contains(flag),
            "{names:?}: {}",
            page.stdout
        );
    }
    let unknown = run_snowlease(&["man", "wroker"], &[], secs(5));
    assert_eq!(unknown.code, Some(2), "{unknown:?}");
    assert!(
        unknown.stderr.contains("\"wroker\"") && unknown.stderr.contains("worker"),
        "{unknown:?}"
    );
}

/// An unreadable `SNOWLEASE_LOG` is bad input: exit 2, the variable named, nothing written.
#[test]
fn unreadable_log_filter_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worker-id");
    let run = run_snowlease(
        &[
            "worker",
            "--app",
            "logs",
            "--redis-url",
            "redis://127.0.0.1:1",
            "--output-file",
            file.to_str().unwrap(),
        ],
        &[("SNOWLEASE_LOG", "snowlease=loud")],
        secs(10),
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.contains("SNOWLEASE_LOG"), "{run:?}");
    assert!(!file.exists());
}

/// A command that fails after its logging started says why once on stderr in text logs (it
/// was said twice: a log event and the plain last line), and in JSON logs also as an event.
#[test]
fn a_failing_command_states_its_error_once_in_text_logs() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    let status = |format: &str| {
        let args = ["pool", "status", "--pool", "p", "--redis-url", &url];
        let args = [&args[..], &["--log-format", format]].concat();
        run_snowlease(&args, &[], secs(20))
    };
    let text = status("text");
    assert_eq!(text.code, Some(1), "{text:?}");
    assert_eq!(
        text.stderr.matches("Connection refused").count(),
        1,
        "{text:?}"
    );
    let json = status("json");
    assert_eq!(json.code, Some(1), "{json:?}");
    let events = json
        .stderr
        .lines()
        .filter(|l| l.contains(r#""message":"exiting""#));
    assert_eq!(events.count(), 1, "{json:?}");
}

/// Bad input a new user typed exits 2 naming the flag and its allowed range in the docs' words:
/// a duration without a unit suggests `10s` (humantime said "10sec"); an out-of-range duration
/// is shown as typed with the range as the docs write it (was "1day 1h is outside 1s-1day");
/// a pool ttl that is whole ms but too long says "outside" (was "not a whole number of
/// milliseconds"); a bad db or port in the URL names it without the percent-encoding hint for
/// passwords, and echoes nothing of the URL.
#[test]
fn bad_input_is_named_in_the_docs_words() {
    let worker = ["worker", "--app", "a", "--output-file", "/nonexistent/x/id"];
    let cases: [(Vec<&str>, &[&str], &[&str]); 6] = [
        (
            [&worker[..], &["--ttl", "10"]].concat(),
            &["--ttl", "10s", "10ms"],
            &["10sec", "for example"],
        ),
        (
            [&worker[..], &["--claim-timeout", "25h"]].concat(),
            &["--claim-timeout", "25h is outside 1s-24h"],
            &["day"],
        ),
        (
            vec!["pool", "acquire", "--pool", "p", "--ttl", "11m"],
            &["--ttl", "11m is outside 1ms-10m"],
            &["whole number"],
        ),
        (
            vec!["pool", "acquire", "--pool", "p", "--ttl", "1500us"],
            &["--ttl", "1500us is not a whole number of milliseconds"],
            &["outside"],
        ),
        (
            vec![
                "status",
                "--app",
                "a",
                "--redis-url",
                "redis://:s3cr@127.0.0.1:18379/abc",
            ],
            &[
                "--redis-url",
                "the db in the URL's path (/<db>) must be a number 0-65535",
            ],
            &["percent-encode", "s3cr", "abc"],
        ),
        (
            vec![
                "status",
                "--app",
                "a",
                "--redis-url",
                "redis://:s3cr@127.0.0.1:99999/0",
            ],
            &[
                "--redis-url",
                "the port in the URL must be a number 1-65535",
            ],
            &["percent-encode", "s3cr", "99999"],
        ),
    ];
    for (argv, says, not) in cases {
        let run = run_snowlease(&argv, &[], secs(10));
        assert_eq!(run.code, Some(2), "{argv:?}: {run:?}");
        for text in says {
            assert!(run.stderr.contains(text), "{argv:?}: {text:?}: {run:?}");
        }
        for text in not {
            assert!(!run.stderr.contains(text), "{argv:?}: {text:?}: {run:?}");
        }
    }
}

/// Every whole-number flag names itself and its range for any number it cannot take: a
/// negative one (typed `--flag -1`, which clap read as an unknown flag `-1`), one too large for
/// its type (clap said "-1 is not in 0..=4294967295" or "number too large to fit in target
/// type") and no number at all (clap named no range); exit 2 each.
#[test]
fn whole_number_flags_name_their_range_for_any_bad_number() {
    let worker = ["worker", "--app", "a"];
    let budget = ["--budget", "b", "--budget-key", "k", "--budget-rate", "1/s"];
    let acquire = [&["pool", "acquire", "--pool", "p"][..], &budget[..]].concat();
    let take = [
        "budget", "take", "--name", "b", "--key", "k", "--rate", "1/s",
    ];
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (worker.to_vec(), "--max-worker-id", "0-1023"),
        (vec!["status", "--app", "a"], "--max-worker-id", "0-1023"),
        (
            vec!["guard", "open", "--app", "a"],
            "--max-worker-id",
            "0-1023",
        ),
        (worker.to_vec(), "--retries", "0-10"),
        (worker.to_vec(), "--min-replicas-ack", "0-16"),
        (worker.to_vec(), "--max-connections", "1-65536"),
        (
            vec!["pool", "serve", "--pool", "p"],
            "--max-connections",
            "1-65536",
        ),
        (vec!["pool", "reap", "--pool", "p"], "--limit", "1-1000"),
        (
            vec!["pool", "config", "--pool", "p", "--strike-window", "1m"],
            "--max-strikes",
            "1-100",
        ),
        (take.to_vec(), "--burst", "1-1000000"),
        (
            [&take[..], &["--burst", "5"]].concat(),
            "--cost",
            "1-1000000",
        ),
        (acquire.clone(), "--budget-burst", "1-1000000"),
        (
            [&acquire[..], &["--budget-burst", "5"]].concat(),
            "--budget-cost",
            "1-1000000",
        ),
    ];
    for (argv, flag, range) in cases {
        for (value, says) in [
            ("-1", "-1 is outside"),
            ("99999999999999999999", "99999999999999999999 is outside"),
            ("abc", "not a whole number"),
        ] {
            let argv = [&argv[..], &[flag, value]].concat();
            let run = run_snowlease(&argv, &[], secs(10));
            assert_eq!(run.code, Some(2), "{argv:?}: {run:?}");
            for text in [flag, range, says] {
                assert!(run.stderr.contains(text), "{argv:?}: {text:?}: {run:?}");
            }
        }
    }
}

/// A value that fails validation (a range decided after parsing) names the environment
/// variable it came from, and the flag when it was given on the command line.
#[test]
fn a_bad_value_from_the_environment_names_its_variable() {
    let run = run_snowlease(
        &["worker", "--app", "a"],
        &[("SNOWLEASE_RENEW_INTERVAL", "200s")],
        secs(5),
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr
            .contains("SNOWLEASE_RENEW_INTERVAL (the environment variable of --renew-interval)"),
        "{run:?}"
    );
    let run = run_snowlease(
        &["worker", "--app", "a", "--renew-interval", "200s"],
        &[],
        secs(5),
    );
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr.contains("for --renew-interval:") && !run.stderr.contains("SNOWLEASE_"),
        "{run:?}"
    );
}
