//! The fire path: a fire, or a batch of fires due together, from the
//! claim to the dispatch, each keeping its own `fire` span (the root of its
//! run's trace) and outcome. The operator's manual trigger and backfill go
//! the same way, as other [`FireSource`]s.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tracing::Instrument as _;
use uuid::Uuid;

use belfry_dispatch::DispatchOutcome;

use super::{FireOutcome, Replica, SkipReason};
use crate::claim::{ClaimOutcome, FireSource};
use crate::counters::FireCounters;
use crate::schedule::Schedule;
use crate::timer::Timer;

/// Every fire's outcome, once each slot is filled (a slot left empty would
/// be a bug; it reads as not fired rather than vanishing).
fn settled(outcomes: Vec<Option<FireOutcome>>) -> Vec<FireOutcome> {
    outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or(FireOutcome::ClaimFailed {
                reason: "not fired".into(),
            })
        })
        .collect()
}

impl Replica {
    /// Claims and, when won, dispatches the fire of `schedule` at `at`.
    ///
    /// A fire that cannot be claimed here (the ledger is unreachable, or
    /// this replica's clock is skewed) is remembered as missed; the recovery
    /// loop applies the schedule's misfire policy to it once claiming works
    /// again.
    pub async fn fire(&self, schedule: &Arc<Schedule>, at: DateTime<Utc>) -> FireOutcome {
        self.fire_with(schedule, at, FireSource::Timer).await
    }

    async fn fire_with(
        &self,
        schedule: &Arc<Schedule>,
        at: DateTime<Utc>,
        source: FireSource,
    ) -> FireOutcome {
        // The root of the run's trace: claim and publish are its children,
        // and the worker's spans continue under the publish span.
        // Its children carry only what they add (the instance is the
        // exporter's `service.instance.id`).
        let span = tracing::info_span!("fire", job.name = %schedule.name, job.type = %schedule.job_type,
            belfry.fire_at = %at, belfry.run_key = tracing::field::Empty,
            trace_id = tracing::field::Empty, belfry.outcome = tracing::field::Empty);
        let outcome = self
            .fire_inner(schedule, at, source, &span)
            .instrument(span.clone())
            .await;
        span.record("belfry.outcome", outcome.label());
        outcome
    }

    async fn fire_inner(
        &self,
        schedule: &Arc<Schedule>,
        at: DateTime<Utc>,
        source: FireSource,
        span: &tracing::Span,
    ) -> FireOutcome {
        FireCounters::add(&self.counters.fires, 1);
        if !self.guard.allows_claims() {
            FireCounters::add(&self.counters.skipped_clock_skew, 1);
            self.remember_missed_from(source, schedule, at);
            return FireOutcome::Skipped {
                reason: SkipReason::ClockSkew {
                    skew_ms: self.guard.last_skew_ms(),
                },
            };
        }
        let claimed = self.claimer.claim_from(schedule, at, source).await;
        let run = match claimed {
            Ok(ClaimOutcome::Won(run)) => {
                belfry_runtime::failpoint::hit("after_claim_before_publish");
                run
            }
            Ok(ClaimOutcome::LostAtLock) => {
                // Another replica holds the lock; if it dies before
                // recording the fire, nobody would. Check later that the
                // fire was recorded.
                self.remember_lock_loss(schedule, at);
                return FireOutcome::Lost;
            }
            Ok(ClaimOutcome::LostAtLedger) => return FireOutcome::Lost,
            Ok(ClaimOutcome::Overlapped) => {
                return FireOutcome::Skipped {
                    reason: SkipReason::Overlap,
                }
            }
            Err(e) => {
                FireCounters::add(&self.counters.claim_errors, 1);
                tracing::error!(schedule = %schedule.name, %at, error = %e, "fire could not be claimed; the misfire policy decides once the ledger is back");
                self.remember_missed_from(source, schedule, at);
                return FireOutcome::ClaimFailed {
                    reason: e.to_string(),
                };
            }
        };
        self.dispatch_won(&run, at, source, span).await
    }

