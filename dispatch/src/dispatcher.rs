//! Publishing a run and recording the broker's answer.
//!
//! Order matters: a run is marked `dispatched` only after the broker
//! confirmed its message. A crash between the two leaves the run `claimed`
//! in the outbox; the reconciler publishes it again with the same message
//! id, which is safe because workers drop deliveries of finished runs.

use chrono::{DateTime, Utc};
use tracing::Instrument as _;

use belfry_broker::{Broker, PublishOutcome, PublisherSlot};
use belfry_ledger::{Ledger, RunRecord};
use belfry_protocol::JobMessage;

use crate::DispatchError;

/// What happened to a run at the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchOutcome {
    /// Confirmed by the broker and recorded.
    Dispatched,
    /// Returned by the broker: no worker group serves the job type. The run
    /// is `dead` with an error saying so.
    Unroutable,
    /// Not confirmed (broker down, nack, timeout). The run stays in the
    /// outbox for the reconciler.
    NotConfirmed(String),
}

/// Publishes runs and records the outcome in the ledger.
#[derive(Debug)]
pub struct Dispatcher {
    ledger: Ledger,
    publishers: PublisherSlot,
    /// `messaging.system` of the publish spans.
    system: &'static str,
}

/// The error text recorded for a job type no worker group serves.
pub fn unroutable_reason(job_type: &str) -> String {
    format!(
        "no worker group serves job type {job_type:?} at this priority: the broker returned the \
         message as unroutable; start a worker whose registry handles {job_type:?} (a worker \
         declares its group's high and low queues when it starts, so upgrade the workers before \
         publishing high or low runs), then trigger the run again"
    )
}

impl Dispatcher {
    /// A dispatcher publishing through `broker` and recording in `ledger`.
    pub fn new(broker: Broker, ledger: Ledger) -> Self {
        Self {
            ledger,
            system: broker.messaging_system(),
            publishers: PublisherSlot::new(broker),
        }
    }

    /// Publishes a freshly claimed run's `message` and records the answer:
    /// a batch of one ([`Dispatcher::dispatch_many`]), its `publish` span a
    /// child of the caller's span (or, outside the run's trace, of the
    /// run's stored context).
    pub async fn dispatch(&self, message: &JobMessage) -> DispatchOutcome {
        self.dispatch_many(std::slice::from_ref(message), &[tracing::Span::current()])
            .await
            .pop()
            .unwrap_or_else(|| DispatchOutcome::NotConfirmed("not published".into()))
    }

    /// Publishes freshly claimed runs pipelined and records the answers:
    /// one statement marks every confirmed run `dispatched`; returned runs
    /// become `dead` one by one (rare); unconfirmed ones stay in the outbox.
    /// Each message gets its own `publish` span under its fire's span
    /// (`parents`, one per message), so every run keeps its own trace; a
    /// parent outside the run's trace (an ad-hoc job enqueued under a
    /// caller's span, or under none) gives way to the run's stored context,
    /// so the row's trace id and the worker's spans agree.
    /// One outcome per message, in order; a failure to record is reported
    /// as [`DispatchOutcome::NotConfirmed`] (the run stays `claimed`, and a
    /// republish is safe).
    pub async fn dispatch_many(
        &self,
        messages: &[JobMessage],
        parents: &[tracing::Span],
    ) -> Vec<DispatchOutcome> {
        let spans: Vec<tracing::Span> = messages
            .iter()
            .zip(parents)
            .map(|(message, parent)| run_publish_span(self.system, message, parent))
            .collect();
        // With OpenTelemetry on, each message carries its publish span's
        // context, as a single publish does.
        let traced: Vec<JobMessage> = messages
            .iter()
            .zip(&spans)
            .map(
                |(message, span)| match span.in_scope(crate::run_trace::current) {
                    Some(trace) => JobMessage {
                        trace: Some(trace),
                        ..message.clone()
                    },
                    None => message.clone(),
                },
            )
            .collect();
        let answers = self.publishers.publish_many(&traced).await;
        let mut confirmed = Vec::new();
        for ((answer, span), message) in answers.iter().zip(&spans).zip(messages) {
            span.record("belfry.publish", publish_label(answer));
            if matches!(answer, Ok(PublishOutcome::Confirmed)) {
                confirmed.push(message.message_id);
            }
        }
        drop(spans);
        let recorded = if confirmed.is_empty() {
            Ok(0)
        } else {
            belfry_runtime::failpoint::hit("after_publish_before_dispatched");
            self.ledger.mark_dispatched_many(&confirmed).await
        };
        if let Err(e) = &recorded {
            tracing::error!(runs = confirmed.len(), error = %e,
                "confirmed publishes could not be recorded; the runs stay claimed and are republished");
        }
        let mut outcomes = Vec::with_capacity(messages.len());
        for (answer, message) in answers.into_iter().zip(messages) {
            outcomes.push(match answer {
                Ok(PublishOutcome::Confirmed) => match &recorded {
                    Ok(_) => DispatchOutcome::Dispatched,
                    Err(e) => DispatchOutcome::NotConfirmed(format!(
                        "dispatch could not be recorded: {e}"
                    )),
                },
                Ok(PublishOutcome::Unroutable) => match self.unroutable(message).await {
                    Ok(()) => DispatchOutcome::Unroutable,
                    Err(e) => DispatchOutcome::NotConfirmed(format!(
                        "dead run could not be recorded: {e}"
                    )),
                },
                Ok(PublishOutcome::Nacked) => {
                    not_confirmed(message, "the broker nacked the publish".into())
                }
                Err(e) => not_confirmed(message, e.to_string()),
            });
        }
        outcomes
    }

