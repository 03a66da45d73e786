//! Worker-ID mode: the sidecar that claims a free worker ID of an
//! app, renews it, and publishes it to the app beside it; `status` reads the
//! same keys. This file wires the parts together and fixes the shutdown
//! order (unpublish first, then release); mint mode is a component started
//! from the keeper's state (`mint::spawn`), whose error is the exit.
//!
//! # Layout
//! - [`args`]: flags of `worker` (and the app-key group `status` shares), validated.
//! - [`claim`]: key names, `claim.lua` (re-adopt ours, else lowest free ID), the claimer (a range of at most 32 IDs in one window, a larger one in interleaved windows of at most 16).
//! - `state`: `WorkerState`, the one value the keeper writes and every publisher reads; `Mode`,
//!   publishing the worker ID or minting with it.
//! - `keeper`: the claim / renew / loss loop, the only writer of the state; releases at the stop;
//!   its timing rules as pure functions (`keeper/schedule.rs`), the Redis outage they ride
//!   through, logged at start (`keeper/sizing.rs`), and its side of the gate (`keeper/gate.rs`).
//! - `gate`: the checks a confirmed write passes before it counts (claim, renew, and mint
//!   mode's reservation), in order; the keeper and the reserver share them.
//! - [`range`]: the worker IDs a sidecar claims (`--worker-ids`), so regions split one ID space.
//! - [`guard`]: `snowlease guard open`, first use without waiting one TTL.
//! - [`carry`]: `snowlease mint carry-over`, a change of the ID format under a new app.
//! - `publish`: the ID file, the state file and the lock file as the sidecar writes them (their
//!   format: `crate::published`), and the routes `/id`, `/readyz`, `/metrics`.
//! - `metrics`: Prometheus metrics of worker mode.
//! - [`mint`]: mint mode, a component riding on the keeper: minting IDs under the lease, `/next`.
//! - [`status`]: `snowlease status`, a read-only view of an app's leases.

pub mod args;
pub mod carry;
pub mod claim;
pub(crate) mod gate;
pub mod guard;
pub(crate) mod keeper;
pub mod keys;
pub(crate) mod limits;
pub(crate) mod metrics;
pub mod mint;
pub(crate) mod publish;
pub mod range;
pub(crate) mod state;
pub mod status;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::args::{LeaseSettings, WorkerConfig};
use self::keeper::sizing;
use self::keeper::{Worker, WorkerParams};
use self::metrics::WorkerMetrics;
use self::mint::KeeperLink;
use self::publish::routes::WorkerHttp;
use self::publish::{files, routes, writer};
use crate::config_error::ConfigError;
use crate::identity::{Owner, resolve_identity};
use crate::timing::ms;
use crate::{atomic_file, http};

/// Logs at start what the lease settings ride through (docs/operations.md, "Sizing for Redis
/// outages"): the Redis outage during which the ID stays published, wherever it starts and
/// at best, and how long a crashed pod's ID stays taken. In mint mode minting rides through
/// less: at most the last reservation's lead, `--mint-window` (docs/worker.md, "Mint mode").
fn log_outage_budget(settings: &LeaseSettings, mint_window: Option<Duration>) {
    let budget = sizing::OutageBudget::sidecar(settings);
    let (held_min, held_max) = sizing::crashed_pod_holds(settings);
    // The values in the text too: a reader of text logs should not have to
    // match field names to the sentence.
    let secs = |d: Duration| format!("{:.1}s", d.as_secs_f64());
    let (guaranteed, best) = (secs(budget.guaranteed), secs(budget.best));
    let (rides, message) = match mint_window {
        None => (
            None,
            format!(
                "the ID stays published through a Redis outage of {guaranteed} ({best} if it starts right after a renew); an app under exec rides through less: a renewal must come --grace + --poll before the deadline (table in docs/operations.md, Sizing for Redis outages)"
            ),
        ),
        Some(window) => (
            Some(ms(window)),
            format!(
                "the lease stays held through a Redis outage of {guaranteed} ({best} at best); minting goes on through at most {} of it (the last reservation's lead, --mint-window), then /next answers 503 reserving until Redis answers (docs/worker.md, Mint mode)",
                secs(window)
            ),
        ),
    };
    info!(
        ttl_ms = ms(settings.ttl),
        renew_interval_ms = ms(settings.renew_interval),
        retries = settings.retries,
        outage_ridden_ms = ms(budget.guaranteed),
        outage_ridden_best_ms = ms(budget.best),
        mint_outage_ridden_ms = rides,
        crashed_pod_id_taken_min_ms = ms(held_min),
        crashed_pod_id_taken_max_ms = ms(held_max),
        "{message}"
    );
}

