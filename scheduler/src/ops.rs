//! Operator actions: create, replace and delete a schedule, pause and
//! resume it, run it now (trigger), backfill a past range, preview its next
//! instants. The REST API and the web view call these (parse → ops →
//! response); each change writes its audit line here, so no front end can
//! forget it, and each failure is an [`OpsError`] saying what was wrong,
//! which the front end turns into its own answer (an HTTP status, a page).
//!
//! Every change is written to the `schedules` table, whose notifications
//! reach each replica's timer; the operator's own fires (trigger, backfill)
//! go through the same claim path as the timer's.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use belfry_ledger::{LedgerError, RunRecord, ScheduleRow};
use belfry_protocol::{validate_name, NameError, ScheduleSpec};

use crate::replica::{FireOutcome, Replica, SkipReason};
use crate::schedule::{Schedule, ScheduleError};
use crate::schedule_sync::{schedule_of_row, spec_of_row, StoredScheduleError};
use crate::zoned_cron::CronCache;

/// Most fire instants one backfill may cover.
pub const MAX_BACKFILL: usize = 10_000;

/// Why an operator action was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The schedule name breaks the naming rule.
    #[error(transparent)]
    BadName(#[from] NameError),
    /// There is no schedule of that name.
    #[error("no schedule named {name:?}")]
    NotFound {
        /// The name asked for.
        name: String,
    },
    /// A schedule of that name exists already (create).
    #[error("a schedule named {name:?} exists")]
    Exists {
        /// The name.
        name: String,
    },
    /// The stored definition cannot be compiled (edited by hand, say).
    #[error(
        "the stored definition of {name:?} is not valid ({source}); fix it with a replace first"
    )]
    StoredInvalid {
        /// The schedule.
        name: String,
        /// What is wrong with it.
        source: StoredScheduleError,
    },
    /// The schedule forbids overlap and its previous run is not finished
    /// (trigger without force).
    #[error(
        "{name:?}'s overlap policy skips a run while the previous one is unfinished, and it is; \
         force to run anyway"
    )]
    Overlap {
        /// The schedule.
        name: String,
    },
    /// A backfill of several instants of a schedule that forbids overlap,
    /// without force: they would run side by side.
    #[error(
        "{name:?} forbids overlap, and a backfill of {instants} instants would run them side by \
         side; force to run them anyway, or backfill one instant at a time"
    )]
    BackfillOverlap {
        /// The schedule.
        name: String,
        /// How many instants the range holds.
        instants: usize,
    },
    /// A value of the request breaks a rule (the field names it).
    #[error("{message}")]
    Invalid {
        /// The request field (`from`, `to`, ...).
        field: &'static str,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// The definition is invalid.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// The run could not be claimed now (the ledger is unreachable, this
    /// replica's clock is skewed); retrying may work.
    #[error("the run could not be claimed: {reason}; retry")]
    NotClaimed {
        /// Why.
        reason: String,
    },
    /// Another claim of the same run won (a race between replicas); retrying
    /// makes a new run.
    #[error("the run could not be claimed; retry")]
    ClaimLost,
    /// The backfill's task ended before its fires did (the process is
    /// stopping, or it panicked); what it claimed stays claimed for the
    /// outbox.
    #[error("the backfill stopped: {reason}")]
    Stopped {
        /// Why.
        reason: String,
    },
    /// No run has this id (cancel).
    #[error("no run with id {id}")]
    RunNotFound {
        /// The id asked for.
        id: uuid::Uuid,
    },
    /// The run has finished; there is nothing to cancel.
    #[error("run {id} has already finished ({status}); only an unfinished run can be cancelled")]
    RunFinished {
        /// The run.
        id: uuid::Uuid,
        /// Its terminal status.
        status: belfry_ledger::RunStatus,
    },
    /// The ledger failed (see [`LedgerError::is_data_error`] for a value it
    /// refuses, as opposed to an outage).
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// What a trigger did.
#[derive(Debug, Clone)]
pub struct Triggered {
    /// The fire's outcome (dispatched, unroutable, not confirmed).
    pub outcome: FireOutcome,
    /// The run's id.
    pub run_id: uuid::Uuid,
    /// The run as stored just after (`None` if it could not be read back:
    /// the run exists either way).
    pub run: Option<RunRecord>,
    /// A note for the operator when the run is not simply dispatched.
    pub note: Option<String>,
}

/// What happened to one instant of a backfill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BackfillOutcome {
    /// Claimed and published.
    Dispatched,
    /// It had run already (or another replica claimed it).
    AlreadyRan,
    /// Not claimed on purpose (overlap, clock skew).
    Skipped,
    /// Claimed, publish not confirmed yet: the outbox publishes it.
    NotConfirmed,
    /// Claimed, but no worker group serves the type: the run is dead.
    Unroutable,
    /// Claimed and held by the overlap policy until the previous run ends.
    Buffered,
    /// Not claimed: the ledger was unreachable; backfill again.
    Failed,
}

