//! How a run becomes a row and is found again, written once for both
//! backends: the run inserted from a message alone ([`FromMessage`]), the
//! ways a run is looked up ([`RunLookup`]) and a run's options as stored
//! JSON. The SQL around them is each backend's (`postgres/runs.rs`,
//! `sqlite/runs.rs`); what they bind and in which order is decided here, so
//! the two cannot drift apart.

use chrono::{DateTime, Utc};
use sqlx::query::{Query, QueryAs};
use uuid::Uuid;

use belfry_protocol::{JobMessage, JobOptions};

use crate::runs::{RunRecord, RUN_COLUMNS};
use crate::{LedgerError, RunStatus};

/// A run known only from its message (published by hand, or refused before
/// any row was written), as [`Ledger`] records it: the row both backends
/// insert, and what happens when its run key is already there (their
/// `ON CONFLICT (job_name, run_key)` action).
#[derive(Debug, Clone, Copy)]
pub(crate) enum FromMessage<'a> {
    /// `dispatched` (the broker had it); an existing row is left alone.
    Dispatched(&'a JobMessage),
    /// `dead` with this reason (already storable); an existing waiting run
    /// becomes `dead` too, a finished or running one keeps its state.
    Dead(&'a JobMessage, &'a str),
}

impl<'a> FromMessage<'a> {
    /// The message.
    pub(crate) fn message(self) -> &'a JobMessage {
        match self {
            Self::Dispatched(message) | Self::Dead(message, _) => message,
        }
    }

    /// The status the row is inserted with.
    pub(crate) fn status(self) -> RunStatus {
        match self {
            Self::Dispatched(_) => RunStatus::Dispatched,
            Self::Dead(..) => RunStatus::Dead,
        }
    }

    /// Binds the row to `query`, the first 13 parameters of both backends'
    /// inserts:
    /// id, job_name, run_key, job_type, status, payload, scheduled_at,
    /// dispatched_at (the instant it was published), last_error, whether the
    /// status is terminal (`finished_at` is set), trace_id, traceparent,
    /// options. `instant` turns an instant into the value its database
    /// stores (as in [`crate::run_query::push_run_filter`]).
    ///
    /// # Errors
    ///
    /// [`sqlx::Error::Protocol`] when the job options cannot be encoded.
    pub(crate) fn bind<DB, T>(
        self,
        query: Query<'a, DB, DB::Arguments<'a>>,
        instant: impl Fn(DateTime<Utc>) -> T,
    ) -> Result<Query<'a, DB, DB::Arguments<'a>>, sqlx::Error>
    where
        DB: sqlx::Database,
        Uuid: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        Option<&'a str>: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        serde_json::Value: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        bool: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        T: sqlx::Encode<'a, DB> + sqlx::Type<DB> + 'a,
    {
        let message = self.message();
        let status = self.status();
        let last_error = match self {
            Self::Dispatched(_) => None,
            Self::Dead(_, reason) => Some(reason),
        };
        let options =
            options_json(&message.options).map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
        let trace = message.trace.as_ref();
        Ok(query
            .bind(message.message_id)
            .bind(message.job_name.as_str())
            .bind(message.run_key.as_str())
            .bind(message.job_type.as_str())
            .bind(status.as_str())
            .bind(&message.payload)
            .bind(instant(message.scheduled_at))
            .bind(instant(message.published_at))
            .bind(last_error)
            .bind(status.is_terminal())
            .bind(trace.and_then(|t| t.trace_id()))
            .bind(trace.map(|t| t.traceparent.as_str()))
            .bind(options))
    }
}

/// Which runs [`crate::store::RunStore::runs`] reads: the lookups of
/// [`Ledger::run`], [`Ledger::run_by_key`] and [`Ledger::runs_of`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum RunLookup<'a> {
    /// The run with this id.
    Id(Uuid),
    /// The run `(job_name, run_key)`.
    Key(&'a str, &'a str),
    /// The runs of a job, oldest fire first, at most this many.
    Job(&'a str, i64),
}

impl<'a> RunLookup<'a> {
    /// The `SELECT` of the lookup, the same on both backends (SQLite reads
    /// the `$n` placeholders as Postgres does).
    pub(crate) fn sql(self) -> String {
        let rows = match self {
            Self::Id(_) => "id = $1",
            Self::Key(..) => "job_name = $1 AND run_key = $2",
            Self::Job(..) => "job_name = $1 ORDER BY scheduled_at ASC LIMIT $2",
        };
        format!("SELECT {RUN_COLUMNS} FROM job_runs WHERE {rows}")
    }

    /// `sql` (this lookup's [`RunLookup::sql`]) with the lookup's values
    /// bound, on either backend.
    pub(crate) fn query<DB>(self, sql: &'a str) -> QueryAs<'a, DB, RunRecord, DB::Arguments<'a>>
    where
        DB: sqlx::Database,
        RunRecord: for<'r> sqlx::FromRow<'r, DB::Row>,
        Uuid: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    {
        let query = sqlx::query_as(sql);
        match self {
            Self::Id(id) => query.bind(id),
            Self::Key(job_name, run_key) => query.bind(job_name).bind(run_key),
            Self::Job(job_name, limit) => query.bind(job_name).bind(limit),
        }
    }
}

/// The job options as both backends store them (JSON).
///
/// # Errors
///
/// [`LedgerError::Corrupt`] when the options cannot be encoded.
pub(crate) fn options_json(options: &JobOptions) -> Result<serde_json::Value, LedgerError> {
    serde_json::to_value(options).map_err(|e| LedgerError::Corrupt(format!("job options: {e}")))
}

/// The error of inserting `run`'s row: the run key is handled by `ON
/// CONFLICT`, so a unique violation can only be the primary key, which
/// means the message's id belongs to another run.
pub(crate) fn from_message_error(run: &FromMessage<'_>, e: sqlx::Error) -> LedgerError {
    match e {
        sqlx::Error::Database(d) if d.is_unique_violation() => id_conflict(run),
        e => e.into(),
    }
}

/// [`LedgerError::IdConflict`] for `run`'s message.
pub(crate) fn id_conflict(run: &FromMessage<'_>) -> LedgerError {
    LedgerError::IdConflict {
        id: run.message().message_id,
        run_key: run.message().run_key.clone(),
    }
}
