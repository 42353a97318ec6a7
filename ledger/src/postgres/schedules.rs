//! The `schedules` table on Postgres; every change is announced to the
//! replicas by the table's `NOTIFY` trigger.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::PgStore;
use crate::schedules::{IfStored, ScheduleLookup, ScheduleRow, SCHEDULE_COLUMNS};
use crate::store::ScheduleStore;
use crate::LedgerError;

#[async_trait]
impl ScheduleStore for PgStore {
    async fn write_schedule(
        &self,
        row: &ScheduleRow,
        if_stored: IfStored,
    ) -> Result<u64, LedgerError> {
        let on_conflict = match if_stored {
            // Rows that did not change are left alone, so replicas starting
            // together do not wake each other with notifications.
            IfStored::Update => {
                "DO UPDATE SET cron = EXCLUDED.cron, every_ms = EXCLUDED.every_ms, \
                     timezone = EXCLUDED.timezone, job_type = EXCLUDED.job_type, \
                     payload = EXCLUDED.payload, options = EXCLUDED.options, spec = EXCLUDED.spec \
                 WHERE (schedules.cron, schedules.every_ms, schedules.timezone, schedules.job_type, \
                        schedules.payload, schedules.options, schedules.spec) \
                       IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_ms, EXCLUDED.timezone, \
                        EXCLUDED.job_type, EXCLUDED.payload, EXCLUDED.options, EXCLUDED.spec)"
            }
            IfStored::Keep => "DO NOTHING",
        };
        let insert = format!(
            "INSERT INTO schedules (name, cron, every_ms, timezone, job_type, payload, options, spec, \
                 paused) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (name) {on_conflict}"
        );
        // `$1` to `$8`: the definition; then the paused flag.
        let done = row
            .bind_definition(sqlx::query(&insert))
            .bind(row.paused)
            .execute(&self.route)
            .await?;
        Ok(done.rows_affected())
    }

    async fn replace_schedule(
        &self,
        row: &ScheduleRow,
        paused: Option<bool>,
    ) -> Result<bool, LedgerError> {
        // Every expression reads the row as it was: a replace that resumes
        // (paused → not) restarts the failure count and drops the note.
        let replace = sqlx::query(
            "UPDATE schedules SET cron = $2, every_ms = $3, timezone = $4, job_type = $5, \
                 payload = $6, options = $7, spec = $8, paused = COALESCE($9, paused), \
                 resumed_at = CASE WHEN paused AND NOT $9 THEN now() ELSE resumed_at END, \
                 pause_note = CASE WHEN COALESCE($9, paused) THEN pause_note END \
             WHERE name = $1",
        );
        self.moved(row.bind_definition(replace).bind(paused)).await
    }

    async fn delete_schedule(&self, name: &str) -> Result<bool, LedgerError> {
        self.moved(sqlx::query("DELETE FROM schedules WHERE name = $1").bind(name))
            .await
    }

    async fn schedules(&self, lookup: ScheduleLookup<'_>) -> Result<Vec<ScheduleRow>, LedgerError> {
        let sql = lookup.sql();
        Ok(lookup.query(&sql).fetch_all(&self.route).await?)
    }

    async fn schedules_in_shards(
        &self,
        shards: u32,
        wanted: &[u32],
    ) -> Result<Vec<ScheduleRow>, LedgerError> {
        // `shard_key` is the database's own FNV-1a of the name, the same as
        // `belfry_protocol::shard_key` (tested); a scan, done when shards
        // are taken, not per fire.
        let wanted: Vec<i64> = wanted.iter().map(|&s| i64::from(s)).collect();
        Ok(sqlx::query_as(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE shard_key % $1 = ANY($2) ORDER BY name"
        ))
        .bind(i64::from(shards))
        .bind(wanted)
        .fetch_all(&self.route)
        .await?)
    }

    async fn schedule_versions(&self) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        Ok(sqlx::query_as("SELECT name, updated_at FROM schedules")
            .fetch_all(&self.route)
            .await?)
    }

    async fn schedule_versions_in_shards(
        &self,
        shards: u32,
        wanted: &[u32],
    ) -> Result<Vec<(String, DateTime<Utc>)>, LedgerError> {
        // A scan still, but only the owned share of the rows is sent and
        // decoded (a third of a million names every resync, not a million).
        let wanted: Vec<i64> = wanted.iter().map(|&s| i64::from(s)).collect();
        Ok(
            sqlx::query_as("SELECT name, updated_at FROM schedules WHERE shard_key % $1 = ANY($2)")
                .bind(i64::from(shards))
                .bind(wanted)
                .fetch_all(&self.route)
                .await?,
        )
    }

    async fn set_paused(
        &self,
        name: &str,
        paused: bool,
        note: Option<&str>,
    ) -> Result<bool, LedgerError> {
        let update = sqlx::query(
            "UPDATE schedules SET paused = $2, pause_note = CASE WHEN $2 THEN $3 END, \
                 resumed_at = CASE WHEN $2 THEN resumed_at ELSE now() END \
             WHERE name = $1",
        );
        self.moved(update.bind(name).bind(paused).bind(note)).await
    }

    async fn delete_schedules_except(&self, keep: &[String]) -> Result<Vec<String>, LedgerError> {
        Ok(
            sqlx::query_scalar("DELETE FROM schedules WHERE NOT (name = ANY($1)) RETURNING name")
                .bind(keep)
                .fetch_all(&self.route)
                .await?,
        )
    }
}
