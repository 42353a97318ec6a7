//! Recovery: the misfire policies applied to fires missed while no replica
//! ran (at start, and when a schedule is resumed or changed), to fires this
//! replica could not claim, and to fires lost at the lock whose winner never
//! recorded them; and the report of runs that stopped moving.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::missed_fires::{missed_fire, MAX_REMEMBERED_MISSES};
use super::{FireOutcome, Replica};
use crate::claim::FireSource;
use crate::counters::FireCounters;
use crate::misfire::DueInstants;
use crate::schedule::Schedule;
use crate::timer::Skipped;
use crate::SchedulerError;

/// What a misfire decision's due instants are (see [`Replica::decide`]).
#[derive(Debug, Clone, Copy)]
enum DueSpan<'a> {
    /// Every instant of the schedule in `(after, until]`.
    Between(DateTime<Utc>, DateTime<Utc>),
    /// Exactly these instants (sorted).
    Listed(&'a [DateTime<Utc>]),
}

/// The runs of consecutive instants (by the schedule's timetable) among
/// `instants` (sorted) that are not in `fired`: `(first, last, count)`.
fn consecutive_runs(
    schedule: &Schedule,
    instants: &[DateTime<Utc>],
    fired: &[DateTime<Utc>],
) -> Vec<(DateTime<Utc>, DateTime<Utc>, u64)> {
    let mut runs: Vec<(DateTime<Utc>, DateTime<Utc>, u64)> = Vec::new();
    for at in instants.iter().filter(|at| !fired.contains(at)) {
        match runs.last_mut() {
            Some((_, last, count)) if schedule.next_after(*last) == Some(*at) => {
                *last = *at;
                *count += 1;
            }
            _ => runs.push((*at, *at, 1)),
        }
    }
    runs
}

impl Replica {
    /// Reports runs that stopped moving (see
    /// [`belfry_ledger::Ledger::mark_stuck`]): an error log line and a
    /// counter for each, and a `stuck: ...` reason in `job_runs`. Returns
    /// how many were found.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached.
    pub async fn report_stuck_once(&self) -> Result<usize, SchedulerError> {
        let stuck = self
            .ledger
            .mark_stuck(self.timing.stuck_after, 1_000)
            .await?;
        for (run_key, status, reason) in &stuck {
            FireCounters::add(&self.counters.stuck_runs, 1);
            tracing::error!(%run_key, %status, %reason, "run is stuck");
        }
        Ok(stuck.len())
    }

    /// Records a `run.late` alert event for each run of a schedule with a
    /// `deadline` that is not finished that long after its scheduled
    /// instant; once per run across replicas (the event's dedupe key).
    /// Returns how many were recorded now.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached.
    pub async fn report_late_once(&self) -> Result<u64, SchedulerError> {
        let deadlines: Vec<(String, std::time::Duration)> = self
            .ledger
            .schedule_deadlines()
            .await?
            .into_iter()
            .filter_map(|(name, raw)| {
                // Checked when stored; a hand-edited value that does not
                // read is left out (the schedule itself refuses to load).
                humantime::parse_duration(raw.trim())
                    .ok()
                    .filter(|d| !d.is_zero())
                    .map(|d| (name, d))
            })
            .collect();
        let late = self.ledger.record_late_runs(&deadlines).await?;
        if late > 0 {
            tracing::warn!(late, "runs past their schedule's deadline");
        }
        Ok(late)
    }

    /// Checks the fires this replica lost at the Redis lock at least
    /// `after` ago: any that no replica recorded in the ledger (the lock
    /// holder died between the lock and the insert) is treated as missed
    /// and goes through the misfire policy, claimed through the ledger
    /// alone. Returns how many were missing.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be read (the
    /// entries are kept for the next pass).
    pub async fn verify_lock_losses_once(&self, after: Duration) -> Result<usize, SchedulerError> {
        let ready: Vec<(Arc<Schedule>, DateTime<Utc>)> = {
            let mut losses = self.lock_losses.lock().unwrap_or_else(|p| p.into_inner());
            let mut ready = Vec::new();
            while losses
                .front()
                .is_some_and(|(_, _, when)| when.elapsed() >= after)
            {
                if let Some((s, at, _)) = losses.pop_front() {
                    ready.push((s, at));
                }
            }
            ready
        };
        if ready.is_empty() {
            return Ok(0);
        }
        // Pairs are built together so a fire and its key can never drift apart
        // (a run key always builds for a validated schedule name).
        let ready: Vec<(Arc<Schedule>, DateTime<Utc>, String)> = ready
            .into_iter()
            .filter_map(|(s, at)| {
                belfry_protocol::run_key(&s.name, at)
                    .ok()
                    .map(|k| (s, at, k))
            })
            .collect();
        let keys: Vec<(String, String)> = ready
            .iter()
            .map(|(s, _, k)| (s.name.clone(), k.clone()))
            .collect();
        let recorded = match self.ledger.recorded_keys(&keys).await {
            Ok(r) => r,
            Err(e) => {
                let mut losses = self.lock_losses.lock().unwrap_or_else(|p| p.into_inner());
                for (s, at, _) in ready {
                    losses.push_front((s, at, std::time::Instant::now()));
                }
                return Err(e.into());
            }
        };
        let mut missing = 0;
        for (schedule, at, key) in &ready {
            if !recorded.contains(key) {
                missing += 1;
                tracing::warn!(run_key = %key, "a fire lost at the lock was never recorded (its holder died?); recovering it");
                self.remember_missed(schedule, *at);
            }
        }
        Ok(missing)
    }

