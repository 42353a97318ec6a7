//! `GET /ui/schedules`, `GET /ui/schedules/{name}` and the schedule
//! actions (`POST /ui/schedules/{name}/{action}`), which call the engine's
//! operator actions.

use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::header::LOCATION;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use chrono::{DateTime, Utc};

use belfry_api_types::BackfillRequest;
use belfry_ledger::RunFilter;

use crate::api::input::{PathParam, QueryParams};
use crate::api::{ApiError, ApiState, Caller, Role};
use crate::ui::html::{esc, table, url, when, Section};
use belfry_scheduler::schedule_sync::{schedule_of_row, spec_of_row};
use belfry_scheduler::zoned_cron::CronCache;

use super::*;

/// `GET /ui/schedules`: every schedule (100 a page) with its timetable in
/// words, zone, policies, state, next fires and a strip of its last fires.
// Long on purpose: the page top to bottom (filters, rows, strips, pager),
// as it is rendered.
pub async fn schedules(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    RawQuery(query): RawQuery,
) -> PageResult {
    let q = QueryParams::parse(query.as_deref(), &["cursor"]).map_err(error_page)?;
    let rows = state
        .ledger()
        .schedules_page(q.text("cursor"), SCHEDULE_PAGE + 1)
        .await
        .map_err(|e| error_page(e.into()))?;
    let more = rows.len() > SCHEDULE_PAGE as usize;
    let rows = &rows[..rows.len().min(SCHEDULE_PAGE as usize)];
    let names: Vec<String> = rows.iter().map(|r| r.name.clone()).collect();
    let fires = state
        .ledger()
        .recent_fires(&names, STRIP)
        .await
        .map_err(|e| error_page(e.into()))?;
    let mut by_name: std::collections::HashMap<&str, Vec<(DateTime<Utc>, String)>> =
        std::collections::HashMap::new();
    for f in &fires {
        by_name
            .entry(f.job_name.as_str())
            .or_default()
            .push((f.scheduled_at, f.status.clone()));
    }
    // Newest first, whatever order the rows came in.
    for fires in by_name.values_mut() {
        fires.sort_by_key(|f| std::cmp::Reverse(f.0));
    }
    let mut cache = CronCache::default();
    let table_rows: Vec<String> = rows
        .iter()
        .map(|row| {
            let spec = spec_of_row(row);
            let (words, raw, zone, policies) = match &spec {
                Ok(spec) => (
                    belfry_scheduler::describe::describe(spec),
                    spec.cron
                        .clone()
                        .or_else(|| spec.every.clone().map(|e| format!("every = {e}")))
                        .or_else(|| spec.at.clone().map(|a| format!("at = {a}")))
                        .unwrap_or_default(),
                    spec.timezone.clone().unwrap_or_else(|| "UTC".into()),
                    format!(
                        "misfire {}, overlap {}",
                        spec.misfire.as_deref().unwrap_or("fire_once"),
                        spec.overlap.as_deref().unwrap_or("allow")
                    ),
                ),
                Err(e) => (format!("invalid: {e}"), String::new(), String::new(), String::new()),
            };
            let next = schedule_of_row(row, &mut cache)
                .map(|s| {
                    s.upcoming(Utc::now(), 3)
                        .iter()
                        .map(|t| t.format("%m-%d %H:%M:%S").to_string())
                        .collect::<Vec<_>>()
                        .join("<br>")
                })
                .unwrap_or_else(|e| esc(&e.to_string()));
            let strip = by_name.get(row.name.as_str()).map(|f| status_strip(f)).unwrap_or_default();
            format!(
                "<tr><td><a href=\"/ui/schedules/{}\">{}</a><div class=\"muted\">{}</div></td>\
                 <td>{}<div><code>{}</code></div></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                url(&row.name),
                esc(&row.name),
                esc(&row.job_type),
                esc(&words),
                esc(&raw),
                esc(&zone),
                esc(&policies),
                if row.paused {
                    "<span class=\"badge paused\">paused</span>"
                } else {
                    "<span class=\"badge active\">active</span>"
                },
                next,
                strip
            )
        })
        .collect();
    let mut body = String::from("<h1>Schedules</h1>");
    body.push_str(&table(
        &[
            "schedule",
            "when",
            "zone",
            "policies",
            "state",
            "next fires (UTC)",
            "last fires",
        ],
        &table_rows,
    ));
    if more {
        if let Some(last) = rows.last() {
            let _ = write!(
                body,
                "<p class=\"pager\"><a href=\"/ui/schedules?cursor={}\">next page</a></p>",
                url(&last.name)
            );
        }
    }
    Ok(html("Schedules", Section::Schedules, &caller, true, &body))
}

