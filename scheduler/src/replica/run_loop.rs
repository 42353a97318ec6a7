//! The loop a `belfry-scheduler` process runs: the timer loop that fires
//! what is due in batches under a bound on fires in flight, with its
//! background loops (late claims then outbox, the clock guard, recovery)
//! as named functions, and the drain at shutdown.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use belfry_runtime::shutdown::drain_within;
use belfry_runtime::SharedClock;

use super::recovering::{RecoveryWait, Scope};
use super::Replica;
use crate::claim::FireSource;
use crate::counters::FireCounters;
use crate::schedule::Schedule;
use crate::schedule_sync::ScheduleChange;
use crate::timer::Timer;

/// How often a misfire recovery (at start, of taken shards, of a resumed
/// schedule) is tried before it is given up (every [`RECOVERY_INTERVAL`]:
/// ten minutes).
const RECOVERY_ATTEMPTS: u32 = 120;
/// The longest one attempt of a misfire recovery may take (a recovery at
/// start reads the latest run of a third of a million schedules in
/// seconds; a hung connection would otherwise keep their fires waiting).
const RECOVERY_ATTEMPT_BOUND: Duration = Duration::from_secs(300);
/// How often fires this replica could not claim are looked at again.
const RECOVERY_INTERVAL: Duration = Duration::from_secs(5);
/// How long after losing a fire at the lock this replica checks that the
/// winner recorded it: far longer than a claim takes.
const LOCK_LOSS_CHECK_AFTER: Duration = Duration::from_secs(5);

impl Replica {
    /// Applies one schedule change to `timer`.
    pub fn apply_change(
        self: &Arc<Self>,
        timer: &mut Timer,
        change: ScheduleChange,
        now: DateTime<Utc>,
    ) {
        match change {
            ScheduleChange::Upsert(schedule) => {
                let changed = timer.upsert(schedule.clone(), now);
                tracing::info!(schedule = %schedule.name, changed, "schedule added, resumed or changed");
                if changed {
                    // A changed definition continues from now: its new
                    // instants before now were never due.
                    return;
                }
                // Fires missed while it was paused or absent follow its
                // misfire policy (nothing happens when it ran recently).
                let schedules = vec![schedule];
                self.spawn_recovery(Scope::of(&schedules), schedules, now, "a resumed schedule");
            }
            ScheduleChange::Remove(name) => {
                if timer.remove(&name) {
                    tracing::info!(schedule = %name, "schedule removed or paused");
                }
            }
            ScheduleChange::Taken(schedules) => {
                tracing::info!(
                    schedules = schedules.len(),
                    "schedules of taken shards added"
                );
                // Whoever held these shards before (a replica that died,
                // left, or still fires them until it sees the steal), their
                // missed instants follow the misfire policy; instants
                // already made are found taken. The recovery is marked
                // before this loop fires again, so none of their fires is
                // claimed ahead of it.
                for schedule in &schedules {
                    timer.upsert(schedule.clone(), now);
                }
                self.spawn_recovery(Scope::of(&schedules), schedules, now, "taken shards");
            }
        }
    }

    /// Marks the misfire recovery of `schedules` as under way until the
    /// guard is dropped: meanwhile the timer's fires of them are not
    /// claimed but remembered as missed (and recorded in the ledger before
    /// anything is claimed), to be decided with what the recovery makes
    /// (see `replica::recovering`). The loop marks each recovery it runs
    /// (at start, of taken shards, of a resumed schedule) before the timer
    /// holds its schedules.
    pub fn wait_for_recovery(&self, schedules: &[Arc<Schedule>]) -> RecoveryWait {
        self.recovering.begin(Scope::of(schedules))
    }

