//! The `snowlease` binary: parse flags, validate, set up logging, run one
//! mode, map the outcome to an exit code ([`snowlease::exit`],
//! docs/operations.md "Exit codes").

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use snowlease::cli::{ConfigError, LogFormat, check_range, parse_duration, stdout_line};
use snowlease::logging::{self, LogGuard, Run};
use snowlease::{budget, exec, exit, failure, lock, open_files, pool, shutdown, worker_id};

/// `--version`: the crate version and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SNOWLEASE_COMMIT"),
    ")"
);

/// Leases Snowflake worker IDs and resource pools in Redis.
#[derive(Parser)]
#[command(name = "snowlease", version = VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the worker-ID sidecar: claim an ID, renew it, publish it.
    #[command(after_help = exit::HELP)]
    Worker(worker_id::args::WorkerArgs),
    /// Run CMD with the published worker ID in its environment; stop it when the ID is lost.
    #[command(after_help = exit::HELP)]
    Exec(exec::ExecArgs),
    /// Print the published worker ID (for shell scripts).
    #[command(after_help = exit::HELP)]
    Id(exec::IdArgs),
    /// Show which worker IDs of an app are held, by whom, for how long (read-only).
    #[command(after_help = exit::HELP)]
    Status(worker_id::status::StatusArgs),
    /// Manage an app's claim guard: `guard open` lets the first sidecars of a new app claim at once.
    #[command(after_help = exit::HELP)]
    Guard(worker_id::guard::GuardArgs),
    /// Mint mode's one-off steps: `mint carry-over` for a change of the ID format.
    #[command(after_help = exit::HELP)]
    Mint(worker_id::carry::MintCommandArgs),
    /// Copy this binary into DIR (an init container sharing it with the app).
    Install(exec::InstallArgs),
    /// Lease resource ids from a Redis pool: init, acquire, release, ..., serve (HTTP).
    #[command(after_help = exit::HELP)]
    Pool(pool::cli::PoolArgs),
    /// Rate budgets per domain or account (GCRA in Redis): take, penalize.
    #[command(after_help = exit::HELP)]
    Budget(budget::cli::BudgetArgs),
    /// Run CMD while holding a named lock in Redis (a distributed mutex with a fencing token).
    #[command(after_help = exit::HELP)]
    Lock(lock::LockArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff, from the same flag definitions) to stdout: `snowlease man worker | man -l -`.
    Man {
        /// The subcommand whose page (with its flags) to print, e.g. `worker` or `pool acquire`;
        /// none: the top-level page.
        subcommand: Vec<String>,
    },
    /// Wait DURATION, then exit 0: a preStop hook for images without a shell (k8s/plain-sidecar/).
    Sleep(SleepArgs),
}

/// `snowlease sleep`: Kubernetes before 1.30 has no `preStop.sleep`, and the
/// snowlease image has no `sleep` binary to exec.
#[derive(clap::Args)]
struct SleepArgs {
    /// How long to wait (0s-1h), e.g. 20s.
    #[arg(value_parser = parse_duration)]
    duration: Duration,
}

impl Command {
    /// `lock --quiet`.
    fn quiet(&self) -> bool {
        matches!(self, Self::Lock(args) if args.quiet)
    }

    /// How error messages of this command start.
    fn prefix(&self) -> &'static str {
        match self {
            Self::Exec(_) => "snowlease exec",
            Self::Id(_) => "snowlease id",
            Self::Pool(_) => "snowlease pool",
            Self::Budget(_) => "snowlease budget",
            Self::Lock(_) => "snowlease lock",
            _ => "snowlease",
        }
    }
}

