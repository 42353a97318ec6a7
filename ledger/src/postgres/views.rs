//! Read-mostly views on Postgres (dashboard counts, run lists) and
//! retention (pruning in bounded batches).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;

use super::PgStore;
use crate::dashboard::{MinuteCount, Overview, RecentFire};
use crate::retention::prune_recorded;
use crate::run_query::{push_run_filter, RunCursor, RunFilter};
use crate::runs::{RunRecord, RUN_COLUMNS};
use crate::skipped_range::SkippedRange;
use crate::store::ViewStore;
use crate::LedgerError;

#[async_trait]
impl ViewStore for PgStore {
    async fn runs_per_minute(&self, since: DateTime<Utc>) -> Result<Vec<MinuteCount>, LedgerError> {
        let pool = &self.pool;
        let rows = sqlx::query(
            "SELECT date_trunc('minute', scheduled_at) AS minute, status, count(*) AS n \
             FROM job_runs WHERE scheduled_at >= $1 AND scheduled_at <= now() \
             GROUP BY 1, 2 ORDER BY 1",
        )
        .bind(since)
        .fetch_all(pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(MinuteCount {
                    minute: r.try_get("minute")?,
                    status: r.try_get("status")?,
                    count: r.try_get("n")?,
                })
            })
            .collect()
    }

    async fn overview(&self, seen_since: DateTime<Utc>) -> Result<Overview, LedgerError> {
        let pool = &self.pool;
        let counts = sqlx::query(
            "SELECT \
               (SELECT count(*) FROM job_runs \
                  WHERE status IN ('claimed', 'dispatched', 'running', 'retrying')) AS in_flight, \
               (SELECT count(*) FROM job_runs \
                  WHERE status IN ('claimed', 'dispatched', 'running', 'retrying') \
                    AND last_error LIKE 'stuck:%') AS stuck, \
               (SELECT count(*) FILTER (WHERE status = 'dead') FROM job_runs \
                  WHERE finished_at > now() - interval '1 day') AS dead, \
               (SELECT count(*) FILTER (WHERE status = 'failed') FROM job_runs \
                  WHERE finished_at > now() - interval '1 day') AS failed",
        )
        .fetch_one(pool)
        .await?;
        let seen = |sql: &'static str| {
            let pool = pool.clone();
            async move {
                let rows = sqlx::query(sql).bind(seen_since).fetch_all(&pool).await?;
                rows.into_iter()
                    .map(|r| Ok((r.try_get::<String, _>("who")?, r.try_get("last")?)))
                    .collect::<Result<Vec<(String, DateTime<Utc>)>, LedgerError>>()
            }
        };
        // Both look only at fires scheduled in the window (the
        // (scheduled_at, id) index), not at the whole table.
        let replicas = seen(
            "SELECT claimed_by AS who, max(claimed_at) AS last FROM job_runs \
             WHERE scheduled_at >= $1 AND claimed_by IS NOT NULL AND claimed_at IS NOT NULL \
             GROUP BY 1 ORDER BY 2 DESC LIMIT 50",
        )
        .await?;
        let workers = seen(
            "SELECT worker AS who, max(started_at) AS last FROM job_runs \
             WHERE scheduled_at >= $1 AND worker IS NOT NULL AND started_at IS NOT NULL \
             GROUP BY 1 ORDER BY 2 DESC LIMIT 50",
        )
        .await?;
        Ok(Overview {
            in_flight: counts.try_get("in_flight")?,
            stuck: counts.try_get("stuck")?,
            dead_last_day: counts.try_get("dead")?,
            failed_last_day: counts.try_get("failed")?,
            replicas,
            workers,
        })
    }

    async fn recent_fires(
        &self,
        names: &[String],
        per: i64,
    ) -> Result<Vec<RecentFire>, LedgerError> {
        let pool = &self.pool;
        let rows = sqlx::query(
            "SELECT n.name AS job_name, f.scheduled_at, f.status FROM unnest($1::text[]) AS n(name) \
             CROSS JOIN LATERAL ( \
                 SELECT scheduled_at, status FROM ( \
                     (SELECT scheduled_at, status FROM job_runs r WHERE r.job_name = n.name \
                      ORDER BY scheduled_at DESC LIMIT $2) \
                     UNION ALL \
                     (SELECT scheduled_at, 'skipped' AS status FROM skipped_fires s \
                      WHERE s.job_name = n.name ORDER BY scheduled_at DESC LIMIT $2)) u \
                 ORDER BY scheduled_at DESC LIMIT $2) f",
        )
        .bind(names)
        .bind(per)
        .fetch_all(pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok(RecentFire {
                    job_name: r.try_get("job_name")?,
                    scheduled_at: r.try_get("scheduled_at")?,
                    status: r.try_get("status")?,
                })
            })
            .collect()
    }

    async fn list_runs(
        &self,
        filter: &RunFilter,
        cursor: Option<RunCursor>,
        limit: i64,
    ) -> Result<Vec<RunRecord>, LedgerError> {
        let pool = &self.pool;
        let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE TRUE"
        ));
        push_run_filter(&mut q, filter, cursor, limit, |at| at);
        Ok(q.build_query_as().fetch_all(pool).await?)
    }

    async fn prune_finished_runs(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        let pool = &self.pool;
        let done = sqlx::query(&format!(
            "WITH doomed AS ( \
                 SELECT r.id FROM job_runs r \
                 WHERE r.finished_at < $1 \
                   AND (NOT COALESCE({}, false) \
                        OR EXISTS (SELECT 1 FROM job_runs n \
                                   WHERE n.job_name = r.job_name AND n.scheduled_at > r.scheduled_at \
                                     AND {})) \
                 ORDER BY r.finished_at LIMIT $2 \
                 FOR UPDATE SKIP LOCKED) \
             DELETE FROM job_runs WHERE id IN (SELECT id FROM doomed)",
            crate::fire_history::live_fire("r"),
            crate::fire_history::live_fire("n")
        ))
        .bind(cutoff)
        .bind(batch)
        .execute(pool)
        .await?;
        Ok(done.rows_affected())
    }

    async fn prune_skipped_fires(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        let pool = &self.pool;
        prune_recorded(pool, "skipped_fires", cutoff, batch).await
    }

    async fn record_skipped_ranges(&self, ranges: &[SkippedRange]) -> Result<(), LedgerError> {
        let pool = &self.pool;
        let names: Vec<&str> = ranges.iter().map(|r| r.job_name.as_str()).collect();
        let after: Vec<DateTime<Utc>> = ranges.iter().map(|r| r.after).collect();
        let until: Vec<DateTime<Utc>> = ranges.iter().map(|r| r.until).collect();
        let counts: Vec<i64> = ranges
            .iter()
            .map(|r| i64::try_from(r.skipped).unwrap_or(i64::MAX))
            .collect();
        let reasons: Vec<String> = ranges
            .iter()
            .map(|r| crate::storable(&r.reason).into_owned())
            .collect();
        let by: Vec<&str> = ranges.iter().map(|r| r.recorded_by.as_str()).collect();
        sqlx::query(
            "INSERT INTO skipped_ranges (job_name, after_at, until_at, skipped, reason, recorded_by) \
             SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::bigint[], \
                                  $5::text[], $6::text[]) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&names)
        .bind(&after)
        .bind(&until)
        .bind(&counts)
        .bind(&reasons)
        .bind(&by)
        .execute(pool)
        .await?;
        Ok(())
    }

    async fn prune_skipped_ranges(
        &self,
        cutoff: DateTime<Utc>,
        batch: i64,
    ) -> Result<u64, LedgerError> {
        let pool = &self.pool;
        crate::retention::prune_recorded(pool, "skipped_ranges", cutoff, batch).await
    }

    async fn count_by_status(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        Ok(
            sqlx::query_as("SELECT status, count(*) FROM job_runs GROUP BY status")
                .fetch_all(&self.pool)
                .await?,
        )
    }
}
