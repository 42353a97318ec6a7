//! Time partitions of `job_runs` on Postgres (issue 21): the ledger stays
//! fast at volume because retention drops whole days instead of deleting
//! rows one by one.
//!
//! `job_runs` is partitioned by range of `key_instant`, the instant its run
//! key names (the fire instant of a scheduled fire, the clock of an ad-hoc
//! run's UUIDv7; 1970-01-01 for a key that names none). The value is a pure
//! function of `(job_name, run_key)`, computed in one place
//! (`belfry_key_instant` in the database, which every insert calls), so the
//! unique key `(job_name, run_key, key_instant)` is exactly the old
//! uniqueness of the run key: the same key always lands in the same
//! partition. See the partitioned-runs migration for the whole argument.
//!
//! Partitions: `job_runs_keyed` (everything before the first day
//! partition: keys naming no instant, and the history from before the
//! upgrade), one per UTC day (`job_runs_pYYYYMMDD`), which the schedulers
//! create [`PARTITION_DAYS_AHEAD`] days ahead
//! ([`Ledger::prepare_run_partitions`]), and `job_runs_default` for runs
//! outside every partition (moved into a day partition when that day is
//! created). Retention ([`Ledger::drop_expired_run_partitions`]) drops a
//! day partition once every run in it finished before the cutoff, after
//! recording each schedule's newest fire in it (misfire recovery counts
//! from it); the keyed and default partitions, and a day partition still
//! holding an unfinished run, are pruned row by row as before.
//!
//! The embedded SQLite ledger keeps its one simple table: these calls do
//! nothing there.

use chrono::{DateTime, Days, NaiveDate, Utc};

use crate::{Ledger, LedgerError};

/// Day partitions are created this many days past today (today included
/// besides), so a replica that cannot reach the database for a while, or
/// whose pass fails, does not leave tomorrow's fires to the default
/// partition.
pub const PARTITION_DAYS_AHEAD: u64 = 3;

/// One partition of `job_runs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPartition {
    /// Table name.
    pub name: String,
    /// Lowest `key_instant` it holds (`None`: from the beginning of time).
    pub from: Option<DateTime<Utc>>,
    /// First `key_instant` past it (`None`: the default partition).
    pub to: Option<DateTime<Utc>>,
    /// Whether it is the default partition.
    pub default: bool,
}

impl RunPartition {
    /// A day partition (bounded on both sides), droppable whole by retention.
    pub fn is_day(&self) -> bool {
        self.from.is_some() && self.to.is_some()
    }
}

/// What one retention pass did to the day partitions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionDrop {
    /// Day partitions dropped (whole, with their runs).
    pub dropped: Vec<String>,
    /// Past the cutoff but kept: they still hold an unfinished run, or one
    /// that finished after the cutoff (their finished runs are pruned row
    /// by row instead).
    pub kept: Vec<String>,
}

/// The UTC days from `today` to `today + ahead`, both included.
pub fn days_ahead(today: NaiveDate, ahead: u64) -> Vec<NaiveDate> {
    (0..=ahead)
        .filter_map(|d| today.checked_add_days(Days::new(d)))
        .collect()
}

impl Ledger {
    /// Creates the day partitions of `days` that no partition covers yet,
    /// moving any runs of those days out of the default partition; returns
    /// the names created. A day the keyed partition covers (the day of an
    /// upgrade) is skipped. Serialised between replicas; each partition is
    /// attached under a short lock timeout, so a pass never queues claims
    /// behind it for long (a failed pass is retried by the next).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or a lock
    /// was not granted in time. Nothing on the embedded ledger.
    pub async fn prepare_run_partitions(
        &self,
        days: &[NaiveDate],
    ) -> Result<Vec<String>, LedgerError> {
        self.store.prepare_run_partitions(days).await
    }

    /// Drops every day partition that ends at or before `cutoff` and whose
    /// runs all finished before `cutoff`, first recording each schedule's
    /// newest live fire in it (`schedule_last_fires`).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or a lock
    /// was not granted in time (what was dropped stays dropped). Nothing on
    /// the embedded ledger.
    pub async fn drop_expired_run_partitions(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<PartitionDrop, LedgerError> {
        self.store.drop_expired_run_partitions(cutoff).await
    }

    /// The partitions of `job_runs`, oldest first (the default last); empty
    /// on the embedded ledger.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn run_partitions(&self) -> Result<Vec<RunPartition>, LedgerError> {
        self.store.run_partitions().await
    }
}

/// The name of the day partition of `day`: `job_runs_p20261203`.
pub(crate) fn day_partition_name(day: NaiveDate) -> String {
    format!("job_runs_p{}", day.format("%Y%m%d"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_names() {
        let d = NaiveDate::from_ymd_opt(2026, 12, 30).unwrap();
        let days = days_ahead(d, 3);
        assert_eq!(days.len(), 4);
        assert_eq!(day_partition_name(days[3]), "job_runs_p20270102");
        assert_eq!(days_ahead(NaiveDate::MAX, 3), vec![NaiveDate::MAX]);
    }
}