impl BackfillOutcome {
    /// The name the API and the web view show.
    pub fn label(self) -> &'static str {
        match self {
            BackfillOutcome::Dispatched => "dispatched",
            BackfillOutcome::AlreadyRan => "already_ran",
            BackfillOutcome::Skipped => "skipped",
            BackfillOutcome::NotConfirmed => "not_confirmed",
            BackfillOutcome::Unroutable => "unroutable",
            BackfillOutcome::Buffered => "buffered",
            BackfillOutcome::Failed => "failed",
        }
    }

    fn of(outcome: &FireOutcome) -> Self {
        match outcome {
            FireOutcome::Dispatched { .. } => BackfillOutcome::Dispatched,
            FireOutcome::Lost => BackfillOutcome::AlreadyRan,
            FireOutcome::Skipped { .. } => BackfillOutcome::Skipped,
            FireOutcome::NotConfirmed { .. } => BackfillOutcome::NotConfirmed,
            FireOutcome::Unroutable { .. } => BackfillOutcome::Unroutable,
            FireOutcome::Buffered { .. } => BackfillOutcome::Buffered,
            FireOutcome::ClaimFailed { .. } => BackfillOutcome::Failed,
        }
    }
}

/// What a backfill did.
#[derive(Debug, Clone)]
pub struct Backfilled {
    /// The range's start (inclusive).
    pub from: DateTime<Utc>,
    /// The range's end (exclusive).
    pub to: DateTime<Utc>,
    /// Each instant of the range and what happened to it, in order.
    pub fires: Vec<(DateTime<Utc>, BackfillOutcome)>,
}

impl Backfilled {
    /// How many instants ended each way.
    pub fn counts(&self) -> std::collections::BTreeMap<BackfillOutcome, u64> {
        let mut counts = std::collections::BTreeMap::new();
        for (_, outcome) in &self.fires {
            *counts.entry(*outcome).or_default() += 1;
        }
        counts
    }
}

/// The operator actions of one replica.
#[derive(Debug, Clone)]
pub struct Ops {
    replica: Arc<Replica>,
    retention: Option<Duration>,
}

/// One audit log line for a change: who (the token's name), what (the
/// action), which schedule (or ad-hoc job name), and details.
pub fn audit(actor: &str, action: &str, schedule: &str, detail: &str) {
    tracing::info!(target: "belfry::audit", who = %actor, action, schedule, detail, "audit");
}

impl Ops {
    /// The actions of `replica`.
    pub fn new(replica: Arc<Replica>) -> Self {
        Self {
            replica,
            retention: None,
        }
    }

    /// How long finished runs are kept: a backfill reaching further back is
    /// refused (pruned runs would run again).
    pub fn with_retention(mut self, retention: Option<Duration>) -> Self {
        self.retention = retention;
        self
    }

    /// The run retention this replica prunes with.
    pub fn retention(&self) -> Option<Duration> {
        self.retention
    }

