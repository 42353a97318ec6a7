//! One attempt: a handler call under a timeout, with panics captured.
//!
//! The handler runs in its own task so that a panic is caught (as a failed
//! attempt) instead of killing the worker, and so that a timeout or a hard
//! stop can abort it without waiting for its cooperation.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::job::{JobContext, JobError};
use crate::registry::Handler;

/// How long an aborted handler gets to notice its cancellation token before
/// its task is aborted.
const CANCEL_GRACE: Duration = Duration::from_millis(200);

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The handler returned `Ok`.
    Succeeded,
    /// The handler returned an error.
    Failed(JobError),
    /// The handler ran past the per-attempt timeout and was cancelled.
    TimedOut(Duration),
    /// The handler panicked; the message is the panic's.
    Panicked(String),
    /// The payload does not decode into the job's payload type.
    InvalidPayload(String),
    /// The worker stopped the attempt (shutdown deadline passed).
    Interrupted,
}

/// Runs one attempt of `handler` with `payload`.
pub async fn run_attempt(
    handler: &Arc<dyn Handler>,
    ctx: JobContext,
    payload: serde_json::Value,
    timeout: Duration,
    hard_stop: &CancellationToken,
) -> AttemptResult {
    let cancel = ctx.cancel.clone();
    let span = ctx.span.clone();
    let future = match handler.start(ctx, payload) {
        Ok(f) => f,
        Err(e) => return AttemptResult::InvalidPayload(e.to_string()),
    };
    let mut task = tokio::spawn(future.instrument(span));
    // Three ways out: the handler finishes, the timeout fires, or the worker
    // must stop now. In the latter two the handler is told through its token,
    // given a short grace, then aborted; its result is ignored either way.
    let interrupted = tokio::select! {
        joined = tokio::time::timeout(timeout, &mut task) => match joined {
            Ok(Ok(Ok(()))) => return AttemptResult::Succeeded,
            Ok(Ok(Err(e))) => return AttemptResult::Failed(e),
            Ok(Err(join)) if join.is_panic() => {
                return AttemptResult::Panicked(panic_message(join.into_panic()))
            }
            Ok(Err(_)) => AttemptResult::Interrupted,
            Err(_) => AttemptResult::TimedOut(timeout),
        },
        _ = hard_stop.cancelled() => AttemptResult::Interrupted,
    };
    cancel.cancel();
    match tokio::time::timeout(CANCEL_GRACE, &mut task).await {
        // The handler finished successfully at the last moment: its side
        // effects happened, so record the success rather than run it again.
        Ok(Ok(Ok(()))) => AttemptResult::Succeeded,
        Ok(_) => interrupted,
        Err(_) => {
            task.abort();
            interrupted
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "handler panicked with a non-string payload".to_owned()
    }
}
