//! `schedules`: the stored schedule definitions.
//!
//! The scheduler syncs its schedule file into this table at start (upsert by
//! name), so the definitions an operator sees in the database are the ones
//! the replicas run.

use chrono::{DateTime, Utc};

use crate::{Ledger, LedgerError};

/// A row of `schedules`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ScheduleRow {
    /// Unique schedule name (= job name of its runs).
    pub name: String,
    /// Cron expression, for cron schedules.
    pub cron: Option<String>,
    /// Period in milliseconds, for interval schedules.
    pub every_ms: Option<i64>,
    /// IANA time zone the cron expression is read in.
    pub timezone: String,
    /// Job type of its runs.
    pub job_type: String,
    /// Payload of its runs.
    pub payload: serde_json::Value,
    /// Whether firing is paused.
    pub paused: bool,
    /// Retry/timeout overrides of its runs (JSON `JobOptions`).
    pub options: serde_json::Value,
    /// The whole definition (JSON `ScheduleSpec`), which replicas run.
    pub spec: Option<serde_json::Value>,
    /// When the row last changed.
    #[sqlx(default)]
    pub updated_at: Option<DateTime<Utc>>,
}

/// The columns of [`ScheduleRow`].
pub(crate) const SCHEDULE_COLUMNS: &str =
    "name, cron, every_ms, timezone, job_type, payload, paused, options, spec, updated_at";

impl Ledger {
    /// Inserts or replaces the definition of `row.name`, keeping its paused
    /// state and creation time.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or the row
    /// breaks a table constraint.
    pub async fn upsert_schedule(&self, row: &ScheduleRow) -> Result<(), LedgerError> {
        self.store.upsert_schedule(row).await
    }

    /// Stores a new schedule (with `row.paused`). Returns `false`, and
    /// changes nothing, when a schedule of that name exists.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or the row
    /// breaks a table constraint.
    pub async fn insert_schedule(&self, row: &ScheduleRow) -> Result<bool, LedgerError> {
        self.store.insert_schedule(row).await
    }

    /// Replaces the definition of the existing schedule `row.name`; its
    /// paused state becomes `paused` when given and is kept otherwise.
    /// Returns `false`, and changes nothing, when there is no such schedule.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or the row
    /// breaks a table constraint.
    pub async fn replace_schedule(
        &self,
        row: &ScheduleRow,
        paused: Option<bool>,
    ) -> Result<bool, LedgerError> {
        self.store.replace_schedule(row, paused).await
    }

    /// Deletes one schedule; its runs stay in `job_runs`. Returns whether
    /// it existed.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool, LedgerError> {
        self.store.delete_schedule(name).await
    }

    /// All stored schedules, by name.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>, LedgerError> {
        self.store.schedules().await
    }

    /// Up to `limit` stored schedules by name, after `after` (keyset
    /// pagination on the primary key).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedules_page(
        &self,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ScheduleRow>, LedgerError> {
        self.store.schedules_page(after, limit).await
    }

    /// One stored schedule.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>, LedgerError> {
        self.store.schedule(name).await
    }

    /// The name and last change of every stored schedule: what a replica
    /// compares against its timer in a periodic resync.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedule_versions(&self) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        self.store.schedule_versions().await
    }

    /// Sets a schedule's paused flag. Returns whether the schedule exists.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn set_paused(&self, name: &str, paused: bool) -> Result<bool, LedgerError> {
        self.store.set_paused(name, paused).await
    }

    /// Deletes the stored schedules whose names are not in `keep`; returns
    /// the deleted names. Their runs stay in `job_runs`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn delete_schedules_except(
        &self,
        keep: &[String],
    ) -> Result<Vec<String>, LedgerError> {
        self.store.delete_schedules_except(keep).await
    }
}
