//! The `schedules` table on Postgres; every change is announced to the
//! replicas by the table's `NOTIFY` trigger.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;

use super::PgStore;
use crate::schedules::ScheduleRow;
use crate::store::ScheduleStore;
use crate::LedgerError;

#[async_trait]
impl ScheduleStore for PgStore {
    async fn upsert_schedule(&self, row: &ScheduleRow) -> Result<(), LedgerError> {
        let pool = &self.pool;
        // Rows that did not change are left alone, so replicas starting
        // together do not wake each other with notifications.
        write_schedule(
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

    async fn insert_schedule(&self, row: &ScheduleRow) -> Result<bool, LedgerError> {
        let pool = &self.pool;
        Ok(write_schedule(pool, row, "DO NOTHING").await? == 1)
    }

    async fn replace_schedule(
        &self,
        row: &ScheduleRow,
        paused: Option<bool>,
    ) -> Result<bool, LedgerError> {
        let pool = &self.pool;
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

    async fn delete_schedule(&self, name: &str) -> Result<bool, LedgerError> {
        let pool = &self.pool;
        let done = sqlx::query("DELETE FROM schedules WHERE name = $1")
            .bind(name)
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRow>, LedgerError> {
        let pool = &self.pool;
        Ok(sqlx::query_as(
            "SELECT name, cron, every_ms, timezone, job_type, payload, paused, options, spec, updated_at \
             FROM schedules ORDER BY name",
        )
        .fetch_all(pool)
        .await?)
    }

    async fn schedules_page(
        &self,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ScheduleRow>, LedgerError> {
        let pool = &self.pool;
        Ok(sqlx::query_as(
            "SELECT name, cron, every_ms, timezone, job_type, payload, paused, options, spec, updated_at \
             FROM schedules WHERE ($1::text IS NULL OR name > $1) ORDER BY name LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }

    async fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>, LedgerError> {
        let pool = &self.pool;
        Ok(sqlx::query_as(
            "SELECT name, cron, every_ms, timezone, job_type, payload, paused, options, spec, updated_at \
             FROM schedules WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(pool)
        .await?)
    }

    async fn schedule_versions(&self) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        let pool = &self.pool;
        let rows = sqlx::query("SELECT name, updated_at FROM schedules")
            .fetch_all(pool)
            .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get("name")?, r.try_get("updated_at")?)))
            .collect()
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<bool, LedgerError> {
        let pool = &self.pool;
        let done = sqlx::query("UPDATE schedules SET paused = $2 WHERE name = $1")
            .bind(name)
            .bind(paused)
            .execute(pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_schedules_except(&self, keep: &[String]) -> Result<Vec<String>, LedgerError> {
        let pool = &self.pool;
        Ok(
            sqlx::query_scalar("DELETE FROM schedules WHERE NOT (name = ANY($1)) RETURNING name")
                .bind(keep)
                .fetch_all(pool)
                .await?,
        )
    }
}

/// Inserts `row`, with `on_conflict` (an `ON CONFLICT (name)` action)
/// deciding what happens to an existing schedule; rows written.
async fn write_schedule(
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
