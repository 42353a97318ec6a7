//! The alert deliverer every scheduler replica runs (and the embedded
//! mode): routes new events into deliveries, then sends what is due.
//!
//! Each pass is two steps, both safe to run on every replica at once:
//! [`AlertDeliverer::route_once`] gives each unrouted event its deliveries
//! (one per channel, whoever routes it: see `belfry_ledger::Ledger::route_alert`),
//! and [`AlertDeliverer::deliver_once`] takes due deliveries under a lease
//! and records each result fenced by that lease. A delivery is sent by
//! one replica at a time; if a replica dies between sending and recording,
//! the lease expires and another sends it again (at-least-once; receivers
//! drop repeats by `webhook-id`, the delivery's id).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use belfry_ledger::{AlertKind, DeliveryResult, DueDelivery, Ledger, NewAlertEvent};
use chrono::Utc;
use tokio_util::sync::CancellationToken;

use crate::channel::{Channels, SendOutcome};
use crate::config::AlertsConfig;
use crate::counters::AlertCounters;
use crate::message::AlertMessage;
use crate::AlertError;

/// Events routed per pass.
const ROUTE_PAGE: i64 = 200;
/// Deliveries taken per pass (sent concurrently).
const DELIVERY_PAGE: i64 = 32;

/// Routes and sends alerts.
#[derive(Debug)]
pub struct AlertDeliverer {
    ledger: Ledger,
    config: Option<AlertsConfig>,
    channels: Option<Channels>,
    namespace: String,
    owner: String,
    lease: Duration,
    counters: Arc<AlertCounters>,
}

/// What a pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    /// Events routed.
    pub routed: usize,
    /// Deliveries the channel accepted.
    pub sent: usize,
    /// Deliveries to be tried again.
    pub retried: usize,
    /// Deliveries given up.
    pub failed: usize,
}

impl AlertDeliverer {
    /// A deliverer on `ledger` for `config` (`None`: no channels; events
    /// are still recorded and marked routed, with no delivery), sending
    /// as namespace `namespace`, taking leases as `owner`.
    ///
    /// # Errors
    ///
    /// [`AlertError::Channel`] when a channel cannot be set up.
    pub fn new(
        ledger: Ledger,
        config: Option<AlertsConfig>,
        namespace: &str,
        owner: &str,
    ) -> Result<Self, AlertError> {
        let channels = config.as_ref().map(Channels::new).transpose()?;
        // Longer than the slowest channel's attempt, with room: a lease
        // never ends while its attempt can still succeed.
        let slowest = config
            .as_ref()
            .and_then(|c| c.channels.values().map(|ch| ch.timeout).max())
            .unwrap_or(Duration::from_secs(30));
        Ok(Self {
            ledger,
            config,
            channels,
            namespace: namespace.to_owned(),
            owner: owner.to_owned(),
            lease: slowest * 2 + Duration::from_secs(5),
            counters: Arc::default(),
        })
    }

    /// The configuration, if any.
    pub fn config(&self) -> Option<&AlertsConfig> {
        self.config.as_ref()
    }

    /// Its counters (register them with the metrics registry).
    pub fn counters(&self) -> &Arc<AlertCounters> {
        &self.counters
    }

    /// Records a test alert for channel `channel` (sent by the next
    /// pass, unthrottled); `note` says who asked. Returns nothing: the
    /// result is in the deliveries list.
    ///
    /// # Errors
    ///
    /// [`AlertError::UnknownChannel`] when no channel has that name;
    /// [`AlertError::Ledger`] when the event cannot be recorded.
    pub async fn send_test(&self, channel: &str, note: &str) -> Result<(), AlertError> {
        if !self.channels.as_ref().is_some_and(|c| c.contains(channel)) {
            return Err(AlertError::UnknownChannel(channel.to_owned()));
        }
        self.ledger
            .record_alert(&NewAlertEvent {
                kind: AlertKind::Test,
                subject: format!("channel:{channel}"),
                job_name: None,
                detail: note.to_owned(),
                channel: Some(channel.to_owned()),
                dedupe_key: None,
            })
            .await?;
        Ok(())
    }

