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

/// Why a fire is being claimed: decides the lock, the run's `claimed_by`,
/// and how misfire handling treats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireSource {
    /// The timer: the Redis lock filters the other replicas first.
    Timer,
    /// Misfire recovery: the ledger alone decides (the lock may still be
    /// held by a replica that died before recording the fire).
    Recovery,
    /// An operator's backfill: the ledger alone decides; the run is
    /// `claimed_by = backfill:{instance}`, so misfire policies never drop it
    /// and recovery never counts from it, and a failed claim is reported to
    /// the operator instead of being remembered as missed.
    Backfill,
    /// An operator's "run it now": its own run key, `claimed_by =
    /// manual:{instance}`, never mistaken for a fire of the timetable.
    Manual,
}

impl FireSource {
    /// Whether the Redis lock is taken first.
    pub fn uses_lock(self) -> bool {
        self == FireSource::Timer
    }

    /// The `claimed_by` of runs this source claims on replica `instance`.
    pub fn claimed_by(self, instance: &str) -> String {
        match self {
            FireSource::Timer | FireSource::Recovery => instance.to_owned(),
            FireSource::Backfill => format!("backfill:{instance}"),
            FireSource::Manual => format!("manual:{instance}"),
        }
    }
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
        self.claim_from(schedule, at, FireSource::Timer).await
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
        self.claim_from(schedule, at, FireSource::Recovery).await
    }

    /// [`Claimer::claim`] for a fire from `source` (see [`FireSource`]).
    ///
    /// # Errors
    ///
    /// As [`Claimer::claim`].
    pub async fn claim_from(
        &self,
        schedule: &Schedule,
        at: DateTime<Utc>,
        source: FireSource,
    ) -> Result<ClaimOutcome, SchedulerError> {
        let span = tracing::info_span!(
            "claim",
            belfry.lock = source.uses_lock() && self.lock.is_some(),
            belfry.claim = tracing::field::Empty
        );
        let outcome = self
            .claim_inner(schedule, at, source)
            .instrument(span.clone())
            .await;
        span.record("belfry.claim", claim_label(outcome.as_ref().ok()));
        outcome
    }

    async fn claim_inner(
        &self,
        schedule: &Schedule,
        at: DateTime<Utc>,
        source: FireSource,
    ) -> Result<ClaimOutcome, SchedulerError> {
        let use_lock = source.uses_lock();
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
        let run = self.new_run(schedule, key, at, source.claimed_by(&self.instance));
        let claimed = match self.insert(&run, schedule.overlap, true).await {
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
        // A refused manual run is not a fire: nothing is recorded.
        let outcome = match self
            .insert(&run, policy, false)
            .instrument(span.clone())
            .await?
        {
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

    pub(crate) fn new_run(
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
    /// key was taken, `None` skipped because the previous run is unfinished
    /// (recorded in `skipped_fires` with `record_skip`).
    async fn insert(
        &self,
        run: &NewRun,
        overlap: OverlapPolicy,
        record_skip: bool,
    ) -> Result<Option<bool>, belfry_ledger::LedgerError> {
        match overlap {
            OverlapPolicy::Allow => self.ledger.claim(run).await.map(Some),
            OverlapPolicy::Forbid => {
                match self.ledger.claim_exclusive_with(run, record_skip).await? {
                    ExclusiveClaim::Won => Ok(Some(true)),
                    ExclusiveClaim::Taken => Ok(Some(false)),
                    ExclusiveClaim::Overlapped => {
                        FireCounters::add(&self.counters.skipped_overlap, 1);
                        tracing::info!(run_key = %run.run_key, "fire skipped: the previous run is not finished (overlap = forbid)");
                        Ok(None)
                    }
                }
            }
        }
    }

    /// Claims many fires at once, one outcome per fire in order: one
    /// pipelined Redis round trip takes every lock (fires whose lock is held
    /// elsewhere are lost there and cost nothing more), then one multi-row
    /// insert claims the rest, each row decided by the unique constraint as
    /// in [`Claimer::claim`]. `claim_spans` (one per fire) receive each
    /// fire's `belfry.claim`, and each run's trace starts in its span.
    ///
    /// Only for schedules that allow overlap: a forbidding schedule's claim
    /// needs its per-schedule decision ([`Claimer::claim`]).
    ///
    /// An unreachable ledger fails every fire of the batch (`Err`), after
    /// giving back the locks it took.
    pub async fn claim_batch(
        &self,
        fires: &[(&Schedule, DateTime<Utc>)],
        claim_spans: &[tracing::Span],
        source: FireSource,
    ) -> Vec<Result<ClaimOutcome, String>> {
        let use_lock = source.uses_lock();
        let mut outcomes: Vec<Option<Result<ClaimOutcome, String>>> = vec![None; fires.len()];
        let mut keys = Vec::with_capacity(fires.len());
        for (i, (schedule, at)) in fires.iter().enumerate() {
            match run_key(&schedule.name, *at) {
                Ok(key) => keys.push(key),
                Err(e) => {
                    outcomes[i] = Some(Err(e.to_string()));
                    keys.push(String::new());
                }
            }
        }
        let mut locked = vec![false; fires.len()];
        if let Some(lock) = self.lock.as_ref().filter(|_| use_lock) {
            let asked: Vec<(&str, &str)> = fires
                .iter()
                .zip(&keys)
                .map(|((s, _), k)| (s.name.as_str(), k.as_str()))
                .collect();
            match lock.try_acquire_many(&asked).await {
                Ok(answers) => {
                    for (i, answer) in answers.into_iter().enumerate() {
                        match answer {
                            LockOutcome::Acquired => locked[i] = true,
                            LockOutcome::HeldElsewhere if outcomes[i].is_none() => {
                                FireCounters::add(&self.counters.claims_lost_lock, 1);
                                outcomes[i] = Some(Ok(ClaimOutcome::LostAtLock));
                            }
                            LockOutcome::HeldElsewhere => {}
                        }
                    }
                }
                // Already logged (rate-limited) by the lock; the ledger
                // alone still decides correctly.
                Err(_) => FireCounters::add(&self.counters.lock_fallbacks, fires.len() as u64),
            }
        }
        let mut runs = Vec::new();
        let mut run_index = Vec::new();
        for (i, ((schedule, at), key)) in fires.iter().zip(&keys).enumerate() {
            if outcomes[i].is_none() {
                // Inside the fire's claim span: the run's trace is its fire's.
                let run = claim_spans[i].in_scope(|| {
                    self.new_run(
                        schedule,
                        key.clone(),
                        *at,
                        source.claimed_by(&self.instance),
                    )
                });
                runs.push(run);
                run_index.push(i);
            }
        }
        match self.ledger.claim_many(&runs).await {
            Ok(won) => {
                for (run, i) in runs.into_iter().zip(run_index) {
                    outcomes[i] = Some(Ok(if won.contains(&run.id) {
                        FireCounters::add(&self.counters.claims_won, 1);
                        ClaimOutcome::Won(Box::new(run))
                    } else {
                        FireCounters::add(&self.counters.claims_lost_ledger, 1);
                        ClaimOutcome::LostAtLedger
                    }));
                }
            }
            Err(e) => {
                // Nothing of the batch is recorded: give the locks back so
                // other replicas are not turned away from fires nobody owns.
                if let Some(lock) = &self.lock {
                    let releases = run_index
                        .iter()
                        .filter(|i| locked[**i])
                        .map(|i| lock.release(&fires[*i].0.name, &keys[*i]));
                    futures::future::join_all(releases).await;
                }
                let reason = e.to_string();
                for i in run_index {
                    outcomes[i] = Some(Err(reason.clone()));
                }
            }
        }
        outcomes
            .into_iter()
            .zip(claim_spans)
            .map(|(outcome, span)| {
                let outcome = outcome.unwrap_or_else(|| Err("not claimed".into()));
                span.record("belfry.claim", claim_label(outcome.as_ref().ok()));
                outcome
            })
            .collect()
    }
}

/// The `belfry.claim` value of a claim's span (`None`: the claim failed).
fn claim_label(outcome: Option<&ClaimOutcome>) -> &'static str {
    match outcome {
        Some(ClaimOutcome::Won(_)) => "won",
        Some(ClaimOutcome::LostAtLock) => "lost_lock",
        Some(ClaimOutcome::LostAtLedger) => "lost_ledger",
        Some(ClaimOutcome::Overlapped) => "overlapped",
        None => "error",
    }
}
