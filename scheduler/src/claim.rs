//! Claiming a fire: the Redis filter, then the ledger's unique insert.
//!
//! Order matters: the lock comes first because it is cheap and turns most
//! losing replicas away; the insert comes second because it is the only
//! step that is exact. Losing either race is normal, logged at debug and
//! counted, never an error.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use belfry_ledger::{ExclusiveClaim, Ledger, NewRun};
use belfry_protocol::run_key;
use tracing::Instrument as _;

use crate::counters::FireCounters;
use crate::lock::{ClaimLock, LockOutcome};
use crate::schedule::{OverlapPolicy, Schedule};
use crate::SchedulerError;

/// The result of trying to claim a fire.
#[derive(Debug, Clone)]
pub enum ClaimOutcome {
    /// This replica owns the fire; the row is `claimed`.
    Won(Box<NewRun>),
    /// Another replica holds the Redis lock for this fire.
    LostAtLock,
    /// Another replica inserted the row first.
    LostAtLedger,
    /// The schedule forbids overlap and its previous run is unfinished: the
    /// fire was recorded as skipped.
    Overlapped,
}

/// Claims fires for one replica.
#[derive(Debug)]
pub struct Claimer {
    lock: Option<ClaimLock>,
    ledger: Ledger,
    instance: String,
    counters: Arc<FireCounters>,
    confirm_grace: chrono::Duration,
}

impl Claimer {
    /// A claimer using `lock` as filter (none: database only) and `ledger`
    /// as the decider. A claimed run not confirmed within `confirm_grace` is
    /// published by the outbox reconciler.
    pub fn new(
        lock: Option<ClaimLock>,
        ledger: Ledger,
        instance: &str,
        counters: Arc<FireCounters>,
        confirm_grace: std::time::Duration,
    ) -> Self {
        Self {
            lock,
            ledger,
            instance: instance.to_owned(),
            counters,
            confirm_grace: chrono::Duration::from_std(confirm_grace)
                .unwrap_or(chrono::Duration::seconds(30)),
        }
    }

    /// The Redis lock in front of the ledger, when one is configured.
    pub fn lock(&self) -> Option<&ClaimLock> {
        self.lock.as_ref()
    }

    /// Tries to own the fire of `schedule` at `at`.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached (the
    /// fire is not claimed by this replica); [`SchedulerError::Name`] when the
    /// schedule name cannot form a run key (validated schedules always can).
    pub async fn claim(
        &self,
        schedule: &Schedule,
        at: DateTime<Utc>,
    ) -> Result<ClaimOutcome, SchedulerError> {
        self.claim_with(schedule, at, true).await
    }

    /// [`Claimer::claim`] through the ledger alone, skipping the lock: for
    /// recovered fires, whose lock may still be held by a replica that died
    /// before recording them (the ledger decides correctly either way).
    ///
    /// # Errors
    ///
    /// As [`Claimer::claim`].
    pub async fn claim_unlocked(
        &self,
        schedule: &Schedule,
        at: DateTime<Utc>,
    ) -> Result<ClaimOutcome, SchedulerError> {
        self.claim_with(schedule, at, false).await
    }

    async fn claim_with(
        &self,
        schedule: &Schedule,
        at: DateTime<Utc>,
        use_lock: bool,
    ) -> Result<ClaimOutcome, SchedulerError> {
        let span = tracing::info_span!(
            "claim",
            belfry.lock = use_lock && self.lock.is_some(),
            belfry.claim = tracing::field::Empty
        );
        let outcome = self
            .claim_inner(schedule, at, use_lock)
            .instrument(span.clone())
            .await;
        span.record(
            "belfry.claim",
            match &outcome {
                Ok(ClaimOutcome::Won(_)) => "won",
                Ok(ClaimOutcome::LostAtLock) => "lost_lock",
                Ok(ClaimOutcome::LostAtLedger) => "lost_ledger",
                Ok(ClaimOutcome::Overlapped) => "overlapped",
                Err(_) => "error",
            },
        );
        outcome
    }

