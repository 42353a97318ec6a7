//! Keeps the day partitions of `job_runs` created ahead of the fires that
//! need them (issue 21; see `belfry_ledger::RunPartition` for the layout).
//!
//! Every replica runs the keeper: passes are serialised in the database
//! and a day that exists is skipped, so replicas preparing at the same
//! moment create each day once. A pass that fails (the database is away, a
//! lock was not granted within its short timeout) is logged and retried at
//! the next; meanwhile fires of a day without its partition land in the
//! default partition and move into the day when it is created, so nothing
//! waits on the keeper. Retention's half, dropping expired days, is in
//! [`crate::retention`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use belfry_ledger::{days_ahead, Ledger, LedgerError, PARTITION_DAYS_AHEAD};

/// How often the keeper checks the days ahead.
pub const PREPARE_EVERY: Duration = Duration::from_secs(600);

/// Creates `job_runs`' day partitions ahead of time.
#[derive(Debug, Clone)]
pub struct RunPartitionKeeper {
    ledger: Ledger,
}

impl RunPartitionKeeper {
    /// A keeper for `ledger` (on the embedded ledger every pass is a no-op).
    pub fn new(ledger: Ledger) -> Self {
        Self { ledger }
    }

    /// Creates the partitions of `now`'s UTC day and the
    /// [`PARTITION_DAYS_AHEAD`] days after it that do not exist; returns
    /// the names created.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when the database cannot be reached or a lock was
    /// not granted in time (the days created so far stay).
    pub async fn prepare_once(&self, now: DateTime<Utc>) -> Result<Vec<String>, LedgerError> {
        self.ledger
            .prepare_run_partitions(&days_ahead(now.date_naive(), PARTITION_DAYS_AHEAD))
            .await
    }

    /// One pass now, then one every `every` until `cancel`.
    pub async fn run(self, every: Duration, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Shutdown wins over a due pass; a pass in progress is a few
            // short transactions and ends on its own.
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.prepare_once(Utc::now()).await {
                Ok(created) if !created.is_empty() => {
                    tracing::info!(partitions = ?created, "created run partitions ahead");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    "creating run partitions ahead failed; retrying next pass (fires meanwhile land in job_runs_default)"
                ),
            }
        }
    }
}
