//! The fire path: a fire, or a batch of fires due together, from the
//! claim to the dispatch, each keeping its own `fire` span (the root of its
//! run's trace) and outcome. The operator's manual trigger and backfill go
//! the same way, as other [`FireSource`]s.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use tracing::Instrument as _;
use uuid::Uuid;

use belfry_dispatch::DispatchOutcome;
use belfry_ledger::NewRun;

use super::claim_order::ClaimTurn;
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
    /// Claims and, when won, dispatches the fire of `schedule` at `at`: a
    /// batch of one ([`Replica::fire_batch`] from the timer).
    ///
    /// A fire that cannot be claimed here (the ledger is unreachable, or
    /// this replica's clock is skewed) is remembered as missed; the recovery
    /// loop applies the schedule's misfire policy to it once claiming works
    /// again.
    pub async fn fire(&self, schedule: &Arc<Schedule>, at: DateTime<Utc>) -> FireOutcome {
        let fire = [(schedule.clone(), at)];
        self.fire_batch(&fire, FireSource::Timer)
            .await
            .pop()
            .unwrap_or(FireOutcome::ClaimFailed {
                reason: "not fired".into(),
            })
    }

    /// Claims and dispatches `fires` as one batch (the only fire path: a
    /// lone fire is a batch of one): one pipelined Redis round trip for the
    /// locks, one multi-row insert (each fire of a schedule that forbids
    /// overlap decided on its own, under its schedule's advisory lock),
    /// publishes pipelined under a confirm window, one update marking the
    /// confirmed ones `dispatched`. Outcomes per fire, in order (a fire that
    /// could not be claimed is remembered for its misfire policy); every
    /// fire is the root of its own `fire` span and trace. `source` says
    /// whether the lock is taken and how the runs are recorded (see
    /// [`FireSource`]). The batch claims after the batches this replica
    /// handed off before it have decided their claims of the same schedules
    /// (see [`super::claim_order`]).
    pub async fn fire_batch(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
    ) -> Vec<FireOutcome> {
        // A backfill's runs are not live fires: recovery neither starts from
        // them nor remembers their failures, so their order protects
        // nothing, and a long backfill must not hold the timer back.
        let turn = if source == FireSource::Backfill {
            self.claim_order.enter(&[])
        } else {
            self.claim_order.enter(fires)
        };
        self.fire_batch_in_turn(fires, source, turn).await
    }

    /// [`Replica::fire_batch`] for a batch whose place in the claim order
    /// was taken when it was handed off (the timer loop takes it before it
    /// spawns the batch, so batches claim a schedule's fires in the order of
    /// its instants; see [`super::claim_order`]).
    pub(super) async fn fire_batch_in_turn(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
        turn: ClaimTurn,
    ) -> Vec<FireOutcome> {
        if fires.is_empty() {
            return Vec::new();
        }
        // An older fire of one of these schedules still being claimed by an
        // earlier batch is decided first: won, or failed and remembered, so
        // the claim path's first step stores it before this batch claims a
        // newer one. Waited for before anything else, so the clock guard and
        // the recovery marks below are read as they are when this batch
        // claims, however long the wait.
        turn.wait().await;
        FireCounters::add(&self.counters.fires, fires.len() as u64);
        // Each fire is the root of its run's trace: claim and publish are
        // its children, and the worker's spans continue under the publish
        // span. Its children carry only what they add (the instance is the
        // exporter's `service.instance.id`).
        let fire_spans: Vec<tracing::Span> = fires
            .iter()
            .map(|(schedule, at)| {
                tracing::info_span!(parent: None, "fire", job.name = %schedule.name, job.type = %schedule.job_type,
                    belfry.fire_at = %at, belfry.run_key = tracing::field::Empty,
                    trace_id = tracing::field::Empty, belfry.outcome = tracing::field::Empty)
            })
            .collect();
        let waits = if source == FireSource::Timer {
            self.recovering.waiting(fires)
        } else {
            None
        };
        let outcomes = match waits {
            None => {
                self.claim_and_dispatch(fires, source, &fire_spans, turn)
                    .await
            }
            Some(waits) => {
                self.claim_unless_recovering(fires, source, &fire_spans, &waits, turn)
                    .await
            }
        };
        for (span, outcome) in fire_spans.iter().zip(&outcomes) {
            span.record("belfry.outcome", outcome.label());
        }
        outcomes
    }

    /// Claims the fires of `fires` that do not wait for their schedule's
    /// recovery (`waits`), and remembers the others as missed, so they are
    /// decided with the instants the recovery makes (see
    /// [`super::recovering`]).
    async fn claim_unless_recovering(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
        fire_spans: &[tracing::Span],
        waits: &[bool],
        mut turn: ClaimTurn,
    ) -> Vec<FireOutcome> {
        let mut outcomes: Vec<Option<FireOutcome>> = vec![None; fires.len()];
        let mut rest = Vec::new();
        let mut rest_spans = Vec::new();
        let mut rest_at = Vec::new();
        for (i, ((fire, span), wait)) in fires.iter().zip(fire_spans).zip(waits).enumerate() {
            if *wait {
                FireCounters::add(&self.counters.waited_for_recovery, 1);
                self.remember_missed(&fire.0, fire.1);
                outcomes[i] = Some(FireOutcome::Skipped {
                    reason: SkipReason::Recovering,
                });
            } else {
                rest.push(fire.clone());
                rest_spans.push(span.clone());
                rest_at.push(i);
            }
        }
        // The schedules left to their recovery are remembered: later
        // batches of theirs need not wait for this one's claims.
        turn.narrow(&rest);
        if !rest.is_empty() {
            let claimed = self
                .claim_and_dispatch(&rest, source, &rest_spans, turn)
                .await;
            for (i, outcome) in rest_at.into_iter().zip(claimed) {
                outcomes[i] = Some(outcome);
            }
        }
        settled(outcomes)
    }

    /// Claims `fires` (their batch's `turn` already waited for, see
    /// [`Replica::fire_batch_in_turn`]), ends the turn once every claim is
    /// decided, then dispatches the ones won.
    async fn claim_and_dispatch(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
        fire_spans: &[tracing::Span],
        mut turn: ClaimTurn,
    ) -> Vec<FireOutcome> {
        if !self.guard.allows_claims() {
            let reason = SkipReason::ClockSkew {
                skew_ms: self.guard.last_skew_ms(),
            };
            return self.not_claimed(
                fires,
                source,
                &self.counters.skipped_clock_skew,
                &FireOutcome::Skipped { reason },
            );
        }
        // Fires this replica could not claim before, and spans a policy
        // skipped, are in the ledger before anything newer is: a newer run
        // of their schedule would otherwise hide them from the next
        // recovery if this replica died before storing them. Not stored,
        // nothing is claimed (the ledger is most likely down, and the
        // claims would fail too).
        if matches!(source, FireSource::Timer | FireSource::Recovery) {
            if let Err(e) = self.record_undecided_once().await {
                let reason =
                    format!("older missed or skipped fires could not be stored first: {e}");
                tracing::error!(fires = fires.len(), error = %e,
                    "fires not claimed: older missed or skipped fires could not be stored first; the misfire policy decides once the ledger is back");
                return self.not_claimed(
                    fires,
                    source,
                    &self.counters.claim_errors,
                    &FireOutcome::ClaimFailed { reason },
                );
            }
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
                    // Another replica holds the lock; if it dies before
                    // recording the fire, nobody would. Check later that
                    // the fire was recorded.
                    self.remember_lock_loss(schedule, *at);
                    Some(FireOutcome::Lost)
                }
                Ok(ClaimOutcome::LostAtLedger) => Some(FireOutcome::Lost),
                Ok(ClaimOutcome::Overlapped) => Some(FireOutcome::Skipped {
                    reason: SkipReason::Overlap,
                }),
                Ok(ClaimOutcome::Buffered(run)) => Some(FireOutcome::Buffered { id: run.id }),
                Ok(ClaimOutcome::RanOut) => Some(FireOutcome::Skipped {
                    reason: SkipReason::RanOut,
                }),
                Err(reason) => {
                    FireCounters::add(&self.counters.claim_errors, 1);
                    self.remember_missed_from(source, schedule, *at);
                    Some(FireOutcome::ClaimFailed { reason })
                }
            };
        }
        // Every claim is decided and every failed fire remembered (a timer
        // or recovery fire; see `remember_missed_from`): later batches of
        // these schedules may claim, storing the remembered fires first.
        // The dispatch below does not hold them back.
        turn.release();
        if outcomes
            .iter()
            .any(|o| matches!(o, Some(FireOutcome::ClaimFailed { .. })))
        {
            tracing::error!(
                fires = fires.len(),
                "fires could not be claimed; the misfire policy decides once the ledger is back"
            );
        }
        if !won.is_empty() {
            belfry_runtime::failpoint::hit("after_claim_before_publish");
            let runs: Vec<(&NewRun, &tracing::Span)> = won
                .iter()
                .map(|(i, run)| (run.as_ref(), &fire_spans[*i]))
                .collect();
            let dispatched = self.dispatch_won(&runs, source).await;
            for ((i, _), outcome) in won.iter().zip(dispatched) {
                outcomes[*i] = Some(outcome);
            }
        }
        settled(outcomes)
    }

    /// `outcome` for every fire of `fires`, none claimed: each counted in
    /// `counter` and remembered as missed for its misfire policy.
    fn not_claimed(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
        counter: &std::sync::atomic::AtomicU64,
        outcome: &FireOutcome,
    ) -> Vec<FireOutcome> {
        fires
            .iter()
            .map(|(schedule, at)| {
                FireCounters::add(counter, 1);
                self.remember_missed_from(source, schedule, *at);
                outcome.clone()
            })
            .collect()
    }

    /// Publishes runs this replica just claimed, each under its fire's (or
    /// trigger's) span, pipelined, and records the broker's answers: one
    /// outcome per run, in order.
    async fn dispatch_won(
        &self,
        runs: &[(&NewRun, &tracing::Span)],
        source: FireSource,
    ) -> Vec<FireOutcome> {
        let mut messages = Vec::with_capacity(runs.len());
        let mut parents = Vec::with_capacity(runs.len());
        for (run, span) in runs {
            span.record("belfry.run_key", run.run_key.as_str());
            span.record("trace_id", run.trace_id.as_deref().unwrap_or(""));
            span.in_scope(|| tracing::info!(run_key = %run.run_key, id = %run.id, trace_id = run.trace_id.as_deref().unwrap_or(""), "fire claimed"));
            messages.push(run.to_message());
            parents.push((*span).clone());
        }
        let publishing = std::time::Instant::now();
        let dispatched = self.dispatcher.dispatch_many(&messages, &parents).await;
        let took = publishing.elapsed().as_secs_f64();
        runs.iter()
            .zip(dispatched)
            .map(|((run, _), outcome)| {
                self.record_dispatch(run.id, run.scheduled_at, source, outcome, took)
            })
            .collect()
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
                    let late = (self.clock.now() - at)
                        .num_microseconds()
                        .unwrap_or(i64::MAX);
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
                Ok(ClaimOutcome::Won(run)) => self
                    .dispatch_won(&[(&run, &span)], FireSource::Manual)
                    .await
                    .pop()
                    .unwrap_or(FireOutcome::NotConfirmed {
                        id: run.id,
                        reason: "not dispatched".into(),
                    }),
                Ok(ClaimOutcome::Overlapped) => FireOutcome::Skipped {
                    reason: SkipReason::Overlap,
                },
                Ok(ClaimOutcome::Buffered(run)) => FireOutcome::Buffered { id: run.id },
                Ok(ClaimOutcome::RanOut) => FireOutcome::Skipped {
                    reason: SkipReason::RanOut,
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
    /// schedule with an overlap policy other than `allow_all` has its
    /// instants claimed as if it allowed overlap (they may then run at the
    /// same time).
    pub async fn backfill(
        &self,
        schedule: &Arc<Schedule>,
        instants: &[DateTime<Utc>],
        force: bool,
    ) -> Vec<(DateTime<Utc>, FireOutcome)> {
        let schedule = if force && schedule.overlap.rule().is_some() {
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
        let fires: Vec<(Arc<Schedule>, DateTime<Utc>)> = due
            .fires
            .iter()
            .map(|f| (f.schedule.clone(), f.at))
            .collect();
        let mut outcomes = Vec::with_capacity(fires.len());
        for batch in fires.chunks(self.timing.max_batch.max(1)) {
            outcomes.extend(self.fire_batch(batch, FireSource::Timer).await);
        }
        outcomes
    }
}
