//! The overview's alert sections (recent alerts, failed deliveries) and
//! its "send a test alert" action.

use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::LOCATION;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;

use belfry_ledger::DeliveryRecord;

use crate::api::{ApiError, ApiState, Caller, Role};
use crate::ui::html::{esc, table, url, when};

use super::shortened;

/// Deliveries each section lists.
const ALERT_ROWS: i64 = 10;

/// One delivery as a table row.
fn row(d: &DeliveryRecord) -> String {
    let text = match (&d.last_error, d.status.as_str()) {
        (Some(e), "failed" | "pending") => format!("error: {e}"),
        _ => d.detail.clone(),
    };
    let subject = match d.run_id {
        Some(run) => format!("<a href=\"/ui/runs/{run}\">{}</a>", esc(&d.subject)),
        None => esc(&d.subject),
    };
    format!(
        "<tr><td>{}</td><td>{}</td><td>{subject}</td><td>{}</td><td><span class=\"status {}\">{}</span></td>\
         <td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
        when(Some(d.occurred_at)),
        esc(&d.kind),
        esc(&d.channel),
        esc(&d.status),
        esc(&d.status),
        d.attempts,
        d.folded,
        esc(&shortened(&text, 160))
    )
}

/// The overview's alert sections: the latest alerts and the latest
/// failed deliveries, and for admins the test-alert form.
///
/// # Errors
///
/// The ledger's, as an [`ApiError`].
pub(super) async fn sections(state: &ApiState, caller: &Caller) -> Result<String, ApiError> {
    let ledger = state.ledger();
    let (recent, failed) = tokio::try_join!(
        ledger.alert_deliveries(None, ALERT_ROWS),
        ledger.alert_deliveries(Some("failed"), ALERT_ROWS),
    )?;
    let headers = [
        "occurred", "event", "subject", "channel", "status", "tries", "folded", "detail",
    ];
    let mut body = String::from("<h2>Recent alerts</h2>");
    let channels = crate::api::alerts::channels(state);
    if channels.is_empty() {
        body.push_str(
            "<p class=\"muted\">No alert channel is configured (BELFRY_ALERTS); events are \
             recorded but nobody is told.</p>",
        );
    } else if caller.role == Role::Admin {
        let options: String = channels
            .iter()
            .map(|c| format!("<option>{}</option>", esc(&c.name)))
            .collect();
        let _ = write!(
            body,
            "<form class=\"inline\" method=\"post\" action=\"/ui/alerts/test\">\
             <select name=\"channel\">{options}</select> <button>send a test alert</button></form>"
        );
    }
    body.push_str(&table(
        &headers,
        &recent.iter().map(row).collect::<Vec<_>>(),
    ));
    body.push_str("<h2>Failed alert deliveries</h2>");
    body.push_str(&table(
        &headers,
        &failed.iter().map(row).collect::<Vec<_>>(),
    ));
    Ok(body)
}

/// `POST /ui/alerts/test` (form field `channel`): the API's test alert,
/// then back to the overview with what happened.
pub async fn test_alert(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Response {
    let channel = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "channel")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let target = match crate::api::alerts::queue_test(&state, &caller, &channel, None).await {
        Ok(()) => format!(
            "/ui?msg={}",
            url(&format!(
                "test alert to {channel} queued; it shows below once sent"
            ))
        ),
        Err(e) => format!("/ui?err={}", url(&e.message)),
    };
    (StatusCode::SEE_OTHER, [(LOCATION, target)]).into_response()
}
