//! One attempt: a handler call under a timeout, with panics captured.
//!
//! The handler runs in its own task so that a panic is caught (as a failed
//! attempt) instead of killing the worker, and so that a timeout or a hard
//! stop can abort it without waiting for its cooperation. Its future is
//! fenced by the attempt's lease (see [`crate::lease::Fenced`]): it is not
//! polled once the lease may have expired.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::job::{JobContext, JobError};
use crate::lease::LeaseGuard;
use crate::registry::Handler;

/// How long an aborted handler gets to notice its cancellation token before
/// its task is aborted.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_millis(200);

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
    /// An operator cancelled the run: the handler was told and did not
    /// finish successfully within the grace period.
    Cancelled,
}

/// Runs one attempt of `handler` with `payload` under `lease`: the attempt
/// stops when the lease's interrupt token is cancelled (the worker's hard
/// stop, a lease not renewed in time or taken over), and the handler is not
/// polled once the lease may have expired. When an operator cancels the
/// run, the handler's token fires and it gets `cancel_grace` (none for an
/// immediate cancel) to return before it is abandoned.
pub async fn run_attempt(
    handler: &Arc<dyn Handler>,
    ctx: JobContext,
    payload: serde_json::Value,
    timeout: Duration,
    lease: &LeaseGuard,
    cancel_grace: Duration,
) -> AttemptResult {
    let hard_stop: &CancellationToken = lease.interrupt();
    let cancel_signal = lease.cancel();
    let cancel = ctx.cancel.clone();
    let span = ctx.span.clone();
    let future = match handler.start(ctx, payload) {
        Ok(f) => f,
        Err(e) => return AttemptResult::InvalidPayload(e.to_string()),
    };
    let mut task = tokio::spawn(lease.fence(future).instrument(span));
    // Four ways out: the handler finishes, the timeout fires, an operator
    // cancels the run, or the worker must stop now. In the latter three the
    // handler is told through its token, given a grace, then aborted; its
    // result is ignored either way (unless it succeeded in the grace).
    // `biased`: the handler's token is a child of `hard_stop`, so a
    // cooperative handler can finish (with an error) in the same instant the
    // stop fires; checking the stop first makes that an interruption, never
    // a failed attempt that spends a retry. The cancel comes next for the
    // same reason: a handler failing because it was told to stop by a
    // cancel is cancelled, not failed.
    let interrupted = tokio::select! {
        biased;
        _ = hard_stop.cancelled() => AttemptResult::Interrupted,
        _ = cancel_signal.token().cancelled() => {
            cancel.cancel();
            let grace = if cancel_signal.immediate() { Duration::ZERO } else { cancel_grace };
            // The grace ends early if the worker must stop now, or an
            // immediate cancel (terminate_other) follows this one.
            let waited = tokio::select! {
                biased;
                _ = hard_stop.cancelled() => None,
                _ = cancel_signal.abandon().cancelled() => Some(None),
                joined = tokio::time::timeout(grace, &mut task) => Some(Some(joined)),
            };
            return match waited {
                // Finished successfully before it could stop: its side
                // effects happened, so the success is recorded.
                Some(Some(Ok(Ok(Ok(()))))) => AttemptResult::Succeeded,
                Some(Some(Ok(_))) => AttemptResult::Cancelled,
                Some(Some(Err(_)) | None) => {
                    task.abort();
                    AttemptResult::Cancelled
                }
                None => {
                    task.abort();
                    AttemptResult::Interrupted
                }
            };
        }
        joined = tokio::time::timeout(timeout, &mut task) => match joined {
            Ok(Ok(Ok(()))) => return AttemptResult::Succeeded,
            // The stop may have fired after the select looked at it but
            // before the handler's error was read: still an interruption.
            // The task has finished, so there is nothing to wait for (its
            // handle must not be polled again).
            Ok(Ok(Err(_))) if hard_stop.is_cancelled() => return AttemptResult::Interrupted,
            Ok(Ok(Err(e))) => return AttemptResult::Failed(e),
            Ok(Err(join)) if join.is_panic() => {
                return AttemptResult::Panicked(panic_message(join.into_panic()))
            }
            Ok(Err(_)) => return AttemptResult::Interrupted,
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
    use crate::lease::Leases;
    use crate::registry::Registry;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

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
            parents: Vec::new(),
            run_log: crate::run_log::RunLog::disabled(),
            result: crate::RunResult::default(),
        }
    }

    /// A handler that returns an error because its attempt was interrupted
    /// is an interruption, not a failed attempt: counting it as a failure
    /// would spend a retry (and write to a ledger the worker just lost).
    /// The handler wakes on the same token as the select, so before the fix
    /// either branch could win. When the handler's error was read first and
    /// the stop was seen only then, the attempt also polled the finished
    /// task's handle again ("JoinHandle polled after completion", a panic
    /// in the worker): 2,000 rounds hit that in about one run of five
    /// before the fix.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_failing_after_an_interruption_is_an_interruption() {
        let registry = Registry::builder().job(StopsWhenTold).build().unwrap();
        let handler = registry.get(StopsWhenTold::TYPE).unwrap().handler.clone();
        for round in 0..2000 {
            let stop = CancellationToken::new();
            let ctx = context(stop.child_token());
            let stopper = stop.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                stopper.cancel();
            });
            let leases = Leases::new(Duration::from_secs(20));
            let lease = leases.hold(uuid::Uuid::nil(), 1, Instant::now(), &stop);
            let result = run_attempt(
                &handler,
                ctx,
                serde_json::json!({}),
                Duration::from_secs(30),
                &lease,
                Duration::from_secs(30),
            )
            .await;
            assert_eq!(result, AttemptResult::Interrupted, "round {round}");
        }
    }

    /// Counts its steps: one on its first poll, one after `go` is
    /// notified; each step stands for a side effect (a request sent).
    struct TwoSteps {
        steps: Arc<AtomicUsize>,
        go: Arc<tokio::sync::Notify>,
    }

    impl Job for TwoSteps {
        const TYPE: &'static str = "two_steps";
        type Payload = serde_json::Value;

        async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
            self.steps.fetch_add(1, Ordering::SeqCst);
            self.go.notified().await;
            self.steps.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn two_steps() -> (Arc<dyn Handler>, Arc<AtomicUsize>, Arc<tokio::sync::Notify>) {
        let steps = Arc::new(AtomicUsize::new(0));
        let go = Arc::new(tokio::sync::Notify::new());
        let registry = Registry::builder()
            .job(TwoSteps {
                steps: steps.clone(),
                go: go.clone(),
            })
            .build()
            .unwrap();
        let handler = registry.get(TwoSteps::TYPE).unwrap().handler.clone();
        (handler, steps, go)
    }

    /// A process stalled (SIGSTOP) between the start of an attempt and its
    /// handler's first poll resumes with the lease possibly expired and
    /// another worker running the run. Before the fence the handler ran
    /// anyway whenever its task was polled before the heartbeat's check
    /// (here the heartbeat does not run at all): its first step happened
    /// and the attempt succeeded.
    #[tokio::test]
    async fn a_handler_is_not_started_once_its_lease_may_have_expired() {
        let (handler, steps, go) = two_steps();
        go.notify_one();
        let stop = CancellationToken::new();
        let leases = Leases::new(Duration::from_secs(20));
        let lease = leases.hold(uuid::Uuid::nil(), 1, Instant::now(), &stop);
        lease.backdate(leases.lease());
        let result = run_attempt(
            &handler,
            context(lease.interrupt().child_token()),
            serde_json::json!({}),
            Duration::from_secs(30),
            &lease,
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(result, AttemptResult::Interrupted);
        assert_eq!(steps.load(Ordering::SeqCst), 0, "the handler ran");
        assert!(lease.interrupt().is_cancelled());
    }

    /// The same stall in the middle of a handler: once the lease may have
    /// expired, the handler takes no further step, though what woke it is
    /// ready at the same time.
    #[tokio::test]
    async fn a_handler_takes_no_step_after_a_stall_past_its_lease() {
        let (handler, steps, go) = two_steps();
        let stop = CancellationToken::new();
        let leases = Leases::new(Duration::from_secs(20));
        let lease = leases.hold(uuid::Uuid::nil(), 1, Instant::now(), &stop);
        let attempt = run_attempt(
            &handler,
            context(lease.interrupt().child_token()),
            serde_json::json!({}),
            Duration::from_secs(30),
            &lease,
            Duration::from_secs(30),
        );
        let stall = async {
            while steps.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
            lease.backdate(leases.lease());
            go.notify_one();
        };
        let (result, ()) = tokio::join!(attempt, stall);
        assert_eq!(result, AttemptResult::Interrupted);
        assert_eq!(
            steps.load(Ordering::SeqCst),
            1,
            "a step ran after the stall"
        );
    }
}
