//! Dispatching a claimed run: publish with confirm, then record it.
//!
//! Order matters: the row is marked `dispatched` only after the broker
//! confirmed the message. A crash between the two leaves the row `claimed`
//! with the message possibly stored; publishing it again later with the
//! same message id is safe because workers drop deliveries of finished runs.

use std::sync::Arc;

use chrono::Utc;
use uuid::Uuid;

use belfry_broker::{Broker, PublishOutcome, PublisherSlot};
use belfry_ledger::{Ledger, NewRun};
use belfry_protocol::{JobMessage, TraceContext, MESSAGE_VERSION};

use crate::counters::FireCounters;
use crate::SchedulerError;

/// What happened to a claimed run at the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchOutcome {
    /// Confirmed by the broker; the run is `dispatched`.
    Dispatched,
    /// Returned by the broker: no worker group serves the job type. The
    /// run is `dead` with an error saying so.
    Unroutable,
    /// Not confirmed (broker down, nack, timeout). The run stays `claimed`
    /// for the reconciler to publish again.
    NotConfirmed(String),
}

/// Publishes claimed runs for one replica.
#[derive(Debug)]
pub struct Dispatcher {
    ledger: Ledger,
    counters: Arc<FireCounters>,
    publisher: PublisherSlot,
}

/// The job message for a run.
pub fn message_for(run: &NewRun) -> JobMessage {
    JobMessage {
        version: MESSAGE_VERSION,
        message_id: run.id,
        job_name: run.job_name.clone(),
        job_type: run.job_type.clone(),
        run_key: run.run_key.clone(),
        scheduled_at: run.scheduled_at,
        published_at: Utc::now(),
        attempt: 1,
        payload: run.payload.clone(),
        trace: run
            .traceparent
            .as_deref()
            .and_then(|tp| TraceContext::from_traceparent(tp, None)),
    }
}

impl Dispatcher {
    /// A dispatcher publishing through `broker` and recording in `ledger`.
    pub fn new(broker: Broker, ledger: Ledger, counters: Arc<FireCounters>) -> Self {
        Self {
            publisher: PublisherSlot::new(broker),
            ledger,
            counters,
        }
    }

    /// Publishes the run and records the broker's answer in the ledger.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the broker answered but the ledger
    /// could not record it (the run stays `claimed`; a republish is safe).
    pub async fn dispatch(&self, run: &NewRun) -> Result<DispatchOutcome, SchedulerError> {
        let message = message_for(run);
        let published = match self.publisher.get().await {
            Ok(p) => p.publish(&message).await,
            Err(e) => Err(e),
        };
        match published {
            Ok(PublishOutcome::Confirmed) => {
                FireCounters::add(&self.counters.published, 1);
                self.ledger.mark_dispatched(run.id).await?;
                Ok(DispatchOutcome::Dispatched)
            }
            Ok(PublishOutcome::Unroutable) => {
                FireCounters::add(&self.counters.unroutable, 1);
                let reason = format!(
                    "no worker group serves job type {:?}: the broker returned the message as \
                     unroutable; start a worker whose registry handles {:?}, then trigger the \
                     run again",
                    run.job_type, run.job_type
                );
                tracing::error!(run_key = %run.run_key, job_type = %run.job_type, "{reason}");
                self.ledger.mark_dead(run.id, &reason).await?;
                Ok(DispatchOutcome::Unroutable)
            }
            Ok(PublishOutcome::Nacked) => {
                Ok(self.not_confirmed(run.id, &run.run_key, "broker nacked the publish".into()))
            }
            Err(e) => {
                self.publisher.reset().await;
                Ok(self.not_confirmed(run.id, &run.run_key, e.to_string()))
            }
        }
    }

    fn not_confirmed(&self, id: Uuid, run_key: &str, reason: String) -> DispatchOutcome {
        FireCounters::add(&self.counters.publish_errors, 1);
        tracing::error!(%id, %run_key, error = %reason, "publish not confirmed; the run stays claimed");
        DispatchOutcome::NotConfirmed(reason)
    }
}
