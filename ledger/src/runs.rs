//! `job_runs`: claiming a fire and every later transition of a run.
//!
//! Every transition is one guarded `UPDATE` whose `WHERE` names the statuses
//! it may leave, so concurrent or repeated callers (two replicas, a
//! redelivered message) cannot move a run backwards or finish it twice.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use belfry_protocol::{JobMessage, JobOptions, TraceContext, MESSAGE_VERSION};

use crate::attempt_batch::{BeginRequest, EndRequest};
use crate::run_limits::RunLimits;
use crate::run_rows::{FromMessage, RunLookup};
use crate::{Ledger, LedgerError, RunStatus};

/// A run to claim: the row a scheduler replica tries to insert for a fire.
#[derive(Debug, Clone)]
pub struct NewRun {
    /// Row id and message id.
    pub id: Uuid,
    /// Schedule (or ad-hoc job) name.
    pub job_name: String,
    /// The run key of the fire.
    pub run_key: String,
    /// The job type.
    pub job_type: String,
    /// The job's payload.
    pub payload: serde_json::Value,
    /// Nominal fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// The claiming scheduler instance.
    pub claimed_by: String,
    /// The run's trace id.
    pub trace_id: Option<String>,
    /// The traceparent the run is published with.
    pub traceparent: Option<String>,
    /// Retry/timeout overrides of the run.
    pub options: JobOptions,
    /// When the reconciler should publish the run if nobody confirmed it by
    /// then: shortly after the claim for runs published at once, the
    /// requested instant for delayed runs.
    pub next_dispatch_at: DateTime<Utc>,
}

