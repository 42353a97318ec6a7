//! `job_runs`: claiming a fire and every later transition of a run.
//!
//! Every transition is one guarded `UPDATE` whose `WHERE` names the statuses
//! it may leave, so concurrent or repeated callers (two replicas, a
//! redelivered message) cannot move a run backwards or finish it twice.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use uuid::Uuid;

use belfry_protocol::{JobMessage, JobOptions, TraceContext, MESSAGE_VERSION};

use crate::status::waiting_statuses;
use crate::{Ledger, LedgerError, RunStatus};

/// Statuses of a run no worker is executing right now.
const WAITING: &str = waiting_statuses!();

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
}

impl AttemptEntry {
    /// The entry as it is stored: its error text with NUL escaped (see
    /// [`crate::storable`]). Takes the entry, so the common case (no NUL)
    /// copies nothing.
    pub(crate) fn into_storable(mut self) -> Self {
        self.error = self.error.map(crate::stored_text::into_storable);
        self
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
struct RunState {
    id: Uuid,
    status: RunStatus,
    lease_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
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
}

/// The columns of [`RunRecord`], in its order.
pub const RUN_COLUMNS: &str =
    "id, job_name, run_key, job_type, status, payload, scheduled_at, attempts, \
     claimed_by, claimed_at, dispatched_at, started_at, finished_at, worker, last_error, \
     attempt_log, trace_id, traceparent, options, next_dispatch_at";

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
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.claim(run).await,
        };
        self.claim_in(pool, run).await
    }

    /// [`Ledger::claim`] on `executor` (a pool or an open transaction).
    pub(crate) async fn claim_in<'e, E>(
        &self,
        executor: E,
        run: &NewRun,
    ) -> Result<bool, LedgerError>
    where
        E: sqlx::Executor<'e, Database = sqlx::Postgres>,
    {
        let inserted = sqlx::query(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
                 claimed_by, claimed_at, trace_id, traceparent, options, next_dispatch_at) \
             VALUES ($1, $2, $3, $4, 'claimed', $5, $6, $7, now(), $8, $9, $10, $11) \
             ON CONFLICT (job_name, run_key) DO NOTHING \
             RETURNING id",
        )
        .bind(run.id)
        .bind(&run.job_name)
        .bind(&run.run_key)
        .bind(&run.job_type)
        .bind(&run.payload)
        .bind(run.scheduled_at)
        .bind(&run.claimed_by)
        .bind(&run.trace_id)
        .bind(&run.traceparent)
        .bind(options_json(&run.options)?)
        .bind(run.next_dispatch_at)
        .fetch_optional(executor)
        .await?;
        Ok(inserted.is_some())
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
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.mark_dispatched(id).await,
        };
        let done = sqlx::query(
            "UPDATE job_runs SET status = 'dispatched', dispatched_at = now(), \
                 next_dispatch_at = NULL, updated_at = now() \
             WHERE id = $1 AND status = 'claimed'",
        )
        .bind(id)
        .execute(pool)
        .await?;
        // dispatched_at is also worth having when the worker was faster.
        if done.rows_affected() == 0 {
            sqlx::query(
                "UPDATE job_runs SET dispatched_at = now() WHERE id = $1 AND dispatched_at IS NULL",
            )
            .bind(id)
            .execute(pool)
            .await?;
        }
        Ok(done.rows_affected() == 1)
    }

    /// Marks a run no worker is executing `dead` with `reason`. Returns
    /// whether the row moved (a finished or running run keeps its state).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn mark_dead(&self, id: Uuid, reason: &str) -> Result<bool, LedgerError> {
        let reason = &*crate::storable(reason);
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.mark_dead(id, reason).await,
        };
        let done = sqlx::query(&format!(
            "UPDATE job_runs SET status = 'dead', last_error = $2, finished_at = now(), \
                 updated_at = now() \
             WHERE id = $1 AND status IN {WAITING}"
        ))
        .bind(id)
        .bind(reason)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
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
        // The common path is one statement: the row exists and is startable.
        if let Some(start) = self.try_begin(message, worker, lease).await? {
            return Ok(start);
        }
        if let Some(state) = self
            .state_by_key(&message.job_name, &message.run_key)
            .await?
        {
            return self.not_startable(message, worker, lease, state).await;
        }
        // A message published by hand: record it as dispatched (the broker
        // had it) and start it like any other.
        self.insert_from_message(message, RunStatus::Dispatched, None, OnRunConflict::Nothing)
            .await?;
        if let Some(start) = self.try_begin(message, worker, lease).await? {
            return Ok(start);
        }
        let state = self
            .state_by_key(&message.job_name, &message.run_key)
            .await?
            .ok_or_else(|| LedgerError::Corrupt(format!("run {} vanished", message.run_key)))?;
        self.not_startable(message, worker, lease, state).await
    }

    async fn not_startable(
        &self,
        message: &JobMessage,
        worker: &str,
        lease: std::time::Duration,
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
        // The row became startable between the two statements (another
        // transition raced us, or the lease just expired); one more try
        // settles it.
        match self.try_begin(message, worker, lease).await? {
            Some(start) => Ok(start),
            None => Ok(AttemptStart::Busy {
                id: state.id,
                until: state.lease_until.unwrap_or(state.now),
            }),
        }
    }

    async fn try_begin(
        &self,
        message: &JobMessage,
        worker: &str,
        lease: std::time::Duration,
    ) -> Result<Option<AttemptStart>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => {
                let started = lite
                    .try_begin(&message.job_name, &message.run_key, worker, lease)
                    .await?;
                return Ok(started.map(|(id, attempt)| AttemptStart::Started { id, attempt }));
            }
        };
        let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
        let row = sqlx::query(concat!(
            "UPDATE job_runs SET status = 'running', attempts = attempts + 1, \
                 started_at = COALESCE(started_at, now()), worker = $3, next_dispatch_at = NULL, \
                 lease_until = now() + make_interval(secs => $4::double precision / 1000), \
                 updated_at = now() \
             WHERE job_name = $1 AND run_key = $2 \
               AND (status IN ",
            waiting_statuses!(),
            " \
                    OR (status = 'running' AND (lease_until IS NULL OR lease_until < now()))) \
             RETURNING id, attempts"
        ))
        .bind(&message.job_name)
        .bind(&message.run_key)
        .bind(worker)
        .bind(lease_ms)
        .fetch_optional(pool)
        .await?;
        row.map(|r| {
            Ok(AttemptStart::Started {
                id: r.try_get("id")?,
                attempt: r.try_get("attempts")?,
            })
        })
        .transpose()
    }

    async fn state_by_key(
        &self,
        job_name: &str,
        run_key: &str,
    ) -> Result<Option<RunState>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => {
                let state = lite.state_by_key(job_name, run_key).await?;
                return state
                    .map(|(id, status, lease_until, now)| {
                        Ok(RunState {
                            id,
                            status: status.parse().map_err(LedgerError::Corrupt)?,
                            lease_until,
                            now,
                        })
                    })
                    .transpose();
            }
        };
        let row = sqlx::query(
            "SELECT id, status, lease_until, now() AS now FROM job_runs \
             WHERE job_name = $1 AND run_key = $2",
        )
        .bind(job_name)
        .bind(run_key)
        .fetch_optional(pool)
        .await?;
        row.map(|r| {
            let status: String = r.try_get("status")?;
            Ok(RunState {
                id: r.try_get("id")?,
                status: status.parse().map_err(LedgerError::Corrupt)?,
                lease_until: r.try_get("lease_until")?,
                now: r.try_get("now")?,
            })
        })
        .transpose()
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
            .insert_from_message(
                message,
                RunStatus::Dead,
                Some(&reason),
                OnRunConflict::MarkDead,
            )
            .await?;
        Ok(changed == 1)
    }

    /// Inserts the row of a run known only from its message, with
    /// `status`, and `on_conflict` (an `ON CONFLICT (job_name, run_key)`
    /// action) deciding what happens when the run key is already there.
    /// Returns the number of rows inserted or updated.
    async fn insert_from_message(
        &self,
        message: &JobMessage,
        status: RunStatus,
        last_error: Option<&str>,
        on_conflict: OnRunConflict,
    ) -> Result<u64, LedgerError> {
        let done = match self.pg() {
            Ok(pool) => {
                self.insert_from_message_pg(pool, message, status, last_error, on_conflict)
                    .await
            }
            Err(lite) => {
                lite.insert_from_message(message, status, last_error, on_conflict)
                    .await
            }
        };
        match done {
            Ok(rows) => Ok(rows),
            // The run key is handled by ON CONFLICT; a unique violation here
            // can only be the primary key: the id belongs to another run.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(LedgerError::IdConflict {
                    id: message.message_id,
                    run_key: message.run_key.clone(),
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn insert_from_message_pg(
        &self,
        pool: &sqlx::PgPool,
        message: &JobMessage,
        status: RunStatus,
        last_error: Option<&str>,
        on_conflict: OnRunConflict,
    ) -> Result<u64, sqlx::Error> {
        let on_conflict = match on_conflict {
            OnRunConflict::Nothing => "DO NOTHING".to_owned(),
            OnRunConflict::MarkDead => format!(
                "DO UPDATE SET status = 'dead', last_error = EXCLUDED.last_error, \
                 finished_at = now(), updated_at = now() WHERE job_runs.status IN {WAITING}"
            ),
        };
        let options =
            options_json(&message.options).map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        let trace = message.trace.as_ref();
        let done = sqlx::query(&format!(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
                 dispatched_at, last_error, finished_at, trace_id, traceparent, options) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, CASE WHEN $10 THEN now() END, $11, $12, $13) \
             ON CONFLICT (job_name, run_key) {on_conflict}"
        ))
        .bind(message.message_id)
        .bind(&message.job_name)
        .bind(&message.run_key)
        .bind(&message.job_type)
        .bind(status.as_str())
        .bind(&message.payload)
        .bind(message.scheduled_at)
        .bind(message.published_at)
        .bind(last_error)
        .bind(status.is_terminal())
        .bind(trace.and_then(|t| t.trace_id()))
        .bind(trace.map(|t| t.traceparent.as_str()))
        .bind(options)
        .execute(pool)
        .await?;
        Ok(done.rows_affected())
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
        let entry = &entry.clone().into_storable();
        let last_error = last_error.map(crate::storable);
        let last_error = last_error.as_deref();
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => {
                return lite
                    .end_attempt(id, status, entry, last_error, redispatch_at)
                    .await
            }
        };
        let entry_json = serde_json::to_value(entry)
            .map_err(|e| LedgerError::Corrupt(format!("attempt entry: {e}")))?;
        let done = sqlx::query(
            "UPDATE job_runs SET status = $2, last_error = $3, \
                 finished_at = CASE WHEN $4 THEN now() ELSE NULL END, \
                 attempt_log = attempt_log || jsonb_build_array($5::jsonb), \
                 next_dispatch_at = $6, lease_until = NULL, updated_at = now() \
             WHERE id = $1 AND status = 'running' AND attempts = $7",
        )
        .bind(id)
        .bind(status.as_str())
        .bind(last_error)
        .bind(status.is_terminal())
        .bind(entry_json)
        .bind(redispatch_at)
        .bind(entry.attempt)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
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
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.hand_back(id, attempt, reason).await,
        };
        let done = sqlx::query(
            "UPDATE job_runs SET status = 'retrying', last_error = $2, lease_until = NULL, \
                 updated_at = now() \
             WHERE id = $1 AND status = 'running' AND attempts = $3",
        )
        .bind(id)
        .bind(reason)
        .bind(attempt)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// One run by id.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn run(&self, id: Uuid) -> Result<Option<RunRecord>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.run(id).await,
        };
        Ok(
            sqlx::query_as(&format!("SELECT {RUN_COLUMNS} FROM job_runs WHERE id = $1"))
                .bind(id)
                .fetch_optional(pool)
                .await?,
        )
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
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.run_by_key(job_name, run_key).await,
        };
        Ok(sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE job_name = $1 AND run_key = $2"
        ))
        .bind(job_name)
        .bind(run_key)
        .fetch_optional(pool)
        .await?)
    }

    /// The runs of `job_name`, oldest fire first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn runs_of(&self, job_name: &str, limit: i64) -> Result<Vec<RunRecord>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.runs_of(job_name, limit).await,
        };
        Ok(sqlx::query_as(&format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE job_name = $1 \
             ORDER BY scheduled_at ASC LIMIT $2"
        ))
        .bind(job_name)
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }
}

/// What inserting a run known only from its message does when its run key
/// is already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnRunConflict {
    /// Leave the existing row alone.
    Nothing,
    /// Make a waiting run `dead` (a finished or running run keeps its state).
    MarkDead,
}

pub(crate) fn options_json(options: &JobOptions) -> Result<serde_json::Value, LedgerError> {
    serde_json::to_value(options).map_err(|e| LedgerError::Corrupt(format!("job options: {e}")))
}