    /// Applies each schedule's misfire policy to the fires this replica
    /// could not claim (ledger down, clock skewed), once claiming works
    /// again; returns the outcomes of the fires it made. Fires of a
    /// schedule whose recovery is under way are left for it (see
    /// `recovering`): deciding them first would store a run newer than the
    /// instants that recovery is about to read.
    pub async fn recover_missed_once(&self, now: DateTime<Utc>) -> Vec<FireOutcome> {
        let taken: Vec<(Arc<Schedule>, DateTime<Utc>)> = {
            let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
            if missed.is_empty() {
                return Vec::new();
            }
            let all: Vec<(Arc<Schedule>, DateTime<Utc>)> = std::mem::take(&mut *missed).into();
            let waits = self.recovering.waiting(&all).unwrap_or_default();
            let mut taken = Vec::with_capacity(all.len());
            for (i, fire) in all.into_iter().enumerate() {
                if waits.get(i).copied().unwrap_or(false) {
                    missed.push_back(fire);
                } else {
                    taken.push(fire);
                }
            }
            taken
        };
        if taken.is_empty() {
            return Vec::new();
        }
        // Recorded first (see `missed_fires`): what this pass decides stays
        // in the ledger until it is decided, whatever happens to this
        // replica meanwhile.
        let unable = !self.guard.allows_claims()
            || !self.ledger.ping().await
            || self.record_undecided_once().await.is_err();
        if unable {
            // Still unable to claim: keep them for the next pass.
            let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
            missed.extend(taken);
            while missed.len() > MAX_REMEMBERED_MISSES {
                missed.pop_front();
                FireCounters::add(&self.counters.misfires_skipped, 1);
            }
            return Vec::new();
        }
        let decided: Vec<belfry_ledger::MissedFire> =
            taken.iter().map(|(s, at)| missed_fire(s, *at)).collect();
        let mut by_schedule: std::collections::BTreeMap<
            String,
            (Arc<Schedule>, Vec<DateTime<Utc>>),
        > = Default::default();
        for (schedule, at) in taken {
            by_schedule
                .entry(schedule.name.clone())
                .or_insert_with(|| (schedule.clone(), Vec::new()))
                .1
                .push(at);
        }
        let mut fires = Vec::new();
        for (_, (schedule, mut instants)) in by_schedule {
            instants.sort_unstable();
            instants.dedup();
            let due = DueInstants {
                total: u64::try_from(instants.len()).unwrap_or(u64::MAX),
                latest: instants,
            };
            fires.extend(self.decide(&schedule, &due, now, DueSpan::Listed(&due.latest)));
        }
        // As in `recover_after_downtime`: spans before the fires kept.
        if let Err(e) = self.record_skipped_once().await {
            tracing::warn!(error = %e, "cannot record skipped fires yet; retrying");
        }
        let kept: Vec<belfry_ledger::MissedFire> =
            fires.iter().map(|(s, at)| missed_fire(s, *at)).collect();
        let outcomes = self.fire_recovered(fires).await;
        self.forget_decided(decided, &kept, &outcomes).await;
        outcomes
    }

