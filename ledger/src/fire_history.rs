//! What the ledger knows about a schedule's past fires: the latest one (for
//! misfire recovery after downtime) and fires skipped because the previous
//! run was still going (overlap = "forbid").

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::runs::NewRun;
use crate::{Ledger, LedgerError};

/// A claimed run that never reached the broker and is now late.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct LateClaim {
    /// The run.
    pub id: uuid::Uuid,
    /// Its schedule.
    pub job_name: String,
    /// Its fire instant.
    pub scheduled_at: DateTime<Utc>,
    /// Whether a later fire of the schedule reached the broker.
    pub superseded: bool,
    /// The schedule's stored definition.
    pub spec: Option<serde_json::Value>,
}

/// The result of a claim that must not overlap the previous run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExclusiveClaim {
    /// The run was inserted.
    Won,
    /// The run key was already claimed, or already recorded as skipped.
    Taken,
    /// A previous run of the schedule is unfinished: the fire was recorded
    /// as skipped.
    Overlapped,
}

/// SQL that is true when the run aliased `alias` is a fire of its schedule's
/// timetable (claimed by a replica's timer or misfire recovery), and false
/// for ad-hoc jobs (`claimed_by` `client:...`), manual triggers
/// (`manual:...`), backfills (`backfill:...`) and hand-published messages
/// (no `claimed_by`). Misfire policies, late-claim decisions and retention's
/// "newest fire" only look at these.
pub(crate) fn live_fire(alias: &str) -> String {
    format!(
        "({alias}.claimed_by NOT LIKE 'client:%' AND {alias}.claimed_by NOT LIKE 'manual:%' \
          AND {alias}.claimed_by NOT LIKE 'backfill:%')"
    )
}

