//! Releasing buffered fires: a fire an overlap policy held back
//! (`buffer_one`, `buffer_all`, `cancel_other`) starts once nothing of its
//! schedule is unfinished. Every replica's reconcile loop releases, before
//! its outbox pass, the oldest buffered run of each such schedule
//! (`buffered → claimed`, due now), so the same pass publishes it with its
//! nominal run key, its own message id and its trace. A schedule's
//! buffered runs thus start one after another, in fire order, each within
//! one reconcile interval (`BELFRY_RECONCILE_INTERVAL`) of its predecessor's
//! end. The ledger makes concurrent releases by several replicas safe
//! (see `belfry_ledger::Ledger::release_buffered`).

use crate::counters::FireCounters;
use crate::replica::Replica;
use crate::SchedulerError;

/// Most schedules whose buffered run one pass releases.
const RELEASE_PAGE: i64 = 500;

impl Replica {
    /// One release pass; returns how many runs were released.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached.
    pub async fn release_buffered_once(&self) -> Result<usize, SchedulerError> {
        let released = self.ledger.release_buffered(RELEASE_PAGE).await?;
        for run in &released {
            tracing::info!(run_key = %run.run_key, id = %run.id,
                "buffered fire released: the previous run of its schedule has ended");
        }
        FireCounters::add(&self.counters.released, released.len() as u64);
        Ok(released.len())
    }
}
