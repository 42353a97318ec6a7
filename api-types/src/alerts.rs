//! `/v1/alerts`: the configured alert channels, recent alert deliveries,
//! and the test alert.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

wire_enum! {
    /// Where a delivery of an alert to a channel is.
    pub enum DeliveryStatus {
        /// Waiting to be sent (or sent again after a failed attempt; a
        /// throttled summary waits for the end of its window).
        Pending = "pending",
        /// The channel accepted it.
        Sent = "sent",
        /// Given up: the receiver refused it, or it kept failing past
        /// `give_up_after` (`last_error` says why).
        Failed = "failed",
        /// Throttled: counted in the summary the window's next alert
        /// carries.
        Folded = "folded",
    }
}

/// One configured channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AlertChannel {
    /// Its name in `BELFRY_ALERTS`.
    pub name: String,
    /// `webhook`, `slack` or `email`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Where it sends (no secret: a Slack hook's URL is not shown).
    pub target: String,
}

/// One delivery of an alert event to a channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AlertDelivery {
    /// The delivery's id (the webhook's `webhook-id`).
    pub id: Uuid,
    /// The channel.
    pub channel: String,
    /// Where it is.
    pub status: DeliveryStatus,
    /// Attempts so far.
    pub attempts: i32,
    /// Events of the same subject folded into it by throttling.
    pub folded: i64,
    /// The last failed attempt's error.
    pub last_error: Option<String>,
    /// When it is (or was) due.
    pub due_at: DateTime<Utc>,
    /// When the channel accepted it.
    pub sent_at: Option<DateTime<Utc>>,
    /// The event's id.
    pub event_id: Uuid,
    /// The event's kind (`run.failed`, `fire.skipped`, ...).
    pub kind: String,
    /// The schedule or job name (or `replica:NAME`) it is about.
    pub subject: String,
    /// The run it is about, if any.
    pub run_id: Option<Uuid>,
    /// Instants it stands for (skipped fires).
    pub count: i64,
    /// The error, reason or note.
    pub detail: String,
    /// When the event was recorded.
    pub occurred_at: DateTime<Utc>,
}

/// `GET /v1/alerts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AlertList {
    /// Whether `BELFRY_ALERTS` is set on the replica that answered.
    pub configured: bool,
    /// The channels.
    pub channels: Vec<AlertChannel>,
    /// The latest deliveries, newest first.
    pub deliveries: Vec<AlertDelivery>,
}

/// The query of `GET /v1/alerts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AlertQuery {
    /// Only deliveries in this status.
    #[param(value_type = Option<DeliveryStatus>, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Deliveries to show.
    #[param(minimum = 1, maximum = 500, default = 50, nullable = false)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// The body of `POST /v1/alerts/test`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestAlert {
    /// The channel to send it to.
    pub channel: String,
    /// Text to put in it (default: who asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The answer of `POST /v1/alerts/test`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TestAlertQueued {
    /// The channel.
    pub channel: String,
    /// Always true: the next alert pass (within a second or two) sends it;
    /// its delivery shows in `GET /v1/alerts`.
    pub queued: bool,
}