    /// Applies the misfire policies to what `schedules` missed until `now`
    /// in the background, then at once to the timer fires that waited for
    /// it. `scope` is marked as under recovery before this returns (so the
    /// caller's timer claims none of its fires ahead of it) and until the
    /// recovery ends or is given up. Retried every
    /// [`RECOVERY_INTERVAL`]: recoveries often run because the database was
    /// flaky, which is when this read fails, and nobody else recovers these
    /// instants (a previous owner no longer holds them). Given up after
    /// [`RECOVERY_ATTEMPTS`], so the timer fires again.
    fn spawn_recovery(
        self: &Arc<Self>,
        scope: Scope,
        schedules: Vec<Arc<Schedule>>,
        now: DateTime<Utc>,
        what: &'static str,
    ) {
        let recovery = self.recovering.begin(scope);
        let this = self.clone();
        let stopping = self.stopping.clone();
        tokio::spawn(async move {
            for attempt in 1..=RECOVERY_ATTEMPTS {
                // Bounded, so a hung connection cannot keep the schedules'
                // fires waiting for ever; ended by the replica's stop, so a
                // stopped replica claims nothing more.
                let attempted = tokio::select! {
                    _ = stopping.cancelled() => return,
                    r = tokio::time::timeout(RECOVERY_ATTEMPT_BOUND, this.recover_after_downtime(&schedules, now)) => r,
                };
                match attempted {
                    Ok(Ok(_)) => {
                        // The wait ends, then the fires that waited are
                        // decided (late by the recovery's duration).
                        drop(recovery);
                        FireCounters::add(&this.counters.recoveries, 1);
                        this.recover_missed_once(this.clock.now()).await;
                        return;
                    }
                    Ok(Err(e)) => tracing::warn!(error = %e, attempt, what,
                        "misfire recovery failed; retrying"),
                    Err(_) => tracing::warn!(bound = ?RECOVERY_ATTEMPT_BOUND, attempt, what,
                        "misfire recovery did not finish in its bound; retrying"),
                }
                // Either ends the pause; a stop ends the task.
                tokio::select! {
                    _ = stopping.cancelled() => return,
                    _ = tokio::time::sleep(RECOVERY_INTERVAL) => {}
                }
            }
            tracing::error!(
                schedules = schedules.len(),
                what,
                "misfire recovery kept failing; the instants missed before it are not made"
            );
        });
    }

    /// Runs the timer loop and the outbox reconciler until `cancel`,
    /// reading time from `clock`.
    ///
    /// On cancellation it stops firing, then waits up to the shutdown
    /// timeout for in-flight claims and publishes to finish.
    pub async fn run(self: Arc<Self>, timer: Timer, clock: SharedClock, cancel: CancellationToken) {
        // No schedule changes arrive: the sender is kept (not dropped) so
        // the receiver never reports closed.
        let (_keep, changes) = mpsc::unbounded_channel();
        self.run_with_changes(timer, clock, cancel, changes).await;
    }

