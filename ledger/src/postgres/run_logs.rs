//! Run logs on Postgres (`crate::run_log`): one `unnest` insert per batch,
//! a keyset read on the primary key, retention by `at` with an anti-join
//! on the run.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use crate::run_log::{AttemptLogExtent, LogCursor, RunLogLine, StoredLine, LINE_COLUMNS};
use crate::store::RunLogStore;
use crate::LedgerError;

#[async_trait]
impl RunLogStore for PgStore {
    async fn append_run_logs(&self, lines: &[RunLogLine]) -> Result<u64, LedgerError> {
        let mut columns: (
            Vec<Uuid>,
            Vec<i32>,
            Vec<i32>,
            Vec<DateTime<Utc>>,
            Vec<&str>,
            Vec<&str>,
            Vec<String>,
            Vec<Option<String>>,
        ) = Default::default();
        let (mut done, mut total) = (Vec::new(), Vec::new());
        for l in lines {
            columns.0.push(l.run_id);
            columns.1.push(l.attempt);
            columns.2.push(l.seq);
            columns.3.push(l.at);
            columns.4.push(l.kind.as_str());
            columns.5.push(&l.level);
            columns.6.push(l.stored_message());
            columns.7.push(l.fields_text());
            done.push(l.done);
            total.push(l.total);
        }
        // A batch sent again after a lost answer finds its lines stored.
        let stored = sqlx::query(
            "INSERT INTO run_logs (run_id, attempt, seq, at, kind, level, message, fields, done, total) \
             SELECT * FROM unnest($1::uuid[], $2::int[], $3::int[], $4::timestamptz[], $5::text[], \
                                  $6::text[], $7::text[], $8::text[], $9::int8[], $10::int8[]) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&columns.0)
        .bind(&columns.1)
        .bind(&columns.2)
        .bind(&columns.3)
        .bind(&columns.4)
        .bind(&columns.5)
        .bind(&columns.6)
        .bind(&columns.7)
        .bind(&done)
        .bind(&total)
        .execute(&self.route)
        .await?;
        Ok(stored.rows_affected())
    }

    async fn run_logs(
        &self,
        run_id: Uuid,
        after: LogCursor,
        limit: i64,
    ) -> Result<Vec<RunLogLine>, LedgerError> {
        let rows: Vec<StoredLine> = sqlx::query_as(&format!(
            "SELECT {LINE_COLUMNS} FROM run_logs \
             WHERE run_id = $1 AND (attempt, seq) > ($2, $3) \
             ORDER BY attempt, seq LIMIT $4"
        ))
        .bind(run_id)
        .bind(after.attempt)
        .bind(after.seq)
        .bind(limit)
        .fetch_all(&self.route)
        .await?;
        Ok(rows.into_iter().map(RunLogLine::from).collect())
    }

    async fn run_log_extent(&self, run_id: Uuid) -> Result<Vec<AttemptLogExtent>, LedgerError> {
        Ok(sqlx::query_as(
            "SELECT attempt, count(*) AS lines, max(seq) AS last_seq, \
                    sum(octet_length(message) + coalesce(octet_length(fields), 0))::int8 AS bytes \
             FROM run_logs WHERE run_id = $1 GROUP BY attempt ORDER BY attempt",
        )
        .bind(run_id)
        .fetch_all(&self.route)
        .await?)
    }

    async fn latest_progress(&self, run_id: Uuid) -> Result<Option<RunLogLine>, LedgerError> {
        // The partial index of progress lines, newest first.
        let row: Option<StoredLine> = sqlx::query_as(&format!(
            "SELECT {LINE_COLUMNS} FROM run_logs WHERE run_id = $1 AND kind = 'progress' \
             ORDER BY attempt DESC, seq DESC LIMIT 1"
        ))
        .bind(run_id)
        .fetch_optional(&self.route)
        .await?;
        Ok(row.map(RunLogLine::from))
    }

    async fn prune_run_logs(
        &self,
        older_than: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError> {
        // Lines before the horizon through the BRIN index on `at`, in no
        // particular order (a batch is any `limit` of them); a line whose
        // run still exists (kept by the runs' retention) stays.
        let deleted = sqlx::query(
            "DELETE FROM run_logs WHERE ctid = ANY(ARRAY( \
                 SELECT l.ctid FROM run_logs l \
                 WHERE l.at < $1 AND NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.id = l.run_id) \
                 LIMIT $2))",
        )
        .bind(older_than)
        .bind(limit)
        .execute(&self.route)
        .await?;
        Ok(deleted.rows_affected())
    }
}