    /// Claims and dispatches `fires` as one batch: one pipelined Redis
    /// round trip for the locks, one multi-row insert, publishes pipelined
    /// under a confirm window, one update marking the confirmed ones
    /// `dispatched`. Outcomes per fire, in order, exactly as [`Replica::fire`]
    /// would give them (a fire that could not be claimed is remembered for
    /// its misfire policy); every fire keeps its own `fire` span and trace.
    /// Schedules that forbid overlap take the single-fire path. A batch of
    /// one is a single fire. `source` says whether the lock is taken and how
    /// the runs are recorded (see [`FireSource`]).
    pub async fn fire_batch(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
    ) -> Vec<FireOutcome> {
        if let [(schedule, at)] = fires {
            return vec![self.fire_with(schedule, *at, source).await];
        }
        let (exclusive, shared): (Vec<usize>, Vec<usize>) = (0..fires.len())
            .partition(|i| fires[*i].0.overlap == crate::schedule::OverlapPolicy::Forbid);
        let single = futures::future::join_all(
            exclusive
                .iter()
                .map(|i| self.fire_with(&fires[*i].0, fires[*i].1, source)),
        );
        let shared_fires: Vec<(Arc<Schedule>, DateTime<Utc>)> =
            shared.iter().map(|i| fires[*i].clone()).collect();
        let batched = self.fire_shared(&shared_fires, source);
        let (single, batched) = tokio::join!(single, batched);
        let mut outcomes: Vec<Option<FireOutcome>> = vec![None; fires.len()];
        for (i, o) in exclusive.into_iter().zip(single) {
            outcomes[i] = Some(o);
        }
        for (i, o) in shared.into_iter().zip(batched) {
            outcomes[i] = Some(o);
        }
        settled(outcomes)
    }

    async fn fire_shared(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
    ) -> Vec<FireOutcome> {
        if fires.is_empty() {
            return Vec::new();
        }
        FireCounters::add(&self.counters.fires, fires.len() as u64);
        // Each fire is the root of its run's trace, as in the single path.
        let fire_spans: Vec<tracing::Span> = fires
            .iter()
            .map(|(schedule, at)| {
                tracing::info_span!(parent: None, "fire", job.name = %schedule.name, job.type = %schedule.job_type,
                    belfry.fire_at = %at, belfry.run_key = tracing::field::Empty,
                    trace_id = tracing::field::Empty, belfry.outcome = tracing::field::Empty)
            })
            .collect();
        let outcomes = self.fire_shared_inner(fires, source, &fire_spans).await;
        for (span, outcome) in fire_spans.iter().zip(&outcomes) {
            span.record("belfry.outcome", outcome.label());
        }
        outcomes
    }

