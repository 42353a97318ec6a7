//! Alerts: events worth telling someone about, and their deliveries to
//! channels.
//!
//! **Events** (`alert_events`) are written in the transaction of the state
//! change that causes them, by database triggers (a run ending `failed`,
//! `dead` or `cancelled`, a fire skipped by a policy, a run marked stuck, a
//! schedule paused by belfry, a failing schedule succeeding again; see the
//! migration), or by a replica's pass with a dedupe key that makes them
//! once across replicas (a run late past its schedule's `deadline`, a
//! replica whose clock guard stopped claiming). No event is lost when a
//! process dies right after the change, and none is recorded twice.
//!
//! **Deliveries** (`alert_deliveries`): a replica routes each new event
//! ([`Ledger::route_alert`]) into one row per channel (the pair is unique,
//! so replicas routing the same event give it one delivery per channel),
//! throttled per (channel, subject) (see [`throttle`]). Replicas then take
//! due deliveries under a lease with `FOR UPDATE SKIP LOCKED`
//! ([`Ledger::take_alert_deliveries`]) and record the result fenced by the
//! lease owner ([`Ledger::finish_alert_delivery`]): each delivery is sent
//! by one replica at a time; a replica that dies after sending and before
//! recording leaves it to be sent again when its lease expires
//! (at-least-once; the webhook's `webhook-id` is the delivery's id, the
//! same on every attempt, for receivers that drop repeats).

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{Ledger, LedgerError};

/// The kinds of alert events (the `kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlertKind {
    /// A run ended `failed` (a permanent error, or its retries ran out).
    RunFailed,
    /// A run was dead-lettered (no worker group for its type, an
    /// undecodable payload, ...).
    RunDead,
    /// A run was cancelled.
    RunCancelled,
    /// The stuck-run scan found a run with no progress.
    RunStuck,
    /// A run not finished by its schedule's `deadline`.
    RunLate,
    /// Fires skipped by a misfire, overlap or `remaining_runs` rule
    /// (`count` says how many instants).
    FireSkipped,
    /// belfry paused a schedule (failures, runs ran out).
    SchedulePaused,
    /// A schedule whose latest run failed succeeded again.
    ScheduleRecovered,
    /// A replica's clock guard stopped it claiming.
    ReplicaClockGuard,
    /// A test alert sent by an operator to one channel.
    Test,
}

impl AlertKind {
    /// Every kind, in the order of the documentation.
    pub const ALL: [AlertKind; 10] = [
        AlertKind::RunFailed,
        AlertKind::RunDead,
        AlertKind::RunCancelled,
        AlertKind::RunStuck,
        AlertKind::RunLate,
        AlertKind::FireSkipped,
        AlertKind::SchedulePaused,
        AlertKind::ScheduleRecovered,
        AlertKind::ReplicaClockGuard,
        AlertKind::Test,
    ];

    /// The stored and wire name (`run.failed`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::RunFailed => "run.failed",
            AlertKind::RunDead => "run.dead",
            AlertKind::RunCancelled => "run.cancelled",
            AlertKind::RunStuck => "run.stuck",
            AlertKind::RunLate => "run.late",
            AlertKind::FireSkipped => "fire.skipped",
            AlertKind::SchedulePaused => "schedule.paused",
            AlertKind::ScheduleRecovered => "schedule.recovered",
            AlertKind::ReplicaClockGuard => "replica.clock_guard",
            AlertKind::Test => "alert.test",
        }
    }

    /// The kind named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether throttling leaves it alone: a resolved notice and an
    /// operator's test are always sent.
    pub fn unthrottled(self) -> bool {
        matches!(self, AlertKind::ScheduleRecovered | AlertKind::Test)
    }
}