impl NewRun {
    /// The job message that publishes this run.
    pub fn to_message(&self) -> JobMessage {
        build_message(
            self.id,
            &self.job_name,
            &self.run_key,
            &self.job_type,
            self.scheduled_at,
            &self.payload,
            self.traceparent.as_deref(),
            &self.options,
            1,
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn build_message(
    id: Uuid,
    job_name: &str,
    run_key: &str,
    job_type: &str,
    scheduled_at: DateTime<Utc>,
    payload: &serde_json::Value,
    traceparent: Option<&str>,
    options: &JobOptions,
    attempt: u32,
) -> JobMessage {
    JobMessage {
        version: MESSAGE_VERSION,
        message_id: id,
        job_name: job_name.to_owned(),
        job_type: job_type.to_owned(),
        run_key: run_key.to_owned(),
        scheduled_at,
        published_at: Utc::now(),
        attempt,
        payload: payload.clone(),
        trace: traceparent.and_then(|tp| TraceContext::from_traceparent(tp, None)),
        options: options.clone(),
    }
}

/// One finished attempt, appended to `job_runs.attempt_log`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptEntry {
    /// 1-based attempt number.
    pub attempt: i32,
    /// The worker instance that ran it.
    pub worker: String,
    /// When the handler was called.
    pub started_at: DateTime<Utc>,
    /// When the attempt ended.
    pub finished_at: DateTime<Utc>,
    /// `succeeded`, `retry`, `failed`, `timeout`, `panicked`, ...
    pub outcome: String,
    /// The error text, when the attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How many log lines the attempt sent to be stored (seq `0..n`), so a
    /// reader knows when the attempt's log is all in (see
    /// [`crate::run_log`]); absent for attempts written before run logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_lines: Option<i32>,
    /// The run's result, set by a succeeded attempt's handler
    /// (`JobContext::set_result`: small JSON, no NUL); handed to the
    /// run's follow-ups. The worker checks it; a caller writing entries
    /// itself must too (`belfry_protocol::check_storable_json`): Postgres
    /// refuses a NUL in it, and with it the whole write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
}

impl AttemptEntry {
    /// The entry as it is stored: its error text with NUL escaped (see
    /// [`crate::storable`]). Takes the entry, so the common case (no NUL)
    /// copies nothing.
    pub(crate) fn into_storable(mut self) -> Self {
        self.error = self.error.map(crate::stored_text::into_storable);
        self
    }

    /// The entry as JSON, as `attempt_log` holds it.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Corrupt`] when it cannot be encoded.
    pub(crate) fn to_json(&self) -> Result<serde_json::Value, LedgerError> {
        serde_json::to_value(self).map_err(|e| LedgerError::Corrupt(format!("attempt entry: {e}")))
    }
}

/// A row of `job_runs`.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRecord {
    /// Row id (= message id).
    pub id: Uuid,
    /// Schedule or job name.
    pub job_name: String,
    /// Run key.
    pub run_key: String,
    /// Job type.
    pub job_type: String,
    /// Status, as stored; see [`RunRecord::status`].
    #[sqlx(rename = "status")]
    pub status_text: String,
    /// Payload.
    pub payload: serde_json::Value,
    /// Nominal fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// Attempts started so far.
    pub attempts: i32,
    /// Claiming scheduler instance.
    pub claimed_by: Option<String>,
    /// When the fire was claimed.
    pub claimed_at: Option<DateTime<Utc>>,
    /// When the broker confirmed the publish.
    pub dispatched_at: Option<DateTime<Utc>>,
    /// When the first attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When the run reached a terminal status.
    pub finished_at: Option<DateTime<Utc>>,
    /// Worker of the latest attempt.
    pub worker: Option<String>,
    /// Latest error text.
    pub last_error: Option<String>,
    /// Finished attempts, as JSON ([`AttemptEntry`] objects).
    pub attempt_log: serde_json::Value,
    /// Trace id.
    pub trace_id: Option<String>,
    /// Traceparent the run was published with.
    pub traceparent: Option<String>,
    /// Retry/timeout overrides, as JSON ([`JobOptions`]).
    pub options: serde_json::Value,
    /// When the reconciler will publish the run (claimed or deferred retry).
    pub next_dispatch_at: Option<DateTime<Utc>>,
    /// When an operator asked to cancel the run (a running run shows it
    /// until its worker stops; see `crate::cancel`).
    pub cancel_requested_at: Option<DateTime<Utc>>,
}

impl RunRecord {
    /// The job message that (re)publishes this run: same message id, same
    /// trace, the next attempt's number.
    pub fn to_message(&self) -> JobMessage {
        let options = serde_json::from_value(self.options.clone()).unwrap_or_default();
        build_message(
            self.id,
            &self.job_name,
            &self.run_key,
            &self.job_type,
            self.scheduled_at,
            &self.payload,
            self.traceparent.as_deref(),
            &options,
            u32::try_from(self.attempts).unwrap_or(0).saturating_add(1),
        )
    }

    /// The parsed status.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Corrupt`] when the stored text is not a known status.
    pub fn status(&self) -> Result<RunStatus, LedgerError> {
        self.status_text.parse().map_err(LedgerError::Corrupt)
    }

