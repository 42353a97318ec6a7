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
//! ([`Ledger::missed_fires_of`]) and decides them under the policy, and a
//! decided fire is forgotten ([`Ledger::forget_missed_fires`]). Two
//! replicas deciding the same fire agree: the claim is unique and a
//! skipped span is recorded once.

use chrono::{DateTime, Utc};

use crate::{Ledger, LedgerError};

/// One fire of one schedule that is still to be decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissedFire {
    /// The schedule.
    pub job_name: String,
    /// The fire's instant.
    pub scheduled_at: DateTime<Utc>,
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

    /// The recorded fires of the schedules `job_names` still to be decided,
    /// oldest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn missed_fires_of(
        &self,
        job_names: &[String],
        limit: i64,
    ) -> Result<Vec<MissedFire>, LedgerError> {
        if job_names.is_empty() {
            return Ok(Vec::new());
        }
        self.store.missed_fires_of(job_names, limit).await
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
