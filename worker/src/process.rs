//! One delivery, from decode to ack.
//!
//! The ledger is consulted before any work: a delivery whose run is already
//! finished is acked and dropped, so a redelivered or republished message
//! never re-runs finished work. Every attempt is counted in `job_runs`
//! before the handler runs, so a crash mid-attempt still counts it. The
//! delivery is acked only after the outcome is recorded: if recording
//! fails, the delivery goes back to the queue and the ledger decides again
//! on redelivery.

use chrono::Utc;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use belfry_broker::{DeadLetter, Delivery};
use belfry_ledger::{AttemptEntry, AttemptStart, LedgerError, RunStatus};
use belfry_protocol::topology::HEADER_TRACEPARENT;
use belfry_protocol::JobMessage;

use crate::attempt::{run_attempt, AttemptResult};
use crate::counters::WorkerCounters;
use crate::job::{JobContext, JobError};
use crate::Worker;

/// What the worker did with one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessOutcome {
    /// The run succeeded.
    Succeeded,
    /// The handler reported a permanent error; the run is `failed`.
    Failed,
    /// The run is `dead` and the message dead-lettered.
    Dead,
    /// The run was already finished; the delivery was dropped.
    Duplicate,
    /// The body was not a job message; it was dead-lettered.
    Undecodable,
    /// The delivery went back to the queue (shutdown, or the ledger was
    /// unreachable).
    HandedBack,
}

struct Finish<'a> {
    id: Uuid,
    status: RunStatus,
    entry: AttemptEntry,
    dead_letter: Option<&'a str>,
}