    async fn claim_inner(
        &self,
        schedule: &Schedule,
        at: DateTime<Utc>,
        use_lock: bool,
    ) -> Result<ClaimOutcome, SchedulerError> {
        let key = run_key(&schedule.name, at).map_err(|belfry_protocol::RunKeyError::Name(e)| e)?;
        let mut locked = false;
        if let Some(lock) = self.lock.as_ref().filter(|_| use_lock) {
            match lock.try_acquire(&schedule.name, &key).await {
                Ok(LockOutcome::Acquired) => locked = true,
                Ok(LockOutcome::HeldElsewhere) => {
                    FireCounters::add(&self.counters.claims_lost_lock, 1);
                    tracing::debug!(run_key = %key, "fire taken by another replica (lock)");
                    return Ok(ClaimOutcome::LostAtLock);
                }
                Err(_) => {
                    // Already logged (rate-limited) by the lock; the ledger
                    // alone still decides correctly.
                    FireCounters::add(&self.counters.lock_fallbacks, 1);
                }
            }
        }
        let run = self.new_run(schedule, key, at, self.instance.clone());
        let claimed = match self.insert(&run, schedule.overlap).await {
            Ok(Some(claimed)) => claimed,
            Ok(None) => return Ok(ClaimOutcome::Overlapped),
            Err(e) => {
                // The fire is not recorded: give the lock back so another
                // replica is not turned away from a fire nobody owns.
                if let (true, Some(lock)) = (locked, &self.lock) {
                    lock.release(&run.job_name, &run.run_key).await;
                }
                return Err(e.into());
            }
        };
        if claimed {
            FireCounters::add(&self.counters.claims_won, 1);
            Ok(ClaimOutcome::Won(Box::new(run)))
        } else {
            FireCounters::add(&self.counters.claims_lost_ledger, 1);
            tracing::debug!(run_key = %run.run_key, "fire taken by another replica (ledger)");
            Ok(ClaimOutcome::LostAtLedger)
        }
    }

    /// Claims a manual run of `schedule` (an operator's "run it now"): its
    /// own run key `{name}@manual-{uuid}`, scheduled now, `claimed_by`
    /// `manual:{instance}` so misfire recovery never mistakes it for a
    /// scheduled fire. The schedule's overlap policy applies unless `force`.
    /// Never contended, so no lock is taken.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached.
    pub async fn claim_manual(
        &self,
        schedule: &Schedule,
        force: bool,
    ) -> Result<ClaimOutcome, SchedulerError> {
        let span = tracing::info_span!(
            "claim",
            belfry.lock = false,
            belfry.claim = tracing::field::Empty
        );
        let id = Uuid::now_v7();
        let key = format!("{}@manual-{}", schedule.name, id.simple());
        let mut run = self.new_run(
            schedule,
            key,
            Utc::now(),
            format!("manual:{}", self.instance),
        );
        run.id = id;
        let policy = if force {
            OverlapPolicy::Allow
        } else {
            schedule.overlap
        };
        let outcome = match self.insert(&run, policy).instrument(span.clone()).await? {
            Some(true) => {
                FireCounters::add(&self.counters.claims_won, 1);
                ClaimOutcome::Won(Box::new(run))
            }
            // A fresh uuid key cannot be taken; report it as a lost race all
            // the same rather than assume.
            Some(false) => ClaimOutcome::LostAtLedger,
            None => ClaimOutcome::Overlapped,
        };
        span.record(
            "belfry.claim",
            if matches!(outcome, ClaimOutcome::Won(_)) {
                "won"
            } else {
                "overlapped"
            },
        );
        Ok(outcome)
    }

    fn new_run(
        &self,
        schedule: &Schedule,
        run_key: String,
        at: DateTime<Utc>,
        claimed_by: String,
    ) -> NewRun {
        // Inside the `claim` span: with OpenTelemetry on, the run's trace is
        // the fire's, and republishes become children of this span.
        let trace = belfry_dispatch::run_trace::current_or_new();
        NewRun {
            // v7 ids are time-ordered, which keeps the primary key index
            // append-mostly.
            id: Uuid::now_v7(),
            job_name: schedule.name.clone(),
            run_key,
            job_type: schedule.job_type.clone(),
            payload: schedule.payload.clone(),
            scheduled_at: at,
            claimed_by,
            trace_id: trace.trace_id().map(str::to_owned),
            traceparent: Some(trace.traceparent),
            options: schedule.options.clone(),
            next_dispatch_at: Utc::now() + self.confirm_grace,
        }
    }

    /// Inserts `run` under `overlap`: `Some(true)` won, `Some(false)` the
    /// key was taken, `None` skipped (and recorded) because the previous
    /// run is unfinished.
    async fn insert(
        &self,
        run: &NewRun,
        overlap: OverlapPolicy,
    ) -> Result<Option<bool>, belfry_ledger::LedgerError> {
        match overlap {
            OverlapPolicy::Allow => self.ledger.claim(run).await.map(Some),
            OverlapPolicy::Forbid => match self.ledger.claim_exclusive(run).await? {
                ExclusiveClaim::Won => Ok(Some(true)),
                ExclusiveClaim::Taken => Ok(Some(false)),
                ExclusiveClaim::Overlapped => {
                    FireCounters::add(&self.counters.skipped_overlap, 1);
                    tracing::info!(run_key = %run.run_key, "fire skipped: the previous run is not finished (overlap = forbid)");
                    Ok(None)
                }
            },
        }
    }
}
