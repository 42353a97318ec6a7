//! `schedules` on the embedded ledger: the statements of
//! [`crate::schedules`] in SQLite's dialect. Every write sets `updated_at`
//! itself (there is no trigger) and announces the schedule to this
//! process's replicas, as the Postgres trigger's `NOTIFY` does.

use chrono::{DateTime, Utc};
use sqlx::Row;

use async_trait::async_trait;

use super::{now, SqliteLedger};
use crate::schedules::{ScheduleRow, SCHEDULE_COLUMNS};
use crate::store::ScheduleStore;
use crate::LedgerError;

impl SqliteLedger {
    async fn write_schedule(
        &self,
        row: &ScheduleRow,
        on_conflict: &str,
    ) -> Result<u64, LedgerError> {
        let done = sqlx::query(&format!(
            "INSERT INTO schedules (name, cron, every_ms, timezone, job_type, payload, paused, \
                 options, spec, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10) \
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
        .bind(now())
        .execute(&self.writer)
        .await?;
        if done.rows_affected() > 0 {
            self.announce(&row.name);
        }
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl ScheduleStore for SqliteLedger {
    async fn upsert_schedule(&self, row: &ScheduleRow) -> Result<(), LedgerError> {
        // Rows that did not change are left alone (no announcement either).
        self.write_schedule(
            row,
            "DO UPDATE SET cron = excluded.cron, every_ms = excluded.every_ms, \
                 timezone = excluded.timezone, job_type = excluded.job_type, \
                 payload = excluded.payload, options = excluded.options, spec = excluded.spec, \
                 updated_at = excluded.updated_at \
             WHERE (schedules.cron, schedules.every_ms, schedules.timezone, schedules.job_type, \
                    schedules.payload, schedules.options, schedules.spec) \
                   IS NOT (excluded.cron, excluded.every_ms, excluded.timezone, \
                    excluded.job_type, excluded.payload, excluded.options, excluded.spec)",
        )
        .await?;
        Ok(())
    }

    async fn insert_schedule(&self, row: &ScheduleRow) -> Result<bool, LedgerError> {
        Ok(self.write_schedule(row, "DO NOTHING").await? == 1)
    }

    async fn replace_schedule(
        &self,
        row: &ScheduleRow,
        paused: Option<bool>,
    ) -> Result<bool, LedgerError> {
        let done = sqlx::query(
            "UPDATE schedules SET cron = ?2, every_ms = ?3, timezone = ?4, job_type = ?5, \
                 payload = ?6, options = ?7, spec = ?8, paused = COALESCE(?9, paused), \
                 updated_at = ?10 \
             WHERE name = ?1",
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
        .bind(now())
        .execute(&self.writer)
        .await?;
        if done.rows_affected() == 1 {
            self.announce(&row.name);
        }
        Ok(done.rows_affected() == 1)
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, LedgerError> {
        let done = sqlx::query("DELETE FROM schedules WHERE name = ?1")
            .bind(name)
            .execute(&self.writer)
            .await?;
        if done.rows_affected() == 1 {
            self.announce(name);
        }
        Ok(done.rows_affected() == 1)
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRow>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY name"
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn schedules_page(
        &self,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ScheduleRow>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE (?1 IS NULL OR name > ?1) \
             ORDER BY name LIMIT ?2"
        ))
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn schedule(&self, name: &str) -> Result<Option<ScheduleRow>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = ?1"
        ))
        .bind(name)
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn schedule_versions(&self) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        let rows = sqlx::query("SELECT name, updated_at FROM schedules")
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get("name")?, r.try_get("updated_at")?)))
            .collect()
    }

    async fn set_paused(&self, name: &str, paused: bool) -> Result<bool, LedgerError> {
        let done = sqlx::query("UPDATE schedules SET paused = ?2, updated_at = ?3 WHERE name = ?1")
            .bind(name)
            .bind(paused)
            .bind(now())
            .execute(&self.writer)
            .await?;
        if done.rows_affected() == 1 {
            self.announce(name);
        }
        Ok(done.rows_affected() == 1)
    }

    async fn delete_schedules_except(&self, keep: &[String]) -> Result<Vec<String>, LedgerError> {
        let keep_json = serde_json::to_string(keep)
            .map_err(|e| LedgerError::Corrupt(format!("schedule names: {e}")))?;
        let gone: Vec<String> = sqlx::query_scalar(
            "DELETE FROM schedules WHERE name NOT IN (SELECT value FROM json_each(?1)) \
             RETURNING name",
        )
        .bind(keep_json)
        .fetch_all(&self.writer)
        .await?;
        for name in &gone {
            self.announce(name);
        }
        Ok(gone)
    }
}