    async fn fire_shared_inner(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
        fire_spans: &[tracing::Span],
    ) -> Vec<FireOutcome> {
        if !self.guard.allows_claims() {
            let reason = SkipReason::ClockSkew {
                skew_ms: self.guard.last_skew_ms(),
            };
            return fires
                .iter()
                .map(|(schedule, at)| {
                    FireCounters::add(&self.counters.skipped_clock_skew, 1);
                    self.remember_missed_from(source, schedule, *at);
                    FireOutcome::Skipped { reason }
                })
                .collect();
        }
        let claim_spans: Vec<tracing::Span> = fire_spans
            .iter()
            .map(|parent| {
                tracing::info_span!(parent: parent, "claim",
                    belfry.lock = source.uses_lock() && self.claimer.lock().is_some(),
                    belfry.claim = tracing::field::Empty)
            })
            .collect();
        let asked: Vec<(&Schedule, DateTime<Utc>)> =
            fires.iter().map(|(s, at)| (s.as_ref(), *at)).collect();
        let claims = self.claimer.claim_batch(&asked, &claim_spans, source).await;
        drop(claim_spans);
        let mut outcomes: Vec<Option<FireOutcome>> = vec![None; fires.len()];
        let mut won = Vec::new();
        for (i, claim) in claims.into_iter().enumerate() {
            let (schedule, at) = &fires[i];
            outcomes[i] = match claim {
                Ok(ClaimOutcome::Won(run)) => {
                    won.push((i, run));
                    None
                }
                Ok(ClaimOutcome::LostAtLock) => {
                    self.remember_lock_loss(schedule, *at);
                    Some(FireOutcome::Lost)
                }
                Ok(ClaimOutcome::LostAtLedger) => Some(FireOutcome::Lost),
                Ok(ClaimOutcome::Overlapped) => Some(FireOutcome::Skipped {
                    reason: SkipReason::Overlap,
                }),
                Err(reason) => {
                    FireCounters::add(&self.counters.claim_errors, 1);
                    self.remember_missed_from(source, schedule, *at);
                    Some(FireOutcome::ClaimFailed { reason })
                }
            };
        }
        if outcomes
            .iter()
            .any(|o| matches!(o, Some(FireOutcome::ClaimFailed { .. })))
        {
            tracing::error!(fires = fires.len(), "a batch of fires could not be claimed; the misfire policy decides once the ledger is back");
        }
        if !won.is_empty() {
            belfry_runtime::failpoint::hit("after_claim_before_publish");
            let mut messages = Vec::with_capacity(won.len());
            let mut parents = Vec::with_capacity(won.len());
            for (i, run) in &won {
                let span = &fire_spans[*i];
                span.record("belfry.run_key", run.run_key.as_str());
                span.record("trace_id", run.trace_id.as_deref().unwrap_or(""));
                span.in_scope(|| tracing::info!(run_key = %run.run_key, id = %run.id, trace_id = run.trace_id.as_deref().unwrap_or(""), "fire claimed"));
                messages.push(run.to_message());
                parents.push(span.clone());
            }
            let publishing = std::time::Instant::now();
            let dispatched = self.dispatcher.dispatch_many(&messages, &parents).await;
            let took = publishing.elapsed().as_secs_f64();
            for ((i, run), outcome) in won.into_iter().zip(dispatched) {
                outcomes[i] = Some(self.record_dispatch(run.id, fires[i].1, source, outcome, took));
            }
        }
        settled(outcomes)
    }

    /// Counts a dispatched fire and turns the broker's answer into its
    /// outcome.
    fn record_dispatch(
        &self,
        id: Uuid,
        at: DateTime<Utc>,
        source: FireSource,
        outcome: DispatchOutcome,
        publish_seconds: f64,
    ) -> FireOutcome {
        match outcome {
            DispatchOutcome::Dispatched => {
                FireCounters::add(&self.counters.published, 1);
                self.counters.publish_seconds.observe(publish_seconds);
                // A backfilled instant is late on purpose (days, maybe);
                // the lateness histogram is about the timer.
                if matches!(source, FireSource::Timer | FireSource::Recovery) {
                    let late = (Utc::now() - at).num_microseconds().unwrap_or(i64::MAX);
                    self.counters
                        .lateness_seconds
                        .observe(late.max(0) as f64 / 1e6);
                }
                FireOutcome::Dispatched { id }
            }
            DispatchOutcome::Unroutable => {
                FireCounters::add(&self.counters.unroutable, 1);
                FireOutcome::Unroutable { id }
            }
            DispatchOutcome::NotConfirmed(reason) => {
                FireCounters::add(&self.counters.publish_errors, 1);
                FireOutcome::NotConfirmed { id, reason }
            }
        }
    }

