//! The outbox reconciler, run on every scheduler replica.
//!
//! Each pass takes the runs whose `next_dispatch_at` has passed — claimed
//! runs whose claimer never got a confirm (it died, or the broker was down),
//! delayed ad-hoc jobs that came due, retries whose long back-off ended —
//! and publishes them again with their original message id and trace.
//! Taking a batch leases it (`FOR UPDATE SKIP LOCKED`, then
//! `next_dispatch_at = now() + lease`), so replicas never publish the same
//! row concurrently, and a replica dying mid-pass only delays its batch by
//! one lease.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use belfry_ledger::Ledger;

use crate::{DispatchError, DispatchOutcome, Dispatcher};

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Runs taken from the outbox.
    pub taken: usize,
    /// Published and confirmed.
    pub republished: usize,
    /// Returned as unroutable (now `dead`).
    pub unroutable: usize,
    /// Not confirmed; postponed.
    pub failed: usize,
    /// The pass took a full batch: more may be due, run the next at once.
    pub more: bool,
}

/// The outbox loop.
#[derive(Debug)]
pub struct Reconciler {
    ledger: Ledger,
    dispatcher: Arc<Dispatcher>,
    lease: Duration,
    batch: i64,
}

impl Reconciler {
    /// A reconciler taking at most `batch` runs per pass and leasing them for
    /// `lease` (longer than a publish can take).
    pub fn new(ledger: Ledger, dispatcher: Arc<Dispatcher>, lease: Duration, batch: i64) -> Self {
        Self {
            ledger,
            dispatcher,
            lease,
            batch: batch.max(1),
        }
    }

    /// One pass: take what is due and publish it.
    ///
    /// # Errors
    ///
    /// [`DispatchError::Ledger`] when the outbox cannot be read.
    pub async fn reconcile_once(&self) -> Result<ReconcileReport, DispatchError> {
        let due = self.ledger.take_due(self.batch, self.lease).await?;
        let mut report = ReconcileReport {
            taken: due.len(),
            more: due.len() >= usize::try_from(self.batch).unwrap_or(usize::MAX),
            ..ReconcileReport::default()
        };
        if due.is_empty() {
            return Ok(report);
        }
        let retry_at = Utc::now() + chrono::Duration::seconds(5);
        let outcomes = futures::future::join_all(
            due.iter()
                .map(|run| self.dispatcher.republish(run, retry_at)),
        )
        .await;
        for (run, outcome) in due.iter().zip(outcomes) {
            match outcome {
                Ok(DispatchOutcome::Dispatched) => {
                    report.republished += 1;
                    tracing::info!(run_key = %run.run_key, status = %run.status_text, "outbox run published");
                }
                Ok(DispatchOutcome::Unroutable) => report.unroutable += 1,
                Ok(DispatchOutcome::NotConfirmed(_)) => report.failed += 1,
                Err(e) => {
                    report.failed += 1;
                    tracing::error!(run_key = %run.run_key, error = %e, "outbox publish could not be recorded; the lease will expire and it is taken again");
                }
            }
        }
        Ok(report)
    }
}