    /// The replica the actions run on.
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// The stored schedule `name`.
    ///
    /// # Errors
    ///
    /// [`OpsError::BadName`], [`OpsError::NotFound`], or the ledger's.
    pub async fn schedule(&self, name: &str) -> Result<ScheduleRow, OpsError> {
        validate_name("schedule name", name)?;
        self.replica
            .ledger()
            .schedule(name)
            .await?
            .ok_or_else(|| OpsError::NotFound { name: name.into() })
    }

    /// The schedule as stored after a change; if it cannot be read back,
    /// what was written: the change is made, so the answer must not be an
    /// error inviting a retry.
    async fn reread(&self, written: ScheduleRow) -> ScheduleRow {
        match self.replica.ledger().schedule(&written.name).await {
            Ok(Some(row)) => row,
            Ok(None) | Err(_) => written,
        }
    }

    /// Creates a schedule from `spec` on behalf of `actor`, paused or not;
    /// returns it as stored.
    ///
    /// # Errors
    ///
    /// [`OpsError::Schedule`] for an invalid definition, [`OpsError::Exists`]
    /// when the name is taken, or the ledger's.
    pub async fn create(
        &self,
        actor: &str,
        spec: &ScheduleSpec,
        paused: bool,
    ) -> Result<ScheduleRow, OpsError> {
        let mut row = Schedule::storable_row(spec, self.replica.clock().now(), true)?;
        row.paused = paused;
        if !self.replica.ledger().insert_schedule(&row).await? {
            return Err(OpsError::Exists {
                name: spec.name.clone(),
            });
        }
        audit(
            actor,
            "schedule.create",
            &spec.name,
            if paused { "paused" } else { "" },
        );
        Ok(self.reread(row).await)
    }

    /// Replaces the definition of the existing schedule `spec.name`;
    /// `paused` sets its paused state too (`None` keeps it). Returns it as
    /// stored.
    ///
    /// # Errors
    ///
    /// [`OpsError::NotFound`] when there is none, [`OpsError::Schedule`]
    /// for an invalid definition, or the ledger's.
    pub async fn replace(
        &self,
        actor: &str,
        spec: &ScheduleSpec,
        paused: Option<bool>,
    ) -> Result<ScheduleRow, OpsError> {
        let current = self.schedule(&spec.name).await?;
        // A one-shot whose instant passed (it fired) can still be edited;
        // only a new instant must be ahead.
        let moved =
            spec.after.is_some() || spec_of_row(&current).map_or(true, |old| old.at != spec.at);
        let mut row = Schedule::storable_row(spec, self.replica.clock().now(), moved)?;
        if !self.replica.ledger().replace_schedule(&row, paused).await? {
            // Deleted between the read and the write.
            return Err(OpsError::NotFound {
                name: spec.name.clone(),
            });
        }
        audit(actor, "schedule.replace", &spec.name, "");
        row.paused = paused.unwrap_or(current.paused);
        Ok(self.reread(row).await)
    }

    /// Deletes the schedule `name`; its runs stay in `job_runs`.
    ///
    /// # Errors
    ///
    /// [`OpsError::BadName`], [`OpsError::NotFound`], or the ledger's.
    pub async fn delete(&self, actor: &str, name: &str) -> Result<(), OpsError> {
        validate_name("schedule name", name)?;
        if !self.replica.ledger().delete_schedule(name).await? {
            return Err(OpsError::NotFound { name: name.into() });
        }
        audit(actor, "schedule.delete", name, "");
        Ok(())
    }

