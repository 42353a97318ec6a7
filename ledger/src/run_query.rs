//! Looking runs up for operators: filtered listing, newest fire first, with
//! keyset pagination.
//!
//! Pages are cut on `(scheduled_at, id)`, the order of
//! `job_runs_scheduled_id_idx`, never with `OFFSET`: page 1,000 costs what
//! page 1 costs, and a run inserted while someone pages does not shift the
//! pages after it. The SQL is built from the filters actually given, so each
//! shape gets a plan that uses its index instead of one generic plan full of
//! `$n IS NULL OR ...`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::runs::RunRecord;
use crate::{Ledger, LedgerError, RunStatus};

/// Which runs to list. Empty fields do not filter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    /// Only runs of this schedule (job name).
    pub job_name: Option<String>,
    /// Only runs of this job type.
    pub job_type: Option<String>,
    /// Only runs in one of these statuses (empty: any).
    pub statuses: Vec<RunStatus>,
    /// Only runs scheduled at or after this instant.
    pub from: Option<DateTime<Utc>>,
    /// Only runs scheduled before this instant.
    pub to: Option<DateTime<Utc>>,
}

/// Where a page starts: strictly after this `(scheduled_at, id)` in
/// newest-first order (the last run of the previous page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunCursor {
    /// The previous page's last `scheduled_at`.
    pub scheduled_at: DateTime<Utc>,
    /// The previous page's last id.
    pub id: Uuid,
}

impl RunCursor {
    /// The cursor that continues after `run`.
    pub fn after(run: &RunRecord) -> Self {
        Self {
            scheduled_at: run.scheduled_at,
            id: run.id,
        }
    }
}

impl Ledger {
    /// Up to `limit` runs matching `filter`, newest fire first, starting
    /// after `cursor`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn list_runs(
        &self,
        filter: &RunFilter,
        cursor: Option<RunCursor>,
        limit: i64,
    ) -> Result<Vec<RunRecord>, LedgerError> {
        let page = RunPage {
            filter,
            cursor,
            limit,
        };
        self.store.list_runs(page).await
    }
}

/// One page of [`Ledger::list_runs`]: which runs, where the page starts,
/// how many at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunPage<'a> {
    /// Which runs.
    pub(crate) filter: &'a RunFilter,
    /// Strictly after this run (newest fire first); `None`: the first page.
    pub(crate) cursor: Option<RunCursor>,
    /// At most this many.
    pub(crate) limit: i64,
}

/// Appends `page` (its filter, cursor and limit) to a `SELECT ... FROM
/// job_runs WHERE TRUE` of either dialect; `instant` turns an instant into
/// the value its database stores (Postgres takes it as is, the embedded
/// ledger as fixed-width text).
pub(crate) fn push_run_filter<'a, DB, T>(
    q: &mut sqlx::QueryBuilder<'a, DB>,
    page: RunPage<'_>,
    instant: impl Fn(DateTime<Utc>) -> T,
) where
    DB: sqlx::Database,
    String: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    Uuid: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    T: sqlx::Encode<'a, DB> + sqlx::Type<DB> + 'a,
{
    let RunPage {
        filter,
        cursor,
        limit,
    } = page;
    if let Some(name) = &filter.job_name {
        q.push(" AND job_name = ").push_bind(name.clone());
    }
    if let Some(job_type) = &filter.job_type {
        q.push(" AND job_type = ").push_bind(job_type.clone());
    }
    if !filter.statuses.is_empty() {
        // Literals, not a bound array: the statuses are this crate's own
        // constants, and the planner can only match partial indexes
        // (`job_runs_failed_idx`, `job_runs_unfinished_idx`) against
        // values it can see.
        let list: Vec<String> = filter
            .statuses
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        q.push(format!(" AND status IN ({})", list.join(", ")));
    }
    if let Some(from) = filter.from {
        q.push(" AND scheduled_at >= ").push_bind(instant(from));
    }
    if let Some(to) = filter.to {
        q.push(" AND scheduled_at < ").push_bind(instant(to));
    }
    if let Some(c) = cursor {
        // Row comparison matches the index order exactly.
        q.push(" AND (scheduled_at, id) < (")
            .push_bind(instant(c.scheduled_at))
            .push(", ")
            .push_bind(c.id)
            .push(")");
    }
    q.push(" ORDER BY scheduled_at DESC, id DESC LIMIT ")
        .push_bind(limit);
}
