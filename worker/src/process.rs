//! One delivery, from decode to ack.
//!
//! The ledger is consulted before any work: a delivery whose run is already
//! finished is acked and dropped, and a delivery whose run another attempt
//! holds under an unexpired lease waits and goes back to the queue, so a
//! redelivered or republished message never re-runs finished work nor runs
//! concurrently with itself. Every attempt is counted in `job_runs` before
//! the handler runs, so a crash mid-attempt still counts it. The delivery is
//! acked only after the outcome is recorded; if recording fails, the
//! delivery goes back to the queue and the ledger decides again.

use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use belfry_broker::Delivery;
use belfry_ledger::{
    AttemptEntry, AttemptStart, BeginRequest, EndRequest, LedgerError, LimitKind, RunLimits,
    RunStatus,
};
use belfry_protocol::JobMessage;

use crate::attempt::{run_attempt, AttemptResult};
use crate::counters::WorkerCounters;
use crate::job::{JobContext, JobError};
use crate::registry::Registered;
use crate::{RetryPolicy, Worker};

/// Longest wait before handing back a delivery the ledger could not take
/// (database down) or another attempt holds.
pub(crate) const HAND_BACK_PAUSE: Duration = Duration::from_secs(5);
/// Longest wait before handing back a duplicate delivery of a run another
/// attempt holds: short, since the holder usually finishes soon and the
/// redelivery is then dropped.
const BUSY_PAUSE: Duration = Duration::from_secs(1);

/// What the worker did with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessOutcome {
    /// The run succeeded.
    Succeeded,
    /// The handler reported a permanent error; the run is `failed`.
    Failed,
    /// The run is `dead` and the message dead-lettered.
    Dead,
    /// An operator cancelled the run while it ran here; it is `cancelled`.
    Cancelled,
    /// The run was already finished; the delivery was dropped.
    Duplicate,
    /// Every slot of the run's concurrency limit was taken: the run waits
    /// in the ledger (no attempt used) and the delivery was acked.
    Waiting,
    /// The body was not a job message; it was dead-lettered.
    Undecodable,
    /// The retry back-off was handed to the ledger; the delivery was acked
    /// and the run will be published again when the back-off ends.
    Deferred,
    /// The delivery went back to the queue (shutdown, the ledger was
    /// unreachable, or another attempt holds the run).
    HandedBack,
    /// The attempt lost its lease to another attempt before recording; its
    /// outcome was not written.
    Superseded,
}

impl ProcessOutcome {
    /// A short name for spans and the `outcome` label of `belfry_jobs`.
    pub fn label(&self) -> &'static str {
        match self {
            ProcessOutcome::Succeeded => "succeeded",
            ProcessOutcome::Failed => "failed",
            ProcessOutcome::Dead => "dead",
            ProcessOutcome::Cancelled => "cancelled",
            ProcessOutcome::Duplicate => "duplicate",
            ProcessOutcome::Waiting => "waiting",
            ProcessOutcome::Undecodable => "undecodable",
            ProcessOutcome::Deferred => "deferred",
            ProcessOutcome::HandedBack => "handed_back",
            ProcessOutcome::Superseded => "superseded",
        }
    }
}

/// Keeps the in-flight gauge up while a delivery is processed.
struct InFlight<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A run's last outcome, to record and then ack (see `crate::settle`).
pub(crate) struct Finish<'a> {
    /// The run.
    pub(crate) id: Uuid,
    /// Its terminal status.
    pub(crate) status: RunStatus,
    /// The attempt that ended it.
    pub(crate) entry: AttemptEntry,
    /// The reason it is dead-lettered with, if it is.
    pub(crate) dead_letter: Option<&'a str>,
}

/// The effective settings of one run: worker default, then the job type's,
/// then the run's own.
fn effective(
    worker: &Worker,
    registered: &Registered,
    message: &JobMessage,
) -> (RetryPolicy, Duration) {
    let mut policy = worker.retry.clone();
    let mut timeout = worker.job_timeout;
    for options in [&registered.options, &message.options] {
        if let Some(r) = &options.retry {
            policy = policy.with_override(r);
        }
        if let Some(ms) = options.timeout_ms {
            timeout = Duration::from_millis(ms.max(1)).min(Duration::from_secs(7 * 24 * 3600));
        }
    }
    (policy, timeout)
}

/// Why an attempt could not start.
enum Begin {
    /// The message can never start: its id belongs to another run, or the
    /// database refused its data (see [`LedgerError::is_data_error`]).
    Refused(String),
    /// The ledger could not be reached; try again later.
    Unavailable(String),
}

