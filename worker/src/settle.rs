//! Settling a delivery: once its attempt is over (or could not start),
//! the delivery is acked after its outcome is recorded, handed back to the
//! queue, or dead-lettered with a reason, exactly once. The decisions are
//! `crate::process`'s; what each one does to the ledger and the broker is
//! here.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use belfry_broker::{DeadLetter, Delivery, PublishOutcome};
use belfry_ledger::{AttemptEntry, RunStatus};
use belfry_protocol::JobMessage;

use crate::counters::WorkerCounters;
use crate::process::{EndFailed, Finish, ProcessOutcome, HAND_BACK_PAUSE};
use crate::Worker;

impl Worker {
    pub(crate) async fn finish(&self, delivery: &Delivery, f: Finish<'_>) -> ProcessOutcome {
        let last_error = f.dead_letter.or(f.entry.error.as_deref());
        match self.end(f.id, f.status, &f.entry, last_error, None).await {
            Ok(true) => {}
            Ok(false) => return self.superseded(delivery, f.id, f.entry.attempt).await,
            Err(e) => {
                return self
                    .end_failed(delivery, f.id, e, &CancellationToken::new())
                    .await
            }
        }
        let outcome = match f.status {
            RunStatus::Succeeded => {
                WorkerCounters::add(&self.counters.succeeded);
                ProcessOutcome::Succeeded
            }
            RunStatus::Failed => {
                WorkerCounters::add(&self.counters.failed);
                ProcessOutcome::Failed
            }
            RunStatus::Cancelled => {
                WorkerCounters::add(&self.counters.cancelled);
                ProcessOutcome::Cancelled
            }
            _ => {
                WorkerCounters::add(&self.counters.dead);
                ProcessOutcome::Dead
            }
        };
        match f.dead_letter {
            Some(reason) => self.dead_letter_and_ack(delivery, Some(f.id), reason).await,
            None => self.ack(delivery).await,
        }
        outcome
    }

    /// An outcome could not be written. Unreachable ledger: the delivery
    /// goes back to the queue after a pause and the redelivery decides
    /// again. Data the database refuses: writing it again would fail again,
    /// so the message is dead-lettered once with the reason (the run stays
    /// `running` until its lease ends and the stuck report names it).
    pub(crate) async fn end_failed(
        &self,
        delivery: &Delivery,
        id: Uuid,
        e: EndFailed,
        hard_stop: &CancellationToken,
    ) -> ProcessOutcome {
        match e {
            EndFailed::Unavailable(e) => {
                tracing::error!(%id, error = %e, "cannot record the outcome; handing the delivery back");
                self.hand_back_after(delivery, None, HAND_BACK_PAUSE, hard_stop)
                    .await
            }
            EndFailed::Refused(e) => {
                let reason = format!("the ledger cannot store this run's outcome: {e}");
                tracing::error!(%id, error = %reason, "dead-lettering");
                WorkerCounters::add(&self.counters.dead);
                self.dead_letter_and_ack(delivery, Some(id), &reason).await;
                ProcessOutcome::Dead
            }
        }
    }

    /// The attempt's lease was taken over by another attempt: nothing was
    /// written; the other attempt owns the run and its outcome.
    pub(crate) async fn superseded(
        &self,
        delivery: &Delivery,
        id: Uuid,
        attempt: i32,
    ) -> ProcessOutcome {
        WorkerCounters::add(&self.counters.superseded);
        tracing::warn!(%id, attempt, "attempt lost its lease to another attempt; its outcome is not recorded");
        self.ack(delivery).await;
        ProcessOutcome::Superseded
    }

    /// Ends the attempt and the run with `status` (`succeeded`, `failed`
    /// for a permanent error, or `cancelled`); nothing is dead-lettered.
    pub(crate) async fn conclude(
        &self,
        delivery: &Delivery,
        id: Uuid,
        status: RunStatus,
        entry: AttemptEntry,
    ) -> ProcessOutcome {
        let finish = Finish {
            id,
            status,
            entry,
            dead_letter: None,
        };
        self.finish(delivery, finish).await
    }

