//! `belfry-worker`: a worker serving the built-in job types (`noop`,
//! `sleep`, `http`). Your own worker binary looks the same with your job
//! types registered; see `examples/custom-worker`.

use belfry_runtime::start_retry::retry_start;
use belfry_runtime::{exit_on_error, init_telemetry_with, shutdown_token, Settings};
use belfry_worker::{Registry, RunLogCapture, Worker, WorkerConfig, WorkerError};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    exit_on_error("belfry-worker", run().await);
}

async fn run() -> anyhow::Result<()> {
    // First: from here on SIGTERM is a graceful stop, even during start-up.
    let cancel = shutdown_token();
    let config = WorkerConfig::from_settings(&Settings::from_env())?;
    // With run-log capture, for job types registered with `capture_tracing`.
    let telemetry = init_telemetry_with(
        "belfry-worker",
        &config.instance,
        config.log_format,
        RunLogCapture::layer(),
    )?;
    tracing::info!(
        ?config,
        exporting_traces = telemetry.exporting(),
        "starting belfry-worker"
    );
    telemetry.flush_after(serve(&config, cancel)).await
}

async fn serve(config: &WorkerConfig, cancel: CancellationToken) -> anyhow::Result<()> {
    let registry = Registry::builder().builtins().build()?;
    // A service restarting while this worker starts is waited out.
    let worker = retry_start(
        "worker start",
        config.start_timeout,
        &cancel,
        WorkerError::is_transient,
        || Worker::start(config, registry.clone()),
    )
    .await?;
    worker.serve(config.metrics_addr.as_deref(), cancel).await?;
    Ok(())
}
