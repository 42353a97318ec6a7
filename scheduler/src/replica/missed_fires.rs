//! What a replica remembers about fires it could not make, until it can
//! act on them: fires it could not claim (for their misfire policy), fires
//! it lost at the lock (to check the winner recorded them), and spans of
//! fires a policy skipped (to record them once the ledger answers). Each
//! memory is bounded; the oldest entries go first.
//!
//! Fires it could not claim are also recorded in the ledger
//! (`missed_fires`, see [`belfry_ledger::MissedFire`]) before this replica
//! claims anything newer ([`Replica::record_undecided_once`] on the claim
//! path), and forgotten there once decided. Memory alone was not enough: a
//! replica that claimed a newer fire of the schedule and then died took
//! the older ones with it, since recovery starts from a schedule's latest
//! run. Whoever recovers the schedule next finds the record.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use belfry_ledger::MissedFire;

use super::Replica;
use crate::claim::FireSource;
use crate::counters::FireCounters;
use crate::schedule::Schedule;
use crate::timer::Skipped;
use crate::SchedulerError;

/// Most missed fires remembered for recovery.
pub(super) const MAX_REMEMBERED_MISSES: usize = 100_000;

/// The ledger's record of `schedule`'s fire at `at`.
pub(super) fn missed_fire(schedule: &Schedule, at: DateTime<Utc>) -> MissedFire {
    MissedFire {
        job_name: schedule.name.clone(),
        scheduled_at: at,
    }
}

/// Keeps the newest [`MAX_REMEMBERED_MISSES`] fires still to be recorded,
/// as the memory they are part of does.
fn bound_unrecorded(unrecorded: &mut Vec<MissedFire>) {
    if unrecorded.len() > MAX_REMEMBERED_MISSES {
        let over = unrecorded.len() - MAX_REMEMBERED_MISSES;
        unrecorded.drain(..over);
    }
}

impl Replica {
    /// Counts fires skipped by misfire policies and queues their spans for
    /// the ledger (see [`Replica::record_skipped_once`]), so no skipped
    /// instant is silently absent.
    pub(super) fn count_skipped(&self, skipped: &[Skipped]) {
        let mut pending = self.pending_skips.lock().unwrap_or_else(|p| p.into_inner());
        for s in skipped {
            FireCounters::add(&self.counters.misfires_skipped, s.count);
            tracing::warn!(schedule = %s.schedule.name, skipped = s.count, policy = ?s.schedule.misfire,
                "missed fires skipped by the misfire policy");
            if let Some((after, until)) = s.span {
                pending.push_back(belfry_ledger::SkippedRange {
                    job_name: s.schedule.name.clone(),
                    after,
                    until,
                    skipped: s.count,
                    reason: format!(
                        "skipped by misfire policy {:?}: missed (no replica could claim them in time)",
                        s.schedule.misfire
                    ),
                    recorded_by: self.instance.clone(),
                });
            }
        }
        while pending.len() > MAX_REMEMBERED_MISSES {
            pending.pop_front();
        }
    }

    /// Records the queued spans of skipped fires in the ledger; returns how
    /// many. They stay queued when the ledger cannot be reached.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached.
    pub async fn record_skipped_once(&self) -> Result<usize, SchedulerError> {
        let _storing = self.storing.lock().await;
        self.store_skipped().await
    }

    /// [`Replica::record_skipped_once`], its caller holding `storing`.
    async fn store_skipped(&self) -> Result<usize, SchedulerError> {
        let taken: Vec<belfry_ledger::SkippedRange> = {
            let mut pending = self.pending_skips.lock().unwrap_or_else(|p| p.into_inner());
            pending.drain(..).collect()
        };
        if taken.is_empty() {
            return Ok(0);
        }
        let mut written = 0;
        for chunk in taken.chunks(1000) {
            if let Err(e) = self.ledger.record_skipped_ranges(chunk).await {
                // What was not written goes back in front, in its order.
                let mut pending = self.pending_skips.lock().unwrap_or_else(|p| p.into_inner());
                for r in taken[written..].iter().rev() {
                    pending.push_front(r.clone());
                }
                return Err(e.into());
            }
            written += chunk.len();
        }
        Ok(taken.len())
    }

    /// Remembers a fire that could not be claimed, for its misfire policy;
    /// a backfilled instant is not a miss (the operator learns it failed
    /// and backfills again).
    pub(super) fn remember_missed_from(
        &self,
        source: FireSource,
        schedule: &Arc<Schedule>,
        at: DateTime<Utc>,
    ) {
        if source != FireSource::Backfill {
            self.remember_missed(schedule, at);
        }
    }

    /// Remembers a fire that could not be claimed, and queues it to be
    /// recorded in the ledger.
    pub(super) fn remember_missed(&self, schedule: &Arc<Schedule>, at: DateTime<Utc>) {
        {
            let mut unrecorded = self.unrecorded.lock().unwrap_or_else(|p| p.into_inner());
            unrecorded.push(missed_fire(schedule, at));
            bound_unrecorded(&mut unrecorded);
        }
        self.remember_recorded(schedule, at);
    }

    /// Remembers a missed fire already recorded in the ledger (by this
    /// replica or one that died), for its misfire policy.
    pub(super) fn remember_recorded(&self, schedule: &Arc<Schedule>, at: DateTime<Utc>) {
        let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a very long outage keeps the latest instants (the
        // policies only ever need those) and counts the rest as skipped.
        if missed.len() >= MAX_REMEMBERED_MISSES {
            missed.pop_front();
            FireCounters::add(&self.counters.misfires_skipped, 1);
        }
        missed.push_back((schedule.clone(), at));
    }

    /// Records the missed fires not yet in the ledger (they stay queued, in
    /// order, when it cannot be reached); its caller holds `storing`.
    async fn store_missed(&self) -> Result<(), SchedulerError> {
        let taken: Vec<MissedFire> = {
            let mut unrecorded = self.unrecorded.lock().unwrap_or_else(|p| p.into_inner());
            if unrecorded.is_empty() {
                return Ok(());
            }
            std::mem::take(&mut *unrecorded)
        };
        if let Err(e) = self
            .ledger
            .record_missed_fires(&taken, &self.instance)
            .await
        {
            // Back in front of what was queued meanwhile, in order.
            let mut unrecorded = self.unrecorded.lock().unwrap_or_else(|p| p.into_inner());
            let later = std::mem::replace(&mut *unrecorded, taken);
            unrecorded.extend(later);
            bound_unrecorded(&mut unrecorded);
            return Err(e.into());
        }
        Ok(())
    }

    /// Stores what this replica knows of older fires and the ledger does
    /// not hold yet: missed fires and spans a policy skipped
    /// ([`Replica::record_skipped_once`]). On the claim path before every
    /// claim, so a newer run is never stored ahead of them; nothing to do
    /// (three uncontended locks) in the usual case.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached (what
    /// was not stored stays queued).
    pub(super) async fn record_undecided_once(&self) -> Result<(), SchedulerError> {
        let _storing = self.storing.lock().await;
        self.store_missed().await?;
        self.store_skipped().await?;
        Ok(())
    }

    pub(super) fn remember_lock_loss(&self, schedule: &Arc<Schedule>, at: DateTime<Utc>) {
        let mut losses = self.lock_losses.lock().unwrap_or_else(|p| p.into_inner());
        if losses.len() >= MAX_REMEMBERED_MISSES {
            losses.pop_front();
        }
        losses.push_back((schedule.clone(), at, std::time::Instant::now()));
    }
}
