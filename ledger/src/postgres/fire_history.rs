//! A schedule's past fires on Postgres: the latest fire, claims under an
//! overlap policy (decided under a transaction-scoped advisory lock on the
//! schedule name) and the release of buffered fires, late claims, skips and
//! stuck runs.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;

use super::PgStore;
use crate::cancel::CancelRequest;
use crate::fire_history::{is_live_claimer, late_claims_sql, live_fire, ExclusiveClaim, LateClaim};
use crate::missed_fire::{decided_fire, MissedFire};
use crate::overlap::{decide, inserted, skipped, Earlier, EarlierRow, Plan, RAN_OUT_NOTE};
use crate::runs::{run_columns_of, NewRun, RunRecord};
use crate::store::FireHistoryStore;
use crate::{LedgerError, OverlapRule};

#[async_trait]
impl FireHistoryStore for PgStore {
    async fn last_fires(
        &self,
        job_names: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, LedgerError> {
        let pool = &self.route;
        // One index probe per name and partition
        // (job_runs_job_name_scheduled_idx); a schedule whose newest fire
        // went with a dropped day partition has it in schedule_last_fires.
        let rows = sqlx::query(&format!(
            "SELECT n.name, GREATEST((SELECT max(r.scheduled_at) FROM job_runs r \
                                      WHERE r.job_name = n.name AND {}), \
                                     (SELECT l.scheduled_at FROM schedule_last_fires l \
                                      WHERE l.job_name = n.name)) AS last \
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

    async fn claim_exclusive_with(
        &self,
        run: &NewRun,
        rule: Option<OverlapRule>,
        record_skip: bool,
    ) -> Result<ExclusiveClaim, LedgerError> {
        let pool = &self.route;
        let mut tx = pool.begin().await?;
        // Serialises decisions for this schedule only; released at commit.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7))")
            .bind(&run.job_name)
            .execute(self.route.on(&mut tx))
            .await?;
        let taken: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM job_runs WHERE job_name = $1 AND run_key = $2 \
                            AND key_instant = belfry_key_instant($1, $2)) \
                 OR EXISTS (SELECT 1 FROM skipped_fires WHERE job_name = $1 AND run_key = $2)",
        )
        .bind(&run.job_name)
        .bind(&run.run_key)
        .fetch_one(self.route.on(&mut tx))
        .await?;
        if taken {
            tx.commit().await?;
            return Ok(ExclusiveClaim::Taken);
        }
        // The counter of a bounded schedule; only fires of the timetable
        // count. A plain read: every decrement is made under the advisory
        // lock held here. Not `FOR UPDATE`: the schedule's row is locked
        // only by the decrement below, after any run row this decision
        // cancels, the order a worker's failure takes too (its run's row,
        // then the schedule's through the pause_after_failures trigger),
        // so the two cannot deadlock.
        let left: Option<i64> = if is_live_claimer(&run.claimed_by) {
            sqlx::query_scalar("SELECT remaining_runs FROM schedules WHERE name = $1")
                .bind(&run.job_name)
                .fetch_optional(self.route.on(&mut tx))
                .await?
                .flatten()
        } else {
            None
        };
        // Unfinished earlier runs. A policy that cancels locks them (in id
        // order, as every batched statement locks run rows), so none
        // starts or ends between this read and its cancel: the decision to
        // hold the new fire stands on what the cancels find.
        let locks = if matches!(
            rule,
            Some(OverlapRule::CancelOther | OverlapRule::TerminateOther)
        ) {
            " FOR UPDATE"
        } else {
            ""
        };
        let rows: Vec<EarlierRow> = if rule.is_none() || left == Some(0) {
            Vec::new()
        } else {
            sqlx::query_as(&format!(
                "SELECT id, run_key, status, \
                     (status = 'running' AND lease_until IS NOT NULL AND lease_until < now()), \
                     scheduled_at \
                 FROM job_runs WHERE job_name = $1 AND scheduled_at < $2 \
                     AND status IN ('buffered', 'claimed', 'dispatched', 'running', 'retrying') \
                 ORDER BY id{locks}"
            ))
            .bind(&run.job_name)
            .bind(run.scheduled_at)
            .fetch_all(self.route.on(&mut tx))
            .await?
        };
        let earlier = Earlier::parse(rows)?;
        let decided = decide(rule, &run.run_key, left, &earlier);
        let (buffered, cancel, immediate, reason) = match decided {
            Plan::Skip(reason) => {
                if record_skip {
                    sqlx::query(
                        "INSERT INTO skipped_fires (job_name, run_key, scheduled_at, reason, recorded_by) \
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                    )
                    .bind(&run.job_name)
                    .bind(&run.run_key)
                    .bind(run.scheduled_at)
                    .bind(reason)
                    .bind(&run.claimed_by)
                    .execute(self.route.on(&mut tx))
                    .await?;
                }
                tx.commit().await?;
                return Ok(skipped(left));
            }
            Plan::Insert {
                buffered,
                cancel,
                immediate,
                reason,
            } => (buffered, cancel, immediate, reason),
        };
        let won =
            !super::runs::claim_rows(self.route.on(&mut tx), std::slice::from_ref(run), buffered)
                .await?
                .is_empty();
        // No partition hint is kept for this claim: it is dispatched (or
        // buffered) through the outbox, whose statements find it by id.
        // Only the claim that won cancels.
        for id in cancel.into_iter().filter(|_| won) {
            let request = CancelRequest {
                id,
                reason: &reason,
                immediate,
            };
            super::runs::cancel_in(&self.route, &mut tx, &request).await?;
        }
        if won && left.is_some() {
            // Every expression reads the counter as it was: the claim of
            // the last run pauses the schedule, saying why.
            sqlx::query(
                "UPDATE schedules SET remaining_runs = remaining_runs - 1, \
                     paused = paused OR remaining_runs = 1, \
                     pause_note = CASE WHEN remaining_runs = 1 THEN $2 ELSE pause_note END \
                 WHERE name = $1",
            )
            .bind(&run.job_name)
            .bind(RAN_OUT_NOTE)
            .execute(self.route.on(&mut tx))
            .await?;
        }
        tx.commit().await?;
        Ok(inserted(won, buffered))
    }

    async fn release_buffered(&self, limit: i64) -> Result<Vec<RunRecord>, LedgerError> {
        // The oldest buffered run of each schedule with nothing unfinished
        // (a run whose worker is gone does not count, as in the decision
        // above) that is not paused (a paused schedule's buffered fires
        // wait for its resume). Two replicas releasing at once pick the same row; its
        // guard lets one update it, and the other's NOT EXISTS sees the
        // released run as unfinished from then on.
        Ok(sqlx::query_as(&format!(
            "WITH next AS ( \
                 SELECT DISTINCT ON (b.job_name) b.id FROM job_runs b \
                 WHERE b.status = 'buffered' \
                   AND NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.job_name = b.job_name \
                       AND r.status IN ('claimed', 'dispatched', 'running', 'retrying') \
                       AND NOT (r.status = 'running' AND r.lease_until < now())) \
                   AND NOT EXISTS (SELECT 1 FROM schedules s WHERE s.name = b.job_name AND s.paused) \
                 ORDER BY b.job_name, b.scheduled_at LIMIT $1) \
             UPDATE job_runs j SET status = 'claimed', claimed_at = now(), next_dispatch_at = now(), \
                 updated_at = now() \
             FROM next WHERE j.id = next.id AND j.status = 'buffered' \
             RETURNING {}",
            run_columns_of("j")
        ))
        .bind(limit)
        .fetch_all(&self.route)
        .await?)
    }

    async fn late_claims(
        &self,
        older_than: std::time::Duration,
        grace: std::time::Duration,
        limit: i64,
        after: Option<(&str, DateTime<Utc>)>,
    ) -> Result<Vec<LateClaim>, LedgerError> {
        let pool = &self.route;
        let late = "r.claimed_at < now() - make_interval(secs => $2) \
                    AND r.scheduled_at < now() - make_interval(secs => $1)";
        Ok(sqlx::query_as(&late_claims_sql(late))
            .bind(older_than.as_secs_f64())
            .bind(grace.as_secs_f64())
            .bind(limit)
            .bind(after.map(|(name, _)| name))
            .bind(after.map(|(_, at)| at))
            .fetch_all(pool)
            .await?)
    }

    async fn skip_claimed(
        &self,
        ids: &[uuid::Uuid],
        reason: &str,
        by: &str,
        grace: std::time::Duration,
    ) -> Result<u64, LedgerError> {
        let pool = &self.route;
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
        .fetch_all(self.route.on(&mut tx))
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
            .execute(self.route.on(&mut tx))
            .await?;
        }
        tx.commit().await?;
        Ok(u64::try_from(skipped.len()).unwrap_or(u64::MAX))
    }

    async fn recorded_keys(
        &self,
        keys: &[(String, String)],
    ) -> Result<std::collections::HashSet<String>, LedgerError> {
        let pool = &self.route;
        let names: Vec<&str> = keys.iter().map(|(n, _)| n.as_str()).collect();
        let run_keys: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT k.run_key FROM unnest($1::text[], $2::text[]) AS k(job_name, run_key) \
             WHERE EXISTS (SELECT 1 FROM job_runs r WHERE r.job_name = k.job_name AND r.run_key = k.run_key \
                           AND r.key_instant = belfry_key_instant(k.job_name, k.run_key)) \
                OR EXISTS (SELECT 1 FROM skipped_fires f WHERE f.job_name = k.job_name AND f.run_key = k.run_key)",
        )
        .bind(&names)
        .bind(&run_keys)
        .fetch_all(pool)
        .await?;
        Ok(found.into_iter().collect())
    }

    async fn record_missed_fires(&self, fires: &[MissedFire], by: &str) -> Result<(), LedgerError> {
        let (names, at) = fire_columns(fires);
        // In key order: two replicas recording the same fires (a shard
        // held by both during a steal) wait on each other's keys in one
        // order, never in a cycle.
        sqlx::query(
            "INSERT INTO missed_fires (job_name, scheduled_at, recorded_by) \
             SELECT n, a, $3 FROM unnest($1::text[], $2::timestamptz[]) AS f(n, a) \
             ORDER BY n, a \
             ON CONFLICT DO NOTHING",
        )
        .bind(&names)
        .bind(&at)
        .bind(by)
        .execute(&self.route)
        .await?;
        Ok(())
    }

    async fn undecided_missed_fires(
        &self,
        job_names: &[String],
        limit: i64,
    ) -> Result<Vec<MissedFire>, LedgerError> {
        // The main query sees the rows as they were before the CTE's
        // delete, so the decided ones are left out by name.
        let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(&format!(
            "WITH decided AS ( \
                 DELETE FROM missed_fires m WHERE m.job_name = ANY($1) AND {} \
                 RETURNING m.job_name, m.scheduled_at) \
             SELECT job_name, scheduled_at FROM missed_fires WHERE job_name = ANY($1) \
               AND (job_name, scheduled_at) NOT IN (SELECT job_name, scheduled_at FROM decided) \
             ORDER BY scheduled_at, job_name LIMIT $2",
            decided_fire("m")
        ))
        .bind(job_names)
        .bind(limit)
        .fetch_all(&self.route)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(job_name, scheduled_at)| MissedFire {
                job_name,
                scheduled_at,
            })
            .collect())
    }

    async fn forget_missed_fires(&self, fires: &[MissedFire]) -> Result<u64, LedgerError> {
        let (names, at) = fire_columns(fires);
        let done = sqlx::query(
            "DELETE FROM missed_fires m USING unnest($1::text[], $2::timestamptz[]) AS f(n, a) \
             WHERE m.job_name = f.n AND m.scheduled_at = f.a",
        )
        .bind(&names)
        .bind(&at)
        .execute(&self.route)
        .await?;
        Ok(done.rows_affected())
    }

    async fn mark_stuck(
        &self,
        after: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<(String, String, String)>, LedgerError> {
        let pool = &self.route;
        Ok(sqlx::query_as(
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
        .await?)
    }

    async fn skipped_fires(
        &self,
        job_name: &str,
        limit: i64,
    ) -> Result<Vec<(String, String)>, LedgerError> {
        let pool = &self.route;
        Ok(sqlx::query_as(
            "SELECT run_key, reason FROM skipped_fires WHERE job_name = $1 ORDER BY scheduled_at DESC LIMIT $2",
        )
        .bind(job_name)
        .bind(limit)
        .fetch_all(pool)
        .await?)
    }
}

/// `fires` as the two arrays the statements `unnest`: names and instants.
fn fire_columns(fires: &[MissedFire]) -> (Vec<&str>, Vec<DateTime<Utc>>) {
    fires
        .iter()
        .map(|f| (f.job_name.as_str(), f.scheduled_at))
        .unzip()
}
