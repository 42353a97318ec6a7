//! Retention: prunes finished runs (and records of skipped fires, alert
//! events whose deliveries are all final, and the log lines of runs that
//! are gone) older than
//! `BELFRY_RETENTION`, so `job_runs` stays the size of its useful history.
//!
//! On Postgres most runs go a whole day at a time: a day partition of
//! `job_runs` past the cutoff whose runs have all finished is dropped
//! (`belfry_ledger::RunPartition`); what no day partition holds (runs whose
//! key names no instant, the history from before partitioning, a day kept
//! for an unfinished run) is deleted row by row as below.
//!
//! Every replica runs the pruner; batches use `SKIP LOCKED`, so replicas
//! pruning at the same moment split the work instead of queueing on row
//! locks. A short pause between batches leaves the database to the claim
//! path when there is a large backlog (the first run after enabling
//! retention on an old table).

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use belfry_ledger::{Ledger, LedgerError};

/// Rows deleted per statement.
pub const PRUNE_BATCH: i64 = 1_000;
/// Pause between two full batches.
const BATCH_PAUSE: Duration = Duration::from_millis(50);

/// What one pruning pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Finished runs deleted.
    pub runs: u64,
    /// Skipped-fire records deleted.
    pub skipped_fires: u64,
    /// Alert events deleted (with their deliveries).
    pub alerts: u64,
    /// Day partitions of `job_runs` dropped whole.
    pub partitions: u64,
    /// Rate-limit starts deleted that no window reaches any more (keys no
    /// run asked for in a day).
    pub rate_starts: u64,
    /// Run log lines deleted (their runs were pruned).
    pub log_lines: u64,
}

/// Prunes one ledger's old history.
#[derive(Debug, Clone)]
pub struct Retention {
    ledger: Ledger,
    keep: Duration,
}

impl Retention {
    /// Keeps finished runs for `keep` after they finished.
    pub fn new(ledger: Ledger, keep: Duration) -> Self {
        Self { ledger, keep }
    }

    /// Deletes everything older than `keep` before `now`, batch by batch,
    /// until nothing is left or `cancel` fires.
    ///
    /// # Errors
    ///
    /// [`LedgerError`] when the database cannot be reached (what was deleted
    /// so far stays deleted; the next pass continues).
    pub async fn prune_once(
        &self,
        now: DateTime<Utc>,
        cancel: &CancellationToken,
    ) -> Result<Pruned, LedgerError> {
        let mut pruned = Pruned::default();
        // A retention longer than the calendar reaches prunes nothing.
        let Some(cutoff) = chrono::Duration::from_std(self.keep)
            .ok()
            .and_then(|keep| now.checked_sub_signed(keep))
        else {
            return Ok(pruned);
        };
        // Whole days first: what they drop, row-by-row pruning need not
        // look at. A failure there (a lock not granted) does not hold up
        // the rest of the pass.
        match self.ledger.drop_expired_run_partitions(cutoff).await {
            Ok(days) => {
                pruned.partitions = u64::try_from(days.dropped.len()).unwrap_or(u64::MAX);
                if !days.kept.is_empty() {
                    tracing::info!(
                        partitions = ?days.kept,
                        "run partitions past retention kept (an unfinished run, or busy); their finished runs are pruned row by row"
                    );
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "dropping expired run partitions failed; retrying next pass")
            }
        }
        loop {
            let runs = self.ledger.prune_finished_runs(cutoff, PRUNE_BATCH).await?;
            let skipped = self.ledger.prune_skipped_fires(cutoff, PRUNE_BATCH).await?;
            // Spans of skipped fires go with the skipped fires (counted
            // with them: each is one record of skips).
            let spans = self
                .ledger
                .prune_skipped_ranges(cutoff, PRUNE_BATCH)
                .await?;
            // Alert events whose deliveries are all final (with them).
            let alerts = self.ledger.prune_alerts(cutoff, PRUNE_BATCH).await?;
            // Not the runs' retention: no rate window is longer than a
            // day, so an older start counts for nothing whatever is kept.
            let window = chrono::Duration::from_std(belfry_protocol::rate_limit::MAX_RATE_WINDOW)
                .unwrap_or(chrono::Duration::days(1));
            let rate_starts = self
                .ledger
                .prune_rate_limits(now - window, PRUNE_BATCH)
                .await?;
            // After the runs: a line goes once its run is gone.
            let log_lines = self.ledger.prune_run_logs(cutoff, PRUNE_BATCH).await?;
            pruned.runs += runs;
            pruned.rate_starts += rate_starts;
            pruned.log_lines += log_lines;
            pruned.skipped_fires += skipped + spans;
            pruned.alerts += alerts;
            let full = runs >= PRUNE_BATCH as u64
                || skipped >= PRUNE_BATCH as u64
                || spans >= PRUNE_BATCH as u64
                || alerts >= PRUNE_BATCH as u64
                || rate_starts >= PRUNE_BATCH as u64
                || log_lines >= PRUNE_BATCH as u64;
            if !full || cancel.is_cancelled() {
                return Ok(pruned);
            }
            tokio::time::sleep(BATCH_PAUSE).await;
        }
    }

    /// Prunes every `every` until `cancel`.
    pub async fn run(self, every: Duration, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Shutdown wins over a due pass; a pass in progress finishes its
            // current batch (one short statement) and stops at the next check.
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.prune_once(Utc::now(), &cancel).await {
                Ok(p) if p.runs + p.skipped_fires + p.partitions > 0 => tracing::info!(
                    runs = p.runs,
                    skipped_fires = p.skipped_fires,
                    run_partitions = p.partitions,
                    keep = %humantime::format_duration(self.keep),
                    "pruned history past retention"
                ),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "pruning old runs failed; retrying next pass"),
            }
        }
    }
}