    /// Ends the attempt with the run `dead` for `reason`, dead-lettering
    /// the delivery.
    pub(crate) async fn dead(
        &self,
        delivery: &Delivery,
        id: Uuid,
        entry: AttemptEntry,
        reason: &str,
    ) -> ProcessOutcome {
        let finish = Finish {
            id,
            status: RunStatus::Dead,
            entry,
            dead_letter: Some(reason),
        };
        self.finish(delivery, finish).await
    }

    /// Records the run `dead` with `reason` and dead-letters the delivery.
    pub(crate) async fn give_up(
        &self,
        delivery: &Delivery,
        message: &JobMessage,
        reason: &str,
    ) -> ProcessOutcome {
        tracing::error!(run_key = %message.run_key, job_type = %message.job_type, error = %reason, "dead-lettering");
        if let Err(e) = self.ledger.record_dead(message, reason).await {
            tracing::error!(run_key = %message.run_key, error = %e, "cannot record the dead run");
        }
        WorkerCounters::add(&self.counters.dead);
        self.dead_letter_and_ack(delivery, Some(message.message_id), reason)
            .await;
        ProcessOutcome::Dead
    }

    pub(crate) async fn dead_letter_and_ack(
        &self,
        delivery: &Delivery,
        id: Option<Uuid>,
        reason: &str,
    ) {
        let traceparent = delivery.traceparent.clone();
        let dead = DeadLetter {
            body: &delivery.data,
            reason,
            routing_key: &delivery.routing_key,
            by: &self.instance,
            message_id: id.map(|i| i.to_string()),
            traceparent,
        };
        WorkerCounters::add(&self.counters.dead_lettered);
        match self.dead_letters.dead_letter(&dead).await {
            Ok(PublishOutcome::Confirmed) => self.ack(delivery).await,
            other => {
                // Not stored in the dead-letter queue (broker down, nack, or
                // the queue is gone): reject without requeue instead, and the
                // group queue's own dead-letter exchange takes the message.
                tracing::error!(result = ?other, "dead-letter publish not confirmed; rejecting to the queue's dead-letter exchange");
                if let Err(e) = delivery.reject(reason, &self.instance).await {
                    tracing::warn!(error = %e, "reject failed; the broker will redeliver");
                }
            }
        }
    }

    /// Gives the delivery back to the queue after `pause` (cut short by
    /// `hard_stop`), first returning attempt `running` of the run to
    /// `retrying` when this worker holds it.
    pub(crate) async fn hand_back_after(
        &self,
        delivery: &Delivery,
        running: Option<(Uuid, i32)>,
        pause: Duration,
        hard_stop: &CancellationToken,
    ) -> ProcessOutcome {
        if let Some((id, attempt)) = running {
            let reason = "interrupted by worker shutdown; handed back to the queue";
            if let Err(e) = self.ledger.hand_back(id, attempt, reason).await {
                tracing::warn!(%id, error = %e, "cannot mark the run handed back; its lease expires and a redelivery takes over");
            }
        }
        // Pausing keeps a worker whose database is down (or a duplicate of
        // a held run) from spinning the delivery through the queue.
        tokio::select! {
            _ = hard_stop.cancelled() => {}
            _ = tokio::time::sleep(pause) => {}
        }
        WorkerCounters::add(&self.counters.handed_back);
        if let Err(e) = delivery.requeue().await {
            tracing::warn!(error = %e, "nack failed; the broker requeues the delivery when the channel closes");
        }
        ProcessOutcome::HandedBack
    }

    pub(crate) async fn ack(&self, delivery: &Delivery) {
        belfry_runtime::failpoint::hit("before_ack");
        if let Err(e) = delivery.ack().await {
            // The outcome is already in the ledger: a redelivery will be
            // recognised as a duplicate.
            tracing::warn!(error = %e, "ack failed; a redelivery will be dropped as a duplicate");
        }
    }
}