fn main() -> ExitCode {
    let (cli, env_sources) = parse();
    let command = cli.command;
    let prefix = command.prefix();
    let quiet = command.quiet();
    // Outlives `run`, so the last log lines are flushed (1 s at most).
    let mut log = None;
    match run(command, &mut log) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            let code = failure::code_of(&err);
            // `lock --quiet`: held by another host is an outcome cron
            // expects, not a failure to mail.
            if quiet && lock::held_elsewhere(&err) {
                return ExitCode::from(code);
            }
            let mut text = failure::describe(err.as_ref());
            // A bad value read from the environment names its variable.
            if let Some(flag) = err.downcast_ref::<ConfigError>().map(|e| e.flag)
                && let Some(env) = env_sources.env_of(flag)
            {
                text = text.replacen(
                    flag,
                    &format!("{env} (the environment variable of {flag})"),
                    1,
                );
            }
            // JSON logs get the error as an event too, for log platforms; in
            // text the plain line below says it once.
            // A sidecar that stopped in order is no error: INFO.
            let released = matches!(
                err.downcast_ref::<exec::ExecError>(),
                Some(exec::ExecError::Released { .. })
            );
            if log.as_ref().is_some_and(|l| l.format() == LogFormat::Json) {
                match released {
                    true => tracing::info!(error = %text, "exiting"),
                    false => tracing::error!(error = %text, "exiting"),
                }
            }
            // Flush the queued log lines first: the plain line is the last.
            drop(log.take());
            report(format!("{prefix}: {text}"));
            ExitCode::from(code)
        }
    }
}

/// Parses the command line (clap errors rewritten by
/// [`snowlease::cli::explain`]); returns which flags came from the
/// environment too. clap's command tree and matches are dropped here, before
/// the runtime allocates: the sidecar's idle heap does not keep them.
fn parse() -> (Cli, snowlease::cli::EnvSources) {
    // Not built up front (`Command::build` builds every subcommand's flags): parsing builds the
    // subcommands it walks through, so the heap's peak at start, which stays in the idle
    // sidecar's RSS, holds one subcommand's tree; an error builds the rest to explain itself.
    let mut root = Cli::command();
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // Parsed in place: a clone of the tree (every subcommand's flags) doubled the heap's
    // peak at start, which the sidecar's idle RSS keeps.
    let parsed = root
        .try_get_matches_from_mut(std::env::args_os())
        .and_then(|matches| Ok((Cli::from_arg_matches(&matches)?, matches)));
    match parsed {
        Ok((cli, matches)) => (cli, snowlease::cli::EnvSources::of(&root, &matches)),
        Err(err) if err.use_stderr() => {
            root.build();
            snowlease::cli::explain(err, &root, &argv).exit()
        }
        Err(err) => err.exit(),
    }
}

/// Validates the flags (nothing is touched before), then runs the command.
/// Commands that run until stopped raise the open-file soft limit first,
/// before the runtime starts ([`open_files::raise_soft_limit`]).
/// Returns the exit code of a run that did its job (`exec` and `lock` pass
/// their command's code through); every failure is an error, mapped to its
/// code by [`failure::code_of`].
fn run(command: Command, log: &mut Option<LogGuard>) -> anyhow::Result<u8> {
    match command {
        Command::Worker(args) => {
            let config = args.validate()?;
            *log = Some(logging::init(args.log.log_format, Run::UntilStopped)?);
            open_files::raise_soft_limit();
            block_on(async move { worker_id::run(config, shutdown::listen()?).await })?;
        }
        Command::Exec(args) => {
            let config = args.validate()?;
            *log = Some(logging::init(args.log.log_format, Run::UntilStopped)?);
            open_files::raise_soft_limit();
            return block_on(async move { Ok(exec::run_exec(&config).await?) });
        }
        Command::Lock(args) => {
            let config = args.validate()?;
            let run = if args.quiet { Run::Quiet } else { Run::Once };
            *log = Some(logging::init(args.log.log_format, run)?);
            open_files::raise_soft_limit();
            return block_on(async move { Ok(lock::run(&config).await?) });
        }
        Command::Id(args) => {
            let (source, wait) = args.validate()?;
            let id = block_on(async move { Ok(exec::run_id(&source, wait).await?) })?;
            stdout_line(&id.to_string())?;
        }
        Command::Status(args) => {
            let config = args.validate()?;
            block_on(async move { worker_id::status::run(&config).await })?;
        }
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "snowlease", &mut out);
            stdout_line(String::from_utf8_lossy(&out).trim_end())?;
        }
        Command::Man { subcommand } => {
            let mut out = Vec::new();
            clap_mangen::Man::new(man_page_of(&subcommand)?).render(&mut out)?;
            stdout_line(String::from_utf8_lossy(&out).trim_end())?;
        }
        Command::Guard(args) => {
            let config = args.validate()?;
            block_on(async move { worker_id::guard::open(&config).await })?;
        }
        Command::Mint(args) => {
            let worker_id::carry::MintCommand::CarryOver(carry) = args.command;
            let config = carry.validate()?;
            block_on(async move { worker_id::carry::carry_over(&config).await })?;
        }
        Command::Install(args) => {
            stdout_line(&exec::install(&args.dir)?.display().to_string())?;
        }
        Command::Sleep(args) => {
            check_range(
                "DURATION",
                args.duration,
                Duration::ZERO,
                Duration::from_secs(3600),
            )?;
            std::thread::sleep(args.duration);
        }
        Command::Pool(args) => {
            let config = args.validate()?;
            let pool_run = if args.is_serve() {
                Run::UntilStopped
            } else {
                Run::Once
            };
            *log = Some(logging::init(args.log_format(), pool_run)?);
            if args.is_serve() {
                open_files::raise_soft_limit();
            }
            block_on(pool::cli::run(config))?;
        }
        Command::Budget(args) => {
            let config = args.validate()?;
            *log = Some(logging::init(args.log_format(), Run::Once)?);
            block_on(budget::cli::run(config))?;
        }
    }
    Ok(0)
}

