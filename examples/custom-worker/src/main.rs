//! A worker binary with its own job type, `invoice`: the whole program a
//! belfry user writes. Run it like `belfry-worker` (same environment
//! variables); schedules with `job_type = "invoice"` are routed to it.
//!
//! `custom-worker dev` runs the same job type in belfry's embedded mode
//! instead: scheduler, this worker and the API in one process on a SQLite
//! file, no services (see `belfry_embedded`).

use belfry_runtime::{init_telemetry_with, shutdown_token, Settings};
use belfry_worker::{
    Job, JobContext, JobError, Registry, RegistryBuilder, RunLogCapture, Worker, WorkerConfig,
};
use serde::Deserialize;

/// The payload of an `invoice` run: `payload = { customer = "c-42", cents = 1999 }`.
#[derive(Deserialize)]
struct Invoice {
    customer: String,
    cents: u64,
}

struct SendInvoice;

impl Job for SendInvoice {
    const TYPE: &'static str = "invoice";
    type Payload = Invoice;

    async fn run(&self, ctx: JobContext, invoice: Invoice) -> Result<(), JobError> {
        if invoice.cents == 0 {
            return Err(JobError::permanent(
                "an invoice of 0 cents is a bug upstream",
            ));
        }
        // Stored in the run's log (`belfry runs logs ID`, the web view).
        ctx.progress(0, Some(1), "sending");
        // ctx.run_key is stable across retries and redeliveries: use it as
        // the idempotency key of the side effect. This `tracing` event is
        // stored in the run's log too (`capture_tracing` below).
        tracing::info!(run_key = %ctx.run_key, customer = %invoice.customer, cents = invoice.cents, "invoice sent");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("dev") {
        return dev().await;
    }
    let config = WorkerConfig::from_settings(&Settings::from_env())?;
    // The run-log capture layer: `tracing` events of job types registered
    // with `capture_tracing` go to their run's log.
    let telemetry = init_telemetry_with(
        "custom-worker",
        &config.instance,
        config.log_format,
        RunLogCapture::layer(),
    )?;
    telemetry.flush_after(serve(&config)).await
}

/// The job types this binary runs: the built-in ones and `invoice`, whose
/// handler's `tracing` events at INFO or more severe are kept in each
/// run's log.
fn registry() -> RegistryBuilder {
    Registry::builder()
        .builtins()
        .job(SendInvoice)
        .capture_tracing::<SendInvoice>(tracing::Level::INFO)
}

async fn serve(config: &WorkerConfig) -> anyhow::Result<()> {
    let registry = registry().build()?;
    let worker = Worker::start(config, registry).await?;
    worker
        .serve(config.metrics_addr.as_deref(), shutdown_token())
        .await?;
    Ok(())
}

/// Everything in one process, with `invoice` registered beside the
/// built-in job types.
async fn dev() -> anyhow::Result<()> {
    let cancel = shutdown_token();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let telemetry = init_telemetry_with(
        "custom-worker",
        &belfry_runtime::default_instance(),
        belfry_runtime::LogFormat::Text,
        RunLogCapture::layer(),
    )?;
    let registry = registry().build()?;
    telemetry
        .flush_after(async {
            let dev = belfry_embedded::start(env, registry, cancel).await?;
            println!("custom-worker dev: {}", dev.mode.describe());
            if let Some(addr) = dev.api_addr {
                println!("  API       http://{addr}/v1");
            }
            Ok(dev.wait().await?)
        })
        .await
}