impl std::fmt::Display for AlertKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored alert event.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AlertEvent {
    /// Its id.
    pub id: Uuid,
    /// Its kind's name ([`AlertKind::as_str`]).
    pub kind: String,
    /// What throttling counts per: the schedule or job name, or
    /// `replica:<instance>`.
    pub subject: String,
    /// The schedule (job) it is about, if any.
    pub job_name: Option<String>,
    /// The job type, when known.
    pub job_type: Option<String>,
    /// The run it is about, if any.
    pub run_id: Option<Uuid>,
    /// That run's key (or a skipped fire's).
    pub run_key: Option<String>,
    /// Instants it stands for (skipped ranges); 1 otherwise.
    pub count: i64,
    /// One line: the error, reason or note.
    pub detail: String,
    /// A test alert's one channel.
    pub channel: Option<String>,
    /// When it was recorded.
    pub occurred_at: DateTime<Utc>,
    /// A skipped span's instants: after this (exclusive) ...
    pub covers_from: Option<DateTime<Utc>>,
    /// ... up to this (inclusive).
    pub covers_until: Option<DateTime<Utc>>,
}

impl AlertEvent {
    /// Its kind; `None` for a kind this build does not know (a newer
    /// version recorded it).
    pub fn alert_kind(&self) -> Option<AlertKind> {
        AlertKind::parse(&self.kind)
    }
}

/// An event a replica or an operator records ([`Ledger::record_alert`]).
#[derive(Debug, Clone)]
pub struct NewAlertEvent {
    /// Its kind.
    pub kind: AlertKind,
    /// See [`AlertEvent::subject`].
    pub subject: String,
    /// See [`AlertEvent::job_name`].
    pub job_name: Option<String>,
    /// See [`AlertEvent::detail`].
    pub detail: String,
    /// See [`AlertEvent::channel`].
    pub channel: Option<String>,
    /// Recorded at most once per key (`None`: always recorded).
    pub dedupe_key: Option<String>,
}

/// One channel an event goes to, with the throttling window of the
/// routes that chose it (zero: none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRoute {
    /// The channel's name.
    pub channel: String,
    /// At most one alert per subject per window on this channel.
    pub window: Duration,
    /// Why it cannot be sent at all (a schedule names a channel the
    /// configuration lacks): the delivery is recorded `failed` with this
    /// reason, where the lists show it, instead of waiting forever.
    pub refusal: Option<String>,
}

/// A delivery taken to be sent ([`Ledger::take_alert_deliveries`]).
#[derive(Debug, Clone)]
pub struct DueDelivery {
    /// The delivery's id: the same on every attempt (the webhook's
    /// `webhook-id`).
    pub id: Uuid,
    /// The channel to send it to.
    pub channel: String,
    /// Attempts so far, this one included.
    pub attempts: i32,
    /// Events of the same channel and subject folded into it.
    pub folded: i64,
    /// The event.
    pub event: AlertEvent,
}

/// What sending a delivery came to ([`Ledger::finish_alert_delivery`]).
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryResult {
    /// The channel accepted it.
    Sent,
    /// Try again at this instant.
    Retry {
        /// When.
        at: DateTime<Utc>,
        /// What went wrong this time.
        error: String,
    },
    /// Given up.
    Failed {
        /// Why.
        error: String,
    },
}

impl DeliveryResult {
    /// What it writes, the same on both backends: (status, next due
    /// instant, error).
    pub(crate) fn columns(&self) -> (&'static str, Option<DateTime<Utc>>, Option<&str>) {
        match self {
            DeliveryResult::Sent => ("sent", None, None),
            DeliveryResult::Retry { at, error } => ("pending", Some(*at), Some(error.as_str())),
            DeliveryResult::Failed { error } => ("failed", None, Some(error.as_str())),
        }
    }
}

/// A delivery as the alert lists show it ([`Ledger::alert_deliveries`]).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeliveryRecord {
    /// The delivery's id.
    pub id: Uuid,
    /// The channel.
    pub channel: String,
    /// `pending`, `sent`, `failed` or `folded`.
    pub status: String,
    /// Attempts so far.
    pub attempts: i32,
    /// Events folded into it.
    pub folded: i64,
    /// The last attempt's error.
    pub last_error: Option<String>,
    /// When it is (or was) due.
    pub due_at: DateTime<Utc>,
    /// When it was sent.
    pub sent_at: Option<DateTime<Utc>>,
    /// The event's id.
    pub event_id: Uuid,
    /// The event's kind.
    pub kind: String,
    /// The event's subject.
    pub subject: String,
    /// The event's run, if any.
    pub run_id: Option<Uuid>,
    /// The event's count.
    pub count: i64,
    /// The event's detail.
    pub detail: String,
    /// When the event was recorded.
    pub occurred_at: DateTime<Utc>,
}

