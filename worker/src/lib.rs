//! belfry's worker, as a library: register your job types, start a
//! [`Worker`], and it consumes your group's queue, runs each job's handler
//! under a per-attempt timeout, retries retryable errors with exponential
//! back-off, and records every attempt and the outcome in `job_runs`.
//!
//! ```no_run
//! use belfry_worker::{Job, JobContext, JobError, Registry, Worker, WorkerConfig};
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Invoice { customer: String }
//!
//! struct Billing;
//!
//! impl Job for Billing {
//!     const TYPE: &'static str = "billing";
//!     type Payload = Invoice;
//!     async fn run(&self, ctx: JobContext, invoice: Invoice) -> Result<(), JobError> {
//!         tracing::info!(run_key = %ctx.run_key, customer = %invoice.customer, "billing");
//!         Ok(())
//!     }
//! }
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let registry = Registry::builder().job(Billing).build()?;
//! let config = WorkerConfig::from_settings(&belfry_runtime::Settings::from_env())?;
//! let worker = Worker::start(&config, registry).await?;
//! worker.run(belfry_runtime::shutdown_token()).await?;
//! # Ok(()) }
//! ```
//!
//! Modules: [`job`] (the trait and its error), [`registry`], [`retry_policy`],
//! [`attempt`] (one handler call: timeout, panic capture), [`lease`] (the
//! heartbeat that keeps running attempts' leases), [`process`] (one
//! delivery from decode to ack), [`worker`] (the consume loop and shutdown),
//! [`builtin`] (`noop`, `sleep`, `http`).

pub mod attempt;
pub mod builtin;
mod cancel_listener;
pub mod config;
pub mod counters;
pub mod error;
pub mod job;
pub mod lease;
pub mod log_capture;
pub mod process;
pub mod registry;
pub mod retry_policy;
pub mod run_limits;
pub mod run_log;
pub mod run_result;
mod settle;
pub mod worker;

pub use config::WorkerConfig;
pub use counters::WorkerCounters;
pub use error::WorkerError;
pub use job::{Job, JobContext, JobError};
pub use log_capture::RunLogCapture;
pub use process::ProcessOutcome;
pub use registry::{Registry, RegistryBuilder, RegistryError};
pub use retry_policy::RetryPolicy;
pub use run_log::{RunLog, RunLogBounds};
pub use run_result::{ResultError, RunResult, MAX_RESULT_BYTES, MAX_RESULT_DEPTH};
pub use worker::{Worker, HEARTBEAT_POOL};
