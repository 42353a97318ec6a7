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
    // `biased`: the handler's token is a child of `hard_stop`, so a
    // cooperative handler can finish (with an error) in the same instant the
    // stop fires; checking the stop first makes that an interruption, never
    // a failed attempt that spends a retry.
    let interrupted = tokio::select! {
        biased;
        _ = hard_stop.cancelled() => AttemptResult::Interrupted,
        joined = tokio::time::timeout(timeout, &mut task) => match joined {
            Ok(Ok(Ok(()))) => return AttemptResult::Succeeded,
            // The stop may have fired after the select looked at it but
            // before the handler's error was read: still an interruption.
            Ok(Ok(Err(_))) if hard_stop.is_cancelled() => AttemptResult::Interrupted,
            Ok(Ok(Err(e))) => return AttemptResult::Failed(e),
            Ok(Err(join)) if join.is_panic() => {
                return AttemptResult::Panicked(panic_message(join.into_panic()))
            }
            Ok(Err(_)) => AttemptResult::Interrupted,
            Err(_) => AttemptResult::TimedOut(timeout),
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Job;
    use crate::registry::Registry;

    /// Waits for its token, then fails the way a cooperative handler does.
    struct StopsWhenTold;

    impl Job for StopsWhenTold {
        const TYPE: &'static str = "stops_when_told";
        type Payload = serde_json::Value;

        async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
            ctx.cancel.cancelled().await;
            Err(JobError::retryable("told to stop"))
        }
    }

    fn context(cancel: CancellationToken) -> JobContext {
        JobContext {
            run_id: uuid::Uuid::nil(),
            job_name: "j".into(),
            run_key: "j@1".into(),
            attempt: 1,
            scheduled_at: chrono::Utc::now(),
            cancel,
            span: tracing::Span::none(),
        }
    }

    /// A handler that returns an error because its attempt was interrupted
    /// is an interruption, not a failed attempt: counting it as a failure
    /// would spend a retry (and write to a ledger the worker just lost).
    /// The handler wakes on the same token as the select, so before the fix
    /// either branch could win; 200 rounds make a lost race near certain.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_failing_after_an_interruption_is_an_interruption() {
        let registry = Registry::builder().job(StopsWhenTold).build().unwrap();
        let handler = registry.get(StopsWhenTold::TYPE).unwrap().handler.clone();
        for round in 0..200 {
            let stop = CancellationToken::new();
            let ctx = context(stop.child_token());
            let stopper = stop.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                stopper.cancel();
            });
            let result = run_attempt(
                &handler,
                ctx,
                serde_json::json!({}),
                Duration::from_secs(30),
                &stop,
            )
            .await;
            assert_eq!(result, AttemptResult::Interrupted, "round {round}");
        }
    }
}
