//! `belfry-worker`: a worker serving the built-in job types (`noop`,
//! `sleep`, `http`). Your own worker binary looks the same with your job
//! types registered; see `examples/custom-worker`.

use belfry_runtime::{init_telemetry, shutdown_token, Settings};
use belfry_worker::{Registry, Worker, WorkerConfig};

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        tracing::error!("{e}");
        // One line naming what is wrong (service and masked URL, variable,
        // file or schedule); the error's own text already includes its cause.
        eprintln!("belfry-worker: {e}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    let config = WorkerConfig::from_settings(&Settings::from_env())?;
    let telemetry = init_telemetry("belfry-worker", &config.instance, config.log_format)?;
    tracing::info!(
        ?config,
        exporting_traces = telemetry.exporting(),
        "starting belfry-worker"
    );
    let served = serve(&config).await;
    // Spans still buffered are flushed whether or not the worker failed.
    telemetry.shutdown().await;
    served
}

async fn serve(config: &WorkerConfig) -> anyhow::Result<()> {
    let cancel = shutdown_token();
    let registry = Registry::builder().builtins().build()?;
    let worker = Worker::start(config, registry).await?;
    worker.serve(config.metrics_addr.as_deref(), cancel).await?;
    Ok(())
}
