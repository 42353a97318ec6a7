//! What operators read on the embedded ledger (run listing, the web view's
//! numbers) and retention: the statements of [`crate::run_query`],
//! [`crate::dashboard`] and [`crate::retention`] in SQLite's dialect, on the
//! same indexes.

use chrono::{DateTime, NaiveDateTime, Utc};

use async_trait::async_trait;

use super::{now, ts, SqliteLedger};
use crate::dashboard::{
    MinuteCount, Overview, OverviewCounts, RecentFire, SEEN_REPLICAS, SEEN_WORKERS,
    UNFINISHED_COUNTS,
};
use crate::retention::{not_newest_fire, PruneBatch, Retained};
use crate::run_query::{push_run_filter, RunPage};
use crate::runs::{RunRecord, RUN_COLUMNS};
use crate::skipped_range::SkippedRange;
use crate::store::ViewStore;
use crate::LedgerError;

#[async_trait]
impl ViewStore for SqliteLedger {
    async fn list_runs(&self, page: RunPage<'_>) -> Result<Vec<RunRecord>, LedgerError> {
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE TRUE"
        ));
        push_run_filter(&mut q, page, ts);
        Ok(q.build_query_as().fetch_all(&self.pool).await?)
    }

    async fn runs_per_minute(&self, since: DateTime<Utc>) -> Result<Vec<MinuteCount>, LedgerError> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT substr(scheduled_at, 1, 16), status, count(*) \
             FROM job_runs WHERE scheduled_at >= ?1 AND scheduled_at <= ?2 \
             GROUP BY 1, 2 ORDER BY 1",
        )
        .bind(ts(since))
        .bind(now())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(minute, status, count)| {
                let minute = NaiveDateTime::parse_from_str(&minute, "%Y-%m-%dT%H:%M")
                    .map_err(|e| LedgerError::Corrupt(format!("minute {minute:?}: {e}")))?
                    .and_utc();
                Ok(MinuteCount {
                    minute,
                    status,
                    count,
                })
            })
            .collect()
    }

    async fn overview(&self, seen_since: DateTime<Utc>) -> Result<Overview, LedgerError> {
        let day_ago = ts(Utc::now() - chrono::Duration::days(1));
        let counts: OverviewCounts = sqlx::query_as(&format!(
            "SELECT {UNFINISHED_COUNTS}, \
               (SELECT count(*) FROM job_runs \
                  WHERE finished_at > ?1 AND status = 'dead') AS dead, \
               (SELECT count(*) FROM job_runs \
                  WHERE finished_at > ?1 AND status = 'failed') AS failed"
        ))
        .bind(&day_ago)
        .fetch_one(&self.pool)
        .await?;
        let since = ts(seen_since);
        let seen = |sql: &'static str| {
            sqlx::query_as(sql)
                .bind(since.clone())
                .fetch_all(&self.pool)
        };
        let replicas = seen(SEEN_REPLICAS).await?;
        let workers = seen(SEEN_WORKERS).await?;
        Ok(counts.with_seen(replicas, workers))
    }

    async fn count_by_status(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        Ok(
            sqlx::query_as("SELECT status, count(*) FROM job_runs GROUP BY status")
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn recent_fires(
        &self,
        names: &[String],
        per: i64,
    ) -> Result<Vec<RecentFire>, LedgerError> {
        let mut out = Vec::new();
        // One indexed probe per schedule on each table, as LATERAL does on
        // Postgres.
        for name in names {
            let fires: Vec<RecentFire> = sqlx::query_as(
                "SELECT ?1 AS job_name, scheduled_at, status FROM ( \
                     SELECT * FROM (SELECT scheduled_at, status FROM job_runs WHERE job_name = ?1 \
                                    ORDER BY scheduled_at DESC LIMIT ?2) \
                     UNION ALL \
                     SELECT * FROM (SELECT scheduled_at, 'skipped' AS status FROM skipped_fires \
                                    WHERE job_name = ?1 ORDER BY scheduled_at DESC LIMIT ?2)) \
                 ORDER BY scheduled_at DESC LIMIT ?2",
            )
            .bind(name)
            .bind(per)
            .fetch_all(&self.pool)
            .await?;
            out.extend(fires);
        }
        Ok(out)
    }

    async fn prune(&self, batch: PruneBatch) -> Result<u64, LedgerError> {
        // One statement under the write lock: no other pruner can hold the
        // rows.
        let delete = match batch.rows {
            Retained::FinishedRuns => format!(
                "DELETE FROM job_runs WHERE id IN ( \
                     SELECT r.id FROM job_runs r WHERE r.finished_at < ?1 AND {} AND {} \
                     ORDER BY r.finished_at LIMIT ?2)",
                not_newest_fire(),
                crate::retention::follow_ups_decided(
                    "json_extract(r.options, '$.follow_ups') IS NOT NULL"
                )
            ),
            Retained::SkippedFires | Retained::SkippedRanges => {
                let table = batch.rows.table();
                format!(
                    "DELETE FROM {table} WHERE rowid IN ( \
                         SELECT rowid FROM {table} WHERE recorded_at < ?1 \
                         ORDER BY recorded_at LIMIT ?2)"
                )
            }
        };
        let done = sqlx::query(&delete)
            .bind(ts(batch.cutoff))
            .bind(batch.batch)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected())
    }

    async fn record_skipped_ranges(&self, ranges: &[SkippedRange]) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        for r in ranges {
            sqlx::query(
                "INSERT INTO skipped_ranges (job_name, after_at, until_at, skipped, reason, recorded_by, recorded_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
            )
            .bind(&r.job_name)
            .bind(ts(r.after))
            .bind(ts(r.until))
            .bind(i64::try_from(r.skipped).unwrap_or(i64::MAX))
            .bind(crate::storable(&r.reason))
            .bind(&r.recorded_by)
            .bind(now())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