/// The command whose man page `man NAMES...` prints: built, so a
/// subcommand's page is titled `snowlease-<name>` like the top page's
/// "SEE ALSO" names it. Errors: a name that is no subcommand (exit 2).
fn man_page_of(names: &[String]) -> Result<clap::Command, ConfigError> {
    let mut page = Cli::command();
    page.build();
    for name in names {
        let known: Vec<String> = page
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect();
        page = page
            .find_subcommand(name)
            .cloned()
            .ok_or_else(|| ConfigError {
                flag: "SUBCOMMAND",
                reason: format!("no subcommand {name:?} (one of: {})", known.join(", ")),
            })?;
    }
    Ok(page)
}

/// Runs `fut` on a current-thread tokio runtime, for every command (the
/// worker's HTTP server gets a thread of its own besides:
/// `http::serve_on_own_thread`); `exec` and `lock` too, so their signals,
/// timers and Redis calls are all on one thread.
///
/// Why one thread also for `pool serve`, which answers many workers at
/// once: its work per request is short and mostly I/O, and on a
/// multi-thread runtime each Redis reply wakes the handler on the other
/// worker thread (a cross-thread wake-up per call). Measured with
/// `cargo bench --bench pool` (50 HTTP clients, 2 CPUs), the server spent
/// about a quarter less CPU per acquire+release cycle on one thread.
fn block_on<T, F: Future<Output = anyhow::Result<T>>>(fut: F) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(fut)
}

/// Prints the last words on stderr from a helper thread, waiting 500 ms at
/// most: a stderr pipe that nobody drains must not keep the process (and
/// its exit code) hostage; a closed one is ignored.
fn report(text: String) {
    let (done, wait) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = writeln!(std::io::stderr(), "{text}");
        let _ = done.send(());
    });
    let _ = wait.recv_timeout(Duration::from_millis(500));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A negative value of every duration flag of every command is explained: clap's
    /// "unexpected argument '-1'" gets the tip that a duration is not negative.
    #[test]
    fn every_duration_flag_explains_a_negative_value() {
        fn walk(cmd: &clap::Command, path: &[String], found: &mut Vec<String>, seen: &mut usize) {
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if arg.get_value_parser().type_id() != std::any::TypeId::of::<Duration>() {
                    continue;
                }
                *seen += 1;
                let mut argv = path.to_vec();
                argv.extend([format!("--{long}"), "-1s".to_owned()]);
                let mut root = Cli::command();
                let Err(err) = root.try_get_matches_from_mut(
                    std::iter::once("snowlease".to_owned()).chain(argv.iter().cloned()),
                ) else {
                    found.push(format!("{argv:?}: parsed"));
                    continue;
                };
                root.build();
                let text = snowlease::cli::explain(err, &root, &argv).to_string();
                if !text.contains("which is not negative") {
                    found.push(format!("{argv:?}: {text}"));
                }
            }
            for sub in cmd.get_subcommands() {
                let mut path = path.to_vec();
                path.push(sub.get_name().to_owned());
                walk(sub, &path, found, seen);
            }
        }
        let (mut found, mut seen) = (Vec::new(), 0);
        walk(&Cli::command(), &[], &mut found, &mut seen);
        assert!(seen >= 30, "only {seen} duration flags found");
        assert!(found.is_empty(), "not explained: {found:#?}");
    }
}
