//! A worker binary with its own job type, `invoice`: the whole program a
//! belfry user writes. Run it like `belfry-worker` (same environment
//! variables); schedules with `job_type = "invoice"` are routed to it.

use belfry_runtime::{init_telemetry, shutdown_token, Settings};
use belfry_worker::{Job, JobContext, JobError, Registry, Worker, WorkerConfig};
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
        // ctx.run_key is stable across retries and redeliveries: use it as
        // the idempotency key of the side effect.
        tracing::info!(run_key = %ctx.run_key, customer = %invoice.customer, cents = invoice.cents, "invoice sent");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = WorkerConfig::from_settings(&Settings::from_env())?;
    let telemetry = init_telemetry("custom-worker", &config.instance, config.log_format)?;
    let served = serve(&config).await;
    // Flushed whether or not the worker failed.
    telemetry.shutdown().await;
    served
}

async fn serve(config: &WorkerConfig) -> anyhow::Result<()> {
    let registry = Registry::builder().builtins().job(SendInvoice).build()?;
    let worker = Worker::start(config, registry).await?;
    worker
        .serve(config.metrics_addr.as_deref(), shutdown_token())
        .await?;
    Ok(())
}