    /// Pauses (no more fires until resumed) or resumes `name` (fires missed
    /// while paused follow its misfire policy), with an optional `note`
    /// saying why (kept while paused); `detail` goes into the audit line
    /// (`web view`, say). Returns the schedule as stored, or `None` when it
    /// cannot be read back (the change is made).
    ///
    /// # Errors
    ///
    /// [`OpsError::BadName`], [`OpsError::NotFound`], or the ledger's.
    pub async fn set_paused(
        &self,
        actor: &str,
        name: &str,
        paused: bool,
        note: Option<&str>,
        detail: &str,
    ) -> Result<Option<ScheduleRow>, OpsError> {
        validate_name("schedule name", name)?;
        let note = note.map(str::trim).filter(|n| !n.is_empty());
        if let Some(n) = note {
            if n.chars().count() > crate::cancel::MAX_REASON_CHARS {
                return Err(OpsError::Invalid {
                    field: "note",
                    message: format!(
                        "the note has {} characters; at most {} are kept",
                        n.chars().count(),
                        crate::cancel::MAX_REASON_CHARS
                    ),
                });
            }
        }
        // The note says who: the audit line's actor.
        let note = note.map(|n| format!("{n} ({actor})"));
        if !self
            .replica
            .ledger()
            .set_paused(name, paused, note.as_deref())
            .await?
        {
            return Err(OpsError::NotFound { name: name.into() });
        }
        let action = if paused {
            "schedule.pause"
        } else {
            "schedule.resume"
        };
        let detail = match &note {
            Some(n) if detail.is_empty() => n.clone(),
            Some(n) => format!("{n}; {detail}"),
            None => detail.to_owned(),
        };
        audit(actor, action, name, &detail);
        Ok(self.replica.ledger().schedule(name).await.ok().flatten())
    }

    /// The compiled definition of a stored schedule.
    fn compiled(row: &ScheduleRow) -> Result<Schedule, OpsError> {
        schedule_of_row(row, &mut CronCache::default()).map_err(|source| OpsError::StoredInvalid {
            name: row.name.clone(),
            source,
        })
    }

    /// Runs `name` now with its own run key, subject to its overlap policy
    /// unless `force`; works on a paused schedule too.
    ///
    /// # Errors
    ///
    /// [`OpsError::NotFound`], [`OpsError::StoredInvalid`],
    /// [`OpsError::Overlap`] (without force), [`OpsError::NotClaimed`] when
    /// the run could not be claimed now, or the ledger's.
    pub async fn trigger(
        &self,
        actor: &str,
        name: &str,
        force: bool,
    ) -> Result<Triggered, OpsError> {
        let row = self.schedule(name).await?;
        let schedule = Self::compiled(&row)?;
        let outcome = self.replica.trigger(&schedule, force).await;
        let (run_id, note) = match &outcome {
            FireOutcome::Dispatched { id } => (*id, None),
            FireOutcome::Unroutable { id } => (
                *id,
                Some(format!(
                    "no worker group serves job type {:?}; the run is dead",
                    schedule.job_type
                )),
            ),
            FireOutcome::NotConfirmed { id, reason } => (
                *id,
                Some(format!(
                    "not yet confirmed by the broker ({reason}); the outbox publishes it"
                )),
            ),
            FireOutcome::Buffered { id } => (
                *id,
                Some(format!(
                    "the previous run is unfinished: held by the overlap policy ({}) until it ends",
                    schedule.overlap.rule().map_or("allow_all", |r| r.as_str())
                )),
            ),
            FireOutcome::Skipped {
                reason: SkipReason::Overlap,
            } => return Err(OpsError::Overlap { name: name.into() }),
            FireOutcome::Skipped { reason } => {
                return Err(OpsError::NotClaimed {
                    reason: reason.to_string(),
                })
            }
            FireOutcome::ClaimFailed { reason } => {
                return Err(OpsError::NotClaimed {
                    reason: reason.clone(),
                })
            }
            FireOutcome::Lost => return Err(OpsError::ClaimLost),
        };
        audit(
            actor,
            "schedule.trigger",
            name,
            &format!("run {run_id}{}", if force { " (forced)" } else { "" }),
        );
        // The run exists either way: a failed read-back only leaves it out.
        let run = self.replica.ledger().run(run_id).await.ok().flatten();
        Ok(Triggered {
            outcome,
            run_id,
            run,
            note,
        })
    }

