//! The `snowlease` binary: parse flags, validate, set up logging, run one
//! mode, map the outcome to an exit code ([`snowlease::exit`], README
//! "Exit codes").

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use snowlease::cli::LogFormat;
use snowlease::{exec, exit, pool, shutdown, worker_id};
use tracing_subscriber::EnvFilter;

/// Leases Snowflake worker IDs and resource pools in Redis.
#[derive(Parser)]
#[command(name = "snowlease", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the worker-ID sidecar: claim an ID, renew it, publish it.
    Worker(worker_id::args::WorkerArgs),
    /// Run CMD with the published worker ID in its environment; stop it when the ID is lost.
    Exec(exec::ExecArgs),
    /// Print the published worker ID (for shell scripts).
    Id(exec::IdArgs),
    /// Show which worker IDs of an app are held, by whom, for how long (read-only).
    Status(worker_id::status::StatusArgs),
    /// Copy this binary into DIR (an init container sharing it with the app).
    Install(exec::InstallArgs),
    /// Lease resource ids from a Redis pool: init, acquire, release, ..., serve (HTTP).
    Pool(pool::cli::PoolArgs),
}

impl Command {
    /// How error messages of this command start.
    fn prefix(&self) -> &'static str {
        match self {
            Self::Exec(_) => "snowlease exec",
            Self::Id(_) => "snowlease id",
            Self::Pool(_) => "snowlease pool",
            _ => "snowlease",
        }
    }
}

/// `eprintln!` that ignores a closed stderr instead of panicking, so the
/// exit code stays the documented one.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

fn main() -> ExitCode {
    let command = Cli::parse().command;
    let prefix = command.prefix();
    match run(command) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            let code = exit::code_of(&err);
            let text = describe(err.as_ref());
            if code != exit::BAD_INPUT {
                tracing::error!(error = %text, "exiting");
            }
            report!("{prefix}: {text}");
            ExitCode::from(code)
        }
    }
}

/// Validates the flags (nothing is touched before), then runs the command.
/// Returns the exit code of a run that did its job (`exec` passes its
/// command's code through).
fn run(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Worker(args) => {
            let config = args.validate()?;
            init_logging(args.log.log_format);
            block_on(async move { worker_id::run(config, shutdown::listen()?).await })?;
        }
        Command::Exec(args) => {
            let config = args.validate()?;
            init_logging(args.log.log_format);
            return Ok(exec::run_exec(&config)?);
        }
        Command::Id(args) => {
            let (source, wait) = args.validate()?;
            println!("{}", exec::run_id(&source, wait)?);
        }
        Command::Status(args) => {
            let config = args.validate()?;
            block_on(async move { worker_id::status::run(&config).await })?;
        }
        Command::Install(args) => println!("{}", exec::install(&args.dir)?.display()),
        Command::Pool(args) => {
            let config = args.validate()?;
            init_logging(args.log_format());
            block_on(pool::cli::run(config))?;
        }
    }
    Ok(0)
}

fn block_on<F: Future<Output = anyhow::Result<()>>>(fut: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(fut)
}

/// An error with its causes, each said once: a redis-rs error repeats its
/// own text as its source, which `{:#}` would print twice.
fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("SNOWLEASE_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        // A closed stderr (log pipe gone) must not turn into a panic that
        // skips the release of the lease.
        .log_internal_errors(false);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