    /// Routes the events no replica has routed yet (a page of them). A
    /// replica without `BELFRY_ALERTS` routes nothing: it leaves the
    /// events to a replica that has it (an event routed with no channel
    /// would be lost for every replica).
    ///
    /// # Errors
    ///
    /// [`AlertError::Ledger`] when the ledger fails; what was routed
    /// stays routed.
    pub async fn route_once(&self) -> Result<usize, AlertError> {
        if self.config.is_none() {
            return Ok(0);
        }
        let events = self.ledger.unrouted_alerts(ROUTE_PAGE).await?;
        // The channels each schedule names, read once per pass.
        let mut named: HashMap<String, Vec<String>> = HashMap::new();
        let mut routed = 0;
        for event in &events {
            let schedule_alerts = match &event.job_name {
                Some(name) if self.config.is_some() => {
                    if !named.contains_key(name) {
                        let alerts = self.schedule_alerts(name).await?;
                        named.insert(name.clone(), alerts);
                    }
                    named.get(name).cloned().unwrap_or_default()
                }
                _ => Vec::new(),
            };
            let routes = match &self.config {
                Some(config) => config.routes_for(event, &schedule_alerts),
                None => Vec::new(),
            };
            if self.ledger.route_alert(event, &routes).await? {
                routed += 1;
            }
        }
        Ok(routed)
    }

