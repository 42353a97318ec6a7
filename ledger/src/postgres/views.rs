//! Read-mostly views on Postgres (dashboard counts, run lists) and
//! retention (pruning in bounded batches).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::PgStore;
use crate::dashboard::{
    MinuteCount, Overview, OverviewCounts, RecentFire, SEEN_REPLICAS, SEEN_WORKERS,
    UNFINISHED_COUNTS,
};
use crate::retention::{not_newest_fire, PruneBatch, Retained};
use crate::run_query::{push_run_filter, RunPage};
use crate::runs::{RunRecord, RUN_COLUMNS};
use crate::skipped_range::SkippedRange;
use crate::store::{RunPartitionStore, ViewStore};
use crate::LedgerError;

#[async_trait]
impl ViewStore for PgStore {
    async fn runs_per_minute(&self, since: DateTime<Utc>) -> Result<Vec<MinuteCount>, LedgerError> {
        Ok(sqlx::query_as(
            "SELECT date_trunc('minute', scheduled_at) AS minute, status, count(*) AS count \
             FROM job_runs WHERE scheduled_at >= $1 AND scheduled_at <= now() \
             GROUP BY 1, 2 ORDER BY 1",
        )
        .bind(since)
        .fetch_all(&self.route)
        .await?)
    }

    async fn overview(&self, seen_since: DateTime<Utc>) -> Result<Overview, LedgerError> {
        let pool = &self.route;
        let counts: OverviewCounts = sqlx::query_as(&format!(
            "SELECT {UNFINISHED_COUNTS}, \
               (SELECT count(*) FILTER (WHERE status = 'dead') FROM job_runs \
                  WHERE finished_at > now() - interval '1 day') AS dead, \
               (SELECT count(*) FILTER (WHERE status = 'failed') FROM job_runs \
                  WHERE finished_at > now() - interval '1 day') AS failed"
        ))
        .fetch_one(pool)
        .await?;
        let seen = |sql: &'static str| sqlx::query_as(sql).bind(seen_since).fetch_all(pool);
        let replicas = seen(SEEN_REPLICAS).await?;
        let workers = seen(SEEN_WORKERS).await?;
        Ok(counts.with_seen(replicas, workers))
    }

    async fn recent_fires(
        &self,
        names: &[String],
        per: i64,
    ) -> Result<Vec<RecentFire>, LedgerError> {
        Ok(sqlx::query_as(
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
        .fetch_all(&self.route)
        .await?)
    }

    async fn list_runs(&self, page: RunPage<'_>) -> Result<Vec<RunRecord>, LedgerError> {
        let mut q = sqlx::QueryBuilder::<sqlx::Postgres>::new(format!(
            "SELECT {RUN_COLUMNS} FROM job_runs WHERE TRUE"
        ));
        push_run_filter(&mut q, page, |at| at);
        Ok(q.build_query_as().fetch_all(&self.route).await?)
    }

    async fn prune(&self, batch: PruneBatch) -> Result<u64, LedgerError> {
        let table = match batch.rows {
            Retained::FinishedRuns => return self.prune_runs(batch).await,
            Retained::SkippedFires | Retained::SkippedRanges => batch.rows.table(),
        };
        // Each batch is one short statement; rows another pruner holds are
        // skipped, not waited for.
        let delete = format!(
            "DELETE FROM {table} WHERE ctid IN ( \
                 SELECT ctid FROM {table} WHERE recorded_at < $1 \
                 ORDER BY recorded_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
        );
        let done = sqlx::query(&delete)
            .bind(batch.cutoff)
            .bind(batch.batch)
            .execute(&self.route)
            .await?;
        Ok(done.rows_affected())
    }

    async fn record_skipped_ranges(&self, ranges: &[SkippedRange]) -> Result<(), LedgerError> {
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
        // In name order: the alert trigger of each row takes its
        // schedule's lock (see the alerts migration), so two replicas
        // recording ranges of the same schedules lock them in one order.
        sqlx::query(
            "INSERT INTO skipped_ranges (job_name, after_at, until_at, skipped, reason, recorded_by) \
             SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::bigint[], \
                                  $5::text[], $6::text[]) AS r(job_name, a, u, n, why, who) \
             ORDER BY job_name \
             ON CONFLICT DO NOTHING",
        )
        .bind(&names)
        .bind(&after)
        .bind(&until)
        .bind(&counts)
        .bind(&reasons)
        .bind(&by)
        .execute(&self.route)
        .await?;
        Ok(())
    }

    async fn count_by_status(&self) -> Result<Vec<(String, i64)>, LedgerError> {
        Ok(
            sqlx::query_as("SELECT status, count(*) FROM job_runs GROUP BY status")
                .fetch_all(&self.route)
                .await?,
        )
    }
}

impl PgStore {
    /// Row-by-row retention of finished runs, only where whole-day drops
    /// do not reach (`crate::run_partitions`): the keyed and default
    /// partitions, and day partitions past the cutoff that are kept for an
    /// unfinished run. Day partitions not yet past the cutoff are left
    /// alone: deleting their rows one by one is the cost partitioning
    /// removes, and they go whole once past it.
    async fn prune_runs(&self, batch: PruneBatch) -> Result<u64, LedgerError> {
        let mut left = batch.batch;
        let mut done = 0;
        for p in self.run_partitions().await? {
            if left <= 0 {
                break;
            }
            if p.is_day() && p.to.is_none_or(|t| t > batch.cutoff) {
                continue;
            }
            let name = &p.name;
            // One short statement; rows another pruner holds are skipped,
            // not waited for.
            let deleted = sqlx::query(&format!(
                "WITH doomed AS ( \
                     SELECT r.id, r.key_instant FROM {name} r WHERE r.finished_at < $1 AND {} \
                       AND {} \
                     ORDER BY r.finished_at LIMIT $2 \
                     FOR UPDATE SKIP LOCKED) \
                 DELETE FROM {name} d USING doomed \
                 WHERE d.id = doomed.id AND d.key_instant = doomed.key_instant",
                not_newest_fire(),
                crate::retention::follow_ups_decided("r.options ? 'follow_ups'")
            ))
            .bind(batch.cutoff)
            .bind(left)
            .execute(&self.route)
            .await?
            .rows_affected();
            done += deleted;
            left -= i64::try_from(deleted).unwrap_or(i64::MAX);
        }
        Ok(done)
    }
}
