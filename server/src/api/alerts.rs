//! `/v1/alerts`: which channels alerts go to, what was sent and what
//! failed, and a test alert to check a channel end to end.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::{Extension, Json};

use belfry_alert::AlertError;
use belfry_api_types::{
    AlertChannel, AlertDelivery, AlertList, AlertQuery, DeliveryStatus, ErrorBody, TestAlert,
    TestAlertQueued,
};
use belfry_ledger::DeliveryRecord;

use super::error::ApiError;
use super::input::{self, QueryParams};
use super::{audit, ApiState, Caller};

/// Most deliveries one answer lists.
const MAX_DELIVERIES: u32 = 500;

/// The API form of a stored delivery.
///
/// # Errors
///
/// [`ApiError`] (503) when the ledger holds a status this build does not
/// know (a newer version wrote it).
pub(crate) fn delivery(r: &DeliveryRecord) -> Result<AlertDelivery, ApiError> {
    let status = DeliveryStatus::from_wire(&r.status).ok_or_else(|| {
        ApiError::unavailable(format!(
            "the ledger holds a delivery status this version does not know: {:?}",
            r.status
        ))
    })?;
    Ok(AlertDelivery {
        id: r.id,
        channel: r.channel.clone(),
        status,
        attempts: r.attempts,
        folded: r.folded,
        last_error: r.last_error.clone(),
        due_at: r.due_at,
        sent_at: r.sent_at,
        event_id: r.event_id,
        kind: r.kind.clone(),
        subject: r.subject.clone(),
        run_id: r.run_id,
        count: r.count,
        detail: r.detail.clone(),
        occurred_at: r.occurred_at,
    })
}

/// The configured channels of `state`'s replica.
pub(crate) fn channels(state: &ApiState) -> Vec<AlertChannel> {
    state
        .alerts()
        .and_then(|a| a.config())
        .map(|config| {
            config
                .channels
                .values()
                .map(|c| AlertChannel {
                    name: c.name.clone(),
                    kind: c.type_name().to_owned(),
                    target: c.target(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `GET /v1/alerts?status=&limit=`.
#[utoipa::path(
    get, path = "/v1/alerts", operation_id = "listAlerts",
    summary = "Alert channels and the latest alert deliveries (sent, pending, failed, folded)",
    params(AlertQuery),
    responses(
        (status = 200, description = "Channels and deliveries", body = AlertList),
        (status = 422, description = "Invalid status or limit", body = ErrorBody),
    ),
)]
pub async fn list(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<AlertList>, ApiError> {
    let q = QueryParams::parse(query.as_deref(), &["status", "limit"])?;
    let status = q
        .text("status")
        .map(|s| {
            DeliveryStatus::from_wire(s).ok_or_else(|| {
                ApiError::invalid(
                    "status",
                    format!("{s:?} is not a delivery status; use pending, sent, failed or folded"),
                )
            })
        })
        .transpose()?;
    let limit = q.number("limit", 50, 1, MAX_DELIVERIES)?;
    let rows = state
        .ledger()
        .alert_deliveries(status.map(DeliveryStatus::as_str), i64::from(limit))
        .await?;
    Ok(Json(AlertList {
        configured: state.alerts().is_some_and(|a| a.config().is_some()),
        channels: channels(&state),
        deliveries: rows.iter().map(delivery).collect::<Result<_, _>>()?,
    }))
}

/// Queues a test alert to `channel` for `caller`, with `note` or a line
/// saying who asked (the API and the web view share it).
///
/// # Errors
///
/// 422 naming `channel` when no channel has that name; 503 when the
/// ledger does not answer.
pub(crate) async fn queue_test(
    state: &ApiState,
    caller: &Caller,
    channel: &str,
    note: Option<&str>,
) -> Result<(), ApiError> {
    let Some(alerts) = state.alerts() else {
        return Err(ApiError::invalid(
            "channel",
            "alerts are not configured on this replica (BELFRY_ALERTS is unset)",
        ));
    };
    let note = note
        .map(str::to_owned)
        .unwrap_or_else(|| format!("a test alert sent by {} from belfry", caller.name));
    match alerts.send_test(channel, &note).await {
        Ok(()) => {
            audit(caller, "alert.test", "", channel);
            Ok(())
        }
        Err(AlertError::Ledger(e)) => Err(e.into()),
        Err(e) => Err(ApiError::invalid("channel", e.to_string())),
    }
}

/// `POST /v1/alerts/test` (`{"channel", "note"?}`): an `alert.test` event
/// for one channel, sent by the next alert pass, unthrottled.
#[utoipa::path(
    post, path = "/v1/alerts/test", operation_id = "testAlert",
    summary = "Send a test alert to one channel",
    request_body = TestAlert,
    responses(
        (status = 202, description = "Queued; its delivery shows in GET /v1/alerts", body = TestAlertQueued),
        (status = 422, description = "No such channel", body = ErrorBody),
    ),
)]
pub async fn test(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<TestAlertQueued>), ApiError> {
    let bytes = input::body_bytes(body)?;
    let value = serde_json::Value::Object(input::json_object(&bytes)?);
    input::storable("note", &value)?;
    let request: TestAlert = input::typed(value)?;
    queue_test(&state, &caller, &request.channel, request.note.as_deref()).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(TestAlertQueued {
            channel: request.channel,
            queued: true,
        }),
    ))
}
