//! The job trait: what a user implements for each job type.
//!
//! A job type has a stable name ([`Job::TYPE`], the AMQP routing key), a
//! serde payload type, and an async `run` that returns whether a failure is
//! worth retrying. The worker decides from that: retryable errors are
//! retried with back-off until the attempts run out, permanent errors end
//! the run as `failed` at once.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::run_log::RunLog;

/// What a handler gets besides its payload.
#[derive(Debug, Clone)]
pub struct JobContext {
    /// The run's id in `job_runs` (= message id).
    pub run_id: Uuid,
    /// Schedule or job name.
    pub job_name: String,
    /// The run key; use it to make side effects idempotent (a run may be
    /// delivered again after a crash).
    pub run_key: String,
    /// 1-based attempt number, durable across worker restarts.
    pub attempt: u32,
    /// The nominal fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// Cancelled when the attempt times out or the worker must stop now;
    /// long handlers should watch it and return.
    pub cancel: CancellationToken,
    /// The span of this attempt; child work can be instrumented with it.
    pub span: tracing::Span,
    /// For a follow-up run: the runs whose end enqueued it, with the status
    /// each ended with (empty for every other run).
    pub parents: Vec<belfry_protocol::ParentRun>,
    /// This attempt's stored log (see [`JobContext::log`]);
    /// [`RunLog::disabled`] outside a worker.
    pub run_log: RunLog,
    /// This attempt's result (see [`JobContext::set_result`]);
    /// `RunResult::default()` outside a worker.
    pub result: crate::RunResult,
}

impl JobContext {
    /// Writes a line to the run's stored log (shown per attempt by the API,
    /// the web view and `belfry runs logs`), at `level`. Never waits: see
    /// [`crate::run_log`] for batching and bounds.
    pub fn log(&self, level: tracing::Level, message: impl AsRef<str>) {
        self.run_log
            .write(level, message.as_ref(), serde_json::Value::Null);
    }

    /// [`JobContext::log`] with structured fields (a JSON object, e.g.
    /// `serde_json::json!({"invoice": 42})`).
    pub fn log_with(
        &self,
        level: tracing::Level,
        message: impl AsRef<str>,
        fields: serde_json::Value,
    ) {
        self.run_log.write(level, message.as_ref(), fields);
    }

    /// Records progress: `done` of `total` units (when known) with a short
    /// note; the web view shows the latest as a progress bar.
    pub fn progress(&self, done: u64, total: Option<u64>, note: impl AsRef<str>) {
        self.run_log.progress(done, total, note.as_ref());
    }

    /// Sets the run's result: a small JSON value kept with the successful
    /// attempt (`GET /v1/runs/{id}`) and handed to the run's follow-ups
    /// (`ctx.parents[i].result`). See [`crate::run_result`].
    ///
    /// # Errors
    ///
    /// [`crate::ResultError`] when the value is over
    /// [`crate::MAX_RESULT_BYTES`] of JSON, holds a NUL or cannot be
    /// encoded; `?` in a handler turns it into a permanent failure.
    pub fn set_result<T: serde::Serialize + ?Sized>(
        &self,
        value: &T,
    ) -> Result<(), crate::ResultError> {
        self.result.set(value)
    }
}

/// A handler's failure, saying whether it is worth retrying.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// Transient: retry with the policy's back-off.
    #[error("{0}")]
    Retryable(String),
    /// Transient, and the handler knows when to try again (a rate limit's
    /// `Retry-After`, say). Still bounded by the policy's attempts.
    #[error("{message} (retry after {after:?})")]
    RetryAfter {
        /// How long to wait.
        after: Duration,
        /// What failed.
        message: String,
    },
    /// Will never succeed: the run ends `failed` without further attempts.
    #[error("{0}")]
    Permanent(String),
}

impl JobError {
    /// A retryable error from anything displayable.
    pub fn retryable(e: impl std::fmt::Display) -> Self {
        Self::Retryable(e.to_string())
    }

    /// A permanent error from anything displayable.
    pub fn permanent(e: impl std::fmt::Display) -> Self {
        Self::Permanent(e.to_string())
    }

    /// A retryable error with an explicit delay.
    pub fn retry_after(after: Duration, e: impl std::fmt::Display) -> Self {
        Self::RetryAfter {
            after,
            message: e.to_string(),
        }
    }
}

/// A job type.
///
/// Implementations must be cheap to share: one instance serves every run of
/// the type, concurrently. CPU-heavy work belongs in
/// `tokio::task::spawn_blocking` inside `run`, so it does not stall the
/// worker's runtime (and its heartbeats to the broker).
pub trait Job: Send + Sync + 'static {
    /// The job type's stable name (routing key); see
    /// [`belfry_protocol::validate_name`] for the allowed characters.
    const TYPE: &'static str;
    /// The payload, decoded from the message's JSON `payload`. A payload
    /// that does not decode makes the run `dead` without any attempt.
    type Payload: DeserializeOwned + Send + 'static;

    /// Runs one attempt.
    fn run(
        &self,
        ctx: JobContext,
        payload: Self::Payload,
    ) -> impl Future<Output = Result<(), JobError>> + Send;
}