/// Runs the worker-ID sidecar until `shutdown` fires or the lease cannot be
/// (re)claimed. In mint mode the mint component rides on the keeper
/// ([`mint`]'s `spawn`); its error is the exit.
///
/// Errors: `keeper::WorkerError` inside the `anyhow::Error` for claim
/// timeout (exit 3) and loss with `--on-loss exit` (exit 4);
/// `files::OutputLockError` when another live process uses the same
/// `--output-file`; a `ConfigError` (exit 2) when mint mode finds another
/// ID format recorded for the app; I/O errors for the listeners and the
/// output folder.
pub async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (identity, source) = resolve_identity(config.identity.as_deref());
    let owner = Owner::generate(&identity);
    info!(identity = %identity, source = ?source, app = %config.app, redis = %config.redis, "starting worker-ID sidecar");
    log_settings(&config);
    // The lock is held until this function returns: the process owns the ID
    // file and the state file.
    let (folder, _output_lock) = open_output(&config.output_file)?;
    let listener = http::bind(config.listen)
        .with_context(|| format!("cannot listen on --listen {}", config.listen))?;
    let conn = config.redis.connect(config.lease.call_timeout())?;
    // Claims and renewals answer their own repeat (a claim "already ours").
    conn.resend_after_idle();

    let metrics = Arc::new(WorkerMetrics::default());
    metrics
        .worker_ids
        .set(i64::from(config.lease.worker_ids.len()));
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    http::register_build_info(&mut registry);
    let recorder = ranges_recorder(&config, conn.clone(), metrics.clone());
    let recorded = files::read_state(&config.output_file, &config.app);
    let (worker, state_rx) = Worker::new(
        conn.clone(),
        owner,
        keeper_params(&config),
        recorded,
        metrics,
    );
    let http_stop = CancellationToken::new();
    // Before the keeper claims: a sidecar of another ID format stops here.
    let mint = match config.mint_params() {
        Some(params) => {
            let keeper = KeeperLink {
                state: state_rx.clone(),
                renew_now: worker.renew_signal(),
            };
            let stops = (shutdown.clone(), http_stop.clone());
            Some(mint::spawn(params, conn, keeper, &mut registry, stops).await?)
        }
        None => None,
    };
    let (mint, minting) = mint.unzip();
    let recorder = tokio::spawn(recorder.run(state_rx.clone(), shutdown.clone()));

    let mut router = routes::worker_router(WorkerHttp {
        app: config.app.as_str().into(),
        state: state_rx.clone(),
        registry: Arc::new(registry),
        mode: config.mode(),
    });
    if let Some(mint) = &mint {
        router = router.merge(mint.routes_on_listen());
    }
    // On its own thread: a flood of connections never delays a renewal or
    // the unpublishing at the deadline, which run on this one.
    let http_task = http::serve_on_own_thread(listener, router, config.http, http_stop.clone())
        .context("cannot start the http thread")?;
    let (output_file, app, mode) = (
        config.output_file.clone(),
        config.app.clone(),
        config.mode(),
    );
    let publisher = tokio::spawn(async move {
        writer::run_publisher(state_rx, folder, &output_file, app, mode).await
    });

    // The keeper unpublishes (awaits the publisher, and in mint mode the
    // reserver stopping the minter and recording its last timestamp), then
    // removes every key of ours, also one a claim left whose reply was lost.
    let mut minted = Ok(());
    let unpublished = async {
        let _ = publisher.await;
        if let Some(task) = minting {
            minted = task.await.unwrap_or(Ok(()));
        }
    };
    let stopped = worker.run(shutdown, unpublished).await;
    recorder.abort();

    // The state file stays, marked `release_unconfirmed`, while its key may
    // still hold its owner string: the next start re-adopts it at once
    // (docs/worker.md, "How the worker-ID sidecar behaves"). A record of an earlier process that this one never
    // adopted is not ours to drop.
    let recorded = files::read_state(&config.output_file, &config.app);
    if stopped.released && recorded.is_none_or(|r| r.owner == stopped.owner.as_str()) {
        writer::remove_state(&config.output_file);
    }
    http_stop.cancel();
    if crate::timing::within(Duration::from_secs(1), http_task)
        .await
        .is_none()
    {
        warn!("http server did not stop within 1s");
    }
    if let Some(mint) = mint {
        mint.socket_stopped().await;
    }
    minted.map_err(ConfigError::from)?;
    // Every stop reason names the Redis it concerns (for a claim timeout the
    // first question); the exit code still comes from the WorkerError.
    stopped
        .result
        .with_context(|| format!("redis {}", config.redis))?;
    info!("stopped");
    Ok(())
}