    /// The finished attempts.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Corrupt`] when the stored log is not a list of
    /// attempt entries.
    pub fn attempt_entries(&self) -> Result<Vec<AttemptEntry>, LedgerError> {
        serde_json::from_value(self.attempt_log.clone())
            .map_err(|e| LedgerError::Corrupt(format!("attempt_log of run {}: {e}", self.id)))
    }
}

/// Where a run stands, read in one statement with the database's clock.
pub(crate) struct RunState {
    /// The run.
    pub(crate) id: Uuid,
    /// Its status.
    pub(crate) status: RunStatus,
    /// Until when its current attempt holds it.
    pub(crate) lease_until: Option<DateTime<Utc>>,
    /// Whether an operator asked to cancel it (see `crate::cancel`).
    pub(crate) cancel_requested: bool,
    /// The database's clock when this was read.
    pub(crate) now: DateTime<Utc>,
}

impl RunState {
    /// The state from the columns both backends read, `(id, status,
    /// lease_until, cancel requested)`, and the clock `now` they were read
    /// at.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Corrupt`] when the stored status is not a known one.
    pub(crate) fn parse(
        (id, status, lease_until, cancel_requested): (Uuid, String, Option<DateTime<Utc>>, bool),
        now: DateTime<Utc>,
    ) -> Result<Self, LedgerError> {
        Ok(Self {
            id,
            status: status.parse().map_err(LedgerError::Corrupt)?,
            lease_until,
            cancel_requested,
            now,
        })
    }
}

/// What a worker learns when it asks to start an attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptStart {
    /// The attempt may run; this is its 1-based number (durable across
    /// worker restarts).
    Started {
        /// The run's id.
        id: Uuid,
        /// The attempt number.
        attempt: i32,
    },
    /// Another attempt holds the run under an unexpired lease: this
    /// delivery is a concurrent duplicate.
    Busy {
        /// The run's id.
        id: Uuid,
        /// When the other attempt's lease ends.
        until: DateTime<Utc>,
    },
    /// The run is already terminal: the delivery is a duplicate.
    AlreadyFinished {
        /// The run's id.
        id: Uuid,
        /// Its terminal status.
        status: RunStatus,
    },
    /// Every slot of the run's concurrency limit is taken, or its rate
    /// limit's window is full: the run did not start, used no attempt, and
    /// waits in the ledger to be published again (see `crate::concurrency`
    /// and `crate::rate_limit`); the delivery is done with.
    Waiting {
        /// The run's id.
        id: Uuid,
        /// The limit it waits for.
        limit: crate::LimitKind,
        /// Runs holding a slot of its concurrency key, or starts in its
        /// rate key's window, when it asked.
        running: i64,
    },
}

