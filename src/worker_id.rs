//! Worker-ID mode: the sidecar that claims a free worker ID of an
//! app, renews it, and publishes it to the app beside it; `status` reads the
//! same keys. This file wires the parts together and fixes the shutdown
//! order (unpublish first, then release).
//!
//! # Layout
//! - [`args`]: flags of `worker` (and the app-key group `status` shares), validated.
//! - [`claim`]: key names, `claim.lua` (re-adopt ours, else lowest free ID), the claimer (a range of at most 32 IDs in one window, a larger one in interleaved windows of at most 16).
//! - `state`: `WorkerState`, the one value the keeper writes and every publisher reads.
//! - `keeper`: the claim / renew / loss loop, the only writer of the state; releases at the stop;
//!   its timing rules as pure functions (`keeper/schedule.rs`) and the Redis outage they ride
//!   through, logged at start (`keeper/sizing.rs`).
//! - [`range`]: the worker IDs a sidecar claims (`--worker-ids`), so regions split one ID space.
//! - [`guard`]: `snowlease guard open`, first use without waiting one TTL.
//! - [`carry`]: `snowlease mint carry-over`, a change of the ID format under a new app.
//! - `publish`: the ID file, the state file and the lock file as the sidecar writes them (their
//!   format: `crate::published`), and the routes `/id`, `/readyz`, `/metrics`.
//! - `metrics`: Prometheus metrics of worker mode.
//! - [`mint`]: mint mode: minting IDs under the lease, `/next`.
//! - [`status`]: `snowlease status`, a read-only view of an app's leases.

