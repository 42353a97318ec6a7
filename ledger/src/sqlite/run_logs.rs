//! Run logs on the embedded ledger (`crate::run_log`): the same statements
//! as on Postgres, a batch in one write transaction of the one writer.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{ts, SqliteLedger};
use crate::run_log::{AttemptLogExtent, LogCursor, RunLogLine, StoredLine, LINE_COLUMNS};
use crate::store::RunLogStore;
use crate::LedgerError;

#[async_trait]
impl RunLogStore for SqliteLedger {
    async fn append_run_logs(&self, lines: &[RunLogLine]) -> Result<u64, LedgerError> {
        let mut tx = self.write_tx().await?;
        let mut stored = 0;
        for l in lines {
            stored += sqlx::query(
                "INSERT INTO run_logs (run_id, attempt, seq, at, kind, level, message, fields, done, total) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING",
            )
            .bind(l.run_id)
            .bind(l.attempt)
            .bind(l.seq)
            .bind(ts(l.at))
            .bind(l.kind.as_str())
            .bind(&l.level)
            .bind(l.stored_message())
            .bind(l.fields_text())
            .bind(l.done)
            .bind(l.total)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        tx.commit().await?;
        Ok(stored)
    }

    async fn run_logs(
        &self,
        run_id: Uuid,
        after: LogCursor,
        limit: i64,
    ) -> Result<Vec<RunLogLine>, LedgerError> {
        let rows: Vec<StoredLine> = sqlx::query_as(&format!(
            "SELECT {LINE_COLUMNS} FROM run_logs \
             WHERE run_id = ?1 AND (attempt > ?2 OR (attempt = ?2 AND seq > ?3)) \
             ORDER BY attempt, seq LIMIT ?4"
        ))
        .bind(run_id)
        .bind(after.attempt)
        .bind(after.seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(RunLogLine::from).collect())
    }

    async fn run_log_extent(&self, run_id: Uuid) -> Result<Vec<AttemptLogExtent>, LedgerError> {
        Ok(sqlx::query_as(
            "SELECT attempt, count(*) AS lines, max(seq) AS last_seq, \
                    sum(length(CAST(message AS BLOB)) + coalesce(length(CAST(fields AS BLOB)), 0)) AS bytes \
             FROM run_logs WHERE run_id = ?1 GROUP BY attempt ORDER BY attempt",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn latest_progress(&self, run_id: Uuid) -> Result<Option<RunLogLine>, LedgerError> {
        // The partial index of progress lines, newest first.
        let row: Option<StoredLine> = sqlx::query_as(&format!(
            "SELECT {LINE_COLUMNS} FROM run_logs WHERE run_id = ?1 AND kind = 'progress' \
             ORDER BY attempt DESC, seq DESC LIMIT 1"
        ))
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(RunLogLine::from))
    }

    async fn prune_run_logs(
        &self,
        older_than: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError> {
        let deleted = sqlx::query(
            "DELETE FROM run_logs WHERE rowid IN ( \
                 SELECT l.rowid FROM run_logs l \
                 WHERE l.at < ?1 AND NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.id = l.run_id) \
                 ORDER BY l.at LIMIT ?2)",
        )
        .bind(ts(older_than))
        .bind(limit)
        .execute(&self.writer)
        .await?;
        Ok(deleted.rows_affected())
    }
}
