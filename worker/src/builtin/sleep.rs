//! `sleep`: waits for the payload's duration, then succeeds. Stands in for
//! work that waits on I/O, as most scheduled jobs do.

use std::time::Duration;

use serde::Deserialize;

use crate::job::{Job, JobContext, JobError};

/// Payload of `sleep`: `{"duration_ms": 3000}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SleepPayload {
    /// How long to sleep, in milliseconds.
    pub duration_ms: u64,
}

/// The `sleep` job type.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sleep;

impl Job for Sleep {
    const TYPE: &'static str = "sleep";
    type Payload = SleepPayload;

    async fn run(&self, ctx: JobContext, payload: SleepPayload) -> Result<(), JobError> {
        let nap = tokio::time::sleep(Duration::from_millis(payload.duration_ms));
        // Return early when the attempt is cancelled (timeout, hard stop),
        // so the worker can hand the run back promptly.
        tokio::select! {
            _ = nap => Ok(()),
            _ = ctx.cancel.cancelled() => Err(JobError::retryable("sleep interrupted")),
        }
    }
}
