//! What operators read on the embedded ledger (run listing, the web view's
//! numbers) and retention: the statements of [`crate::run_query`],
//! [`crate::dashboard`] and [`crate::retention`] in SQLite's dialect, on the
//! same indexes.

use chrono::{DateTime, NaiveDateTime, Utc};
use sqlx::Row;

use async_trait::async_trait;

use super::{now, ts, SqliteLedger};
use crate::dashboard::{MinuteCount, Overview, RecentFire};
use crate::fire_history::live_fire;
use crate::run_query::{push_run_filter, RunCursor, RunFilter};
use crate::runs::{RunRecord, RUN_COLUMNS};
use crate::store::ViewStore;
use crate::LedgerError;

impl SqliteLedger {
    /// Deletes up to `batch` rows of `table` (a record of skips) recorded
    /// before `cutoff`, oldest first; returns how many.
    async fn prune_recorded(
        &self,
        table: &'static str,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        let done = sqlx::query(&format!(
            "DELETE FROM {table} WHERE rowid IN ( \
                 SELECT rowid FROM {table} WHERE recorded_at < ?1 \
                 ORDER BY recorded_at LIMIT ?2)"
        ))
        .bind(ts(cutoff))
        .bind(batch)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl ViewStore for SqliteLedger {
    async fn list_runs(
        &self,
        filter: &RunFilter,
        cursor: Option<RunCursor>,
        limit: i64,
    ) -> Result<Vec<RunRecord>, LedgerError> {
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE TRUE"
        ));
        push_run_filter(&mut q, filter, cursor, limit, ts);
        Ok(q.build_query_as().fetch_all(&self.pool).await?)
    }

    async fn runs_per_minute(&self, since: DateTime<Utc>) -> Result<Vec<MinuteCount>, LedgerError> {
        let rows = sqlx::query(
            "SELECT substr(scheduled_at, 1, 16) AS minute, status, count(*) AS n \
             FROM job_runs WHERE scheduled_at >= ?1 AND scheduled_at <= ?2 \
             GROUP BY 1, 2 ORDER BY 1",
        )
        .bind(ts(since))
        .bind(now())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                let minute: String = r.try_get("minute")?;
                let minute = NaiveDateTime::parse_from_str(&minute, "%Y-%m-%dT%H:%M")
                    .map_err(|e| LedgerError::Corrupt(format!("minute {minute:?}: {e}")))?
                    .and_utc();
                Ok(MinuteCount {
                    minute,
                    status: r.try_get("status")?,
                    count: r.try_get("n")?,
                })
            })
            .collect()
    }

    async fn overview(&self, seen_since: DateTime<Utc>) -> Result<Overview, LedgerError> {
        let day_ago = ts(Utc::now() - chrono::Duration::days(1));
        let counts = sqlx::query(
            "SELECT \
               (SELECT count(*) FROM job_runs \
                  WHERE status IN ('claimed', 'dispatched', 'running', 'retrying')) AS in_flight, \
               (SELECT count(*) FROM job_runs \
                  WHERE status IN ('claimed', 'dispatched', 'running', 'retrying') \
                    AND last_error LIKE 'stuck:%') AS stuck, \
               (SELECT count(*) FROM job_runs \
                  WHERE finished_at > ?1 AND status = 'dead') AS dead, \
               (SELECT count(*) FROM job_runs \
                  WHERE finished_at > ?1 AND status = 'failed') AS failed",
        )
        .bind(&day_ago)
        .fetch_one(&self.pool)
        .await?;
        let since = ts(seen_since);
        let mut seen = Vec::with_capacity(2);
        for sql in [
            "SELECT claimed_by AS who, max(claimed_at) AS last FROM job_runs \
             WHERE scheduled_at >= ?1 AND claimed_by IS NOT NULL AND claimed_at IS NOT NULL \
             GROUP BY 1 ORDER BY 2 DESC LIMIT 50",
            "SELECT worker AS who, max(started_at) AS last FROM job_runs \
             WHERE scheduled_at >= ?1 AND worker IS NOT NULL AND started_at IS NOT NULL \
             GROUP BY 1 ORDER BY 2 DESC LIMIT 50",
        ] {
            let rows = sqlx::query(sql).bind(&since).fetch_all(&self.pool).await?;
            seen.push(
                rows.into_iter()
                    .map(|r| Ok((r.try_get::<String, _>("who")?, r.try_get("last")?)))
                    .collect::<Result<Vec<_>, LedgerError>>()?,
            );
        }
        let workers = seen.pop().unwrap_or_default();
        let replicas = seen.pop().unwrap_or_default();
        Ok(Overview {
            in_flight: counts.try_get("in_flight")?,
            stuck: counts.try_get("stuck")?,
            dead_last_day: counts.try_get("dead")?,
            failed_last_day: counts.try_get("failed")?,
            replicas,
            workers,
        })
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
            let rows = sqlx::query(
                "SELECT scheduled_at, status FROM ( \
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
            for r in rows {
                out.push(RecentFire {
                    job_name: name.clone(),
                    scheduled_at: r.try_get("scheduled_at")?,
                    status: r.try_get("status")?,
                });
            }
        }
        Ok(out)
    }

    async fn prune_finished_runs(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        let done = sqlx::query(&format!(
            "DELETE FROM job_runs WHERE id IN ( \
                 SELECT r.id FROM job_runs r \
                 WHERE r.finished_at < ?1 \
                   AND (NOT COALESCE({}, 0) \
                        OR EXISTS (SELECT 1 FROM job_runs n \
                                   WHERE n.job_name = r.job_name AND n.scheduled_at > r.scheduled_at \
                                     AND {})) \
                 ORDER BY r.finished_at LIMIT ?2)",
            live_fire("r"),
            live_fire("n")
        ))
        .bind(ts(cutoff))
        .bind(batch)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected())
    }

    async fn prune_skipped_fires(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        self.prune_recorded("skipped_fires", cutoff, batch).await
    }

    async fn prune_skipped_ranges(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        self.prune_recorded("skipped_ranges", cutoff, batch).await
    }

    async fn record_skipped_ranges(
        &self,
        ranges: &[crate::SkippedRange],
    ) -> Result<(), LedgerError> {
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
            .bind(super::now())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
