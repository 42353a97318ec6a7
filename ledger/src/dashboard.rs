//! What the web view shows at a glance, each a bounded, indexed query:
//! fires per minute by outcome over the last hours (a range of
//! `job_runs_scheduled_id_idx`), unfinished and stuck runs (the partial
//! unfinished index), recent dead runs (the finished index), the replicas
//! and workers seen lately, and the last fires of a page of schedules (one
//! index probe per schedule on `(job_name, scheduled_at DESC)`).

use chrono::{DateTime, Utc};

use crate::{Ledger, LedgerError};

/// Runs of one minute with one status.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
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
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RecentFire {
    /// The schedule.
    pub job_name: String,
    /// The fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// The run's status, or `skipped`.
    pub status: String,
}

/// The counts of the overview that only look at unfinished runs (the
/// partial unfinished index), as both backends select them.
pub(crate) const UNFINISHED_COUNTS: &str = "\
    (SELECT count(*) FROM job_runs \
       WHERE status IN ('claimed', 'dispatched', 'running', 'retrying')) AS in_flight, \
    (SELECT count(*) FROM job_runs \
       WHERE status IN ('claimed', 'dispatched', 'running', 'retrying') \
         AND last_error LIKE 'stuck:%') AS stuck";

/// The scheduler replicas that claimed fires scheduled since `$1`, with
/// their last claim, latest first; on both backends (SQLite reads `$n` as
/// Postgres does).
pub(crate) const SEEN_REPLICAS: &str = "SELECT claimed_by, max(claimed_at) FROM job_runs \
     WHERE scheduled_at >= $1 AND claimed_by IS NOT NULL AND claimed_at IS NOT NULL \
     GROUP BY 1 ORDER BY 2 DESC LIMIT 50";

/// The workers that started attempts of fires scheduled since `$1`, with
/// their last start, latest first; on both backends.
pub(crate) const SEEN_WORKERS: &str = "SELECT worker, max(started_at) FROM job_runs \
     WHERE scheduled_at >= $1 AND worker IS NOT NULL AND started_at IS NOT NULL \
     GROUP BY 1 ORDER BY 2 DESC LIMIT 50";

/// The four counts of the overview, as both backends select them.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub(crate) struct OverviewCounts {
    /// [`Overview::in_flight`].
    in_flight: i64,
    /// [`Overview::stuck`].
    stuck: i64,
    /// [`Overview::dead_last_day`].
    dead: i64,
    /// [`Overview::failed_last_day`].
    failed: i64,
}

impl OverviewCounts {
    /// The overview: these counts, and the replicas and workers seen.
    pub(crate) fn with_seen(
        self,
        replicas: Vec<(String, DateTime<Utc>)>,
        workers: Vec<(String, DateTime<Utc>)>,
    ) -> Overview {
        Overview {
            in_flight: self.in_flight,
            stuck: self.stuck,
            dead_last_day: self.dead,
            failed_last_day: self.failed,
            replicas,
            workers,
        }
    }
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
        self.store.runs_per_minute(since).await
    }

    /// The overview's counts; replicas and workers seen since `seen_since`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn overview(&self, seen_since: DateTime<Utc>) -> Result<Overview, LedgerError> {
        self.store.overview(seen_since).await
    }

    /// How many runs are in each status (statuses with none are absent).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn count_by_status(
        &self,
    ) -> Result<std::collections::HashMap<String, i64>, LedgerError> {
        let rows = self.store.count_by_status().await?;
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
        self.store.recent_fires(names, per).await
    }
}