impl Ledger {
    /// The latest `scheduled_at` of each of `job_names` that has live fires
    /// (see [`live_fire`]: ad-hoc runs, manual triggers and backfills are not
    /// fires of the timetable).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn last_fires(
        &self,
        job_names: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.last_fires(job_names).await,
        };
        // One index probe per name (job_runs_job_name_scheduled_idx).
        let rows = sqlx::query(&format!(
            "SELECT n.name, (SELECT max(r.scheduled_at) FROM job_runs r \
                  WHERE r.job_name = n.name AND {}) AS last \
             FROM unnest($1::text[]) AS n(name)",
            live_fire("r")
        ))
        .bind(job_names)
        .fetch_all(pool)
        .await?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in rows {
            if let Some(last) = r.try_get::<Option<DateTime<Utc>>, _>("last")? {
                out.insert(r.try_get("name")?, last);
            }
        }
        Ok(out)
    }

    /// Claims `run` unless an earlier run of the same schedule is
    /// unfinished, in which case the fire is recorded in `skipped_fires`.
    ///
    /// The decision is made under a transaction-scoped advisory lock on the
    /// schedule name, so replicas racing for the fire agree: exactly one of
    /// them inserts the run or records the skip, never both.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn claim_exclusive(&self, run: &NewRun) -> Result<ExclusiveClaim, LedgerError> {
        self.claim_exclusive_with(run, true).await
    }

    /// [`Ledger::claim_exclusive`], recording an overlapped fire in
    /// `skipped_fires` only with `record_skip` (a refused manual trigger is
    /// not a fire of the schedule and leaves nothing behind).
    ///
    /// # Errors
    ///
    /// As [`Ledger::claim_exclusive`].
    pub async fn claim_exclusive_with(
        &self,
        run: &NewRun,
        record_skip: bool,
    ) -> Result<ExclusiveClaim, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.claim_exclusive_with(run, record_skip).await,
        };
        let mut tx = pool.begin().await?;
        // Serialises decisions for this schedule only; released at commit.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))")
            .bind(&run.job_name)
            .execute(&mut *tx)
            .await?;
        let taken: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM job_runs WHERE job_name = $1 AND run_key = $2) \
                 OR EXISTS (SELECT 1 FROM skipped_fires WHERE job_name = $1 AND run_key = $2)",
        )
        .bind(&run.job_name)
        .bind(&run.run_key)
        .fetch_one(&mut *tx)
        .await?;
        if taken {
            tx.commit().await?;
            return Ok(ExclusiveClaim::Taken);
        }
        let running: Option<String> = sqlx::query_scalar(
            "SELECT run_key FROM job_runs WHERE job_name = $1 AND scheduled_at < $2 \
                 AND status IN ('claimed', 'dispatched', 'running', 'retrying') \
                 AND NOT (status = 'running' AND lease_until < now()) \
             ORDER BY scheduled_at DESC LIMIT 1",
        )
        .bind(&run.job_name)
        .bind(run.scheduled_at)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(previous) = running {
            if record_skip {
                sqlx::query(
                    "INSERT INTO skipped_fires (job_name, run_key, scheduled_at, reason, recorded_by) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                )
                .bind(&run.job_name)
                .bind(&run.run_key)
                .bind(run.scheduled_at)
                .bind(format!("overlap: previous run {previous} is not finished"))
                .bind(&run.claimed_by)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            return Ok(ExclusiveClaim::Overlapped);
        }
        let won = self.claim_in(&mut *tx, run).await?;
        tx.commit().await?;
        Ok(if won {
            ExclusiveClaim::Won
        } else {
            ExclusiveClaim::Taken
        })
    }

    /// Scheduled runs still `claimed` (never confirmed by the broker),
    /// claimed more than `grace` ago (database time) and due more than
    /// `older_than` ago: `(id, job_name, scheduled_at, superseded, spec)`,
    /// where `superseded` says a later fire of the schedule did reach the
    /// broker. The misfire policy decides which of them are still published.
    ///
    /// One page of at most `limit` rows, by schedule name and then newest
    /// instant first (so the first rows of a schedule are the ones a policy
    /// may keep), strictly after `after` (`(job_name, scheduled_at)` of the
    /// last row of the previous page) in that order.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn late_claims(
        &self,
        older_than: std::time::Duration,
        grace: std::time::Duration,
        limit: i64,
        after: Option<(&str, DateTime<Utc>)>,
    ) -> Result<Vec<LateClaim>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.late_claims(older_than, grace, limit, after).await,
        };
        Ok(sqlx::query_as(&format!(
            "SELECT r.id, r.job_name, r.scheduled_at, s.spec, \
                 EXISTS (SELECT 1 FROM job_runs n WHERE n.job_name = r.job_name \
                         AND n.scheduled_at > r.scheduled_at AND n.status <> 'claimed' \
                         AND {}) AS superseded \
             FROM job_runs r JOIN schedules s ON s.name = r.job_name \
             WHERE r.status = 'claimed' AND {} \
               AND r.claimed_at < now() - make_interval(secs => $2) \
               AND r.scheduled_at < now() - make_interval(secs => $1) \
               AND ($4::text IS NULL OR r.job_name > $4 \
                    OR (r.job_name = $4 AND r.scheduled_at < $5)) \
             ORDER BY r.job_name, r.scheduled_at DESC LIMIT $3",
            live_fire("n"),
            live_fire("r")
        ))
        .bind(older_than.as_secs_f64())
        .bind(grace.as_secs_f64())
        .bind(limit)
        .bind(after.map(|(name, _)| name))
        .bind(after.map(|(_, at)| at))
        .fetch_all(pool)
        .await?)
    }

    /// Gives up claimed runs that their schedule's misfire policy skips:
    /// they become `dead` with `reason` and are recorded in `skipped_fires`
    /// (by `by`). Only rows still `claimed`, not being published right now
    /// (their `next_dispatch_at` has passed, so no reconciler holds them)
    /// and claimed more than `grace` ago change. Returns how many did.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn skip_claimed(
        &self,
        ids: &[uuid::Uuid],
        reason: &str,
        by: &str,
        grace: std::time::Duration,
    ) -> Result<u64, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.skip_claimed(ids, reason, by, grace).await,
        };
        let mut tx = pool.begin().await?;
        let skipped = sqlx::query(
            "UPDATE job_runs SET status = 'dead', last_error = $2, finished_at = now(), \
                 next_dispatch_at = NULL, updated_at = now() \
             WHERE id = ANY($1) AND status = 'claimed' \
               AND next_dispatch_at <= now() AND claimed_at < now() - make_interval(secs => $3) \
             RETURNING job_name, run_key, scheduled_at",
        )
        .bind(ids)
        .bind(reason)
        .bind(grace.as_secs_f64())
        .fetch_all(&mut *tx)
        .await?;
        for r in &skipped {
            sqlx::query(
                "INSERT INTO skipped_fires (job_name, run_key, scheduled_at, reason, recorded_by) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            )
            .bind(r.try_get::<String, _>("job_name")?)
            .bind(r.try_get::<String, _>("run_key")?)
            .bind(r.try_get::<DateTime<Utc>, _>("scheduled_at")?)
            .bind(reason)
            .bind(by)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(u64::try_from(skipped.len()).unwrap_or(u64::MAX))
    }

    /// Which of `keys` (job name, run key) are recorded, as a run or as a
    /// skipped fire: the run keys found.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn recorded_keys(
        &self,
        keys: &[(String, String)],
    ) -> Result<std::collections::HashSet<String>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.recorded_keys(keys).await,
        };
        let names: Vec<&str> = keys.iter().map(|(n, _)| n.as_str()).collect();
        let run_keys: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT k.run_key FROM unnest($1::text[], $2::text[]) AS k(job_name, run_key) \
             WHERE EXISTS (SELECT 1 FROM job_runs r WHERE r.job_name = k.job_name AND r.run_key = k.run_key) \
                OR EXISTS (SELECT 1 FROM skipped_fires f WHERE f.job_name = k.job_name AND f.run_key = k.run_key)",
        )
        .bind(&names)
        .bind(&run_keys)
        .fetch_all(pool)
        .await?;
        Ok(found.into_iter().collect())
    }

    /// Finds runs that stopped moving: `dispatched` or `retrying` with no
    /// change for `after`, or `running` with an expired lease and no change
    /// for `after` (their worker died and no redelivery took them up: no
    /// worker alive for the type, the queue deleted). Each is reported once:
    /// its `last_error` becomes a `stuck: ...` reason (the status stays, so a
    /// late worker can still finish it). Returns `(run_key, status, reason)`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn mark_stuck(
        &self,
        after: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<(String, String, String)>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.mark_stuck(after, limit).await,
        };
        let rows = sqlx::query(
            "WITH stuck AS ( \
                 SELECT id FROM job_runs \
                 WHERE status IN ('dispatched', 'running', 'retrying') \
                   AND updated_at < now() - make_interval(secs => $1) \
                   AND next_dispatch_at IS NULL \
                   AND (status <> 'running' OR lease_until IS NULL OR lease_until < now()) \
                   AND (last_error IS NULL OR last_error NOT LIKE 'stuck:%') \
                 LIMIT $2 FOR UPDATE SKIP LOCKED) \
             UPDATE job_runs j SET last_error = 'stuck: no progress since ' || \
                 to_char(j.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') || ' while ' || j.status || \
                 CASE j.status WHEN 'dispatched' THEN ' (no worker took it: is a worker group serving ' || j.job_type || ' running?)' \
                      WHEN 'running' THEN ' (its worker died and no redelivery took it up)' \
                      ELSE ' (its retry never came: is a worker or a scheduler replica running?)' END \
             FROM stuck WHERE j.id = stuck.id \
             RETURNING j.run_key, j.status, j.last_error",
        )
        .bind(after.as_secs_f64())
        .bind(limit)
        .fetch_all(pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                Ok((
                    r.try_get("run_key")?,
                    r.try_get("status")?,
                    r.try_get("last_error")?,
                ))
            })
            .collect()
    }

    /// The fires of `job_name` skipped for overlap, newest first.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn skipped_fires(
        &self,
        job_name: &str,
        limit: i64,
    ) -> Result<Vec<(String, String)>, LedgerError> {
        let pool = match self.pg() {
            Ok(pool) => pool,
            Err(lite) => return lite.skipped_fires(job_name, limit).await,
        };
        let rows = sqlx::query(
            "SELECT run_key, reason FROM skipped_fires WHERE job_name = $1 ORDER BY scheduled_at DESC LIMIT $2",
        )
        .bind(job_name)
        .bind(limit)
        .fetch_all(pool)
        .await?;
        rows.into_iter()
            .map(|r| Ok((r.try_get("run_key")?, r.try_get("reason")?)))
            .collect()
    }
}
