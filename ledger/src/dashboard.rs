//! What the web view shows at a glance, each a bounded, indexed query:
//! fires per minute by outcome over the last hours (a range of
//! `job_runs_scheduled_id_idx`), unfinished and stuck runs (the partial
//! unfinished index), recent dead runs (the finished index), the replicas
//! and workers seen lately, and the last fires of a page of schedules (one
//! index probe per schedule on `(job_name, scheduled_at DESC)`).

use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::{Ledger, LedgerError};

/// Runs of one minute with one status.
#[derive(Debug, Clone, PartialEq)]
pub struct MinuteCount {
    /// The minute.
    pub minute: DateTime<Utc>,
    /// The run status.
    pub status: String,
    /// How many runs were scheduled in that minute with that status.
    pub count: i64,
}

/// The numbers of the overview.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overview {
    /// Runs not finished (claimed, dispatched, running, retrying).
    pub in_flight: i64,
    /// Unfinished runs reported stuck.
    pub stuck: i64,
    /// Runs that ended `dead` in the last 24 hours.
    pub dead_last_day: i64,
    /// Runs that ended `failed` in the last 24 hours.
    pub failed_last_day: i64,
    /// Scheduler replicas that claimed in the window, with their last claim.
    pub replicas: Vec<(String, DateTime<Utc>)>,
    /// Workers that started attempts in the window, with their last start.
    pub workers: Vec<(String, DateTime<Utc>)>,
}

/// One past fire of a schedule, for its strip.
#[derive(Debug, Clone, PartialEq)]
pub struct RecentFire {
    /// The schedule.
    pub job_name: String,
    /// The fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// The run's status, or `skipped`.
    pub status: String,
}

impl Ledger {
    /// Runs per minute and status scheduled since `since`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn runs_per_minute(
        &self,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCount>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.runs_per_minute(since).await,
        };
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

    /// The overview's counts; replicas and workers seen since `seen_since`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn overview(&self, seen_since: DateTime<Utc>) -> Result<Overview, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.overview(seen_since).await,
        };
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

    /// How many runs are in each status (statuses with none are absent).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn count_by_status(
        &self,
    ) -> Result<std::collections::HashMap<String, i64>, LedgerError> {
        let rows = match self.pg() {
            Ok(pool) => {
                sqlx::query_as::<_, (String, i64)>(
                    "SELECT status, count(*) FROM job_runs GROUP BY status",
                )
                .fetch_all(pool)
                .await?
            }
            Err(lite) => lite.count_by_status().await?,
        };
        Ok(rows.into_iter().collect())
    }

    /// The last `per` fires (runs and skipped fires) of each of `names`,
    /// newest first per schedule.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn recent_fires(
        &self,
        names: &[String],
        per: i64,
    ) -> Result<Vec<RecentFire>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.recent_fires(names, per).await,
        };
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
}
