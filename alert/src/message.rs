//! What an alert says: the webhook's JSON body (its JSON Schema is
//! `docs/alert-webhook.schema.json`), the one-line summary, and the title
//! Slack and e-mail show. Built from a delivery the same way for every
//! channel, so the three say the same thing.

use belfry_ledger::{AlertKind, DueDelivery};
use chrono::SecondsFormat;
use serde::Serialize;
use uuid::Uuid;

/// The webhook body: the envelope Standard Webhooks recommends (`type`,
/// `timestamp`, `data`).
#[derive(Debug, Clone, Serialize)]
pub struct WebhookBody {
    /// The event kind (`run.failed`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// When the event was recorded (RFC 3339, UTC).
    pub timestamp: String,
    /// What happened.
    pub data: AlertData,
}

/// The `data` of a [`WebhookBody`].
#[derive(Debug, Clone, Serialize)]
pub struct AlertData {
    /// The event's id (one per event, shared by its channels).
    pub event_id: Uuid,
    /// This delivery's id (the `webhook-id` header: the same on every
    /// attempt; drop repeats by it).
    pub delivery_id: Uuid,
    /// The belfry namespace (`BELFRY_NAMESPACE`) that sent it.
    pub namespace: String,
    /// What throttling counts per: the schedule or job name, or
    /// `replica:<instance>`.
    pub subject: String,
    /// The schedule (job) name, if the event is about one.
    pub schedule: Option<String>,
    /// Its job type, when known.
    pub job_type: Option<String>,
    /// The run, if the event is about one.
    pub run_id: Option<Uuid>,
    /// That run's (or skipped fire's) key.
    pub run_key: Option<String>,
    /// Instants the event stands for (skipped fires); 1 otherwise.
    pub count: i64,
    /// Events of the same subject folded into this one by throttling.
    pub folded: i64,
    /// The error, reason or note.
    pub detail: String,
    /// One human-readable line.
    pub summary: String,
    /// The run (or schedule) in the web view, when `public_url` is set.
    pub url: Option<String>,
}

/// An alert ready to be sent on any channel.
#[derive(Debug, Clone)]
pub struct AlertMessage {
    /// The channel-independent content.
    pub body: WebhookBody,
    /// `[belfry NAMESPACE] KIND: SUBJECT`.
    pub title: String,
}

/// At most `max` characters of `text`, marked when cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

impl AlertMessage {
    /// The message of `delivery`, sent by namespace `namespace`, linking to
    /// the web view at `public_url` if given.
    pub fn of(delivery: &DueDelivery, namespace: &str, public_url: Option<&str>) -> Self {
        let event = &delivery.event;
        let what = event
            .run_key
            .as_deref()
            .map(|k| format!("run {k}"))
            .unwrap_or_else(|| "a run".into());
        let subject = &event.subject;
        let detail = clip(&event.detail, 2000);
        let mut summary = match event.alert_kind() {
            Some(AlertKind::RunFailed) => format!("{subject}: {what} failed: {detail}"),
            Some(AlertKind::RunDead) => format!("{subject}: {what} was dead-lettered: {detail}"),
            Some(AlertKind::RunCancelled) => format!("{subject}: {what} was cancelled: {detail}"),
            Some(AlertKind::RunStuck) => format!("{subject}: {what} is stuck: {detail}"),
            Some(AlertKind::RunLate) => format!("{subject}: {what} is late: {detail}"),
            Some(AlertKind::FireSkipped) => {
                let fires = if event.count == 1 { "fire" } else { "fires" };
                format!("{subject}: {} {fires} skipped: {detail}", event.count)
            }
            Some(AlertKind::SchedulePaused) => format!("{subject} was paused: {detail}"),
            Some(AlertKind::ScheduleRecovered) => {
                format!("{subject} succeeded again ({what}) after failing")
            }
            Some(AlertKind::ReplicaClockGuard) => format!("{subject}: {detail}"),
            Some(AlertKind::Test) => {
                format!("test alert to channel {}: {detail}", delivery.channel)
            }
            None => format!("{subject}: {}: {detail}", event.kind),
        };
        if delivery.folded > 0 {
            summary.push_str(&format!(
                " (+{} more alerts for {subject} folded by throttling)",
                delivery.folded
            ));
        }
        let url = public_url.map(|base| match (event.run_id, &event.job_name) {
            (Some(run), _) => format!("{base}/ui/runs/{run}"),
            (None, Some(name)) => format!("{base}/ui/schedules/{name}"),
            (None, None) => format!("{base}/ui"),
        });
        let title =
            format!("[belfry {namespace}] {}: {subject}", event.kind).replace(['\r', '\n'], " ");
        Self {
            title,
            body: WebhookBody {
                kind: event.kind.clone(),
                timestamp: event
                    .occurred_at
                    .to_rfc3339_opts(SecondsFormat::Millis, true),
                data: AlertData {
                    event_id: event.id,
                    delivery_id: delivery.id,
                    namespace: namespace.to_owned(),
                    subject: subject.clone(),
                    schedule: event.job_name.clone(),
                    job_type: event.job_type.clone(),
                    run_id: event.run_id,
                    run_key: event.run_key.clone(),
                    count: event.count,
                    folded: delivery.folded,
                    detail,
                    summary,
                    url,
                },
            },
        }
    }

    /// The plain-text form (e-mail body): the summary, then the facts.
    pub fn text(&self) -> String {
        let d = &self.body.data;
        let mut lines = vec![d.summary.clone(), String::new()];
        lines.push(format!("event:     {}", self.body.kind));
        lines.push(format!("at:        {}", self.body.timestamp));
        lines.push(format!("namespace: {}", d.namespace));
        if let Some(s) = &d.schedule {
            lines.push(format!("schedule:  {s}"));
        }
        if let Some(t) = &d.job_type {
            lines.push(format!("job type:  {t}"));
        }
        if let Some(k) = &d.run_key {
            lines.push(format!("run key:   {k}"));
        }
        if let Some(id) = d.run_id {
            lines.push(format!("run id:    {id}"));
        }
        if let Some(url) = &d.url {
            lines.push(format!("open:      {url}"));
        }
        lines.push(format!("event id:  {}", d.event_id));
        lines.join("\n")
    }
}
