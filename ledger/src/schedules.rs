//! `schedules`: the stored schedule definitions.
//!
//! The scheduler syncs its schedule file into this table at start (upsert by
//! name), so the definitions an operator sees in the database are the ones
//! the replicas run.

use chrono::{DateTime, Utc};
use sqlx::Row;

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
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.upsert_schedule(row).await,
        };
        // Rows that did not change are left alone, so replicas starting
        // together do not wake each other with notifications.
        self.write_schedule(
            pool,
            row,
            "DO UPDATE SET cron = EXCLUDED.cron, every_ms = EXCLUDED.every_ms, \
                 timezone = EXCLUDED.timezone, job_type = EXCLUDED.job_type, \
                 payload = EXCLUDED.payload, options = EXCLUDED.options, spec = EXCLUDED.spec \
             WHERE (schedules.cron, schedules.every_ms, schedules.timezone, schedules.job_type, \
                    schedules.payload, schedules.options, schedules.spec) \
                   IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_ms, EXCLUDED.timezone, \
                    EXCLUDED.job_type, EXCLUDED.payload, EXCLUDED.options, EXCLUDED.spec)",
        )
        .await?;
        Ok(())
    }

    /// Stores a new schedule (with `row.paused`). Returns `false`, and
    /// changes nothing, when a schedule of that name exists.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or the row
    /// breaks a table constraint.
    pub async fn insert_schedule(&self, row: &ScheduleRow) -> Result<bool, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.insert_schedule(row).await,
        };
        Ok(self.write_schedule(pool, row, "DO NOTHING").await? == 1)
    }

    /// Inserts `row`, with `on_conflict` (an `ON CONFLICT (name)` action)
    /// deciding what happens to an existing schedule; rows written.
    async fn write_schedule(
        &self,
        pool: &sqlx::PgPool,
        row: &ScheduleRow,
        on_conflict: &str,
    ) -> Result<u64, LedgerError> {
        let done = sqlx::query(&format!(
            "INSERT INTO schedules (name, cron, every_ms, timezone, job_type, payload, paused, options, spec) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (name) {on_conflict}"
        ))
        .bind(&row.name)
        .bind(&row.cron)
        .bind(row.every_ms)
        .bind(&row.timezone)
        .bind(&row.job_type)
        .bind(&row.payload)
        .bind(row.paused)
        .bind(&row.options)
        .bind(&row.spec)
        .execute(pool)
        .await?;
        Ok(done.rows_affected())
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
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.replace_schedule(row, paused).await,
        };
        let done = sqlx::query(
            "UPDATE schedules SET cron = $2, every_ms = $3, timezone = $4, job_type = $5, \
                 payload = $6, options = $7, spec = $8, paused = COALESCE($9, paused) \
             WHERE name = $1",
        )
        .bind(&row.name)
        .bind(&row.cron)
        .bind(row.every_ms)
        .bind(&row.timezone)
        .bind(&row.job_type)
        .bind(&row.payload)
        .bind(&row.options)
        .bind(&row.spec)
        .bind(paused)
        .execute(pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes one schedule; its runs stay in `job_runs`. Returns whether
    /// it existed.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn delete_schedule(&self, name: &str) -> Result<bool, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.delete_schedule(name).await,
        };
        let done = sqlx::query("DELETE FROM schedules WHERE name = $1")
            .bind(name)
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// All stored schedules, by name.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.schedules().await,
        };
        Ok(sqlx::query_as(
            "SELECT name, cron, every_ms, timezone, job_type, payload, paused, options, spec, updated_at \
             FROM schedules ORDER BY name",
        )
        .fetch_all(pool)
        .await?)
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
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.schedules_page(after, limit).await,
        };
        Ok(sqlx::query_as(
            "SELECT name, cron, every_ms, timezone, job_type, payload, paused, options, spec, updated_at \
             FROM schedules WHERE ($1::text IS NULL OR name > $1) ORDER BY name LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }

    /// One stored schedule.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.schedule(name).await,
        };
        Ok(sqlx::query_as(
            "SELECT name, cron, every_ms, timezone, job_type, payload, paused, options, spec, updated_at \
             FROM schedules WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(pool)
        .await?)
    }

    /// The name and last change of every stored schedule: what a replica
    /// compares against its timer in a periodic resync.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedule_versions(&self) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.schedule_versions().await,
        };
        let rows = sqlx::query("SELECT name, updated_at FROM schedules")
            .fetch_all(pool)
            .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get("name")?, r.try_get("updated_at")?)))
            .collect()
    }

    /// Sets a schedule's paused flag. Returns whether the schedule exists.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn set_paused(&self, name: &str, paused: bool) -> Result<bool, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.set_paused(name, paused).await,
        };
        let done = sqlx::query("UPDATE schedules SET paused = $2 WHERE name = $1")
            .bind(name)
            .bind(paused)
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
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
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.delete_schedules_except(keep).await,
        };
        Ok(
            sqlx::query_scalar("DELETE FROM schedules WHERE NOT (name = ANY($1)) RETURNING name")
                .bind(keep)
                .fetch_all(pool)
                .await?,
        )
    }
}
