//! Spans of fires a misfire policy skipped before any was claimed.
//!
//! When every replica was down, the ledger unreachable or a timer stalled,
//! a schedule's policy decides on all the instants it missed at once, most
//! of them never claimed (a ten-minute outage of a one-second schedule is
//! 600 of them; belfry counts them arithmetically rather than one by one).
//! The skipped ones are always the oldest of the span (every policy keeps
//! the newest), so one row `(job_name, after, until]` per decision records
//! them, with their count and the reason. With `job_runs` and
//! `skipped_fires`, every instant of a schedule is then either run or
//! skipped with a reason: none is silently absent. Replicas deciding the
//! same span record it once (primary key); retention prunes spans like
//! skipped fires.

use chrono::{DateTime, Utc};

use crate::retention::Retained;
use crate::{Ledger, LedgerError};

/// One span of skipped fires of one schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRange {
    /// The schedule.
    pub job_name: String,
    /// The span starts after this instant (exclusive).
    pub after: DateTime<Utc>,
    /// The span ends at this instant (inclusive).
    pub until: DateTime<Utc>,
    /// How many instants of the schedule it holds.
    pub skipped: u64,
    /// Why (the policy).
    pub reason: String,
    /// The replica that decided.
    pub recorded_by: String,
}

impl Ledger {
    /// Records `ranges` (one statement on Postgres); a span already
    /// recorded by another replica is left as it is.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn record_skipped_ranges(&self, ranges: &[SkippedRange]) -> Result<(), LedgerError> {
        if ranges.is_empty() {
            return Ok(());
        }
        self.store.record_skipped_ranges(ranges).await
    }

    /// Deletes up to `batch` skipped spans recorded before `cutoff`;
    /// returns how many.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn prune_skipped_ranges(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        self.prune(Retained::SkippedRanges, cutoff, batch).await
    }
}