    /// Publishes a run taken from the outbox again (same message id, same
    /// trace) and records the answer; an unconfirmed run is retried after
    /// `retry_at`.
    ///
    /// # Errors
    ///
    /// [`DispatchError::Ledger`] when the ledger could not record the
    /// answer (the run's lease expires and it is taken again).
    pub async fn republish(
        &self,
        run: &RunRecord,
        retry_at: DateTime<Utc>,
    ) -> Result<DispatchOutcome, DispatchError> {
        let message = run.to_message();
        // A republished run stays in its original trace: the span is a child
        // of the context stored at claim time.
        let span = tracing::info_span!("republish", job.name = %run.job_name, job.type = %run.job_type,
            belfry.run_key = %run.run_key, belfry.status = %run.status_text);
        crate::run_trace::continue_in(&span, message.trace.as_ref());
        self.republish_message(run, message, retry_at)
            .instrument(span)
            .await
    }

    async fn republish_message(
        &self,
        run: &RunRecord,
        message: JobMessage,
        retry_at: DateTime<Utc>,
    ) -> Result<DispatchOutcome, DispatchError> {
        // The lease `take_due` set: later updates only apply while it holds.
        let lease = run.next_dispatch_at.unwrap_or(retry_at);
        match self.publish(&message).await {
            Ok(PublishOutcome::Confirmed) => {
                self.ledger.mark_republished(run.id, lease).await?;
                Ok(DispatchOutcome::Dispatched)
            }
            Ok(PublishOutcome::Unroutable) => {
                self.unroutable(&message).await?;
                Ok(DispatchOutcome::Unroutable)
            }
            Ok(PublishOutcome::Nacked) => {
                self.ledger
                    .postpone_dispatch(run.id, lease, retry_at)
                    .await?;
                Ok(not_confirmed(
                    &message,
                    "the broker nacked the publish".into(),
                ))
            }
            Err(reason) => {
                self.ledger
                    .postpone_dispatch(run.id, lease, retry_at)
                    .await?;
                Ok(not_confirmed(&message, reason))
            }
        }
    }

    async fn publish(&self, message: &JobMessage) -> Result<PublishOutcome, String> {
        let span = run_publish_span(self.system, message, &tracing::Span::current());
        async {
            // With OpenTelemetry on, the message carries this span's
            // context, so the worker's spans become its children; the row
            // keeps the claim's context (republishes start from it).
            let traced = crate::run_trace::current().map(|trace| JobMessage {
                trace: Some(trace),
                ..message.clone()
            });
            let result = self
                .publishers
                .publish(traced.as_ref().unwrap_or(message))
                .await
                .map_err(|e| e.to_string());
            tracing::Span::current().record("belfry.publish", publish_label(&result));
            result
        }
        .instrument(span)
        .await
    }

    async fn unroutable(&self, message: &JobMessage) -> Result<(), DispatchError> {
        let reason = unroutable_reason(&message.job_type);
        tracing::error!(run_key = %message.run_key, job_type = %message.job_type, "{reason}");
        self.ledger.mark_dead(message.message_id, &reason).await?;
        Ok(())
    }
}

/// The `publish` span of `message`, under `parent` (none: a root).
fn publish_span(
    system: &'static str,
    message: &JobMessage,
    parent: Option<tracing::Id>,
) -> tracing::Span {
    tracing::info_span!(parent: parent, "publish", otel.kind = "producer",
        messaging.system = system, messaging.operation.type = "send",
        messaging.rabbitmq.destination.routing_key = %message.job_type,
        messaging.message.id = %message.message_id, belfry.publish = tracing::field::Empty)
}

/// The `publish` span of `message` under `parent`, in the run's trace.
/// Under a `fire` (or a republish) span that already is the case;
/// otherwise (an ad-hoc job enqueued outside any span, or under a caller's
/// span of another trace) it is parented on the run's stored context, so
/// the row's trace id and the worker's spans agree.
fn run_publish_span(
    system: &'static str,
    message: &JobMessage,
    parent: &tracing::Span,
) -> tracing::Span {
    let span = publish_span(system, message, parent.id());
    if belfry_runtime::trace_propagation::enabled() {
        let caller = parent.in_scope(crate::run_trace::current);
        let same = match (&caller, &message.trace) {
            (Some(c), Some(m)) => c.trace_id() == m.trace_id(),
            _ => false,
        };
        if !same {
            crate::run_trace::continue_in(&span, message.trace.as_ref());
        }
    }
    span
}

/// The `belfry.publish` value of a publish span.
fn publish_label<E>(answer: &Result<PublishOutcome, E>) -> &'static str {
    match answer {
        Ok(PublishOutcome::Confirmed) => "confirmed",
        Ok(PublishOutcome::Unroutable) => "unroutable",
        Ok(PublishOutcome::Nacked) => "nacked",
        Err(_) => "failed",
    }
}

fn not_confirmed(message: &JobMessage, reason: String) -> DispatchOutcome {
    tracing::error!(id = %message.message_id, run_key = %message.run_key, error = %reason,
        "publish not confirmed; the run stays in the outbox for the reconciler");
    DispatchOutcome::NotConfirmed(reason)
}