impl Worker {
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
        let Some(handler) = self.registry.get(&message.job_type).cloned() else {
            let reason = format!(
                "no handler for job type {:?} in worker group {:?} (it handles {:?}); register \
                 the type in a worker of a group bound to it",
                message.job_type,
                self.group,
                self.registry.types()
            );
            return self.give_up(&delivery, &message, &reason).await;
        };
        loop {
            let (id, attempt) = match self.ledger.begin_attempt(&message, &self.instance).await {
                Ok(AttemptStart::Started { id, attempt }) => (id, attempt),
                Ok(AttemptStart::AlreadyFinished { id, status }) => {
                    WorkerCounters::add(&self.counters.duplicates);
                    tracing::info!(%id, run_key = %message.run_key, %status, "run already finished; dropping duplicate delivery");
                    self.ack(&delivery).await;
                    return ProcessOutcome::Duplicate;
                }
                Err(e @ LedgerError::IdConflict { .. }) => {
                    return self.give_up(&delivery, &message, &e.to_string()).await;
                }
                Err(e) => {
                    tracing::error!(run_key = %message.run_key, error = %e, "cannot start attempt; handing the delivery back");
                    return self.hand_back(&delivery, None).await;
                }
            };
            let attempt_no = u32::try_from(attempt).unwrap_or(u32::MAX);
            let started_at = Utc::now();
            let mut entry = AttemptEntry {
                attempt,
                worker: self.instance.clone(),
                started_at,
                finished_at: started_at,
                outcome: String::new(),
                error: None,
            };
            if attempt_no > self.retry.max_attempts {
                // The attempts were used up by earlier deliveries (a worker
                // crashing mid-run, say): do not run the handler again.
                let reason = format!(
                    "retries exhausted: attempt {attempt} exceeds the maximum of {} (earlier attempts did not finish)",
                    self.retry.max_attempts
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
            let ctx = JobContext {
                run_id: id,
                job_name: message.job_name.clone(),
                run_key: message.run_key.clone(),
                attempt: attempt_no,
                scheduled_at: message.scheduled_at,
                cancel: hard_stop.child_token(),
                span: span.clone(),
            };
            WorkerCounters::add(&self.counters.attempts);
            let result = run_attempt(
                &handler,
                ctx,
                message.payload.clone(),
                self.job_timeout,
                hard_stop,
            )
            .await;
            entry.finished_at = Utc::now();
            let _enter = span.enter();
            let (outcome, error, requested_delay) = match result {
                AttemptResult::Succeeded => {
                    entry.outcome = "succeeded".into();
                    tracing::info!("attempt succeeded");
                    return self
                        .finish(
                            &delivery,
                            Finish {
                                id,
                                status: RunStatus::Succeeded,
                                entry,
                                dead_letter: None,
                            },
                        )
                        .await;
                }
                AttemptResult::Failed(JobError::Permanent(m)) => {
                    entry.outcome = "failed".into();
                    entry.error = Some(m.clone());
                    tracing::warn!(error = %m, "attempt failed permanently");
                    return self
                        .finish(
                            &delivery,
                            Finish {
                                id,
                                status: RunStatus::Failed,
                                entry,
                                dead_letter: None,
                            },
                        )
                        .await;
                }
                AttemptResult::InvalidPayload(m) => {
                    let reason = format!(
                        "payload does not match job type {:?}: {m}",
                        message.job_type
                    );
                    entry.outcome = "invalid_payload".into();
                    entry.error = Some(reason.clone());
                    tracing::error!(error = %reason, "dead-lettering: payload cannot be decoded");
                    return self.dead(&delivery, id, entry, &reason).await;
                }
                AttemptResult::Interrupted => {
                    tracing::warn!("attempt interrupted by shutdown; handing the run back");
                    return self.hand_back(&delivery, Some(id)).await;
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
            let Some(policy_delay) = self.retry.delay_after(attempt_no) else {
                let reason =
                    format!("retries exhausted after {attempt} attempts; last error: {error}");
                tracing::error!(error = %reason, "run is dead");
                return self.dead(&delivery, id, entry, &reason).await;
            };
            let delay = requested_delay.unwrap_or(policy_delay);
            tracing::warn!(%error, ?delay, "attempt failed; retrying");
            if let Err(e) = self
                .ledger
                .end_attempt(id, RunStatus::Retrying, &entry, entry.error.as_deref())
                .await
            {
                tracing::error!(error = %e, "cannot record the failed attempt; handing the delivery back");
                return self.hand_back(&delivery, None).await;
            }
            drop(_enter);
            // Shutdown wins over the back-off: the attempt count is durable,
            // so the run continues where it stopped on redelivery.
            tokio::select! {
                biased;
                _ = hard_stop.cancelled() => return self.hand_back(&delivery, None).await,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn finish(&self, delivery: &Delivery, f: Finish<'_>) -> ProcessOutcome {
        let last_error = f.dead_letter.or(f.entry.error.as_deref());
        match self
            .ledger
            .end_attempt(f.id, f.status, &f.entry, last_error)
            .await
        {
            Ok(_) => {}
            Err(e) => {
                tracing::error!(id = %f.id, error = %e, "cannot record the outcome; handing the delivery back");
                return self.hand_back(delivery, None).await;
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

    /// Ends the attempt with the run `dead` for `reason`, dead-lettering
    /// the delivery.
    async fn dead(
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
    async fn give_up(
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

    async fn dead_letter_and_ack(&self, delivery: &Delivery, id: Option<Uuid>, reason: &str) {
        let traceparent = delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(HEADER_TRACEPARENT))
            .and_then(|v| v.as_long_string())
            .map(|s| s.to_string());
        let dead = DeadLetter {
            body: &delivery.data,
            reason,
            routing_key: delivery.routing_key.as_str(),
            by: &self.instance,
            message_id: id.map(|i| i.to_string()),
            traceparent,
        };
        let published = match self.dead_letters.get().await {
            Ok(p) => p.dead_letter(&dead).await,
            Err(e) => Err(e),
        };
        match published {
            Ok(_) => {
                WorkerCounters::add(&self.counters.dead_lettered);
                self.ack(delivery).await;
            }
            Err(e) => {
                // The queue's own dead-letter exchange takes a rejected
                // message: reject without requeue instead of losing it.
                tracing::error!(error = %e, "dead-letter publish failed; rejecting to the queue's dead-letter exchange");
                self.dead_letters.reset().await;
                WorkerCounters::add(&self.counters.dead_lettered);
                let nack = BasicNackOptions {
                    requeue: false,
                    ..BasicNackOptions::default()
                };
                if let Err(e) = delivery.acker.nack(nack).await {
                    tracing::warn!(error = %e, "reject failed; the broker will redeliver");
                }
            }
        }
    }

    async fn hand_back(&self, delivery: &Delivery, running: Option<Uuid>) -> ProcessOutcome {
        if let Some(id) = running {
            if let Err(e) = self
                .ledger
                .hand_back(
                    id,
                    "interrupted by worker shutdown; handed back to the queue",
                )
                .await
            {
                tracing::warn!(%id, error = %e, "cannot mark the run handed back; it stays running until redelivered");
            }
        }
        WorkerCounters::add(&self.counters.handed_back);
        let nack = BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        };
        if let Err(e) = delivery.acker.nack(nack).await {
            tracing::warn!(error = %e, "nack failed; the broker requeues the delivery when the channel closes");
        }
        ProcessOutcome::HandedBack
    }

    async fn ack(&self, delivery: &Delivery) {
        if let Err(e) = delivery.acker.ack(BasicAckOptions::default()).await {
            // The outcome is already in the ledger: a redelivery will be
            // recognised as a duplicate.
            tracing::warn!(error = %e, "ack failed; a redelivery will be dropped as a duplicate");
        }
    }
}