impl Begin {
    /// A data error is about this message alone: refused (dead-lettered
    /// once), never mistaken for an outage and handed back forever.
    fn from_ledger(e: &LedgerError) -> Self {
        if e.is_data_error() {
            Self::Refused(refused(e))
        } else {
            Self::Unavailable(e.to_string())
        }
    }
}

/// Why an outcome could not be written.
pub(crate) enum EndFailed {
    /// The database refused the outcome's data: writing it again would fail
    /// again.
    Refused(String),
    /// The ledger could not be reached; the redelivery decides again.
    Unavailable(String),
}

impl EndFailed {
    pub(crate) fn from_ledger(e: &LedgerError) -> Self {
        if e.is_data_error() {
            Self::Refused(e.to_string())
        } else {
            Self::Unavailable(e.to_string())
        }
    }
}

/// The reason a message is dead-lettered with when the ledger refused its
/// data.
fn refused(e: &LedgerError) -> String {
    match e {
        LedgerError::IdConflict { .. } => e.to_string(),
        _ => format!("the ledger cannot store this message: {e}"),
    }
}

impl Worker {
    /// Starts an attempt: the batched common path first, the ledger's full
    /// path when the row is missing, finished or held. A run under a
    /// concurrency or rate limit takes the ledger's limited path only (its
    /// counts and its start are one transaction; see
    /// [`crate::run_limits`]).
    async fn begin(
        &self,
        message: &JobMessage,
        lease: Duration,
        limits: &RunLimits,
    ) -> Result<AttemptStart, Begin> {
        if limits.is_empty() {
            let request = BeginRequest {
                job_name: message.job_name.clone(),
                run_key: message.run_key.clone(),
                worker: self.instance.clone(),
                lease,
            };
            match self.attempts.begin(request).await {
                Ok(Some((id, attempt))) => return Ok(AttemptStart::Started { id, attempt }),
                Ok(None) => {}
                Err(e) => return Err(Begin::from_ledger(&e)),
            }
        }
        self.ledger
            .begin_attempt_limited(message, &self.instance, lease, limits)
            .await
            .map_err(|e| Begin::from_ledger(&e))
    }

    /// Ends an attempt through the batcher; `Ok(false)`: the attempt lost
    /// its lease and nothing was written.
    pub(crate) async fn end(
        &self,
        id: Uuid,
        status: RunStatus,
        entry: &AttemptEntry,
        last_error: Option<&str>,
        redispatch_at: Option<chrono::DateTime<Utc>>,
    ) -> Result<bool, EndFailed> {
        let request = EndRequest {
            id,
            status,
            entry: entry.clone(),
            last_error: last_error.map(str::to_owned),
            redispatch_at,
        };
        let span = tracing::info_span!("record", belfry.status = %status, attempt = entry.attempt);
        self.attempts
            .end(request)
            .instrument(span)
            .await
            .map_err(|e| EndFailed::from_ledger(&e))
    }

    /// Processes one delivery completely: decode, look up the handler, run
    /// attempts with retries, record the outcome, ack (or hand back).
    ///
    /// `hard_stop` is cancelled when in-flight work must stop now (the
    /// shutdown deadline passed): the running attempt is interrupted and the
    /// run handed back to the broker.
    pub async fn process_one(
        &self,
        delivery: Delivery,
        hard_stop: &CancellationToken,
    ) -> ProcessOutcome {
        self.process_on_channel(delivery, hard_stop, &CancellationToken::new())
            .await
    }