    /// Fires every instant of the stored schedule `row` (read with
    /// [`Ops::schedule`]) in `[from, to)` through the normal claim path, so
    /// instants that already ran are not repeated; works on paused
    /// schedules. Runs in its own task: a caller that goes away does
    /// not cut it off halfway.
    ///
    /// # Errors
    ///
    /// [`OpsError::Invalid`] for a range that is empty, reaches into the
    /// future or past the run retention, or holds more than
    /// [`MAX_BACKFILL`] instants; [`OpsError::BackfillOverlap`] for several
    /// instants of a schedule that forbids overlap without `force`;
    /// [`OpsError::StoredInvalid`], or the ledger's.
    pub async fn backfill(
        &self,
        actor: &str,
        row: &ScheduleRow,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        force: bool,
    ) -> Result<Backfilled, OpsError> {
        let name = row.name.as_str();
        if from >= to {
            return Err(OpsError::Invalid {
                field: "to",
                message: "to must be after from; the range is [from, to)".into(),
            });
        }
        let now = self.replica.clock().now();
        if to > now {
            return Err(OpsError::Invalid {
                field: "to",
                message: format!(
                    "to ({to}) is in the future; backfill covers past fires, later ones run on schedule"
                ),
            });
        }
        if let Some(keep) = self.retention {
            let horizon = chrono::Duration::from_std(keep)
                .ok()
                .and_then(|keep| now.checked_sub_signed(keep));
            if horizon.is_some_and(|h| from < h) {
                return Err(OpsError::Invalid {
                    field: "from",
                    message: format!(
                        "from ({from}) is older than the run retention ({}): runs there may have been \
                         pruned, so fires that ran would run again",
                        humantime::format_duration(keep)
                    ),
                });
            }
        }
        let schedule = Arc::new(Self::compiled(row)?);
        let instants = instants_between(&schedule, from, to)?;
        if schedule.overlap.rule().is_some() && instants.len() > 1 && !force {
            return Err(OpsError::BackfillOverlap {
                name: name.into(),
                instants: instants.len(),
            });
        }
        audit(
            actor,
            "schedule.backfill",
            name,
            &format!(
                "[{from}, {to}): {} instants{}",
                instants.len(),
                if force { " (forced)" } else { "" }
            ),
        );
        // Its own task: what it claimed would stay claimed for the outbox
        // anyway, but the rest of the range would not be claimed at all.
        let replica = self.replica.clone();
        let outcomes =
            tokio::spawn(async move { replica.backfill(&schedule, &instants, force).await })
                .await
                .map_err(|e| OpsError::Stopped {
                    reason: e.to_string(),
                })?;
        Ok(Backfilled {
            from,
            to,
            fires: outcomes
                .iter()
                .map(|(at, o)| (*at, BackfillOutcome::of(o)))
                .collect(),
        })
    }

    /// The next `count` fire instants of `name` after now, computed as the
    /// timer does, with the schedule as stored.
    ///
    /// # Errors
    ///
    /// [`OpsError::NotFound`], [`OpsError::StoredInvalid`], or the
    /// ledger's.
    pub async fn preview(
        &self,
        name: &str,
        count: usize,
    ) -> Result<(ScheduleRow, Vec<DateTime<Utc>>), OpsError> {
        let row = self.schedule(name).await?;
        // Inside its start_at/end_at window, and no more than it has runs
        // left (none once it ran out).
        let count = row.capped_by_runs_left(count);
        let next = Self::compiled(&row)?.upcoming(self.replica.clock().now(), count);
        Ok((row, next))
    }
}

/// The fire instants of `schedule` in `[from, to)`.
///
/// # Errors
///
/// [`OpsError::Invalid`] when there are more than [`MAX_BACKFILL`].
pub fn instants_between(
    schedule: &Schedule,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>, OpsError> {
    let mut out = Vec::new();
    // `next_after` is strict: start a second early so `from` itself counts.
    let mut t = from - chrono::Duration::seconds(1);
    while let Some(next) = schedule.next_after(t).filter(|n| *n < to) {
        if next >= from {
            if out.len() == MAX_BACKFILL {
                return Err(OpsError::Invalid {
                    field: "to",
                    message: format!(
                        "the range holds more than {MAX_BACKFILL} fire instants; backfill it in smaller ranges"
                    ),
                });
            }
            out.push(next);
        }
        t = next;
    }
    Ok(out)
}