/// The columns of [`DeliveryRecord`], for `alert_deliveries d JOIN
/// alert_events e`.
pub(crate) const DELIVERY_COLUMNS: &str = "d.id, d.channel, d.status, d.attempts, d.folded, \
     d.last_error, d.due_at, d.sent_at, e.id AS event_id, e.kind, e.subject, e.run_id, e.count, \
     e.detail, e.occurred_at";

/// The columns of [`AlertEvent`], for `alert_events e`.
pub(crate) const EVENT_COLUMNS: &str = "e.id, e.kind, e.subject, e.job_name, e.job_type, \
     e.run_id, e.run_key, e.count, e.detail, e.channel, e.occurred_at, e.covers_from, \
     e.covers_until";

/// Throttling: at most one alert per (channel, subject) per window, the
/// events in between folded into one summary sent when the window ends.
///
/// The first event after a quiet window is sent at once and opens a new
/// window. The next event inside it becomes the *carrier*: due at the end
/// of the window; every later one is `folded` and counted on the throttle
/// row. When the carrier is taken to be sent, the count moves onto it and
/// a new window opens then, so the carrier is the window's one alert.
pub(crate) mod throttle {
    use chrono::{DateTime, Utc};
    use uuid::Uuid;

    /// What to do with a delivery of a throttled channel.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Throttled {
        /// Send now; the window restarts now.
        SendNow,
        /// Send at the end of the window, as its summary.
        Carry {
            /// The end of the window.
            due: DateTime<Utc>,
        },
        /// Fold into the window's carrier.
        Fold,
    }

    /// The decision for an event routed at `now` to a channel whose
    /// window for the subject opened at `start` (the Unix epoch if never)
    /// and lasts `length`, with `carrier` waiting or not.
    pub(crate) fn decide(
        start: DateTime<Utc>,
        carrier: Option<Uuid>,
        length: chrono::Duration,
        now: DateTime<Utc>,
    ) -> Throttled {
        if carrier.is_some() {
            return Throttled::Fold;
        }
        let end = start.checked_add_signed(length).unwrap_or(start);
        if end <= now {
            Throttled::SendNow
        } else {
            Throttled::Carry { due: end }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn one_alert_per_window_then_a_summary() {
            let t0 = DateTime::UNIX_EPOCH + chrono::Duration::days(20_000);
            let w = chrono::Duration::minutes(10);
            // Never sent before: at once.
            assert_eq!(
                decide(DateTime::UNIX_EPOCH, None, w, t0),
                Throttled::SendNow
            );
            // Inside the window opened at t0: carried to its end.
            let at = t0 + chrono::Duration::minutes(3);
            assert_eq!(decide(t0, None, w, at), Throttled::Carry { due: t0 + w });
            // A carrier waits: folded.
            assert_eq!(decide(t0, Some(Uuid::nil()), w, at), Throttled::Fold);
            // Even after the window while the carrier has not gone out.
            assert_eq!(
                decide(t0, Some(Uuid::nil()), w, t0 + w * 2),
                Throttled::Fold
            );
            // A quiet window: at once again.
            assert_eq!(decide(t0, None, w, t0 + w), Throttled::SendNow);
        }
    }
}

