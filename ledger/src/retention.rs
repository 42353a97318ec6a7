//! Retention: finished runs older than a configured age are deleted, in
//! small batches, so `job_runs` does not grow forever.
//!
//! Each batch is one short statement (`LIMIT` rows, `FOR UPDATE SKIP
//! LOCKED`): no long table lock, and two replicas pruning at once take
//! different rows instead of waiting on each other. Unfinished runs are
//! never touched, and the newest scheduled fire of every schedule is kept
//! whatever its age: misfire recovery after downtime counts from it.

use chrono::{DateTime, Utc};

use crate::fire_history::live_fire;
use crate::{Ledger, LedgerError};

impl Ledger {
    /// Deletes up to `batch` finished runs that finished before `cutoff`
    /// (keeping each schedule's newest scheduled fire); returns how many.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn prune_finished_runs(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        self.prune(Retained::FinishedRuns, cutoff, batch).await
    }

    /// Deletes up to `batch` records of skipped fires made before `cutoff`;
    /// returns how many.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn prune_skipped_fires(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        self.prune(Retained::SkippedFires, cutoff, batch).await
    }

    /// Deletes up to `batch` rows of `rows` older than `cutoff`, oldest
    /// first; returns how many.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub(crate) async fn prune(
        &self,
        rows: Retained,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        self.store
            .prune(PruneBatch {
                rows,
                cutoff,
                batch,
            })
            .await
    }
}

/// SQL true unless the finished run aliased `r` is its schedule's newest
/// live fire (see [`crate::fire_history::live_fire`]), which retention
/// keeps whatever its age: misfire recovery after downtime counts from it.
/// The same on both backends.
pub(crate) fn not_newest_fire() -> String {
    format!(
        "(NOT COALESCE({}, FALSE) \
          OR EXISTS (SELECT 1 FROM job_runs n \
                     WHERE n.job_name = r.job_name AND n.scheduled_at > r.scheduled_at \
                       AND {}))",
        live_fire("r"),
        live_fire("n")
    )
}

/// SQL that is true when the finished run aliased `r` has no follow-ups
/// left to decide (see `crate::follow_up`): retention keeps a parent whose
/// join still waits, so the pass finds it. `has_follow_ups` is the
/// dialect's test that `r` has follow-up lists.
pub(crate) fn follow_ups_decided(has_follow_ups: &str) -> String {
    format!("(r.follow_ups_done_at IS NOT NULL OR NOT ({has_follow_ups}))")
}

/// What retention deletes, one kind of row at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retained {
    /// Finished runs, by `finished_at` (each schedule's newest scheduled
    /// fire is kept).
    FinishedRuns,
    /// Records of skipped fires, by `recorded_at`.
    SkippedFires,
    /// Spans of skipped fires, by `recorded_at`.
    SkippedRanges,
}

impl Retained {
    /// The table the rows are in.
    pub(crate) fn table(self) -> &'static str {
        match self {
            Self::FinishedRuns => "job_runs",
            Self::SkippedFires => "skipped_fires",
            Self::SkippedRanges => "skipped_ranges",
        }
    }
}

/// One batch of retention: up to `batch` rows of one kind that finished
/// (runs) or were recorded (skips) before `cutoff`, oldest first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PruneBatch {
    /// Which rows.
    pub(crate) rows: Retained,
    /// Only rows older than this.
    pub(crate) cutoff: DateTime<Utc>,
    /// At most this many.
    pub(crate) batch: i64,
}
