//! A schedule's past fires on the embedded ledger: the statements of
//! [`crate::fire_history`] in SQLite's dialect. Decisions that read and then
//! write (an exclusive claim, skipping late claims) run in `BEGIN IMMEDIATE`
//! transactions: the write lock is taken before the read, which serialises
//! them as the Postgres advisory lock and row locks do.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use uuid::Uuid;

use async_trait::async_trait;

use super::{now, now_minus, ts, SqliteLedger};
use crate::cancel::{CancelOutcome, CancelRequest};
use crate::fire_history::{is_live_claimer, late_claims_sql, live_fire, ExclusiveClaim, LateClaim};
use crate::missed_fire::{decided_fire, MissedFire};
use crate::overlap::{decide, inserted, skipped, Earlier, EarlierRow, Plan, RAN_OUT_NOTE};
use crate::runs::{NewRun, RunRecord, RUN_COLUMNS};
use crate::store::FireHistoryStore;
use crate::{LedgerError, OverlapRule};

async fn insert_skip(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    job_name: &str,
    run_key: &str,
    scheduled_at: &str,
    reason: &str,
    by: &str,
) -> Result<(), LedgerError> {
    sqlx::query(
        "INSERT INTO skipped_fires (job_name, run_key, scheduled_at, reason, recorded_by, recorded_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
    )
    .bind(job_name)
    .bind(run_key)
    .bind(scheduled_at)
    .bind(reason)
    .bind(by)
    .bind(now())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[async_trait]
impl FireHistoryStore for SqliteLedger {
    async fn last_fires(
        &self,
        job_names: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, LedgerError> {
        let sql = format!(
            "SELECT max(r.scheduled_at) FROM job_runs r WHERE r.job_name = ?1 AND {}",
            live_fire("r")
        );
        let mut out = HashMap::with_capacity(job_names.len());
        // One index probe per name, as on Postgres; no round trips to save.
        for name in job_names {
            let last: Option<DateTime<Utc>> = sqlx::query_scalar(&sql)
                .bind(name)
                .fetch_one(&self.pool)
                .await?;
            if let Some(last) = last {
                out.insert(name.clone(), last);
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
        // The write lock is held from the first statement to the commit:
        // the overlap check, the cancels and the insert are one decision.
        let mut tx = self.write_tx().await?;
        let taken: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM job_runs WHERE job_name = ?1 AND run_key = ?2) \
                 OR EXISTS (SELECT 1 FROM skipped_fires WHERE job_name = ?1 AND run_key = ?2)",
        )
        .bind(&run.job_name)
        .bind(&run.run_key)
        .fetch_one(&mut *tx)
        .await?;
        if taken {
            tx.commit().await?;
            return Ok(ExclusiveClaim::Taken);
        }
        let at = now();
        // The counter of a bounded schedule; only fires of the timetable
        // count. The write lock makes reading and decrementing it one
        // decision.
        let left: Option<i64> = if is_live_claimer(&run.claimed_by) {
            sqlx::query_scalar("SELECT remaining_runs FROM schedules WHERE name = ?1")
                .bind(&run.job_name)
                .fetch_optional(&mut *tx)
                .await?
                .flatten()
        } else {
            None
        };
        let rows: Vec<EarlierRow> = if rule.is_none() || left == Some(0) {
            Vec::new()
        } else {
            sqlx::query_as(
            "SELECT id, run_key, status, \
                 (status = 'running' AND lease_until IS NOT NULL AND lease_until < ?3), scheduled_at \
             FROM job_runs WHERE job_name = ?1 AND scheduled_at < ?2 \
                 AND status IN ('buffered', 'claimed', 'dispatched', 'running', 'retrying') \
             ORDER BY id",
        )
        .bind(&run.job_name)
        .bind(ts(run.scheduled_at))
        .bind(&at)
        .fetch_all(&mut *tx)
        .await?
        };
        let earlier = Earlier::parse(rows)?;
        let decided = decide(rule, &run.run_key, left, &earlier);
        let (buffered, cancel, immediate, reason) = match decided {
            Plan::Skip(reason) => {
                if record_skip {
                    insert_skip(
                        &mut tx,
                        &run.job_name,
                        &run.run_key,
                        &ts(run.scheduled_at),
                        &reason,
                        &run.claimed_by,
                    )
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
        let won = !super::runs::claim_in(&mut tx, std::slice::from_ref(run), &at, buffered)
            .await?
            .is_empty();
        // Only the claim that won cancels.
        let mut requested = Vec::new();
        for id in cancel.into_iter().filter(|_| won) {
            let request = CancelRequest {
                id,
                reason: &reason,
                immediate,
            };
            if super::runs::cancel_in(&mut tx, &request).await? == CancelOutcome::Requested {
                requested.push(id);
            }
        }
        let paused = won && left == Some(1);
        if won && left.is_some() {
            sqlx::query(
                "UPDATE schedules SET remaining_runs = remaining_runs - 1, \
                     paused = (paused OR remaining_runs = 1), \
                     pause_note = CASE WHEN remaining_runs = 1 THEN ?2 ELSE pause_note END, \
                     updated_at = ?3 \
                 WHERE name = ?1",
            )
            .bind(&run.job_name)
            .bind(RAN_OUT_NOTE)
            .bind(&at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        if paused {
            // The replicas of this process drop it from their timers.
            self.announce(&run.job_name);
        }
        for id in requested {
            self.announce_cancel(&CancelRequest {
                id,
                reason: &reason,
                immediate,
            });
        }
        Ok(inserted(won, buffered))
    }

    async fn release_buffered(&self, limit: i64) -> Result<Vec<RunRecord>, LedgerError> {
        let at = now();
        // The one writer: the choice and the update are one decision.
        let mut tx = self.write_tx().await?;
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT (SELECT b.id FROM job_runs b WHERE b.job_name = s.job_name \
                     AND b.status = 'buffered' ORDER BY b.scheduled_at LIMIT 1) \
             FROM (SELECT DISTINCT job_name FROM job_runs WHERE status = 'buffered') s \
             WHERE NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.job_name = s.job_name \
                 AND r.status IN ('claimed', 'dispatched', 'running', 'retrying') \
                 AND NOT (r.status = 'running' AND r.lease_until < ?1)) \
               AND NOT EXISTS (SELECT 1 FROM schedules p WHERE p.name = s.job_name AND p.paused) \
             LIMIT ?2",
        )
        .bind(&at)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut released = Vec::with_capacity(ids.len());
        for id in ids {
            let run: Option<RunRecord> = sqlx::query_as(&format!(
                "UPDATE job_runs SET status = 'claimed', claimed_at = ?2, next_dispatch_at = ?2, \
                     updated_at = ?2 \
                 WHERE id = ?1 AND status = 'buffered' RETURNING {RUN_COLUMNS}"
            ))
            .bind(id)
            .bind(&at)
            .fetch_optional(&mut *tx)
            .await?;
            released.extend(run);
        }
        tx.commit().await?;
        Ok(released)
    }

    async fn late_claims(
        &self,
        older_than: Duration,
        grace: Duration,
        limit: i64,
        after: Option<(&str, DateTime<Utc>)>,
    ) -> Result<Vec<LateClaim>, LedgerError> {
        let late = "r.claimed_at < $2 AND r.scheduled_at < $1";
        Ok(sqlx::query_as(&late_claims_sql(late))
            .bind(now_minus(older_than))
            .bind(now_minus(grace))
            .bind(limit)
            .bind(after.map(|(name, _)| name))
            .bind(after.map(|(_, at)| ts(at)))
            .fetch_all(&self.pool)
            .await?)
    }

    async fn skip_claimed(
        &self,
        ids: &[Uuid],
        reason: &str,
        by: &str,
        grace: Duration,
    ) -> Result<u64, LedgerError> {
        let at = now();
        let claimed_before = now_minus(grace);
        let mut skipped = 0;
        let mut tx = self.write_tx().await?;
        for id in ids {
            let row = sqlx::query(
                "UPDATE job_runs SET status = 'dead', last_error = ?2, finished_at = ?3, \
                     next_dispatch_at = NULL, updated_at = ?3 \
                 WHERE id = ?1 AND status = 'claimed' \
                   AND next_dispatch_at <= ?3 AND claimed_at < ?4 \
                 RETURNING job_name, run_key, scheduled_at",
            )
            .bind(id)
            .bind(reason)
            .bind(&at)
            .bind(&claimed_before)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(r) = row {
                let name: String = r.try_get("job_name")?;
                let key: String = r.try_get("run_key")?;
                let instant: String = r.try_get("scheduled_at")?;
                insert_skip(&mut tx, &name, &key, &instant, reason, by).await?;
                skipped += 1;
            }
        }
        tx.commit().await?;
        Ok(skipped)
    }

    async fn recorded_keys(
        &self,
        keys: &[(String, String)],
    ) -> Result<HashSet<String>, LedgerError> {
        let mut found = HashSet::new();
        for (name, key) in keys {
            let recorded: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM job_runs WHERE job_name = ?1 AND run_key = ?2) \
                     OR EXISTS (SELECT 1 FROM skipped_fires WHERE job_name = ?1 AND run_key = ?2)",
            )
            .bind(name)
            .bind(key)
            .fetch_one(&self.pool)
            .await?;
            if recorded {
                found.insert(key.clone());
            }
        }
        Ok(found)
    }

    async fn record_missed_fires(&self, fires: &[MissedFire], by: &str) -> Result<(), LedgerError> {
        let mut tx = self.write_tx().await?;
        let at = now();
        for f in fires {
            sqlx::query(
                "INSERT INTO missed_fires (job_name, scheduled_at, recorded_by, recorded_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            )
            .bind(&f.job_name)
            .bind(ts(f.scheduled_at))
            .bind(by)
            .bind(&at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn undecided_missed_fires(
        &self,
        job_names: &[String],
        limit: i64,
    ) -> Result<Vec<MissedFire>, LedgerError> {
        let mut out = Vec::new();
        let mut tx = self.write_tx().await?;
        // One index probe per name, as `last_fires`; the decided ones are
        // removed first, in the same transaction.
        for name in job_names {
            sqlx::query(&format!(
                "DELETE FROM missed_fires WHERE job_name = ?1 AND {}",
                decided_fire("missed_fires")
            ))
            .bind(name)
            .execute(&mut *tx)
            .await?;
            let rows: Vec<DateTime<Utc>> = sqlx::query_scalar(
                "SELECT scheduled_at FROM missed_fires WHERE job_name = ?1 ORDER BY scheduled_at LIMIT ?2",
            )
            .bind(name)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
            out.extend(rows.into_iter().map(|scheduled_at| MissedFire {
                job_name: name.clone(),
                scheduled_at,
            }));
        }
        tx.commit().await?;
        out.sort_by(|a, b| (a.scheduled_at, &a.job_name).cmp(&(b.scheduled_at, &b.job_name)));
        out.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(out)
    }

    async fn forget_missed_fires(&self, fires: &[MissedFire]) -> Result<u64, LedgerError> {
        let mut tx = self.write_tx().await?;
        let mut forgotten = 0;
        for f in fires {
            forgotten +=
                sqlx::query("DELETE FROM missed_fires WHERE job_name = ?1 AND scheduled_at = ?2")
                    .bind(&f.job_name)
                    .bind(ts(f.scheduled_at))
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
        }
        tx.commit().await?;
        Ok(forgotten)
    }

    async fn mark_stuck(
        &self,
        after: Duration,
        limit: i64,
    ) -> Result<Vec<(String, String, String)>, LedgerError> {
        let at = now();
        Ok(sqlx::query_as(
            "UPDATE job_runs SET last_error = 'stuck: no progress since ' || \
                 substr(updated_at, 1, 19) || 'Z while ' || status || \
                 CASE status WHEN 'dispatched' THEN ' (no worker took it: is a worker group serving ' || job_type || ' running?)' \
                      WHEN 'running' THEN ' (its worker died and no redelivery took it up)' \
                      ELSE ' (its retry never came: is a worker or a scheduler replica running?)' END \
             WHERE id IN ( \
                 SELECT id FROM job_runs \
                 WHERE status IN ('dispatched', 'running', 'retrying') \
                   AND updated_at < ?1 AND next_dispatch_at IS NULL \
                   AND (status <> 'running' OR lease_until IS NULL OR lease_until < ?2) \
                   AND (last_error IS NULL OR last_error NOT LIKE 'stuck:%') \
                 LIMIT ?3) \
             RETURNING run_key, status, last_error",
        )
        .bind(now_minus(after))
        .bind(&at)
        .bind(limit)
        .fetch_all(&self.writer)
        .await?)
    }

    async fn skipped_fires(
        &self,
        job_name: &str,
        limit: i64,
    ) -> Result<Vec<(String, String)>, LedgerError> {
        Ok(sqlx::query_as(
            "SELECT run_key, reason FROM skipped_fires WHERE job_name = ?1 \
             ORDER BY scheduled_at DESC LIMIT ?2",
        )
        .bind(job_name)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }
}