    /// Publishes a run this replica just claimed and records the outcome.
    async fn dispatch_won(
        &self,
        run: &belfry_ledger::NewRun,
        at: DateTime<Utc>,
        source: FireSource,
        span: &tracing::Span,
    ) -> FireOutcome {
        span.record("belfry.run_key", run.run_key.as_str());
        span.record("trace_id", run.trace_id.as_deref().unwrap_or(""));
        tracing::info!(run_key = %run.run_key, id = %run.id, trace_id = run.trace_id.as_deref().unwrap_or(""), "fire claimed");
        let publishing = std::time::Instant::now();
        match self.dispatcher.dispatch(&run.to_message()).await {
            Ok(outcome) => self.record_dispatch(
                run.id,
                at,
                source,
                outcome,
                publishing.elapsed().as_secs_f64(),
            ),
            Err(e) => {
                FireCounters::add(&self.counters.publish_errors, 1);
                tracing::error!(run_key = %run.run_key, error = %e, "dispatch could not be recorded; the run stays claimed");
                FireOutcome::NotConfirmed {
                    id: run.id,
                    reason: e.to_string(),
                }
            }
        }
    }

    /// Runs `schedule` now, outside its timetable (an operator's manual
    /// trigger): a run with its own run key, subject to the schedule's
    /// overlap policy unless `force`, published like any fire. Works on a
    /// paused schedule too: the operator asked for this run.
    pub async fn trigger(&self, schedule: &Schedule, force: bool) -> FireOutcome {
        let span = tracing::info_span!("trigger", job.name = %schedule.name, job.type = %schedule.job_type,
            belfry.force = force, belfry.run_key = tracing::field::Empty,
            trace_id = tracing::field::Empty, belfry.outcome = tracing::field::Empty);
        let outcome = async {
            if !self.guard.allows_claims() {
                return FireOutcome::Skipped {
                    reason: SkipReason::ClockSkew {
                        skew_ms: self.guard.last_skew_ms(),
                    },
                };
            }
            match self.claimer.claim_manual(schedule, force).await {
                Ok(ClaimOutcome::Won(run)) => {
                    self.dispatch_won(&run, run.scheduled_at, FireSource::Manual, &span)
                        .await
                }
                Ok(ClaimOutcome::Overlapped) => FireOutcome::Skipped {
                    reason: SkipReason::Overlap,
                },
                Ok(ClaimOutcome::LostAtLock | ClaimOutcome::LostAtLedger) => FireOutcome::Lost,
                Err(e) => {
                    FireCounters::add(&self.counters.claim_errors, 1);
                    FireOutcome::ClaimFailed {
                        reason: e.to_string(),
                    }
                }
            }
        }
        .instrument(span.clone())
        .await;
        span.record("belfry.outcome", outcome.label());
        outcome
    }

    /// Fires every instant of `schedule` in `instants` through the normal
    /// claim path as [`FireSource::Backfill`] (the ledger decides; no lock,
    /// which a timer may hold for the same instant), in batches: instants
    /// that already ran are found taken and not repeated. With `force`, a
    /// schedule that forbids overlap has its instants claimed as if it
    /// allowed it (they may then run at the same time).
    pub async fn backfill(
        &self,
        schedule: &Arc<Schedule>,
        instants: &[DateTime<Utc>],
        force: bool,
    ) -> Vec<(DateTime<Utc>, FireOutcome)> {
        let schedule = if force && schedule.overlap == crate::schedule::OverlapPolicy::Forbid {
            Arc::new(Schedule {
                overlap: crate::schedule::OverlapPolicy::Allow,
                ..Schedule::clone(schedule)
            })
        } else {
            schedule.clone()
        };
        let fires: Vec<(Arc<Schedule>, DateTime<Utc>)> =
            instants.iter().map(|at| (schedule.clone(), *at)).collect();
        let mut out = Vec::with_capacity(fires.len());
        for chunk in fires.chunks(self.timing.max_batch) {
            let outcomes = self.fire_batch(chunk, FireSource::Backfill).await;
            out.extend(chunk.iter().map(|(_, at)| *at).zip(outcomes));
        }
        out
    }

    /// One step of the loop at instant `now`: fires everything `timer` has
    /// due and waits for all of them.
    pub async fn tick_once(&self, timer: &mut Timer, now: DateTime<Utc>) -> Vec<FireOutcome> {
        let due = timer.due(now);
        self.count_skipped(&due.skipped);
        futures::future::join_all(due.fires.iter().map(|f| self.fire(&f.schedule, f.at))).await
    }
}