    /// Forgets the ledger's records of `fires`, decided by a policy: those
    /// it skipped once their spans are stored, those it `kept` once claimed.
    /// A kept fire whose claim failed (its outcome in `outcomes`, in the
    /// order of `kept`) was remembered again and keeps its record. What
    /// cannot be forgotten stays; a later read finds it decided and drops
    /// it (see [`belfry_ledger::Ledger::undecided_missed_fires`]).
    async fn forget_decided(
        &self,
        fires: Vec<belfry_ledger::MissedFire>,
        kept: &[belfry_ledger::MissedFire],
        outcomes: &[FireOutcome],
    ) {
        if !self
            .pending_skips
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
        {
            // A span is not stored yet: its instants must keep their records.
            return;
        }
        let failed: std::collections::HashSet<&belfry_ledger::MissedFire> = kept
            .iter()
            .zip(outcomes)
            .filter(|(_, o)| {
                matches!(
                    o,
                    FireOutcome::ClaimFailed { .. }
                        | FireOutcome::Skipped {
                            reason: crate::SkipReason::ClockSkew { .. }
                                | crate::SkipReason::Recovering
                        }
                )
            })
            .map(|(f, _)| f)
            .collect();
        let decided: Vec<belfry_ledger::MissedFire> =
            fires.into_iter().filter(|f| !failed.contains(f)).collect();
        // Under `storing`: a record of one of these whose write is in
        // flight lands before this forget, not after it.
        let _storing = self.storing.lock().await;
        for chunk in decided.chunks(10_000) {
            if let Err(e) = self.ledger.forget_missed_fires(chunk).await {
                tracing::warn!(error = %e, "cannot forget decided missed fires; a later read finds them decided and drops them");
                return;
            }
        }
    }

    /// Applies each schedule's misfire policy to the fires missed while no
    /// replica was running: the instants between the schedule's latest run
    /// in the ledger and `now`. Every replica does this at start; the claim
    /// path makes each recovered fire happen once. Missed fires recorded in
    /// the ledger before a schedule's latest run are taken over (see
    /// `missed_fires`); missed fires this replica remembers inside the span
    /// decided here are decided by it.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be read.
    pub async fn recover_after_downtime(
        &self,
        schedules: &[Arc<Schedule>],
        now: DateTime<Utc>,
    ) -> Result<Vec<FireOutcome>, SchedulerError> {
        let names: Vec<String> = schedules.iter().map(|s| s.name.clone()).collect();
        let last = self.ledger.last_fires(&names).await?;
        let mut within = self.adopt_recorded(schedules, &names, &last, now).await?;
        let mut fires = Vec::new();
        let mut spans: std::collections::HashMap<&str, (DateTime<Utc>, DateTime<Utc>)> =
            std::collections::HashMap::new();
        for schedule in schedules {
            // Never ran: only a one-shot whose instant passed has a miss.
            let from = match last.get(&schedule.name) {
                Some(last) => *last,
                None => match schedule.first_instant() {
                    Some(at) => at - chrono::Duration::seconds(1),
                    None => continue,
                },
            };
            // Lateness counts from each fire's wake-up, as in the timer.
            let until = now - schedule.jitter_offset;
            spans.insert(schedule.name.as_str(), (from, until));
            let due = crate::misfire::due_between(schedule, from, until, schedule.misfire.keep());
            if due.total > 0 {
                fires.extend(self.decide(schedule, &due, now, DueSpan::Between(from, until)));
            }
        }
        within.extend(self.drop_remembered_within(&spans));
        // The spans a policy skipped are stored before the fires it kept
        // are claimed: a kept fire is newer than what it skipped, and once
        // its run is stored the next recovery starts after it.
        self.record_skipped_once().await?;
        let kept: Vec<belfry_ledger::MissedFire> =
            fires.iter().map(|(s, at)| missed_fire(s, *at)).collect();
        let outcomes = self.fire_recovered(fires).await;
        self.forget_decided(within, &kept, &outcomes).await;
        Ok(outcomes)
    }

    /// Drops the missed fires this replica remembers (and has still to
    /// record) that lie inside a span decided now (`spans`: each schedule's
    /// `(after, until]`): that decision holds them, and a second one on
    /// the list could fire an instant the span's decision skipped. Returns
    /// them, to forget their records once the decision is stored.
    fn drop_remembered_within(
        &self,
        spans: &std::collections::HashMap<&str, (DateTime<Utc>, DateTime<Utc>)>,
    ) -> Vec<belfry_ledger::MissedFire> {
        let inside = |name: &str, at: DateTime<Utc>| {
            spans
                .get(name)
                .is_some_and(|(after, until)| *after < at && at <= *until)
        };
        let mut dropped = Vec::new();
        {
            let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
            missed.retain(|(s, at)| {
                let keep = !inside(&s.name, *at);
                if !keep {
                    dropped.push(missed_fire(s, *at));
                }
                keep
            });
        }
        let mut unrecorded = self.unrecorded.lock().unwrap_or_else(|p| p.into_inner());
        unrecorded.retain(|f| !inside(&f.job_name, f.scheduled_at));
        dropped
    }

