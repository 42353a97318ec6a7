//! Alert events and deliveries on Postgres (see `crate::alerts`).
//!
//! Routing locks the event's row (`FOR UPDATE SKIP LOCKED`: a replica
//! routing it already is left to it), then each throttle row in channel
//! order; taking deliveries locks delivery rows (`SKIP LOCKED`), then the
//! throttle rows of the carriers among them. Routing never locks an
//! existing delivery, so the two never wait for each other in a cycle.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::PgStore;
use crate::alerts::throttle::{decide, Throttled};
use crate::alerts::{
    AlertEvent, AlertRoute, DeliveryRecord, DeliveryResult, DueDelivery, NewAlertEvent,
    DELIVERY_COLUMNS, EVENT_COLUMNS,
};
use crate::store::AlertStore;
use crate::LedgerError;

/// A delivery row taken to be sent, with its event's columns.
#[derive(sqlx::FromRow)]
struct TakenRow {
    delivery_id: Uuid,
    delivery_channel: String,
    attempts: i32,
    folded: i64,
    #[sqlx(flatten)]
    event: AlertEvent,
}

impl From<TakenRow> for DueDelivery {
    fn from(row: TakenRow) -> Self {
        DueDelivery {
            id: row.delivery_id,
            channel: row.delivery_channel,
            attempts: row.attempts,
            folded: row.folded,
            event: row.event,
        }
    }
}