/// Logs what the settings ride through, and warns of settings that weaken a guarantee.
fn log_settings(config: &WorkerConfig) {
    let mint_window = config.mint.as_ref().map(|m| m.max_lead());
    log_outage_budget(&config.lease, mint_window);
    // Two nodes within the skew bound differ by up to twice it (docs/worker.md, "ID handover").
    if config.handover_delay < 2 * config.max_clock_skew {
        warn!(
            handover_delay_ms = ms(config.handover_delay),
            max_clock_skew_ms = ms(config.max_clock_skew),
            "--handover-delay is below twice --max-clock-skew: the next holder of a released ID may mint in milliseconds the last one used"
        );
    }
    if config.allow_evicting_redis {
        warn!(
            "--allow-evicting-redis: maxmemory-policy is not checked; on a Redis that evicts keys one worker ID can be published twice"
        );
    }
}

/// Creates and opens the folder of `output_file`, then takes the output lock
/// ([`files::lock_output`]), before the state file is read or Redis is used.
/// The folder is kept open: the files are written relative to it (one
/// descriptor per write, none per check), so a process short of descriptors
/// still keeps them fresh.
///
/// Errors: the folder cannot be created or opened; another live process
/// holds the lock (`files::OutputLockError`).
fn open_output(output_file: &Path) -> anyhow::Result<(atomic_file::Folder, std::fs::File)> {
    let dir = output_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    atomic_file::create_dir_all_readable(dir).with_context(|| {
        format!(
            "cannot create the folder of --output-file {}",
            dir.display()
        )
    })?;
    let folder = atomic_file::Folder::open(dir)
        .with_context(|| format!("cannot open the folder of --output-file {}", dir.display()))?;
    let lock = files::lock_output(output_file)?;
    Ok((folder, lock))
}

/// What the keeper takes of the settings; nothing about files or HTTP.
fn keeper_params(config: &WorkerConfig) -> WorkerParams {
    WorkerParams {
        app: config.app.clone(),
        settings: config.lease.clone(),
        on_loss: config.on_loss,
        claim_timeout: config.claim_timeout,
        allow_evicting_redis: config.allow_evicting_redis,
        min_replicas_ack: config.min_replicas_ack,
        max_clock_skew: config.max_clock_skew,
        handover_delay: config.handover_delay,
        mode: config.mode(),
    }
}

/// The record of the claimed range (`--worker-ids`), kept beside the leases for `status`.
fn ranges_recorder(
    config: &WorkerConfig,
    conn: crate::connection::Redis,
    metrics: Arc<WorkerMetrics>,
) -> range::record::RangeRecorder {
    range::record::RangeRecorder {
        conn,
        key: keys::LeaseKeys::new(&config.lease.key_prefix, &config.app).ranges(),
        range: config.lease.worker_ids,
        ttl: config.lease.ttl,
        // Not the renewals' bound: the record is only a report, on its own task (aborted at
        // the stop), and a call timed out at the renewals' short bound dropped the connection
        // the renewals share, so a loaded Redis cost them a reconnect.
        call_timeout: crate::timing::COMMAND_CALL_TIMEOUT,
        metrics,
    }
}
