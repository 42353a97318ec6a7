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
}

impl Ledger {
    /// Inserts or replaces the definition of `row.name`, keeping its paused
    /// state and creation time.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached or the row
    /// breaks a table constraint.
    pub async fn upsert_schedule(&self, row: &ScheduleRow) -> Result<(), LedgerError> {
        sqlx::query(
            "INSERT INTO schedules (name, cron, every_ms, timezone, job_type, payload, paused, options) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (name) DO UPDATE SET cron = EXCLUDED.cron, every_ms = EXCLUDED.every_ms, \
                 timezone = EXCLUDED.timezone, job_type = EXCLUDED.job_type, \
                 payload = EXCLUDED.payload, options = EXCLUDED.options, updated_at = now()",
        )
        .bind(&row.name)
        .bind(&row.cron)
        .bind(row.every_ms)
        .bind(&row.timezone)
        .bind(&row.job_type)
        .bind(&row.payload)
        .bind(row.paused)
        .bind(&row.options)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// All stored schedules, by name.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRow>, LedgerError> {
        Ok(sqlx::query_as(
            "SELECT name, cron, every_ms, timezone, job_type, payload, paused, options \
             FROM schedules ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// The database's current time, for clock comparisons.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn now(&self) -> Result<DateTime<Utc>, LedgerError> {
        Ok(sqlx::query_scalar("SELECT now()")
            .fetch_one(&self.pool)
            .await?)
    }
}
