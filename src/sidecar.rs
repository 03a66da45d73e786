//! Wires worker mode together: Redis, the worker loop, the file publisher
//! and HTTP, and the shutdown order (unpublish first, then release).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::WorkerConfig;
use crate::http::{self, WorkerHttp};
use crate::identity::{Owner, resolve_identity};
use crate::metrics::WorkerMetrics;
use crate::publish;
use crate::worker::{self, Worker, WorkerState};

/// Upper bound for the compare-and-delete at shutdown; Kubernetes' default
/// grace period is 30 s, and a Redis outage must not stretch the stop.
const RELEASE_LIMIT: Duration = Duration::from_secs(1);

/// Runs the worker-ID sidecar until `shutdown` fires or the lease cannot be
/// (re)claimed.
///
/// Errors: [`worker::WorkerError`] inside the `anyhow::Error` for claim
/// timeout (exit 3) and loss with `--on-loss exit` (exit 4);
/// [`publish::OutputLockError`] when another live process uses the same
/// `--output-file`; I/O errors for the listener and the output folder.
pub async fn run_worker(config: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (identity, source) = resolve_identity(config.identity.as_deref());
    let owner = Owner::generate(&identity);
    info!(identity = %identity, source = ?source, app = %config.app, redis = %config.redis, "starting worker-ID sidecar");

    if let Some(dir) = config
        .output_file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir).with_context(|| {
            format!(
                "cannot create the folder of --output-file {}",
                dir.display()
            )
        })?;
    }
    // Held until this function returns: the process owns the ID file and
    // the state file. Taken before the state file is read or Redis is used.
    let _output_lock = publish::lock_output(&config.output_file)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on --listen {}", config.listen))?;
    let conn = config.redis.connect(config.lease.call_timeout())?;

    let metrics = Arc::new(WorkerMetrics::default());
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let recorded = publish::read_state(&config.output_file, &config.app);
    let initial = match recorded.as_ref().and_then(|r| r.deadline(config.lease.ttl)) {
        Some(until) => WorkerState::Readopting(until),
        None => WorkerState::Claiming,
    };
    let (state_tx, state_rx) = watch::channel(initial);

    let http_stop = CancellationToken::new();
    let router = http::worker_router(WorkerHttp {
        app: config.app.as_str().into(),
        state: state_rx.clone(),
        registry: Arc::new(registry),
    });
    let http_task = tokio::spawn(http::serve(listener, router, http_stop.clone()));
    let publisher = tokio::spawn(publish::run_publisher(
        state_rx,
        config.output_file.clone(),
        config.app.clone(),
    ));

    let mut release_conn = conn.clone();
    let worker = Worker {
        conn,
        app: config.app.clone(),
        settings: config.lease.clone(),
        owner,
        on_loss: config.on_loss,
        claim_timeout: config.claim_timeout,
        metrics,
        state: state_tx,
    };
    let outcome = worker.run(recorded, shutdown).await;

    // The worker dropped its sender: the publisher removes the files and
    // ends. Only then may the key go, so no two processes publish one ID.
    let _ = publisher.await;
    if let Ok(Some((held, key))) = &outcome {
        worker::release(&mut release_conn, key, &held.owner, RELEASE_LIMIT).await;
    }
    http_stop.cancel();
    if tokio::time::timeout(Duration::from_secs(1), http_task)
        .await
        .is_err()
    {
        warn!("http server did not stop within 1s");
    }
    outcome?;
    info!("stopped");
    Ok(())
}