    /// [`Replica::run`], also applying schedule changes from `changes`
    /// (see [`crate::schedule_sync`]) to the timer as they arrive. A
    /// changed or resumed schedule first goes through misfire recovery for
    /// the fires it missed while paused or absent.
    pub async fn run_with_changes(
        self: Arc<Self>,
        mut timer: Timer,
        clock: SharedClock,
        cancel: CancellationToken,
        mut changes: mpsc::UnboundedReceiver<ScheduleChange>,
    ) {
        // The clock is checked once before anything is claimed (first
        // tick, misfire recovery), so a replica started with a wrong clock
        // claims nothing early (or late) while the guard's loop has not run
        // yet. A failed check keeps claims allowed: the loop retries, and
        // run keys cannot collide anyway.
        if let Err(e) = self.guard.check_once(&self.ledger, &clock).await {
            tracing::warn!(error = %e, "first clock check failed; the guard retries");
        }
        let reconciling = tokio::spawn(self.clone().reconcile_loop(clock.clone(), cancel.clone()));
        let guarding = {
            let this = self.clone();
            let (clock, cancel) = (clock.clone(), cancel.clone());
            tokio::spawn(async move {
                this.guard
                    .run(
                        &this.ledger,
                        &clock,
                        this.timing.clock_check_interval,
                        cancel,
                    )
                    .await
            })
        };
        // The keeper frees this replica's shards as soon as `cancel` fires
        // (before the drain), so the others take them at their next pass.
        let keeping = self.spawn_keeper(cancel.clone());
        // Marked before the timer loop starts, so no fire is claimed ahead
        // of the first recovery (see `recovering`).
        self.spawn_recovery(Scope::All, timer.schedules(), clock.now(), "start");
        let recovering = tokio::spawn(self.clone().recovery_loop(clock.clone(), cancel.clone()));
        let mut inflight = JoinSet::new();
        tracing::info!(instance = %self.instance, schedules = timer.len(), "scheduler replica running");
        self.timer_loop(&mut timer, &clock, &cancel, &mut changes, &mut inflight)
            .await;
        self.stopping.cancel();
        self.drain(inflight).await;
        // What the drained fires could not claim is stored before the
        // process ends, for whoever recovers their schedules next.
        match tokio::time::timeout(self.timing.shutdown_timeout, self.record_undecided_once()).await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "missed fires not stored at shutdown; the next recovery starts from each schedule's latest run")
            }
            Err(_) => tracing::warn!("missed fires not stored within the shutdown timeout"),
        }
        let _ = reconciling.await;
        let _ = guarding.await;
        let _ = recovering.await;
        if let Some(keeping) = keeping {
            let _ = keeping.await;
        }
        self.broker.close().await;
        tracing::info!(instance = %self.instance, "scheduler replica stopped");
    }

    /// Fires what `timer` has due, in batches, until `cancel`; applies
    /// schedule changes between fires. Fires go into `inflight`, bounded by
    /// `max_inflight` permits (one per fire).
    async fn timer_loop(
        self: &Arc<Self>,
        timer: &mut Timer,
        clock: &SharedClock,
        cancel: &CancellationToken,
        changes: &mut mpsc::UnboundedReceiver<ScheduleChange>,
        inflight: &mut JoinSet<Vec<super::FireOutcome>>,
    ) {
        let permits = Arc::new(Semaphore::new(self.timing.max_inflight));
        loop {
            while inflight.try_join_next().is_some() {}
            // Waiting is progress however long it lasts; what follows the
            // wake-up must not take long (see `timer_progress`).
            self.progress.idle();
            let change = tokio::select! {
                // Biased towards shutdown: once cancelled, no new fire is
                // claimed even if one is due at the same moment. Due fires
                // come before schedule changes, so a burst of changes cannot
                // delay them; a change is applied between fires.
                biased;
                _ = cancel.cancelled() => return,
                _ = timer.wait(clock) => None,
                change = changes.recv() => change,
            };
            self.progress.busy(clock.now());
            // What is due is handed off before a change is applied, so a
            // change arriving just as its schedule is due does not lose
            // that fire.
            let due = timer.due(clock.now());
            self.count_skipped(&due.skipped);
            let due_fires: Vec<(Arc<Schedule>, DateTime<Utc>)> =
                due.fires.into_iter().map(|f| (f.schedule, f.at)).collect();
            for batch in due_fires.chunks(self.timing.max_batch) {
                // Everything due now goes out in batches (a lone fire is a
                // batch of one, sent at once). Waiting for permits (one per
                // fire) bounds in-flight fires; the timer catches up
                // afterwards because instants come from the schedule, not
                // from when this loop gets to them. Shutdown ends the wait:
                // fires not yet started are not claimed.
                let wanted = u32::try_from(batch.len()).unwrap_or(u32::MAX);
                let permit = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return,
                    p = permits.clone().acquire_many_owned(wanted) => match p { Ok(p) => p, Err(_) => return },
                };
                // The batch's place in the claim order is taken here, in
                // the order the timer yields instants, not when its task
                // first runs: a later batch of the same schedule then waits
                // for this one's claims (see `claim_order`).
                let turn = self.claim_order.enter(batch);
                let this = self.clone();
                let batch = batch.to_vec();
                let batch_clock = clock.clone();
                inflight.spawn(async move {
                    let _permit = permit;
                    let started = batch_clock.now();
                    let outcomes = this
                        .fire_batch_in_turn(&batch, FireSource::Timer, turn)
                        .await;
                    // How long claims take now sets how long the loop may
                    // wait for permits before it counts as stalled.
                    this.progress.batch_done(started, batch_clock.now());
                    outcomes
                });
                // A batch handed off is progress: an instant with more fires
                // than the claims get through in the stall bound (a million
                // schedules on one top of the hour) keeps the loop busy for
                // minutes, and must not make every replica let its shards go
                // (each would take the others' and find them as busy). Only
                // a hand-off that does not come for the stall bound is one.
                self.progress.busy(clock.now());
            }
            if let Some(change) = change {
                self.apply_change(timer, change, clock.now());
            }
        }
    }

    /// Waits up to the shutdown timeout for in-flight claims and publishes;
    /// what is left stays claimed for the reconciler.
    async fn drain(&self, mut inflight: JoinSet<Vec<super::FireOutcome>>) {
        let pending = inflight.len();
        tracing::info!(
            pending,
            "stopping: finishing in-flight claims and publishes"
        );
        if !drain_within(&mut inflight, self.timing.shutdown_timeout).await {
            tracing::warn!(
                left = inflight.len(),
                "shutdown deadline passed; unfinished fires stay claimed for the reconciler"
            );
            inflight.abort_all();
        }
    }

    /// Until `cancel`: misfire policies for late unpublished fires first,
    /// then the release of buffered fires whose schedule has nothing
    /// unfinished, then the outbox, so the reconciler never publishes a fire
    /// the policy skips. A pass reads every late claim and always ends, so the outbox
    /// runs after every pass, whatever the backlog; a full outbox page is
    /// followed by the next at once.
    async fn reconcile_loop(self: Arc<Self>, clock: SharedClock, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.skip_late_claims_once(clock.now()).await {
                tracing::warn!(error = %e, "late-claim pass failed; retrying");
            }
            // Before the outbox: what it releases is published this pass.
            if let Err(e) = self.release_buffered_once().await {
                tracing::warn!(error = %e, "cannot release buffered fires; retrying");
            }
            // Before the outbox too: the children it enqueues are due at
            // once and published by this pass.
            if let Err(e) = self.settle_follow_ups_once().await {
                tracing::warn!(error = %e, "cannot enqueue follow-up runs; retrying");
            }
            let full = match self.reconciler.reconcile_once().await {
                Ok(report) => {
                    FireCounters::add(&self.counters.republished, report.republished as u64);
                    report.more
                }
                Err(e) => {
                    tracing::warn!(error = %e, "outbox pass failed; retrying");
                    false
                }
            };
            if full && !cancel.is_cancelled() {
                continue;
            }
            // Either wakes the loop; a cancel between passes ends it.
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.timing.reconcile_interval) => {}
            }
        }
    }

    /// Every few seconds until `cancel`: stuck runs, late runs, fires lost
    /// at the lock, fires this replica could not claim, and spans the timer
    /// skipped. (Fires missed while every replica was down are recovered
    /// once at start, beside it.)
    async fn recovery_loop(self: Arc<Self>, clock: SharedClock, cancel: CancellationToken) {
        loop {
            // Either wakes the loop; a cancel between passes ends it.
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(RECOVERY_INTERVAL) => {}
            }
            if let Err(e) = self.report_stuck_once().await {
                tracing::warn!(error = %e, "cannot look for stuck runs; retrying");
            }
            if let Err(e) = self.report_late_once().await {
                tracing::warn!(error = %e, "cannot look for late runs; retrying");
            }
            if let Err(e) = self.verify_lock_losses_once(LOCK_LOSS_CHECK_AFTER).await {
                tracing::warn!(error = %e, "cannot check fires lost at the lock; retrying");
            }
            self.recover_missed_once(clock.now()).await;
            if let Err(e) = self.record_skipped_once().await {
                tracing::warn!(error = %e, "cannot record skipped fires yet; retrying");
            }
        }
    }
}