#[async_trait]
impl AlertStore for PgStore {
    async fn record_alert(&self, event: &NewAlertEvent) -> Result<bool, LedgerError> {
        let done = sqlx::query(
            "INSERT INTO alert_events (kind, subject, job_name, job_type, detail, channel, dedupe_key) \
             VALUES ($1, $2, $3, (SELECT job_type FROM schedules WHERE name = $3), $4, $5, $6) \
             ON CONFLICT (dedupe_key) DO NOTHING",
        )
        .bind(event.kind.as_str())
        .bind(&event.subject)
        .bind(&event.job_name)
        .bind(&event.detail)
        .bind(&event.channel)
        .bind(&event.dedupe_key)
        .execute(&self.route)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn unrouted_alerts(&self, limit: i64) -> Result<Vec<AlertEvent>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {EVENT_COLUMNS} FROM alert_events e WHERE e.routed_at IS NULL \
             ORDER BY e.occurred_at LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.route)
        .await?)
    }

    async fn route_alert(
        &self,
        event: Uuid,
        subject: &str,
        routes: &[AlertRoute],
    ) -> Result<bool, LedgerError> {
        let mut tx = self.route.begin().await?;
        // The event's row first: a replica routing it already holds it, and
        // this one leaves it alone rather than wait.
        let now: Option<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT now() FROM alert_events WHERE id = $1 AND routed_at IS NULL \
             FOR UPDATE SKIP LOCKED",
        )
        .bind(event)
        .fetch_optional(self.route.on(&mut tx))
        .await?;
        let Some(now) = now else {
            tx.commit().await?;
            return Ok(false);
        };
        for route in routes {
            let delivery = Uuid::now_v7();
            if let Some(refusal) = &route.refusal {
                sqlx::query(
                    "INSERT INTO alert_deliveries (id, event_id, channel, status, due_at, last_error) \
                     VALUES ($1, $2, $3, 'failed', $4, $5) ON CONFLICT (event_id, channel) DO NOTHING",
                )
                .bind(delivery)
                .bind(event)
                .bind(&route.channel)
                .bind(now)
                .bind(refusal)
                .execute(self.route.on(&mut tx))
                .await?;
                continue;
            }
            let decision = if route.window.is_zero() {
                None
            } else {
                sqlx::query(
                    "INSERT INTO alert_throttles (channel, subject, window_start) \
                     VALUES ($1, $2, 'epoch') ON CONFLICT DO NOTHING",
                )
                .bind(&route.channel)
                .bind(subject)
                .execute(self.route.on(&mut tx))
                .await?;
                // Serialises the decisions of this channel and subject.
                let (start, carrier): (DateTime<Utc>, Option<Uuid>) = sqlx::query_as(
                    "SELECT window_start, carrier FROM alert_throttles \
                     WHERE channel = $1 AND subject = $2 FOR UPDATE",
                )
                .bind(&route.channel)
                .bind(subject)
                .fetch_one(self.route.on(&mut tx))
                .await?;
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
                "INSERT INTO alert_deliveries (id, event_id, channel, status, due_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id, channel) DO NOTHING",
            )
            .bind(delivery)
            .bind(event)
            .bind(&route.channel)
            .bind(status)
            .bind(due)
            .execute(self.route.on(&mut tx))
            .await?;
            let update = match decision {
                None => None,
                Some(Throttled::SendNow) => Some(
                    sqlx::query(
                        "UPDATE alert_throttles SET window_start = $3, carrier = NULL, folded = 0 \
                         WHERE channel = $1 AND subject = $2",
                    )
                    .bind(&route.channel)
                    .bind(subject)
                    .bind(now),
                ),
                Some(Throttled::Carry { .. }) => Some(
                    sqlx::query(
                        "UPDATE alert_throttles SET carrier = $3, folded = 0 \
                         WHERE channel = $1 AND subject = $2",
                    )
                    .bind(&route.channel)
                    .bind(subject)
                    .bind(delivery),
                ),
                Some(Throttled::Fold) => Some(
                    sqlx::query(
                        "UPDATE alert_throttles SET folded = folded + 1 \
                         WHERE channel = $1 AND subject = $2",
                    )
                    .bind(&route.channel)
                    .bind(subject),
                ),
            };
            if let Some(update) = update {
                update.execute(self.route.on(&mut tx)).await?;
            }
        }
        sqlx::query("UPDATE alert_events SET routed_at = $2 WHERE id = $1")
            .bind(event)
            .bind(now)
            .execute(self.route.on(&mut tx))
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
        let mut tx = self.route.begin().await?;
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "WITH picked AS ( \
                 SELECT id FROM alert_deliveries \
                 WHERE status = 'pending' AND due_at <= now() \
                   AND (lease_until IS NULL OR lease_until < now()) AND channel = ANY($4) \
                 ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
             UPDATE alert_deliveries d SET lease_owner = $2, \
                 lease_until = now() + make_interval(secs => $3), attempts = d.attempts + 1 \
             FROM picked WHERE d.id = picked.id RETURNING d.id",
        )
        .bind(limit)
        .bind(owner)
        .bind(lease.as_secs_f64())
        .bind(channels)
        .fetch_all(self.route.on(&mut tx))
        .await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        // Carriers of throttling windows among them: the count folded into
        // each moves onto it, and its window restarts now (the carrier is
        // the window's one alert). Locked in (channel, subject) order, the
        // order routing locks them in.
        sqlx::query(
            "WITH old AS ( \
                 SELECT channel, subject, carrier, folded FROM alert_throttles \
                 WHERE carrier = ANY($1) ORDER BY channel, subject FOR UPDATE), \
             detached AS ( \
                 UPDATE alert_throttles t SET carrier = NULL, window_start = now(), folded = 0 \
                 FROM old WHERE t.channel = old.channel AND t.subject = old.subject \
                 RETURNING old.carrier AS carrier, old.folded AS folded) \
             UPDATE alert_deliveries d SET folded = detached.folded \
             FROM detached WHERE d.id = detached.carrier",
        )
        .bind(&ids)
        .execute(self.route.on(&mut tx))
        .await?;
        let rows: Vec<TakenRow> = sqlx::query_as(&format!(
            "SELECT d.id AS delivery_id, d.channel AS delivery_channel, d.attempts, d.folded, \
                 {EVENT_COLUMNS} \
             FROM alert_deliveries d JOIN alert_events e ON e.id = d.event_id \
             WHERE d.id = ANY($1) ORDER BY d.due_at"
        ))
        .bind(&ids)
        .fetch_all(self.route.on(&mut tx))
        .await?;
        tx.commit().await?;
        Ok(rows.into_iter().map(DueDelivery::from).collect())
    }

    async fn finish_alert_delivery(
        &self,
        id: Uuid,
        owner: &str,
        attempt: i32,
        result: &DeliveryResult,
    ) -> Result<bool, LedgerError> {
        let (status, due, error) = result.columns();
        self.moved(
            sqlx::query(
                "UPDATE alert_deliveries SET status = $3, due_at = COALESCE($4, due_at), \
                     last_error = COALESCE($5, last_error), \
                     sent_at = CASE WHEN $3 = 'sent' THEN now() ELSE sent_at END, \
                     lease_owner = NULL, lease_until = NULL \
                 WHERE id = $1 AND lease_owner = $2 AND attempts = $6 AND status = 'pending'",
            )
            .bind(id)
            .bind(owner)
            .bind(status)
            .bind(due)
            .bind(error)
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
             WHERE ($1::text IS NULL OR d.status = $1) \
             ORDER BY d.created_at DESC, d.id DESC LIMIT $2"
        ))
        .bind(status)
        .bind(limit)
        .fetch_all(&self.route)
        .await?)
    }

    async fn alert_events(&self, limit: i64) -> Result<Vec<AlertEvent>, LedgerError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {EVENT_COLUMNS} FROM alert_events e ORDER BY e.occurred_at DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.route)
        .await?)
    }

    async fn schedule_deadlines(&self) -> Result<Vec<(String, String)>, LedgerError> {
        Ok(sqlx::query_as(
            "SELECT name, spec ->> 'deadline' FROM schedules \
             WHERE spec ->> 'deadline' IS NOT NULL ORDER BY name",
        )
        .fetch_all(&self.route)
        .await?)
    }

    async fn record_late_runs(&self, deadlines: &[(String, Duration)]) -> Result<u64, LedgerError> {
        let names: Vec<&str> = deadlines.iter().map(|(n, _)| n.as_str()).collect();
        let secs: Vec<f64> = deadlines.iter().map(|(_, d)| d.as_secs_f64()).collect();
        let done = sqlx::query(
            // The unfinished runs through their partial indexes (a read of
            // what is in flight), not every past run of the schedules.
            "WITH unfinished AS MATERIALIZED ( \
                 SELECT id, job_name, job_type, run_key, status, attempts, scheduled_at FROM job_runs \
                 WHERE status IN ('claimed', 'dispatched', 'running', 'retrying') \
                 UNION ALL \
                 SELECT id, job_name, job_type, run_key, status, attempts, scheduled_at FROM job_runs \
                 WHERE status = 'buffered') \
             INSERT INTO alert_events (kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key) \
             SELECT 'run.late', r.job_name, r.job_name, r.job_type, r.id, r.run_key, \
                 format('%s %s s after its scheduled instant %s (status %s)', \
                        CASE WHEN r.attempts = 0 THEN 'not started' ELSE 'not finished' END, \
                        d.secs, \
                        to_char(r.scheduled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                        r.status), \
                 'run.late:' || r.id \
             FROM unnest($1::text[], $2::float8[]) AS d(name, secs) \
             JOIN unfinished r ON r.job_name = d.name \
             WHERE r.scheduled_at < now() - make_interval(secs => d.secs) \
             ORDER BY r.id \
             ON CONFLICT (dedupe_key) DO NOTHING",
        )
        .bind(&names)
        .bind(&secs)
        .execute(&self.route)
        .await?;
        Ok(done.rows_affected())
    }

    async fn prune_alerts(&self, before: DateTime<Utc>, limit: i64) -> Result<u64, LedgerError> {
        // Windows that closed long ago: a new event opens a new one.
        sqlx::query(
            "DELETE FROM alert_throttles WHERE ctid IN ( \
                 SELECT ctid FROM alert_throttles WHERE carrier IS NULL AND window_start < $1 \
                 LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(before)
        .bind(limit)
        .execute(&self.route)
        .await?;
        // Deliveries go with their event (ON DELETE CASCADE); an event with
        // a delivery still to send is kept.
        let done = sqlx::query(
            "DELETE FROM alert_events WHERE id IN ( \
                 SELECT e.id FROM alert_events e \
                 WHERE e.occurred_at < $1 \
                   AND NOT EXISTS (SELECT 1 FROM alert_deliveries d \
                                   WHERE d.event_id = e.id AND d.status = 'pending') \
                 ORDER BY e.occurred_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(before)
        .bind(limit)
        .execute(&self.route)
        .await?;
        Ok(done.rows_affected())
    }
}