/// [`RUN_COLUMNS`] of the table aliased `alias` (`j.id, j.job_name, ...`),
/// for statements that join or update through an alias.
pub(crate) fn run_columns_of(alias: &str) -> String {
    RUN_COLUMNS
        .split(", ")
        .map(|c| format!("{alias}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of [`RunRecord`], in its order.
pub const RUN_COLUMNS: &str =
    "id, job_name, run_key, job_type, status, payload, scheduled_at, attempts, \
     claimed_by, claimed_at, dispatched_at, started_at, finished_at, worker, last_error, \
     attempt_log, trace_id, traceparent, options, next_dispatch_at, cancel_requested_at";

impl Ledger {
    /// Tries to own a fire: inserts the run as `claimed` unless a row with
    /// the same `(job_name, run_key)` exists.
    ///
    /// Returns `true` when this call inserted the row (this replica owns the
    /// fire) and `false` when another replica already had it. The unique
    /// constraint makes this exact even when the Redis lock is unavailable.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn claim(&self, run: &NewRun) -> Result<bool, LedgerError> {
        // A batch of one: the batch's statement is the only claim.
        let won = self.claim_many(std::slice::from_ref(run)).await?;
        Ok(won.contains(&run.id))
    }

    /// Marks a claimed run `dispatched` after the broker confirmed it.
    ///
    /// Only a `claimed` row moves: a fast worker may already have marked it
    /// `running` (or finished it) before this update, and that must not be
    /// undone. Returns whether the row moved.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn mark_dispatched(&self, id: Uuid) -> Result<bool, LedgerError> {
        self.store.mark_dispatched(id).await
    }

    /// Marks a run no worker is executing `dead` with `reason`. Returns
    /// whether the row moved (a finished or running run keeps its state).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn mark_dead(&self, id: Uuid, reason: &str) -> Result<bool, LedgerError> {
        let reason = &*crate::storable(reason);
        self.store.mark_dead(id, reason).await
    }

    /// Starts the next attempt of the run `message` belongs to: counts it
    /// durably, marks the run `running` by `worker` and leases it to this
    /// attempt for `lease` (the attempt's timeout plus a grace).
    ///
    /// A run that is `running` under a lease that has not expired belongs to
    /// another attempt (a duplicate delivery after a channel loss, say):
    /// the answer is [`AttemptStart::Busy`] and nothing changes. Once the
    /// lease has expired the holder is presumed dead and the run is taken
    /// over, its attempt count intact.
    ///
    /// A message published by hand (another language, no scheduler) has no
    /// row yet; it is recorded here first, so every run is in `job_runs`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::IdConflict`] when the message id belongs to a different
    /// run; [`LedgerError::Query`] when the database cannot be reached.
    pub async fn begin_attempt(
        &self,
        message: &JobMessage,
        worker: &str,
        lease: std::time::Duration,
    ) -> Result<AttemptStart, LedgerError> {
        self.begin_attempt_limited(message, worker, lease, &RunLimits::default())
            .await
    }

    /// [`Ledger::begin_attempt`] under cluster-wide `limits` (see
    /// `crate::concurrency` and `crate::rate_limit`): the attempt starts
    /// only with a free slot of the concurrency key and a free start in
    /// the rate key's window, and otherwise the run waits in the ledger
    /// ([`AttemptStart::Waiting`]) without using an attempt.
    ///
    /// # Errors
    ///
    /// As [`Ledger::begin_attempt`].
    pub async fn begin_attempt_limited(
        &self,
        message: &JobMessage,
        worker: &str,
        lease: std::time::Duration,
        limits: &RunLimits,
    ) -> Result<AttemptStart, LedgerError> {
        let request = BeginRequest {
            job_name: message.job_name.clone(),
            run_key: message.run_key.clone(),
            worker: worker.to_owned(),
            lease,
        };
        // The common path is one statement (a limited start: one
        // transaction): the row exists and is startable.
        if let Some(start) = self.try_begin(&request, limits).await? {
            return Ok(start);
        }
        if let Some(state) = self.store.state_of(message).await? {
            return self.not_startable(&request, limits, state).await;
        }
        // A message published by hand: record it as dispatched (the broker
        // had it) and start it like any other.
        self.insert_from_message(FromMessage::Dispatched(message))
            .await?;
        if let Some(start) = self.try_begin(&request, limits).await? {
            return Ok(start);
        }
        let state = self
            .store
            .state_of(message)
            .await?
            .ok_or_else(|| LedgerError::Corrupt(format!("run {} vanished", message.run_key)))?;
        self.not_startable(&request, limits, state).await
    }

    /// Starts the run's next attempt if it is startable: a batch of one,
    /// whose guard is the only one (as [`Ledger::claim`] is a batch of one).
    async fn try_begin(
        &self,
        request: &BeginRequest,
        limits: &RunLimits,
    ) -> Result<Option<AttemptStart>, LedgerError> {
        if !limits.is_empty() {
            return self.store.begin_limited(request, limits).await;
        }
        let started = self.begin_batch(std::slice::from_ref(request)).await?;
        Ok(started
            .into_iter()
            .flatten()
            .next()
            .map(|(id, attempt)| AttemptStart::Started { id, attempt }))
    }

    /// The answer for a run that was not startable when `state` was read:
    /// finished, busy, or (when it became startable meanwhile) started after
    /// all.
    async fn not_startable(
        &self,
        request: &BeginRequest,
        limits: &RunLimits,
        state: RunState,
    ) -> Result<AttemptStart, LedgerError> {
        if state.status.is_terminal() {
            return Ok(AttemptStart::AlreadyFinished {
                id: state.id,
                status: state.status,
            });
        }
        if let (RunStatus::Running, Some(until)) = (state.status, state.lease_until) {
            if until > state.now {
                return Ok(AttemptStart::Busy {
                    id: state.id,
                    until,
                });
            }
        }
        // Cancelled while running, and its worker died before acting on
        // it: the run ends here instead of being taken over.
        if state.status == RunStatus::Running
            && state.cancel_requested
            && self.store.finish_cancelled(state.id).await?
        {
            return Ok(AttemptStart::AlreadyFinished {
                id: state.id,
                status: RunStatus::Cancelled,
            });
        }
        // The row became startable between the two statements (another
        // transition raced us, or the lease just expired); one more try
        // settles it.
        match self.try_begin(request, limits).await? {
            Some(start) => Ok(start),
            None => Ok(AttemptStart::Busy {
                id: state.id,
                until: state.lease_until.unwrap_or(state.now),
            }),
        }
    }

    /// Records a run that can never be processed (unknown job type, id
    /// conflict) as `dead` with `reason`, inserting its row when the message
    /// was published by hand and has none. A run that already finished keeps
    /// its outcome. Returns whether the row changed.
    ///
    /// # Errors
    ///
    /// [`LedgerError::IdConflict`] when the message id belongs to a
    /// different run; [`LedgerError::Query`] when the database cannot be
    /// reached.
    pub async fn record_dead(
        &self,
        message: &JobMessage,
        reason: &str,
    ) -> Result<bool, LedgerError> {
        let reason = crate::storable(reason);
        let changed = self
            .insert_from_message(FromMessage::Dead(message, &reason))
            .await?;
        Ok(changed == 1)
    }

    /// Inserts the row of a run known only from its message, as `run`
    /// says. Returns the number of rows inserted or updated.
    async fn insert_from_message(&self, run: FromMessage<'_>) -> Result<u64, LedgerError> {
        self.store.insert_from_message(run).await
    }

    /// Records the end of attempt `entry.attempt` and moves the run to `status`
    /// (`retrying` for an attempt that will be retried, or a terminal
    /// status). Returns whether the row moved: `false` means the attempt no
    /// longer owns the run (its lease expired and another attempt took
    /// over), and nothing was written.
    ///
    /// `redispatch_at` hands a `retrying` run's back-off to the ledger: the
    /// reconciler publishes it again at that instant (the worker acks the
    /// delivery instead of holding it). Terminal statuses set `finished_at`.
    /// `last_error` is stored as the
    /// run's latest error (`None` clears it, as on success); it may say more
    /// than the attempt's own error, e.g. "retries exhausted after 3
    /// attempts; last error: ...".
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn end_attempt(
        &self,
        id: Uuid,
        status: RunStatus,
        entry: &AttemptEntry,
        last_error: Option<&str>,
        redispatch_at: Option<DateTime<Utc>>,
    ) -> Result<bool, LedgerError> {
        // Free text is made storable first: a NUL in a handler's error must
        // not fail the outcome's write.
        let request = EndRequest {
            id,
            status,
            entry: entry.clone().into_storable(),
            last_error: last_error.map(|e| crate::storable(e).into_owned()),
            redispatch_at,
        };
        // A batch of one: the batch's statement, and its guard, is the only
        // way an attempt ends.
        let written = self.end_batch(std::slice::from_ref(&request)).await?;
        Ok(written.first() == Some(&true))
    }

    /// Hands interrupted attempt `attempt` back (worker shutting down): the
    /// run returns to `retrying` so the redelivered message picks it up. The
    /// interrupted attempt stays counted. Only the attempt's own holder can
    /// do this (the attempt number must still be current).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn hand_back(
        &self,
        id: Uuid,
        attempt: i32,
        reason: &str,
    ) -> Result<bool, LedgerError> {
        let reason = &*crate::storable(reason);
        self.store.hand_back(id, attempt, reason).await
    }

    /// One run by id.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn run(&self, id: Uuid) -> Result<Option<RunRecord>, LedgerError> {
        Ok(self.store.runs(RunLookup::Id(id)).await?.pop())
    }

    /// One run by `(job_name, run_key)`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn run_by_key(
        &self,
        job_name: &str,
        run_key: &str,
    ) -> Result<Option<RunRecord>, LedgerError> {
        Ok(self
            .store
            .runs(RunLookup::Key(job_name, run_key))
            .await?
            .pop())
    }

    /// The runs of `job_name`, oldest fire first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn runs_of(&self, job_name: &str, limit: i64) -> Result<Vec<RunRecord>, LedgerError> {
        self.store.runs(RunLookup::Job(job_name, limit)).await
    }
}
