//! Fires a replica could not claim, kept in the ledger until their
//! schedule's misfire policy decided them.
//!
//! A replica that cannot claim (the ledger unreachable, its clock skewed)
//! remembers the fires in memory and decides them once claiming works
//! again. Memory dies with the process: a replica that claims a newer fire
//! of the schedule and then dies before deciding the older ones leaves a
//! hole the next owner cannot see, since recovery starts from a
//! schedule's latest run. So before a replica claims anything, it records
//! the fires it still has to decide here ([`Ledger::record_missed_fires`]);
//! whoever recovers the schedule next (a restart, the replica taking its
//! shard, a resume) takes those older than the schedule's latest run
//! ([`Ledger::undecided_missed_fires`]) and decides them under the policy,
//! and a decided fire is forgotten ([`Ledger::forget_missed_fires`]).
//!
//! A record can outlive its decision (the forget failed, or a record was
//! stored by a replica that decided the fire meanwhile); such a record
//! must not be decided again, or a fire a policy skipped could run after
//! all. So the read returns only fires with no run at their instant and no
//! recorded skip covering it, and removes the others. Records of a deleted
//! schedule go with it (a trigger), so a schedule created again under its
//! name does not inherit them.

use chrono::{DateTime, Utc};

use crate::{Ledger, LedgerError};

/// One fire of one schedule that is still to be decided.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MissedFire {
    /// The schedule.
    pub job_name: String,
    /// The fire's instant.
    pub scheduled_at: DateTime<Utc>,
}

/// SQL: whether the `missed_fires` row `alias` is decided: a run at its
/// instant, or a skipped fire or skipped span covering it. One predicate
/// for both backends' reads (instants compare alike in both: `timestamptz`
/// on Postgres, fixed-width text on SQLite).
pub(crate) fn decided_fire(alias: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM job_runs r \
                  WHERE r.job_name = {alias}.job_name AND r.scheduled_at = {alias}.scheduled_at) \
          OR EXISTS (SELECT 1 FROM skipped_fires f \
                     WHERE f.job_name = {alias}.job_name AND f.scheduled_at = {alias}.scheduled_at) \
          OR EXISTS (SELECT 1 FROM skipped_ranges s WHERE s.job_name = {alias}.job_name \
                     AND s.after_at < {alias}.scheduled_at AND {alias}.scheduled_at <= s.until_at))"
    )
}

impl Ledger {
    /// Records `fires` as still to be decided, by replica `by` (one
    /// statement on Postgres); a fire already recorded is left as it is.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn record_missed_fires(
        &self,
        fires: &[MissedFire],
        by: &str,
    ) -> Result<(), LedgerError> {
        if fires.is_empty() {
            return Ok(());
        }
        self.store.record_missed_fires(fires, by).await
    }

    /// The recorded fires of the schedules `job_names` still undecided: no
    /// run at their instant, no skipped fire or skipped span covering it;
    /// oldest first, at most `limit`. Records of fires decided meanwhile
    /// are removed in the same statement (see the module docs).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn undecided_missed_fires(
        &self,
        job_names: &[String],
        limit: i64,
    ) -> Result<Vec<MissedFire>, LedgerError> {
        if job_names.is_empty() {
            return Ok(Vec::new());
        }
        self.store.undecided_missed_fires(job_names, limit).await
    }

    /// Forgets `fires`, decided (claimed or skipped with a record); returns
    /// how many were recorded.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn forget_missed_fires(&self, fires: &[MissedFire]) -> Result<u64, LedgerError> {
        if fires.is_empty() {
            return Ok(0);
        }
        self.store.forget_missed_fires(fires).await
    }
}
