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
use belfry_runtime::SharedClock;
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
    /// The schedule's overlap policy skipped the fire (its previous run is
    /// unfinished): the fire was recorded as skipped.
    Overlapped,
    /// This replica owns the fire, and the schedule's overlap policy holds
    /// it `buffered` until the previous run ends (a replica's reconciler
    /// then releases it to the outbox).
    Buffered(Box<NewRun>),
    /// The schedule's `remaining_runs` is at zero: not claimed (recorded
    /// as skipped).
    RanOut,
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
    /// The replica's clock: a run's confirm deadline and a manual run's
    /// instant are read from it.
    clock: SharedClock,
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
            clock: belfry_runtime::process_clock(),
        }
    }

    /// The same claimer on `clock` instead of the process's clock.
    pub fn with_clock(self, clock: SharedClock) -> Self {
        Self { clock, ..self }
    }

    /// The Redis lock in front of the ledger, when one is configured.
    pub fn lock(&self) -> Option<&ClaimLock> {
        self.lock.as_ref()
    }

    /// Tries to own the fire of `schedule` at `at` from the timer: a batch
    /// of one ([`Claimer::claim_batch`]), its `claim` span a child of the
    /// caller's span (so the run's trace is the caller's).
    ///
    /// # Errors
    ///
    /// The ledger's error, as text, when it cannot be reached (the fire is
    /// not claimed by this replica), or the run key's when the schedule name
    /// cannot form one (validated schedules always can).
    pub async fn claim(
        &self,
        schedule: &Schedule,
        at: DateTime<Utc>,
    ) -> Result<ClaimOutcome, String> {
        let span = tracing::info_span!(
            "claim",
            belfry.lock = self.lock.is_some(),
            belfry.claim = tracing::field::Empty
        );
        self.claim_batch(&[(schedule, at)], &[span], FireSource::Timer)
            .await
            .pop()
            .unwrap_or_else(|| Err("not claimed".into()))
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
            self.clock.now(),
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
            .insert(&run, policy, schedule.counted, false)
            .instrument(span.clone())
            .await?
        {
            ExclusiveClaim::Won => {
                FireCounters::add(&self.counters.claims_won, 1);
                ClaimOutcome::Won(Box::new(run))
            }
            ExclusiveClaim::Buffered => {
                FireCounters::add(&self.counters.claims_won, 1);
                ClaimOutcome::Buffered(Box::new(run))
            }
            // A fresh uuid key cannot be taken; report it as a lost race all
            // the same rather than assume.
            ExclusiveClaim::Taken => ClaimOutcome::LostAtLedger,
            ExclusiveClaim::Overlapped => ClaimOutcome::Overlapped,
            ExclusiveClaim::RanOut => ClaimOutcome::RanOut,
        };
        span.record("belfry.claim", claim_label(Some(&outcome)));
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
            next_dispatch_at: self.clock.now() + self.confirm_grace,
        }
    }

    /// Inserts `run` under `overlap` (skipped fires recorded in
    /// `skipped_fires` with `record_skip`); with `counted` (the schedule
    /// has `remaining_runs`) through the per-schedule decision too, which
    /// counts the fire down with its claim.
    async fn insert(
        &self,
        run: &NewRun,
        overlap: OverlapPolicy,
        counted: bool,
        record_skip: bool,
    ) -> Result<ExclusiveClaim, belfry_ledger::LedgerError> {
        let rule = overlap.rule();
        if rule.is_none() && !counted {
            return Ok(if self.ledger.claim(run).await? {
                ExclusiveClaim::Won
            } else {
                ExclusiveClaim::Taken
            });
        }
        let label = rule.map_or("allow_all", |r| r.as_str());
        let decided = self
            .ledger
            .claim_exclusive_with(run, rule, record_skip)
            .await?;
        match decided {
            ExclusiveClaim::Won | ExclusiveClaim::Taken => {}
            ExclusiveClaim::Buffered => {
                FireCounters::add(&self.counters.buffered, 1);
                tracing::info!(run_key = %run.run_key, overlap = label,
                        "fire buffered: it starts when the previous run has ended");
            }
            ExclusiveClaim::Overlapped => {
                FireCounters::add(&self.counters.skipped_overlap, 1);
                tracing::info!(run_key = %run.run_key, overlap = label,
                        "fire skipped: the previous run is not finished");
            }
            ExclusiveClaim::RanOut => {
                FireCounters::add(&self.counters.skipped_ran_out, 1);
                tracing::info!(run_key = %run.run_key,
                        "fire skipped: the schedule has no runs left (remaining_runs)");
            }
        }
        Ok(decided)
    }

    /// Claims fires, one outcome per fire in order; every fire is claimed
    /// here, a lone fire as a batch of one. One pipelined Redis round trip
    /// takes every lock (with [`FireSource::Timer`]; fires whose lock is
    /// held elsewhere are lost there and cost nothing more), then one
    /// multi-row insert claims the fires of schedules that allow overlap,
    /// each row decided by the unique constraint, while each fire of a
    /// schedule that forbids overlap gets its per-schedule decision
    /// ([`belfry_ledger::Ledger::claim_exclusive_with`]: claimed, or
    /// recorded as skipped). `claim_spans` (one per fire) receive each
    /// fire's `belfry.claim`, and each run's trace starts in its span.
    ///
    /// A fire the ledger could not record fails (`Err`, the ledger's error
    /// as text) after giving back the lock it took: an unreachable ledger
    /// fails every fire of the batch.
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
        let locked = if use_lock {
            self.take_locks(fires, &keys, &mut outcomes).await
        } else {
            vec![false; fires.len()]
        };
        let mut runs = Vec::new();
        let mut run_index = Vec::new();
        let mut exclusive = Vec::new();
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
                if schedule.overlap.rule().is_some() || schedule.counted {
                    exclusive.push((i, schedule.overlap, schedule.counted, run));
                } else {
                    runs.push(run);
                    run_index.push(i);
                }
            }
        }
        // Both kinds at once: the exclusive claims are decided one by one,
        // each under its own schedule's advisory lock, so they do not wait
        // for the batch (nor it for them). Different schedules' claims run
        // side by side; one schedule's run one after the other, oldest
        // instant first, and stop at the first failure: a newer run stored
        // beside an older fire's failed claim would hide that fire from the
        // next recovery if this replica died before remembering it in the
        // ledger (see `replica::claim_order`).
        let decided = futures::future::join_all(by_schedule(exclusive).into_iter().map(
            |claims| async move {
                let mut decided = Vec::with_capacity(claims.len());
                let mut failed: Option<String> = None;
                for (i, policy, counted, run) in claims {
                    let inserted = match &failed {
                        Some(reason) => Err(format!(
                            "not tried: an older fire of the schedule could not be claimed ({reason})"
                        )),
                        None => self
                            .insert(&run, policy, counted, true)
                            .instrument(claim_spans[i].clone())
                            .await
                            .map_err(|e| e.to_string()),
                    };
                    if let Err(reason) = &inserted {
                        failed.get_or_insert_with(|| reason.clone());
                    }
                    decided.push((i, inserted, run));
                }
                decided
            },
        ));
        let (decided, batch) = tokio::join!(decided, self.claim_shared(&runs));
        let mut unrecorded = Vec::new();
        for (i, inserted, run) in decided.into_iter().flatten() {
            outcomes[i] = Some(match inserted {
                Ok(ExclusiveClaim::Won) => Ok(self.claimed(run, true)),
                Ok(ExclusiveClaim::Taken) => Ok(self.claimed(run, false)),
                Ok(ExclusiveClaim::Buffered) => Ok(ClaimOutcome::Buffered(Box::new(run))),
                Ok(ExclusiveClaim::Overlapped) => Ok(ClaimOutcome::Overlapped),
                Ok(ExclusiveClaim::RanOut) => Ok(ClaimOutcome::RanOut),
                Err(reason) => {
                    unrecorded.push(i);
                    Err(reason)
                }
            });
        }
        if batch.is_err() {
            unrecorded.extend(run_index.iter().copied());
        }
        // Nothing of these is recorded: give their locks back (at once) so
        // other replicas are not turned away from fires nobody owns.
        let releases = unrecorded
            .iter()
            .map(|i| self.release(locked[*i], &fires[*i].0.name, &keys[*i]));
        futures::future::join_all(releases).await;
        match batch {
            Ok(won) => {
                for (run, i) in runs.into_iter().zip(run_index) {
                    let this = won.contains(&run.id);
                    outcomes[i] = Some(Ok(self.claimed(run, this)));
                }
            }
            Err(e) => {
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

impl Claimer {
    /// Takes the lock of every fire not decided yet in one pipelined round
    /// trip: a fire whose lock another replica holds is lost there
    /// (`outcomes`); the answer says which locks this claim took. Without a
    /// lock, or with Redis unreachable, none: the ledger alone decides.
    async fn take_locks(
        &self,
        fires: &[(&Schedule, DateTime<Utc>)],
        keys: &[String],
        outcomes: &mut [Option<Result<ClaimOutcome, String>>],
    ) -> Vec<bool> {
        let mut locked = vec![false; fires.len()];
        let Some(lock) = &self.lock else {
            return locked;
        };
        let asked: Vec<(&str, &str)> = fires
            .iter()
            .zip(keys)
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
            // Already logged (rate-limited) by the lock; the ledger alone
            // still decides correctly.
            Err(_) => FireCounters::add(&self.counters.lock_fallbacks, fires.len() as u64),
        }
        locked
    }

    /// One multi-row insert for the fires of schedules that allow overlap
    /// (none: nothing to ask).
    async fn claim_shared(
        &self,
        runs: &[NewRun],
    ) -> Result<std::collections::HashSet<Uuid>, belfry_ledger::LedgerError> {
        if runs.is_empty() {
            return Ok(std::collections::HashSet::new());
        }
        self.ledger.claim_many(runs).await
    }

    /// The outcome of a run the ledger recorded (`won`) or found taken,
    /// counted.
    fn claimed(&self, run: NewRun, won: bool) -> ClaimOutcome {
        if won {
            FireCounters::add(&self.counters.claims_won, 1);
            ClaimOutcome::Won(Box::new(run))
        } else {
            FireCounters::add(&self.counters.claims_lost_ledger, 1);
            tracing::debug!(run_key = %run.run_key, "fire taken by another replica (ledger)");
            ClaimOutcome::LostAtLedger
        }
    }

    /// Gives back the lock of a fire nobody recorded (when this claim took
    /// it), so another replica is not turned away from a fire nobody owns.
    async fn release(&self, locked: bool, name: &str, key: &str) {
        if let (true, Some(lock)) = (locked, &self.lock) {
            lock.release(name, key).await;
        }
    }
}

/// One exclusive claim waiting to be decided: the fire's index in its
/// batch, its schedule's overlap policy, whether it is counted, its run.
type ExclusiveFire = (usize, OverlapPolicy, bool, NewRun);

/// `claims` grouped by schedule, each group in the order of its instants
/// (the groups' order does not matter: they are decided side by side).
fn by_schedule(mut claims: Vec<ExclusiveFire>) -> Vec<Vec<ExclusiveFire>> {
    claims
        .sort_by(|a, b| (&a.3.job_name, a.3.scheduled_at).cmp(&(&b.3.job_name, b.3.scheduled_at)));
    let mut groups: Vec<Vec<ExclusiveFire>> = Vec::new();
    for claim in claims {
        match groups.last_mut() {
            Some(group) if group[0].3.job_name == claim.3.job_name => group.push(claim),
            _ => groups.push(vec![claim]),
        }
    }
    groups
}

/// The `belfry.claim` value of a claim's span (`None`: the claim failed).
fn claim_label(outcome: Option<&ClaimOutcome>) -> &'static str {
    match outcome {
        Some(ClaimOutcome::Won(_)) => "won",
        Some(ClaimOutcome::LostAtLock) => "lost_lock",
        Some(ClaimOutcome::LostAtLedger) => "lost_ledger",
        Some(ClaimOutcome::Overlapped) => "overlapped",
        Some(ClaimOutcome::Buffered(_)) => "buffered",
        Some(ClaimOutcome::RanOut) => "ran_out",
        None => "error",
    }
}