    /// The `alerts` of schedule `name`'s stored definition.
    async fn schedule_alerts(&self, name: &str) -> Result<Vec<String>, AlertError> {
        let Some(row) = self.ledger.schedule(name).await? else {
            return Ok(Vec::new());
        };
        Ok(row
            .spec
            .as_ref()
            .and_then(|spec| spec.get("alerts"))
            .and_then(|alerts| alerts.as_array())
            .map(|alerts| {
                alerts
                    .iter()
                    .filter_map(|a| a.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Sends the deliveries that are due (a page of them, concurrently)
    /// and records each result.
    ///
    /// # Errors
    ///
    /// [`AlertError::Ledger`] when due deliveries cannot be taken; a
    /// result that cannot be recorded is logged, and the delivery is
    /// sent again after its lease (at-least-once).
    pub async fn deliver_once(&self) -> Result<PassReport, AlertError> {
        let (Some(config), Some(channels)) = (&self.config, &self.channels) else {
            return Ok(PassReport::default());
        };
        let due = self
            .ledger
            .take_alert_deliveries(
                &self.owner,
                &config.channel_names(),
                DELIVERY_PAGE,
                self.lease,
            )
            .await?;
        let sends = due.iter().map(|delivery| async move {
            let message = AlertMessage::of(delivery, &self.namespace, config.public_url.as_deref());
            let outcome = channels.send(&delivery.channel, &message).await;
            (delivery, outcome)
        });
        let mut report = PassReport::default();
        let mut results = Vec::with_capacity(due.len());
        for (delivery, outcome) in futures::future::join_all(sends).await {
            let result = self.result_of(config, delivery, outcome);
            match &result {
                DeliveryResult::Sent => {
                    report.sent += 1;
                    self.counters.add(&delivery.channel, |c| c.sent += 1);
                }
                DeliveryResult::Retry { error, .. } => {
                    report.retried += 1;
                    self.counters
                        .add(&delivery.channel, |c| c.attempts_failed += 1);
                    tracing::warn!(channel = %delivery.channel, kind = %delivery.event.kind,
                        attempt = delivery.attempts, %error, "alert not delivered; retrying");
                }
                DeliveryResult::Failed { error } => {
                    report.failed += 1;
                    self.counters.add(&delivery.channel, |c| {
                        c.attempts_failed += 1;
                        c.failed += 1;
                    });
                    tracing::error!(channel = %delivery.channel, kind = %delivery.event.kind,
                        attempt = delivery.attempts, %error, "alert given up");
                }
            }
            results.push((delivery, result));
        }
        // Concurrently: one result waiting out a ledger restart does not
        // hold the others past their leases.
        futures::future::join_all(results.iter().map(|(d, r)| self.record(d, r))).await;
        Ok(report)
    }

    /// Records `result` of `delivery`, trying again for a while when the
    /// ledger does not answer (a restart takes seconds): a result not
    /// recorded before the lease ends means another replica sends the
    /// alert again.
    async fn record(&self, delivery: &DueDelivery, result: &DeliveryResult) {
        let mut pause = Duration::from_millis(250);
        let give_up = std::time::Instant::now() + self.lease / 2;
        loop {
            match self
                .ledger
                .finish_alert_delivery(delivery.id, &self.owner, delivery.attempts, result)
                .await
            {
                Ok(true) => return,
                Ok(false) => {
                    tracing::warn!(delivery = %delivery.id,
                        "an alert's lease ran out before its result was recorded; another replica may send it again");
                    return;
                }
                Err(e) if std::time::Instant::now() + pause > give_up => {
                    tracing::warn!(delivery = %delivery.id, error = %e,
                        "cannot record an alert's result; it is sent again after its lease");
                    return;
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// What `outcome` means for `delivery`: retried with back-off (the
    /// receiver's `Retry-After` if it gave one, never sooner than
    /// `retry_initial`) until `give_up_after` from the event, then given
    /// up.
    fn result_of(
        &self,
        config: &AlertsConfig,
        delivery: &DueDelivery,
        outcome: SendOutcome,
    ) -> DeliveryResult {
        match outcome {
            SendOutcome::Delivered => DeliveryResult::Sent,
            SendOutcome::Permanent(error) => DeliveryResult::Failed { error },
            SendOutcome::Retry { after, error } => {
                let exponent = u32::try_from(delivery.attempts.max(1) - 1)
                    .unwrap_or(0)
                    .min(20);
                let backoff = config
                    .retry_initial
                    .saturating_mul(2u32.saturating_pow(exponent))
                    .min(config.retry_max);
                let delay = after.map_or(backoff, |a| a.max(config.retry_initial));
                // Saturating: an absurd setting means "never", not a panic.
                let later = |t: chrono::DateTime<Utc>, d: Duration| {
                    chrono::Duration::from_std(d)
                        .ok()
                        .and_then(|d| t.checked_add_signed(d))
                        .unwrap_or(chrono::DateTime::<Utc>::MAX_UTC)
                };
                let at = later(Utc::now(), delay);
                let give_up = later(delivery.event.occurred_at, config.give_up_after);
                if at > give_up {
                    DeliveryResult::Failed {
                        error: format!(
                            "gave up after {} attempts over {} (give_up_after): {error}",
                            delivery.attempts,
                            humantime::format_duration(config.give_up_after)
                        ),
                    }
                } else {
                    DeliveryResult::Retry { at, error }
                }
            }
        }
    }

    /// One pass: routes, then sends what is due (a routing failure does
    /// not hold up what is already due).
    ///
    /// # Errors
    ///
    /// As [`AlertDeliverer::route_once`] and
    /// [`AlertDeliverer::deliver_once`]: the first error, after both ran.
    pub async fn pass_once(&self) -> Result<PassReport, AlertError> {
        let routed = self.route_once().await;
        let report = self.deliver_once().await;
        match (routed, report) {
            (Ok(routed), Ok(report)) => Ok(PassReport { routed, ..report }),
            (Err(e), Ok(_)) | (_, Err(e)) => Err(e),
        }
    }

    /// Passes every `interval` until `cancel`. A pass in progress when
    /// `cancel` fires is finished (its sends are bounded by the channels'
    /// timeouts), so no result is left unrecorded by a clean stop.
    pub async fn run(self: Arc<Self>, interval: Duration, cancel: CancellationToken) {
        loop {
            match self.pass_once().await {
                // A full page: go on at once, unless stopping.
                Ok(r)
                    if r.routed as i64 >= ROUTE_PAGE
                        || (r.sent + r.failed) as i64 >= DELIVERY_PAGE =>
                {
                    if cancel.is_cancelled() {
                        return;
                    }
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "alert pass failed; retrying"),
            }
            // Either wakes the loop; a cancel between passes ends it.
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }
}