pub mod args;
pub mod carry;
pub mod claim;
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
use self::mint::Mint;
use self::mint::reserver::Reserver;
use self::mint::socket::MintSocket;
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
/// (re)claimed.
///
/// Errors: `keeper::WorkerError` inside the `anyhow::Error` for claim
/// timeout (exit 3) and loss with `--on-loss exit` (exit 4);
/// `files::OutputLockError` when another live process uses the same
/// `--output-file`; I/O errors for the listener and the output folder.
pub async fn run(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (identity, source) = resolve_identity(config.identity.as_deref());
    let owner = Owner::generate(&identity);
    info!(identity = %identity, source = ?source, app = %config.app, redis = %config.redis, "starting worker-ID sidecar");
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

    let dir = config
        .output_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    atomic_file::create_dir_all_readable(dir).with_context(|| {
        format!(
            "cannot create the folder of --output-file {}",
            dir.display()
        )
    })?;
    // Kept open: the files are written relative to it (one descriptor per
    // write, none per check), so a process short of descriptors still
    // keeps them fresh.
    let folder = atomic_file::Folder::open(dir)
        .with_context(|| format!("cannot open the folder of --output-file {}", dir.display()))?;
    // Held until this function returns: the process owns the ID file and
    // the state file. Taken before the state file is read or Redis is used.
    let _output_lock = files::lock_output(&config.output_file)?;
    let listener = http::bind(config.listen)
        .with_context(|| format!("cannot listen on --listen {}", config.listen))?;
    let mint_socket = match config.mint.as_ref().and_then(|m| m.socket.as_deref()) {
        Some(path) => Some(
            MintSocket::bind(path)
                .with_context(|| format!("cannot listen on --mint-socket {}", path.display()))?,
        ),
        None => None,
    };
    let conn = config.redis.connect(config.lease.call_timeout())?;
    // A sidecar of another ID format stops before it claims (the reserver checks before it
    // mints only when Redis did not answer here).
    let mut format_checked = false;
    if let Some(mint) = &config.mint {
        let keys = keys::MintKeys::new(&config.lease.key_prefix, &config.app);
        let timeout = config.lease.call_timeout();
        let mut probe = conn.clone();
        let checked = mint::reserver::format_refusal(&mut probe, &keys, mint, timeout);
        match checked.await {
            Ok(None) => format_checked = true,
            Ok(Some(why)) => {
                if let Some(socket) = mint_socket {
                    socket.close();
                }
                return Err(ConfigError::new("--id-layout, --epoch, --datacenter-id", why).into());
            }
            Err(_) => {}
        }
    }

    let metrics = Arc::new(WorkerMetrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    metrics
        .worker_ids
        .set(i64::from(config.lease.worker_ids.len()));
    http::register_build_info(&mut registry);
    let mint = config.mint.clone().map(|m| Mint::new(m, &mut registry));
    let recorded = files::read_state(&config.output_file, &config.app);
    let params = WorkerParams {
        app: config.app.clone(),
        settings: config.lease.clone(),
        on_loss: config.on_loss,
        claim_timeout: config.claim_timeout,
        allow_evicting_redis: config.allow_evicting_redis,
        min_replicas_ack: config.min_replicas_ack,
        max_clock_skew: config.max_clock_skew,
        handover_delay: config.handover_delay,
        mode: match config.mint {
            Some(_) => state::Mode::Mint,
            None => state::Mode::Publish,
        },
    };
    if config.allow_evicting_redis {
        warn!(
            "--allow-evicting-redis: maxmemory-policy is not checked; on a Redis that evicts keys one worker ID can be published twice"
        );
    }
    let reserver_conn = conn.clone();
    let recorder = range::record::RangeRecorder {
        conn: conn.clone(),
        key: keys::LeaseKeys::new(&config.lease.key_prefix, &config.app).ranges(),
        range: config.lease.worker_ids,
        ttl: config.lease.ttl,
        // Not the renewals' bound: the record is only a report, on its own task (aborted at
        // the stop), and a call timed out at the renewals' short bound dropped the connection
        // the renewals share, so a loaded Redis cost them a reconnect.
        call_timeout: crate::timing::COMMAND_CALL_TIMEOUT,
        metrics: metrics.clone(),
    };
    let (worker, state_rx) = Worker::new(conn, owner, params, recorded, metrics);
    let recorder = tokio::spawn(recorder.run(state_rx.clone(), shutdown.clone()));

    let http_stop = CancellationToken::new();
    let mut router = routes::worker_router(WorkerHttp {
        app: config.app.as_str().into(),
        state: state_rx.clone(),
        registry: Arc::new(registry),
        mint: mint.is_some(),
    });
    let mut socket_task = None;
    if let Some(mint) = &mint {
        // With a socket, /next stays off the TCP port unless asked for: only what shares the
        // socket's volume mints with this worker ID.
        router = match mint.config.socket.as_deref() {
            Some(path) if !mint.config.next_on_listen => {
                router.merge(mint::routes::served_on_socket_only(path))
            }
            _ => router.merge(mint::routes::router(mint.http.clone())),
        };
        if let Some(socket) = mint_socket {
            let routes = mint::routes::router(mint.http.clone()).merge(http::liveness_routes());
            let serving = socket.serve(routes, config.http, http_stop.clone());
            socket_task = Some(
                http::on_own_thread("mint-socket", serving)
                    .context("cannot start the mint socket's thread")?,
            );
        }
    }
    // On its own thread: a flood of connections never delays a renewal or
    // the unpublishing at the deadline, which run on this one.
    let http_task = http::serve_on_own_thread(listener, router, config.http, http_stop.clone())
        .context("cannot start the http thread")?;
    let output_file = config.output_file.clone();
    let app = config.app.clone();
    let mint_mode = mint.is_some();
    let publisher_state = state_rx.clone();
    let publisher = tokio::spawn(async move {
        writer::run_publisher(publisher_state, folder, &output_file, app, mint_mode).await
    });
    let format_refused = Arc::new(std::sync::OnceLock::new());
    let reserver = mint.map(|mint| {
        let reserver = Reserver {
            desk: mint.http.desk,
            metrics: mint.http.metrics,
            conn: reserver_conn,
            lease_keys: keys::LeaseKeys::new(&config.lease.key_prefix, &config.app),
            mint_keys: keys::MintKeys::new(&config.lease.key_prefix, &config.app),
            config: mint.config,
            call_timeout: config.lease.call_timeout(),
            min_replicas_ack: config.min_replicas_ack,
            max_clock_skew: config.max_clock_skew,
            renew_now: worker.renew_signal(),
            stop: shutdown.clone(),
            format_refused: format_refused.clone(),
            format_checked,
        };
        tokio::spawn(reserver.run(state_rx))
    });

    // The keeper unpublishes (awaits the publisher, and in mint mode the
    // reserver stopping the minter and recording its last timestamp), then
    // removes every key of ours, also one a claim left whose reply was lost.
    let unpublished = async {
        let _ = publisher.await;
        if let Some(reserver) = reserver {
            let _ = reserver.await;
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
    if let Some(task) = socket_task
        && crate::timing::within(Duration::from_secs(1), task)
            .await
            .is_none()
    {
        warn!("the mint socket did not stop within 1s");
    }
    if let Some(why) = format_refused.get() {
        return Err(crate::config_error::ConfigError::new(
            "--id-layout, --epoch, --datacenter-id",
            why.clone(),
        )
        .into());
    }
    // Every stop reason names the Redis it concerns (for a claim timeout the
    // first question); the exit code still comes from the WorkerError.
    stopped
        .result
        .with_context(|| format!("redis {}", config.redis))?;
    info!("stopped");
    Ok(())
}
