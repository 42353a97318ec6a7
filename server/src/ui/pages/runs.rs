//! `GET /ui/runs` (filtered, paged) and `GET /ui/runs/{id}`.

use std::fmt::Write as _;

use axum::extract::{RawQuery, State};
use axum::Extension;

use crate::api::input::{PathParam, QueryParams};
use crate::api::{ApiError, ApiState, Caller};
use crate::ui::html::{esc, table, url, when, Section};

use super::*;

/// `GET /ui/runs`: runs with filters (schedule, job type, status, time
/// range), newest first, 50 a page.
pub async fn runs(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> PageResult {
    let q = QueryParams::parse(
        query.as_deref(),
        &["schedule", "job_type", "status", "from", "to", "cursor"],
    )
    .map_err(error_page)?;
    let filter = crate::api::runs::run_filter(&q).map_err(error_page)?;
    let (runs, next) = run_page(&state, &filter, q.text("cursor")).await?;
    let field = |n: &str, ph: &str| {
        format!(
            "<input name=\"{n}\" placeholder=\"{ph}\" value=\"{}\" size=\"16\">",
            esc(q.text(n).unwrap_or(""))
        )
    };
    let mut body = format!(
        "<h1>Runs</h1><form method=\"get\" action=\"/ui/runs\" class=\"inline\">{}{}{}{}{}<button>filter</button></form>",
        field("schedule", "schedule"),
        field("job_type", "job type"),
        field("status", "failed,dead"),
        field("from", "from (RFC 3339)"),
        field("to", "to (RFC 3339)"),
    );
    body.push_str(&table(&RUN_HEADERS, &run_rows(&runs)));
    if let Some(c) = next {
        let mut keep = String::new();
        for n in ["schedule", "job_type", "status", "from", "to"] {
            if let Some(v) = q.text(n) {
                let _ = write!(keep, "&{n}={}", url(v));
            }
        }
        let _ = write!(
            body,
            "<p class=\"pager\"><a href=\"/ui/runs?cursor={c}{keep}\">older runs</a></p>"
        );
    }
    Ok(html("Runs", Section::Runs, &caller, true, &body))
}

/// `GET /ui/runs/{id}`: one run's timings, attempts and errors, replica,
/// worker and trace.
pub async fn run(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(id): PathParam,
) -> PageResult {
    let id = uuid::Uuid::parse_str(&id)
        .map_err(|_| error_page(ApiError::bad_request(format!("{id:?} is not a run id"))))?;
    let detail = run_detail(&state, id).await?;
    let r = &detail.run;
    let trace = match (&r.trace_id, state.trace_ui()) {
        (Some(t), Some(template)) => format!(
            "<a href=\"{}\">{}</a>",
            esc(&template.replace("{trace_id}", &url(t))),
            esc(t)
        ),
        (Some(t), None) => format!("<code>{}</code>", esc(t)),
        (None, _) => "-".into(),
    };
    let facts: Vec<(&str, String)> = vec![
        (
            "schedule",
            format!(
                "<a href=\"/ui/schedules/{}\">{}</a>",
                url(&r.job_name),
                esc(&r.job_name)
            ),
        ),
        ("run key", esc(&r.run_key)),
        ("job type", esc(&r.job_type)),
        (
            "status",
            format!("<span class=\"badge s-{0}\">{0}</span>", r.status),
        ),
        ("scheduled", when(Some(r.scheduled_at))),
        ("claimed", when(r.claimed_at)),
        ("dispatched", when(r.dispatched_at)),
        ("started", when(r.started_at)),
        ("finished", when(r.finished_at)),
        ("lateness (scheduled → dispatched)", lateness(r)),
        ("attempts", r.attempts.to_string()),
        ("claimed by", esc(r.claimed_by.as_deref().unwrap_or("-"))),
        ("worker", esc(r.worker.as_deref().unwrap_or("-"))),
        (
            "last error",
            format!("<pre>{}</pre>", esc(r.last_error.as_deref().unwrap_or(""))),
        ),
        ("trace", trace),
        (
            "payload",
            format!(
                "<pre>{}</pre>",
                esc(&serde_json::to_string_pretty(&detail.payload).unwrap_or_default())
            ),
        ),
    ];
    let rows: Vec<String> = facts
        .iter()
        .map(|(k, v)| format!("<tr><th>{}</th><td>{v}</td></tr>", esc(k)))
        .collect();
    let attempts: Vec<String> = detail
        .attempt_log
        .iter()
        .map(|a| {
            format!(
                "<tr><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><pre>{}</pre></td></tr>",
                a.attempt,
                esc(&a.worker),
                when(Some(a.started_at)),
                when(Some(a.finished_at)),
                esc(&a.outcome),
                esc(a.error.as_deref().unwrap_or(""))
            )
        })
        .collect();
    let body = format!(
        "<h1>Run {}</h1><table><tbody>{}</tbody></table><h2>Attempts</h2>{}",
        esc(&r.run_key),
        rows.concat(),
        table(
            &["#", "worker", "started", "finished", "outcome", "error"],
            &attempts
        )
    );
    Ok(html(&r.run_key, Section::Runs, &caller, true, &body))
}