    /// [`Worker::process_one`] for a delivery of a channel that may be lost:
    /// `channel_lost` is cancelled when it is. The broker then redelivers the
    /// message elsewhere, so a retry waiting out its back-off here stops
    /// waiting and leaves the run to the redelivery instead of retrying it
    /// alongside (a running attempt is protected by its lease instead).
    pub async fn process_on_channel(
        &self,
        delivery: Delivery,
        hard_stop: &CancellationToken,
        channel_lost: &CancellationToken,
    ) -> ProcessOutcome {
        WorkerCounters::add(&self.counters.deliveries);
        let message = match JobMessage::from_slice(&delivery.data) {
            Ok(m) => m,
            Err(e) => {
                let reason = format!("undecodable message: {e}");
                tracing::error!(routing_key = %delivery.routing_key, error = %reason, "dead-lettering a message that is not a job message");
                self.dead_letter_and_ack(&delivery, None, &reason).await;
                return ProcessOutcome::Undecodable;
            }
        };
        let trace = message.trace.as_ref();
        let span = tracing::info_span!("process", otel.kind = "consumer",
            messaging.system = self.broker.messaging_system(), messaging.operation.type = "process",
            messaging.rabbitmq.destination.routing_key = %delivery.routing_key,
            messaging.message.id = %message.message_id, job.name = %message.job_name,
            job.type = %message.job_type, belfry.run_key = %message.run_key,
            trace_id = trace.and_then(|t| t.trace_id()).unwrap_or(""),
            belfry.outcome = tracing::field::Empty);
        // The worker's spans continue the publisher's trace (set before the
        // span is first entered, as OpenTelemetry requires).
        if let Some(t) = trace {
            belfry_runtime::trace_propagation::set_parent(
                &span,
                &t.traceparent,
                t.tracestate.as_deref(),
            );
        }
        self.counters.in_flight.inc();
        // Decremented even if this future is dropped mid-way.
        let _in_flight = InFlight(&self.counters.in_flight);
        let outcome = self
            .process_message(delivery, &message, hard_stop, channel_lost)
            .instrument(span.clone())
            .await;
        span.record("belfry.outcome", outcome.label());
        if outcome != ProcessOutcome::Undecodable {
            self.counters
                .jobs
                .get_or_create(&vec![
                    ("job_type", message.job_type.clone()),
                    ("outcome", outcome.label().to_owned()),
                ])
                .inc();
        }
        outcome
    }