impl Ledger {
    /// Records an event a replica or an operator raised: at most once per
    /// `dedupe_key` (whoever comes second finds it recorded). Whether it
    /// was recorded now.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn record_alert(&self, event: &NewAlertEvent) -> Result<bool, LedgerError> {
        let event = NewAlertEvent {
            detail: crate::storable(&event.detail).into_owned(),
            ..event.clone()
        };
        self.store.record_alert(&event).await
    }

    /// Events no replica has routed yet, oldest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn unrouted_alerts(&self, limit: i64) -> Result<Vec<AlertEvent>, LedgerError> {
        self.store.unrouted_alerts(limit).await
    }

    /// Gives `event` one delivery per route, throttled per (channel,
    /// subject) by the route's window (none for
    /// [`AlertKind::unthrottled`] kinds), and marks it routed, in one
    /// transaction. Whether this call routed it (`false`: another replica
    /// is routing or did).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails (nothing is
    /// written; the event is routed by a later pass).
    pub async fn route_alert(
        &self,
        event: &AlertEvent,
        routes: &[AlertRoute],
    ) -> Result<bool, LedgerError> {
        let unthrottled = event.alert_kind().is_some_and(AlertKind::unthrottled);
        let mut routes: Vec<AlertRoute> = routes
            .iter()
            .map(|r| AlertRoute {
                channel: r.channel.clone(),
                window: if unthrottled || r.refusal.is_some() {
                    Duration::ZERO
                } else {
                    r.window
                },
                refusal: r
                    .refusal
                    .as_deref()
                    .map(|e| crate::storable(e).into_owned()),
            })
            .collect();
        // Throttle rows are locked in channel order: two replicas routing
        // events of the same subject cannot deadlock.
        routes.sort_by(|a, b| a.channel.cmp(&b.channel));
        routes.dedup_by(|a, b| a.channel == b.channel);
        self.store
            .route_alert(event.id, &event.subject, &routes)
            .await
    }

    /// Takes at most `limit` due deliveries to `channels` (the ones this
    /// replica can send to: a replica whose configuration lacks a channel
    /// leaves its deliveries to the others) for `owner` for `lease`
    /// (counting an attempt on each), oldest due first; a carrier of a
    /// throttling window gets the count of what was folded into it, and
    /// its window restarts.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails (nothing is taken).
    pub async fn take_alert_deliveries(
        &self,
        owner: &str,
        channels: &[String],
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<DueDelivery>, LedgerError> {
        if channels.is_empty() {
            return Ok(Vec::new());
        }
        self.store
            .take_alert_deliveries(owner, channels, limit, lease)
            .await
    }

    /// Records what attempt `attempt` of delivery `id` came to, if
    /// `owner` still holds that attempt's lease (whether it did: a later
    /// attempt by anyone, this replica included, fences an earlier one
    /// out).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn finish_alert_delivery(
        &self,
        id: Uuid,
        owner: &str,
        attempt: i32,
        result: &DeliveryResult,
    ) -> Result<bool, LedgerError> {
        let result = match result {
            DeliveryResult::Sent => DeliveryResult::Sent,
            DeliveryResult::Retry { at, error } => DeliveryResult::Retry {
                at: *at,
                error: crate::storable(error).into_owned(),
            },
            DeliveryResult::Failed { error } => DeliveryResult::Failed {
                error: crate::storable(error).into_owned(),
            },
        };
        self.store
            .finish_alert_delivery(id, owner, attempt, &result)
            .await
    }

    /// The latest deliveries, newest event first, at most `limit`;
    /// `status` keeps only deliveries in it.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn alert_deliveries(
        &self,
        status: Option<&str>,
        limit: i64,
    ) -> Result<Vec<DeliveryRecord>, LedgerError> {
        self.store.alert_deliveries(status, limit).await
    }

    /// The latest events, newest first, at most `limit`.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn alert_events(&self, limit: i64) -> Result<Vec<AlertEvent>, LedgerError> {
        self.store.alert_events(limit).await
    }

    /// The schedules with a `deadline` in their definition: (name, the
    /// value as written).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn schedule_deadlines(&self) -> Result<Vec<(String, String)>, LedgerError> {
        self.store.schedule_deadlines().await
    }

    /// Records a `run.late` event for every run of the given schedules
    /// not finished `deadline` after its scheduled instant, once per run
    /// (whichever replica comes first); how many were recorded now.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn record_late_runs(
        &self,
        deadlines: &[(String, Duration)],
    ) -> Result<u64, LedgerError> {
        if deadlines.is_empty() {
            return Ok(0);
        }
        self.store.record_late_runs(deadlines).await
    }

    /// Deletes events recorded before `before` whose deliveries are all
    /// final (sent, failed, folded; an event no replica routed in all that
    /// time goes too), at most `limit`, and throttling windows that closed
    /// before it; how many events.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database fails.
    pub async fn prune_alerts(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, LedgerError> {
        self.store.prune_alerts(before, limit).await
    }
}
