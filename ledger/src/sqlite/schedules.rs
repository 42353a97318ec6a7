//! `schedules` on the embedded ledger: the statements of
//! [`crate::schedules`] in SQLite's dialect. Every write sets `updated_at`
//! itself (there is no trigger) and announces the schedule to this
//! process's replicas, as the Postgres trigger's `NOTIFY` does.

use chrono::{DateTime, Utc};

use async_trait::async_trait;

use super::{now, SqliteLedger, SqliteQuery};
use crate::schedules::{IfStored, ScheduleLookup, ScheduleRow};
use crate::store::ScheduleStore;
use crate::LedgerError;

impl SqliteLedger {
    /// [`SqliteLedger::moved`], announcing the schedule `name` when it moved.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the statement fails (nothing is
    /// announced).
    async fn moved_announced(
        &self,
        name: &str,
        statement: SqliteQuery<'_>,
    ) -> Result<bool, LedgerError> {
        let moved = self.moved(statement).await?;
        if moved {
            self.announce(name);
        }
        Ok(moved)
    }
}

#[async_trait]
impl ScheduleStore for SqliteLedger {
    async fn write_schedule(
        &self,
        row: &ScheduleRow,
        if_stored: IfStored,
    ) -> Result<u64, LedgerError> {
        let on_conflict = match if_stored {
            // Rows that did not change are left alone (no announcement
            // either).
            IfStored::Update => {
                "DO UPDATE SET cron = excluded.cron, every_ms = excluded.every_ms, \
                     timezone = excluded.timezone, job_type = excluded.job_type, \
                     payload = excluded.payload, options = excluded.options, spec = excluded.spec, \
                     updated_at = excluded.updated_at \
                 WHERE (schedules.cron, schedules.every_ms, schedules.timezone, schedules.job_type, \
                        schedules.payload, schedules.options, schedules.spec) \
                       IS NOT (excluded.cron, excluded.every_ms, excluded.timezone, \
                        excluded.job_type, excluded.payload, excluded.options, excluded.spec)"
            }
            IfStored::Keep => "DO NOTHING",
        };
        let insert = format!(
            "INSERT INTO schedules (name, cron, every_ms, timezone, job_type, payload, options, \
                 spec, paused, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10) \
             ON CONFLICT (name) {on_conflict}"
        );
        // `?1` to `?8`: the definition; then the paused flag and now.
        let done = row
            .bind_definition(sqlx::query(&insert))
            .bind(row.paused)
            .bind(now())
            .execute(&self.writer)
            .await?;
        if done.rows_affected() > 0 {
            self.announce(&row.name);
        }
        Ok(done.rows_affected())
    }

    async fn replace_schedule(
        &self,
        row: &ScheduleRow,
        paused: Option<bool>,
    ) -> Result<bool, LedgerError> {
        let replace = sqlx::query(
            "UPDATE schedules SET cron = ?2, every_ms = ?3, timezone = ?4, job_type = ?5, \
                 payload = ?6, options = ?7, spec = ?8, paused = COALESCE(?9, paused), \
                 updated_at = ?10, \
                 resumed_at = CASE WHEN paused AND ?9 = 0 THEN ?10 ELSE resumed_at END, \
                 pause_note = CASE WHEN COALESCE(?9, paused) THEN pause_note END \
             WHERE name = ?1",
        );
        let replace = row.bind_definition(replace).bind(paused).bind(now());
        self.moved_announced(&row.name, replace).await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, LedgerError> {
        let delete = sqlx::query("DELETE FROM schedules WHERE name = ?1").bind(name);
        self.moved_announced(name, delete).await
    }

    async fn schedules(&self, lookup: ScheduleLookup<'_>) -> Result<Vec<ScheduleRow>, LedgerError> {
        let sql = lookup.sql();
        Ok(lookup.query(&sql).fetch_all(&self.pool).await?)
    }

    async fn schedules_in_shards(
        &self,
        shards: u32,
        wanted: &[u32],
    ) -> Result<Vec<ScheduleRow>, LedgerError> {
        // No hash in SQL here: the embedded ledger never shards (one
        // process), so this is only ever a convenience.
        let mut rows = self.schedules(ScheduleLookup::All).await?;
        rows.retain(|row| wanted.contains(&belfry_protocol::shard_of(&row.name, shards)));
        Ok(rows)
    }

    async fn schedule_versions(&self) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        Ok(sqlx::query_as("SELECT name, updated_at FROM schedules")
            .fetch_all(&self.pool)
            .await?)
    }

    async fn schedule_versions_in_shards(
        &self,
        shards: u32,
        wanted: &[u32],
    ) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        // As `schedules_in_shards`: never sharded, a convenience only.
        let mut versions = self.schedule_versions().await?;
        versions.retain(|(name, _)| wanted.contains(&belfry_protocol::shard_of(name, shards)));
        Ok(versions)
    }

    async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        note: Option<&str>,
    ) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE schedules SET paused = ?2, updated_at = ?3, \
                 pause_note = CASE WHEN ?2 THEN ?4 END, \
                 resumed_at = CASE WHEN ?2 THEN resumed_at ELSE ?3 END \
             WHERE name = ?1",
        );
        self.moved_announced(name, update.bind(name).bind(paused).bind(now()).bind(note))
            .await
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
