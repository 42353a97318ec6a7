//! Alert events and deliveries on the embedded database (see
//! `crate::alerts` and the Postgres twin, `postgres/alerts.rs`). Routing
//! and taking deliveries are read-then-write decisions, so each runs in a
//! `BEGIN IMMEDIATE` transaction on the one writer: what `FOR UPDATE (SKIP
//! LOCKED)` gives on Postgres.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{now_minus, now_plus, ts, SqliteLedger};
use crate::alerts::throttle::{decide, Throttled};
use crate::alerts::{
    AlertEvent, AlertRoute, DeliveryRecord, DeliveryResult, DueDelivery, NewAlertEvent,
    DELIVERY_COLUMNS, EVENT_COLUMNS,
};
use crate::store::AlertStore;
use crate::LedgerError;

#[async_trait]
impl AlertStore for SqliteLedger {
    async fn record_alert(&self, event: &NewAlertEvent) -> Result<bool, LedgerError> {
        let done = sqlx::query(
            "INSERT OR IGNORE INTO alert_events \
                 (id, kind, subject, job_name, job_type, detail, channel, dedupe_key, occurred_at) \
             VALUES (?1, ?2, ?3, ?4, (SELECT job_type FROM schedules WHERE name = ?4), ?5, ?6, ?7, ?8)",
        )
        .bind(Uuid::now_v7())
        .bind(event.kind.as_str())
        .bind(&event.subject)
        .bind(&event.job_name)
        .bind(&event.detail)
        .bind(&event.channel)
        .bind(&event.dedupe_key)
        .bind(ts(Utc::now()))
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn unrouted_alerts(&self, limit: i64) -> Result<Vec<AlertEvent>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {EVENT_COLUMNS} FROM alert_events e WHERE e.routed_at IS NULL \
             ORDER BY e.occurred_at LIMIT ?1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn route_alert(
        &self,
        event: Uuid,
        subject: &str,
        routes: &[AlertRoute],
    ) -> Result<bool, LedgerError> {
        let mut tx = self.write_tx().await?;
        let open: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM alert_events WHERE id = ?1 AND routed_at IS NULL)",
        )
        .bind(event)
        .fetch_one(&mut *tx)
        .await?;
        if !open {
            tx.commit().await?;
            return Ok(false);
        }
        let now = Utc::now();
        for route in routes {
            let delivery = Uuid::now_v7();
            if let Some(refusal) = &route.refusal {
                sqlx::query(
                    "INSERT OR IGNORE INTO alert_deliveries \
                         (id, event_id, channel, status, due_at, created_at, last_error) \
                     VALUES (?1, ?2, ?3, 'failed', ?4, ?4, ?5)",
                )
                .bind(delivery)
                .bind(event)
                .bind(&route.channel)
                .bind(ts(now))
                .bind(refusal)
                .execute(&mut *tx)
                .await?;
                continue;
            }
            let decision = if route.window.is_zero() {
                None
            } else {
                let row: Option<(DateTime<Utc>, Option<Uuid>)> = sqlx::query_as(
                    "SELECT window_start, carrier FROM alert_throttles \
                     WHERE channel = ?1 AND subject = ?2",
                )
                .bind(&route.channel)
                .bind(subject)
                .fetch_optional(&mut *tx)
                .await?;
                let (start, carrier) = row.unwrap_or((DateTime::UNIX_EPOCH, None));
                let length =
                    chrono::Duration::from_std(route.window).unwrap_or(chrono::Duration::MAX);
                Some(decide(start, carrier, length, now))
            };
            let (status, due) = match decision {
                None | Some(Throttled::SendNow) => ("pending", now),
                Some(Throttled::Carry { due }) => ("pending", due),
                Some(Throttled::Fold) => ("folded", now),
            };
            sqlx::query(
                "INSERT OR IGNORE INTO alert_deliveries (id, event_id, channel, status, due_at, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .bind(delivery)
            .bind(event)
            .bind(&route.channel)
            .bind(status)
            .bind(ts(due))
            .bind(ts(now))
            .execute(&mut *tx)
            .await?;
            let update = match decision {
                None => None,
                Some(Throttled::SendNow) => Some(
                    sqlx::query(
                        "INSERT INTO alert_throttles (channel, subject, window_start) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (channel, subject) DO UPDATE SET \
                             window_start = excluded.window_start, carrier = NULL, folded = 0",
                    )
                    .bind(&route.channel)
                    .bind(subject)
                    .bind(ts(now)),
                ),
                Some(Throttled::Carry { .. }) => Some(
                    sqlx::query(
                        "UPDATE alert_throttles SET carrier = ?3, folded = 0 \
                         WHERE channel = ?1 AND subject = ?2",
                    )
                    .bind(&route.channel)
                    .bind(subject)
                    .bind(delivery),
                ),
                Some(Throttled::Fold) => Some(
                    sqlx::query(
                        "UPDATE alert_throttles SET folded = folded + 1 \
                         WHERE channel = ?1 AND subject = ?2",
                    )
                    .bind(&route.channel)
                    .bind(subject),
                ),
            };
            if let Some(update) = update {
                update.execute(&mut *tx).await?;
            }
        }
        sqlx::query("UPDATE alert_events SET routed_at = ?2 WHERE id = ?1")
            .bind(event)
            .bind(ts(now))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn take_alert_deliveries(
        &self,
        owner: &str,
        channels: &[String],
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<DueDelivery>, LedgerError> {
        let channels = serde_json::to_string(channels)
            .map_err(|e| LedgerError::Query(sqlx::Error::Encode(Box::new(e))))?;
        let mut tx = self.write_tx().await?;
        let at = ts(Utc::now());
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM alert_deliveries \
             WHERE status = 'pending' AND due_at <= ?1 AND (lease_until IS NULL OR lease_until < ?1) \
               AND channel IN (SELECT value FROM json_each(?3)) \
             ORDER BY due_at LIMIT ?2",
        )
        .bind(&at)
        .bind(limit)
        .bind(&channels)
        .fetch_all(&mut *tx)
        .await?;
        let mut taken = Vec::with_capacity(ids.len());
        for id in ids {
            sqlx::query(
                "UPDATE alert_deliveries SET lease_owner = ?2, lease_until = ?3, \
                     attempts = attempts + 1 WHERE id = ?1",
            )
            .bind(id)
            .bind(owner)
            .bind(now_plus(lease))
            .execute(&mut *tx)
            .await?;
            // A carrier: the folded count moves onto it, its window restarts.
            let folded: Option<i64> =
                sqlx::query_scalar("SELECT folded FROM alert_throttles WHERE carrier = ?1")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some(folded) = folded {
                sqlx::query(
                    "UPDATE alert_throttles SET carrier = NULL, window_start = ?2, folded = 0 \
                     WHERE carrier = ?1",
                )
                .bind(id)
                .bind(&at)
                .execute(&mut *tx)
                .await?;
                sqlx::query("UPDATE alert_deliveries SET folded = ?2 WHERE id = ?1")
                    .bind(id)
                    .bind(folded)
                    .execute(&mut *tx)
                    .await?;
            }
            let row: (Uuid, String, i32, i64) = sqlx::query_as(
                "SELECT event_id, channel, attempts, folded FROM alert_deliveries WHERE id = ?1",
            )
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
            let event: AlertEvent = sqlx::query_as(&format!(
                "SELECT {EVENT_COLUMNS} FROM alert_events e WHERE e.id = ?1"
            ))
            .bind(row.0)
            .fetch_one(&mut *tx)
            .await?;
            taken.push(DueDelivery {
                id,
                channel: row.1,
                attempts: row.2,
                folded: row.3,
                event,
            });
        }
        tx.commit().await?;
        Ok(taken)
    }

    async fn finish_alert_delivery(
        &self,
        id: Uuid,
        owner: &str,
        attempt: i32,
        result: &DeliveryResult,
    ) -> Result<bool, LedgerError> {
        let (status, due, error) = result.columns();
        let at = ts(Utc::now());
        self.moved(
            sqlx::query(
                "UPDATE alert_deliveries SET status = ?3, due_at = COALESCE(?4, due_at), \
                     last_error = COALESCE(?5, last_error), \
                     sent_at = CASE WHEN ?3 = 'sent' THEN ?6 ELSE sent_at END, \
                     lease_owner = NULL, lease_until = NULL \
                 WHERE id = ?1 AND lease_owner = ?2 AND attempts = ?7 AND status = 'pending'",
            )
            .bind(id)
            .bind(owner)
            .bind(status)
            .bind(due.map(ts))
            .bind(error)
            .bind(at)
            .bind(attempt),
        )
        .await
    }

    async fn alert_deliveries(
        &self,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM alert_deliveries d \
             JOIN alert_events e ON e.id = d.event_id \
             WHERE (?1 IS NULL OR d.status = ?1) \
             ORDER BY d.created_at DESC, d.id DESC LIMIT ?2"
        ))
        .bind(status)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn alert_events(&self, limit: i64) -> Result<Vec<AlertEvent>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {EVENT_COLUMNS} FROM alert_events e ORDER BY e.occurred_at DESC LIMIT ?1"
        ))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn schedule_deadlines(&self) -> Result<Vec<(String, String)>, LedgerError> {
        Ok(sqlx::query_as(
            "SELECT name, json_extract(spec, '$.deadline') FROM schedules \
             WHERE json_extract(spec, '$.deadline') IS NOT NULL ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    async fn record_late_runs(&self, deadlines: &[(String, Duration)]) -> Result<u64, LedgerError> {
        let at = ts(Utc::now());
        let mut recorded = 0;
        for (name, deadline) in deadlines {
            let done = sqlx::query(
                "INSERT OR IGNORE INTO alert_events \
                     (id, kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key, occurred_at) \
                 SELECT randomblob(16), 'run.late', r.job_name, r.job_name, r.job_type, r.id, r.run_key, \
                     CASE WHEN r.attempts = 0 THEN 'not started' ELSE 'not finished' END \
                         || ' ' || ?3 || ' s after its scheduled instant ' \
                         || substr(r.scheduled_at, 1, 19) || 'Z (status ' || r.status || ')', \
                     'run.late:' || hex(r.id), ?4 \
                 FROM (SELECT * FROM job_runs INDEXED BY job_runs_unfinished_idx \
                       WHERE status IN ('claimed', 'dispatched', 'running', 'retrying') \
                         AND job_name = ?1 AND scheduled_at < ?2 \
                       UNION ALL \
                       SELECT * FROM job_runs INDEXED BY job_runs_buffered_idx \
                       WHERE status = 'buffered' AND job_name = ?1 AND scheduled_at < ?2) r",
            )
            .bind(name)
            .bind(now_minus(*deadline))
            .bind(deadline.as_secs_f64())
            .bind(&at)
            .execute(&self.writer)
            .await?;
            recorded += done.rows_affected();
        }
        Ok(recorded)
    }

    async fn prune_alerts(&self, before: DateTime<Utc>, limit: i64) -> Result<u64, LedgerError> {
        let mut tx = self.write_tx().await?;
        sqlx::query(
            "DELETE FROM alert_throttles WHERE rowid IN ( \
                 SELECT rowid FROM alert_throttles WHERE carrier IS NULL AND window_start < ?1 LIMIT ?2)",
        )
        .bind(ts(before))
        .bind(limit)
        .execute(&mut *tx)
        .await?;
        let doomed = "SELECT e.id FROM alert_events e \
             WHERE e.occurred_at < ?1 \
               AND NOT EXISTS (SELECT 1 FROM alert_deliveries d \
                               WHERE d.event_id = e.id AND d.status = 'pending') \
             ORDER BY e.occurred_at LIMIT ?2";
        // The embedded database does not enforce foreign keys unless told
        // to: the deliveries are deleted with their events explicitly.
        sqlx::query(&format!(
            "DELETE FROM alert_deliveries WHERE event_id IN ({doomed})"
        ))
        .bind(ts(before))
        .bind(limit)
        .execute(&mut *tx)
        .await?;
        let done = sqlx::query(&format!("DELETE FROM alert_events WHERE id IN ({doomed})"))
            .bind(ts(before))
            .bind(limit)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }
}