/// `GET /ui/schedules/{name}`: definition, next fires, actions (admins) and
/// run history.
pub async fn schedule(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    PathParam(name): PathParam,
    RawQuery(query): RawQuery,
) -> PageResult {
    let q = QueryParams::parse(query.as_deref(), &["cursor", "msg", "err"]).map_err(error_page)?;
    // Looked up as written: a row whose name was set by hand outside the
    // naming rule still has a page.
    let row = state
        .ledger()
        .schedule(&name)
        .await
        .map_err(|e| error_page(e.into()))?
        .ok_or_else(|| error_page(ApiError::not_found(format!("no schedule named {name:?}"))))?;
    let filter = RunFilter {
        job_name: Some(name.clone()),
        ..RunFilter::default()
    };
    let (runs, next_page) = run_page(&state, &filter, q.text("cursor")).await?;
    let mut body = format!("<h1>{}</h1>{}", esc(&name), flashes(&q));
    let spec = spec_of_row(&row);
    let words = spec
        .as_ref()
        .map(belfry_scheduler::describe::describe)
        .unwrap_or_else(|e| format!("invalid: {e}"));
    let _ = write!(
        body,
        "<p>{} — {}</p>",
        esc(&words),
        if row.paused {
            "<span class=\"badge paused\">paused</span>"
        } else {
            "<span class=\"badge active\">active</span>"
        }
    );
    if let (true, Some(note)) = (row.paused, &row.pause_note) {
        let _ = write!(body, "<div class=\"flash\">paused: {}</div>", esc(note));
    }
    if let Some(left) = row.remaining_runs {
        let _ = write!(body, "<p>runs left (remaining_runs): <b>{left}</b></p>");
    }
    if caller.role == Role::Admin {
        let base = format!("/ui/schedules/{}", url(&name));
        let toggle = if row.paused { "resume" } else { "pause" };
        let _ = write!(
            body,
            "<form class=\"inline\" method=\"post\" action=\"{base}/{toggle}\">\
             <input name=\"note\" placeholder=\"note (optional)\" size=\"24\"> <button>{toggle}</button></form>\
             <form class=\"inline\" method=\"post\" action=\"{base}/trigger\"><button>trigger now</button>\
             <label><input type=\"checkbox\" name=\"force\" value=\"true\"> even if the previous run is unfinished</label></form>\
             <form class=\"inline\" method=\"post\" action=\"{base}/backfill\">backfill from \
             <input name=\"from\" placeholder=\"2026-07-26T00:00:00Z\" size=\"22\"> to \
             <input name=\"to\" placeholder=\"2026-07-26T01:00:00Z\" size=\"22\">\
             <label><input type=\"checkbox\" name=\"force\" value=\"true\"> allow overlap</label>\
             <button>backfill</button></form>"
        );
    }
    let next = upcoming(&row, 10)
        .map(|n| {
            n.iter()
                .map(|t| format!("<li>{}</li>", when(Some(*t))))
                .collect::<String>()
        })
        .unwrap_or_else(|e| format!("<li>{}</li>", esc(&e.to_string())));
    let definition = spec
        .as_ref()
        .ok()
        .and_then(|s| serde_json::to_string_pretty(s).ok())
        .unwrap_or_else(|| row.spec.as_ref().map(|v| v.to_string()).unwrap_or_default());
    let _ = write!(
        body,
        "<h2>Definition</h2><pre>{}</pre><h2>Next fires (UTC)</h2><ul>{next}</ul><h2>Runs</h2>{}",
        esc(&definition),
        table(&RUN_HEADERS, &run_rows(&runs))
    );
    if let Some(c) = next_page {
        let _ = write!(
            body,
            "<p class=\"pager\"><a href=\"/ui/schedules/{}?cursor={c}\">older runs</a></p>",
            url(&name)
        );
    }
    Ok(html(&name, Section::Schedules, &caller, true, &body))
}

/// `POST /ui/schedules/{name}/{action}`: pause, resume, trigger, backfill;
/// the same operations as the API, then back to the schedule's page.
pub async fn act(
    State(state): State<ApiState>,
    Extension(caller): Extension<Caller>,
    axum::extract::Path((name, action)): axum::extract::Path<(String, String)>,
    body: Bytes,
) -> Response {
    let form: std::collections::HashMap<String, String> = form_urlencoded::parse(&body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let force = form.get("force").is_some_and(|v| v == "true");
    let done: Result<String, ApiError> = async {
        crate::api::schedules::checked_name(&name)?;
        match action.as_str() {
            "pause" | "resume" => {
                state
                    .ops()
                    .set_paused(
                        &caller.name,
                        &name,
                        action == "pause",
                        form.get("note").map(String::as_str),
                        "web view",
                    )
                    .await?;
                Ok(format!("{action}d"))
            }
            "trigger" => {
                let t = crate::api::schedules::triggered_view(
                    &state.ops().trigger(&caller.name, &name, force).await?,
                )?;
                Ok(format!(
                    "triggered: run {} ({})",
                    t.run_key.unwrap_or_default(),
                    t.outcome
                ))
            }
            "backfill" => {
                let field = |k: &str| form.get(k).cloned().unwrap_or_default();
                let request = BackfillRequest {
                    from: field("from"),
                    to: field("to"),
                    force,
                };
                let done =
                    crate::api::schedules::run_backfill(&state, &caller, &name, &request).await?;
                let done = crate::api::schedules::backfilled_view(&name, &done);
                let counts: Vec<String> = done
                    .counts
                    .iter()
                    .map(|(outcome, n)| format!("{outcome}: {n}"))
                    .collect();
                Ok(format!(
                    "backfilled {} instants: {}",
                    done.instants,
                    counts.join(", ")
                ))
            }
            other => Err(ApiError::not_found(format!("no action {other:?}"))),
        }
    }
    .await;
    let target = match done {
        Ok(msg) => format!("/ui/schedules/{}?msg={}", url(&name), url(&msg)),
        Err(e) if e.status == StatusCode::NOT_FOUND || e.status == StatusCode::BAD_REQUEST => {
            return error_page(e)
        }
        Err(e) => format!("/ui/schedules/{}?err={}", url(&name), url(&e.message)),
    };
    (StatusCode::SEE_OTHER, [(LOCATION, target)]).into_response()
}