    // Long on purpose: one delivery's life, from the first begin to the
    // outcome, as one loop over its retries. Every `return` settles the
    // delivery exactly once (ack, hand back, dead-letter); keeping them in
    // one function is what makes that checkable by reading it.
    async fn process_message(
        &self,
        delivery: Delivery,
        message: &JobMessage,
        hard_stop: &CancellationToken,
        channel_lost: &CancellationToken,
    ) -> ProcessOutcome {
        let Some(registered) = self.registry.get(&message.job_type).cloned() else {
            let reason = format!(
                "no handler for job type {:?} in worker group {:?} (it handles {:?}); register \
                 the type in a worker of a group bound to it",
                message.job_type,
                self.group,
                self.registry.types()
            );
            return self.give_up(&delivery, message, &reason).await;
        };
        let (policy, timeout) = effective(self, &registered, message);
        let limits = match crate::run_limits::limits_of(&registered.options, message) {
            Ok(limits) => limits,
            Err(reason) => return self.give_up(&delivery, message, &reason).await,
        };
        // Checked before the first attempt, as the limits: a run whose
        // follow-ups could never be enqueued (a hand-published message;
        // schedules and requests are checked when stored) is refused once,
        // not run and then found wanting.
        if let Err(e) = message.options.check_follow_ups(&message.job_name) {
            let reason = format!("the run's follow-ups cannot be used: options.follow_ups.{e}");
            return self.give_up(&delivery, message, &reason).await;
        }
        loop {
            // The lease is short and renewed by the heartbeat while the
            // attempt runs (see `crate::lease`); `sent` is when the
            // statement setting it left, so the lease cannot end earlier
            // than `sent + lease`.
            let sent = std::time::Instant::now();
            let started = self.begin(message, self.leases.lease(), &limits).await;
            let (id, attempt) = match started {
                Ok(AttemptStart::Started { id, attempt }) => (id, attempt),
                Ok(AttemptStart::AlreadyFinished { id, status }) => {
                    WorkerCounters::add(&self.counters.duplicates);
                    tracing::info!(%id, run_key = %message.run_key, %status, "run already finished; dropping duplicate delivery");
                    self.ack(&delivery).await;
                    return ProcessOutcome::Duplicate;
                }
                Ok(AttemptStart::Waiting { id, limit, running }) => {
                    // The run waits in the ledger, which publishes it again
                    // after the limit's wait: this delivery is done with,
                    // and the worker's slot goes to other work.
                    let counter = match limit {
                        LimitKind::Concurrency => &self.counters.limited,
                        LimitKind::Rate => &self.counters.rate_limited,
                    };
                    WorkerCounters::add(counter);
                    tracing::debug!(%id, run_key = %message.run_key, ?limit, running, "limit full; the run waits in the ledger");
                    self.ack(&delivery).await;
                    return ProcessOutcome::Waiting;
                }
                Ok(AttemptStart::Busy { id, until }) => {
                    // Another attempt holds the run (this delivery is a
                    // duplicate from a channel loss). Wait a little, then
                    // give it back: once the holder records an outcome the
                    // redelivery is dropped as a duplicate; if the holder
                    // died, its lease expires and a redelivery takes over.
                    let wait = (until - Utc::now())
                        .to_std()
                        .unwrap_or(Duration::ZERO)
                        .min(BUSY_PAUSE);
                    tracing::info!(%id, run_key = %message.run_key, %until, "run held by another attempt; handing the delivery back");
                    return self.hand_back_after(&delivery, None, wait, hard_stop).await;
                }
                Err(Begin::Refused(reason)) => {
                    return self.give_up(&delivery, message, &reason).await;
                }
                Err(Begin::Unavailable(e)) => {
                    tracing::error!(run_key = %message.run_key, error = %e, "cannot start attempt; handing the delivery back");
                    return self
                        .hand_back_after(&delivery, None, HAND_BACK_PAUSE, hard_stop)
                        .await;
                }
            };
            let lease = self.leases.hold(id, attempt, sent, hard_stop);
            let attempt_no = u32::try_from(attempt).unwrap_or(u32::MAX);
            let started_at = Utc::now();
            let mut entry = AttemptEntry {
                attempt,
                worker: self.instance.clone(),
                started_at,
                finished_at: started_at,
                outcome: String::new(),
                error: None,
                log_lines: None,
                result: None,
            };
            if attempt_no > policy.max_attempts {
                // The attempts were used up by earlier deliveries (a worker
                // crashing mid-run, say): do not run the handler again.
                let reason = format!(
                    "retries exhausted: attempt {attempt} exceeds the maximum of {} (earlier attempts did not finish)",
                    policy.max_attempts
                );
                entry.outcome = "exhausted".into();
                entry.error = Some(reason.clone());
                return self.dead(&delivery, id, entry, &reason).await;
            }
            let trace_id = message
                .trace
                .as_ref()
                .and_then(|t| t.trace_id())
                .unwrap_or("");
            let span = tracing::info_span!("attempt", job_name = %message.job_name, job_type = %message.job_type,
                run_key = %message.run_key, attempt, trace_id, worker = %self.instance);
            // A retry starts from what the run's earlier attempts stored, so
            // the log's bound is the run's (read only after a first attempt).
            let stored_before = if attempt_no > 1 {
                // This worker's lines of the earlier attempt first (another
                // worker's are written within a batch's wait, well inside
                // any retry delay).
                self.run_logs.flush(Duration::from_secs(1)).await;
                crate::run_log::stored_before(&self.ledger, id, Duration::from_secs(1)).await
            } else {
                (0, 0)
            };
            let run_log = self
                .run_logs
                .attempt(id, attempt_no, self.run_log_bounds, stored_before);
            // The span carries the log for its life; events after the
            // outcome find it closed (see `log_capture`).
            if let Some(level) = registered.capture_tracing {
                crate::log_capture::attach(&span, run_log.clone(), level);
            }
            let run_result = crate::RunResult::default();
            let ctx = JobContext {
                result: run_result.clone(),
                run_log: run_log.clone(),
                run_id: id,
                job_name: message.job_name.clone(),
                run_key: message.run_key.clone(),
                attempt: attempt_no,
                scheduled_at: message.scheduled_at,
                cancel: lease.interrupt().child_token(),
                span: span.clone(),
                parents: message.options.parents.clone(),
            };
            WorkerCounters::add(&self.counters.attempts);
            let by_type = vec![("job_type", message.job_type.clone())];
            self.counters.attempts_by_type.get_or_create(&by_type).inc();
            belfry_runtime::failpoint::hit("inside_handler");
            let result = run_attempt(
                &registered.handler,
                ctx,
                message.payload.clone(),
                timeout,
                &lease,
                self.cancel_grace,
            )
            .await;
            lease.ending();
            entry.finished_at = Utc::now();
            let took = (entry.finished_at - started_at)
                .num_microseconds()
                .unwrap_or(0);
            self.counters
                .durations
                .get_or_create(&by_type)
                .observe(took.max(0) as f64 / 1e6);
            let (outcome, error, requested_delay) = match result {
                AttemptResult::Succeeded => {
                    entry.outcome = "succeeded".into();
                    entry.log_lines = run_log.close();
                    entry.result = run_result.take();
                    tracing::info!(parent: &span, "attempt succeeded");
                    return self
                        .conclude(&delivery, id, RunStatus::Succeeded, entry)
                        .await;
                }
                AttemptResult::Failed(JobError::Permanent(m)) => {
                    entry.outcome = "failed".into();
                    entry.error = Some(m.clone());
                    run_log.error(&m);
                    entry.log_lines = run_log.close();
                    tracing::warn!(parent: &span, error = %m, "attempt failed permanently");
                    return self.conclude(&delivery, id, RunStatus::Failed, entry).await;
                }
                AttemptResult::InvalidPayload(m) => {
                    let reason = format!(
                        "payload does not match job type {:?}: {m}",
                        message.job_type
                    );
                    entry.outcome = "invalid_payload".into();
                    entry.error = Some(reason.clone());
                    run_log.error(&reason);
                    entry.log_lines = run_log.close();
                    tracing::error!(parent: &span, error = %reason, "dead-lettering: payload cannot be decoded");
                    return self.dead(&delivery, id, entry, &reason).await;
                }
                AttemptResult::Cancelled => {
                    // No retry, no dead letter; the ledger writes the
                    // canceller's reason as the run's last error.
                    entry.outcome = "cancelled".into();
                    entry.error = Some("cancelled while running".into());
                    entry.log_lines = run_log.close();
                    tracing::warn!(parent: &span, "attempt stopped: the run was cancelled");
                    return self
                        .conclude(&delivery, id, RunStatus::Cancelled, entry)
                        .await;
                }
                AttemptResult::Interrupted if !hard_stop.is_cancelled() => {
                    // The heartbeat could not renew the lease in time, or
                    // found it taken over: give the run back (the hand-back
                    // is refused if another attempt now holds it).
                    tracing::warn!(parent: &span, "attempt interrupted: its lease could not be kept; handing the run back");
                    WorkerCounters::add(&self.counters.lease_lost);
                    run_log.close();
                    return self
                        .hand_back_after(&delivery, Some((id, attempt)), Duration::ZERO, hard_stop)
                        .await;
                }
                AttemptResult::Interrupted => {
                    tracing::warn!(parent: &span, "attempt interrupted by shutdown; handing the run back");
                    run_log.close();
                    return self
                        .hand_back_after(&delivery, Some((id, attempt)), Duration::ZERO, hard_stop)
                        .await;
                }
                AttemptResult::Failed(JobError::Retryable(m)) => ("retry", m, None),
                AttemptResult::Failed(JobError::RetryAfter { after, message }) => {
                    ("retry", message, Some(after))
                }
                AttemptResult::TimedOut(t) => {
                    ("timeout", format!("attempt timed out after {t:?}"), None)
                }
                AttemptResult::Panicked(m) => ("panicked", format!("handler panicked: {m}"), None),
            };
            entry.outcome = outcome.into();
            entry.error = Some(error.clone());
            // The failure after the handler's last lines: read together;
            // then nothing more (see `run_log`'s "End").
            run_log.error(&error);
            entry.log_lines = run_log.close();
            let Some(policy_delay) = policy.delay_after(attempt_no) else {
                let reason =
                    format!("retries exhausted after {attempt} attempts; last error: {error}");
                tracing::error!(parent: &span, error = %reason, "run is dead");
                return self.dead(&delivery, id, entry, &reason).await;
            };
            // A handler may ask for its own delay, but never past the
            // policy's cap (times two, for jitter).
            let delay = requested_delay.map_or(policy_delay, |d| d.min(policy.max_delay * 2));
            if delay >= self.requeue_after {
                // A long back-off must not hold a prefetch slot (or outlive
                // the broker's consumer timeout): the ledger keeps the
                // retry time and a reconciler publishes the run then.
                let at =
                    Utc::now() + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
                tracing::warn!(parent: &span, %error, ?delay, "attempt failed; retry handed to the ledger");
                let recorded = self
                    .end(id, RunStatus::Retrying, &entry, Some(&error), Some(at))
                    .await;
                return match recorded {
                    Ok(true) => {
                        WorkerCounters::add(&self.counters.deferred);
                        self.ack(&delivery).await;
                        ProcessOutcome::Deferred
                    }
                    Ok(false) => self.superseded(&delivery, id, attempt).await,
                    Err(e) => self.end_failed(&delivery, id, e, hard_stop).await,
                };
            }
            tracing::warn!(parent: &span, %error, ?delay, "attempt failed; retrying");
            match self
                .end(id, RunStatus::Retrying, &entry, Some(&error), None)
                .await
            {
                Ok(true) => {}
                Ok(false) => return self.superseded(&delivery, id, attempt).await,
                Err(e) => return self.end_failed(&delivery, id, e, hard_stop).await,
            }
            // Not running during the back-off: nothing to renew.
            drop(lease);
            // Shutdown wins over the back-off: the attempt count is durable,
            // so the run continues where it stopped on redelivery.
            tokio::select! {
                biased;
                _ = hard_stop.cancelled() => return self.hand_back_after(&delivery, None, Duration::ZERO, hard_stop).await,
                _ = channel_lost.cancelled() => {
                    tracing::warn!(run_key = %message.run_key, "channel lost during the back-off; the redelivered message continues the run");
                    return ProcessOutcome::HandedBack;
                }
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }
}