    /// The missed fires recorded in the ledger for `schedules` (see
    /// `missed_fires`) and still undecided: those at or before a
    /// schedule's latest run (or of a schedule that never ran, which has no
    /// span) are left by a replica that claimed that run and died, and this
    /// span's decision does not hold them, so they are remembered as this
    /// replica's own misses and decided by the next pass. Returns the
    /// others, inside the span decided now, to forget once it is.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be read.
    async fn adopt_recorded(
        &self,
        schedules: &[Arc<Schedule>],
        names: &[String],
        last: &std::collections::HashMap<String, DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Result<Vec<belfry_ledger::MissedFire>, SchedulerError> {
        let limit = i64::try_from(MAX_REMEMBERED_MISSES).unwrap_or(i64::MAX);
        let recorded = self.ledger.undecided_missed_fires(names, limit).await?;
        if recorded.is_empty() {
            return Ok(Vec::new());
        }
        let by_name: std::collections::HashMap<&str, &Arc<Schedule>> =
            schedules.iter().map(|s| (s.name.as_str(), s)).collect();
        let mut within = Vec::new();
        let mut adopted = 0_usize;
        for fire in recorded {
            let Some(schedule) = by_name.get(fire.job_name.as_str()) else {
                continue;
            };
            let before_span = match last.get(&fire.job_name) {
                Some(l) => fire.scheduled_at <= *l,
                // A one-shot that never ran has a span (its instant); a
                // recurring schedule that never ran has none.
                None => schedule.first_instant().is_none(),
            };
            if before_span {
                self.remember_recorded(schedule, fire.scheduled_at);
                adopted += 1;
            } else if fire.scheduled_at <= now - schedule.jitter_offset {
                within.push(fire);
            }
        }
        if adopted > 0 {
            tracing::warn!(
                fires = adopted,
                "missed fires recorded by a replica that did not decide them; deciding them"
            );
        }
        Ok(within)
    }

    /// The fires `schedule`'s misfire policy keeps of `due`, judged at
    /// `now`. Lateness counts from each fire's wake-up (its instant plus the
    /// schedule's jitter), as in the timer and the late-claim pass, so a
    /// jittered fire recovered soon after its wake-up is on time.
    ///
    /// `span` is what the due instants are: every instant of the schedule
    /// in `(after, until]`, or exactly the listed ones; the skipped ones are
    /// recorded as spans either way.
    fn decide(
        &self,
        schedule: &Arc<Schedule>,
        due: &DueInstants,
        now: DateTime<Utc>,
        span: DueSpan<'_>,
    ) -> Vec<(Arc<Schedule>, DateTime<Utc>)> {
        let decision = schedule.misfire.decide(
            due,
            now - schedule.jitter_offset,
            self.timing.misfire_threshold,
        );
        if decision.skipped > 0 {
            let skipped: Vec<Skipped> = match span {
                DueSpan::Between(after, until) => vec![Skipped {
                    schedule: schedule.clone(),
                    count: decision.skipped,
                    span: decision.skipped_span(after, until),
                }],
                // Listed instants need not be consecutive (others were
                // claimed meanwhile): one span per run of consecutive
                // skipped instants, so no span covers an instant nobody
                // decided on.
                DueSpan::Listed(instants) => consecutive_runs(schedule, instants, &decision.fire)
                    .into_iter()
                    .map(|(first, last, count)| Skipped {
                        schedule: schedule.clone(),
                        count,
                        span: Some((first - chrono::Duration::seconds(1), last)),
                    })
                    .collect(),
            };
            self.count_skipped(&skipped);
        }
        decision
            .fire
            .into_iter()
            .map(|at| (schedule.clone(), at))
            .collect()
    }

    async fn fire_recovered(&self, fires: Vec<(Arc<Schedule>, DateTime<Utc>)>) -> Vec<FireOutcome> {
        if !fires.is_empty() {
            tracing::info!(
                fires = fires.len(),
                "firing missed fires kept by the misfire policies"
            );
            FireCounters::add(
                &self.counters.misfires_recovered,
                u64::try_from(fires.len()).unwrap_or(u64::MAX),
            );
        }
        let mut outcomes = Vec::with_capacity(fires.len());
        // One batch at a time, each as large as the timer's.
        for chunk in fires.chunks(self.timing.max_batch) {
            outcomes.extend(self.fire_batch(chunk, FireSource::Recovery).await);
        }
        outcomes
    }
}
