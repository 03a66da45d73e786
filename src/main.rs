//! The `snowlease` binary: parse flags, validate, set up logging, run one
//! mode, map the outcome to an exit code (see README.md, "Exit codes").

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use snowlease::config::{ConfigError, LogFormat, WorkerArgs};
use snowlease::worker::WorkerError;
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
    Worker(WorkerArgs),
    /// Run CMD with the published worker ID in its environment; stop it when the ID is lost.
    Exec(snowlease::exec::ExecArgs),
    /// Print the published worker ID (for shell scripts).
    Id(snowlease::exec::IdArgs),
    /// Show which worker IDs of an app are held, by whom, for how long (read-only).
    Status(snowlease::status::StatusArgs),
    /// Copy this binary into DIR (an init container sharing it with the app).
    Install(snowlease::exec::InstallArgs),
    /// Lease resource ids from a Redis pool: init, acquire, release, ..., serve (HTTP).
    Pool(snowlease::pool::cli::PoolArgs),
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
    let cli = Cli::parse();
    match cli.command {
        Command::Worker(args) => {
            let config = match args.validate() {
                Ok(config) => config,
                Err(err) => return config_error(&err),
            };
            init_logging(args.log_format);
            finish(block_on(async move {
                let shutdown = snowlease::shutdown::listen()?;
                snowlease::sidecar::run_worker(config, shutdown).await
            }))
        }
        // Exit codes of exec: the command's, 75 ID lost, 3 no ID, 126/127 cannot start.
        Command::Exec(args) => {
            let config = match args.validate() {
                Ok(config) => config,
                Err(err) => return config_error(&err),
            };
            init_logging(args.log_format);
            snowlease::exec::run_exec(&config).map_or_else(
                |err| {
                    report!("snowlease exec: {}", describe(&err));
                    ExitCode::from(err.exit_code())
                },
                ExitCode::from,
            )
        }
        Command::Id(args) => {
            let (source, wait) = match args.validate() {
                Ok(valid) => valid,
                Err(err) => return config_error(&err),
            };
            match snowlease::exec::run_id(&source, wait) {
                Ok(worker_id) => {
                    println!("{worker_id}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    report!("snowlease id: {}", describe(&err));
                    ExitCode::from(err.exit_code())
                }
            }
        }
        Command::Status(args) => {
            let config = match args.validate() {
                Ok(config) => config,
                Err(err) => return config_error(&err),
            };
            finish(block_on(
                async move { snowlease::status::run(&config).await },
            ))
        }
        Command::Install(args) => match snowlease::exec::install(&args.dir) {
            Ok(path) => {
                println!("{}", path.display());
                ExitCode::SUCCESS
            }
            Err(err) => finish(Err(err)),
        },
        // Exit codes of pool: 2 bad input, 3 nothing due, 4 not owner or expired.
        Command::Pool(args) => {
            let config = match args.validate() {
                Ok(config) => config,
                Err(err) => return config_error(&err),
            };
            init_logging(args.log_format());
            block_on(snowlease::pool::cli::run(config)).map_or_else(
                |err| {
                    report!("snowlease pool: {}", describe(err.as_ref()));
                    ExitCode::from(snowlease::pool::cli::exit_code(&err))
                },
                |()| ExitCode::SUCCESS,
            )
        }
    }
}

fn block_on<F: Future<Output = anyhow::Result<()>>>(fut: F) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(fut)
}

fn config_error(err: &ConfigError) -> ExitCode {
    report!("snowlease: {err}");
    ExitCode::from(2)
}

/// Exit codes: 0 clean stop, 2 bad configuration, 3 no ID claimed in time,
/// 4 lease lost with `--on-loss exit`, 1 anything else.
fn finish(result: anyhow::Result<()>) -> ExitCode {
    let Err(err) = result else {
        return ExitCode::SUCCESS;
    };
    let text = describe(err.as_ref());
    tracing::error!(error = %text, "exiting");
    report!("snowlease: {text}");
    match err.downcast_ref::<WorkerError>() {
        Some(WorkerError::ClaimTimeout { .. }) => ExitCode::from(3),
        Some(WorkerError::LeaseLost { .. }) => ExitCode::from(4),
        _ if err.downcast_ref::<ConfigError>().is_some() => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
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
