//! Enqueuing follow-up runs: every replica's reconcile loop, before its
//! outbox pass, takes ended runs whose follow-ups are undecided and
//! enqueues their children (see `belfry_ledger`'s `follow_up` module for
//! why each child is enqueued exactly once however many replicas pass at
//! once). A child is claimed due at once, so the outbox pass right after
//! publishes it: a follow-up starts within one reconcile interval
//! (`BELFRY_RECONCILE_INTERVAL`) of its parent's end.
//!
//! The clock guard does not hold the pass: a child's run key is derived
//! from its parent's, and its instants are the database's, so a replica
//! whose clock is off enqueues the same children as any other.

use crate::counters::FireCounters;
use crate::replica::Replica;
use crate::SchedulerError;

/// Most ended runs one pass decides (each page is one transaction).
const FOLLOW_UP_PAGE: i64 = 200;
/// Most pages one pass decides before the outbox runs.
const FOLLOW_UP_PAGES: usize = 10;

impl Replica {
    /// One follow-up pass; returns how many children were enqueued.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached.
    pub async fn settle_follow_ups_once(&self) -> Result<usize, SchedulerError> {
        let mut enqueued = 0;
        // A full page may leave more: the next page at once, a bounded
        // number of times, so the outbox is never held up for long.
        for _ in 0..FOLLOW_UP_PAGES {
            let pass = self
                .ledger
                .settle_follow_ups(FOLLOW_UP_PAGE, self.instance())
                .await?;
            for (job_name, run_key) in &pass.enqueued {
                tracing::info!(%job_name, %run_key, "follow-up run enqueued: its parent ended");
            }
            enqueued += pass.enqueued.len();
            FireCounters::add(&self.counters.follow_ups, pass.enqueued.len() as u64);
            if pass.parents < usize::try_from(FOLLOW_UP_PAGE).unwrap_or(usize::MAX) {
                break;
            }
        }
        Ok(enqueued)
    }
}
