//! Each command: build the request, send it, print the answer. Requests and
//! answers are the API's own types (`belfry-api-types`); `--json` prints
//! the answer as the API sent it.

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use belfry_api_types::{AlertList, AlertQuery, TestAlert, TestAlertQueued};
use belfry_api_types::{
    Backfill, BackfillOutcome, BackfillRequest, CancelAnswer, CancelResult, CancelRun, Enqueued,
    JobRequest, LogLine, Page, PauseRequest, Preview, Run, RunDetail, RunList, RunLogPage,
    RunLogQuery, RunQuery, Schedule, ScheduleInput, ScheduleList, ScheduleQuery, TriggerRequest,
    Triggered, MAX_LOG_PAGE,
};

use crate::api_client::{ApiClient, CliError, NONE};
use crate::args::{
    AlertCommand, Cli, Command, JobCommand, RunCommand, ScheduleCommand, ScheduleFields,
};
use crate::table::{cell, instant, maybe, render_each};
use belfry_api_types::encode_url_component as encode;

/// Runs `cli`, printing to stdout.
///
/// # Errors
///
/// [`CliError`]; its [`CliError::exit_code`] is the process's.
pub async fn run(cli: &Cli) -> Result<(), CliError> {
    let api = ApiClient::new(&cli.api, cli.token.clone());
    let out = Output { json: cli.json };
    match &cli.command {
        Command::Schedules(c) => schedules(&api, &out, c).await,
        Command::Runs(c) => runs(&api, &out, c).await,
        Command::Jobs(c) => jobs(&api, &out, c).await,
        Command::Alerts(c) => alerts(&api, &out, c).await,
        // A server, not an API call: the binary starts it (see main.rs).
        Command::Dev => Err(CliError::Usage(
            "`belfry dev` runs a server; start it from the belfry binary".into(),
        )),
    }
}

struct Output {
    json: bool,
}

impl Output {
    fn show<T: Serialize>(&self, v: &T, human: impl FnOnce(&T) -> String) {
        if self.json {
            println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        } else {
            print!("{}", human(v));
        }
    }
}

/// How often `belfry runs logs --follow` asks for new lines.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// How long `belfry runs logs --follow` keeps asking through an API that
/// cannot be reached (a scheduler restarting) before it gives up.
const FOLLOW_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// `belfry runs logs`: pages of the run's log from `after`; with `follow`,
/// asks again until the API says the log is complete. With `--json`, one
/// JSON line per log line.
async fn run_logs(
    api: &ApiClient,
    out: &Output,
    id: &str,
    follow: bool,
    mut after: Option<String>,
) -> Result<(), CliError> {
    let path = format!("/v1/runs/{}/logs", encode(id));
    let mut attempt = None;
    // Since when the API has not answered (following only).
    let mut unreachable_since: Option<std::time::Instant> = None;
    loop {
        let query = RunLogQuery {
            after: after.clone(),
            limit: Some(MAX_LOG_PAGE),
        };
        let page: RunLogPage = match api.call(Method::GET, &path, Some(&query), NONE).await {
            Ok(page) => {
                unreachable_since = None;
                page
            }
            // Following a run through a scheduler's restart: ask again from
            // the same cursor, so no line is lost or printed twice.
            Err(e) if follow && e.is_transient() => {
                let since = *unreachable_since.get_or_insert_with(|| {
                    eprintln!("belfry: {e}; asking again for up to {FOLLOW_PATIENCE:?}");
                    std::time::Instant::now()
                });
                if since.elapsed() > FOLLOW_PATIENCE {
                    return Err(e);
                }
                tokio::time::sleep(FOLLOW_EVERY).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        for line in &page.lines {
            if out.json {
                println!("{}", serde_json::to_string(line).unwrap_or_default());
                continue;
            }
            if attempt != Some(line.attempt) {
                attempt = Some(line.attempt);
                println!("── attempt {} ──", line.attempt);
            }
            println!("{}", log_line(line));
        }
        after = Some(page.next.clone());
        let full = page.lines.len() == MAX_LOG_PAGE as usize;
        if full {
            continue;
        }
        if !follow || page.complete {
            if !out.json && page.complete && follow {
                println!("── run {} ──", page.status.as_str());
            }
            return Ok(());
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
    }
}

/// One log line for a terminal: time, level, text, fields; progress as
/// `[done/total] note`. Control characters other than newline and tab are
/// printed escaped, so a handler's text cannot move the cursor or retitle
/// the terminal.
fn log_line(l: &LogLine) -> String {
    printable(&l.text())
}

/// `s` with every control character but `\n` and `\t` escaped (`\u{1b}`).
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Lists `path` with the query `query(cursor)` from `cursor`, following
/// every page with `all`; prints the items with `rows`, and the cursor of
/// the next page when there is one.
async fn list_pages<P, Q>(
    api: &ApiClient,
    out: &Output,
    path: &str,
    query: impl Fn(Option<String>) -> Q,
    cursor: &Option<String>,
    all: bool,
    rows: fn(&[P::Item]) -> String,
) -> Result<(), CliError>
where
    P: Page + Serialize + DeserializeOwned,
    Q: Serialize,
{
    let mut cursor = cursor.clone();
    let mut list = Vec::new();
    let next = loop {
        let page: P = api
            .call(Method::GET, path, Some(&query(cursor.take())), NONE)
            .await?;
        let (items, next) = page.into_parts();
        list.extend(items);
        match next {
            Some(c) if all => cursor = Some(c),
            other => break other,
        }
    };
    let mut human = rows(&list);
    if let Some(n) = &next {
        human.push_str(&format!("(more: --cursor {n}, or --all)\n"));
    }
    out.show(&P::from_parts(list, next), |_| human);
    Ok(())
}

fn json_arg(flag: &str, raw: &str) -> Result<Value, CliError> {
    serde_json::from_str(raw).map_err(|e| {
        CliError::Usage(format!(
            "--{flag} is not valid JSON ({e}); quote it, e.g. --{flag} '{{\"k\": 1}}'"
        ))
    })
}

fn apply_fields(body: &mut ScheduleInput, f: &ScheduleFields) -> Result<(), CliError> {
    if [&f.cron, &f.every, &f.at, &f.after]
        .iter()
        .any(|k| k.is_some())
    {
        // A new kind replaces the old one.
        body.cron = None;
        body.every = None;
        body.at = None;
        body.after = None;
        body.anchor = None;
        if f.cron.is_none() {
            body.timezone = None;
        }
    }
    for (field, value) in [
        (&mut body.cron, &f.cron),
        (&mut body.every, &f.every),
        (&mut body.at, &f.at),
        (&mut body.after, &f.after),
        (&mut body.timezone, &f.timezone),
        (&mut body.timeout, &f.timeout),
        (&mut body.misfire, &f.misfire),
        (&mut body.overlap, &f.overlap),
        (&mut body.jitter, &f.jitter),
        (&mut body.start_at, &f.start_at),
        (&mut body.end_at, &f.end_at),
    ] {
        if value.is_some() {
            field.clone_from(value);
        }
    }
    if f.remaining_runs.is_some() {
        body.remaining_runs = f.remaining_runs;
    }
    if f.pause_after_failures.is_some() {
        body.pause_after_failures = f.pause_after_failures;
    }
    if let Some(p) = &f.payload {
        body.payload = Some(json_arg("payload", p)?);
    }
    Ok(())
}

fn schedule_kind(s: &Schedule) -> (String, String) {
    if let Some(cron) = &s.cron {
        let expr = match &s.timezone {
            Some(tz) => format!("{cron} ({tz})"),
            None => cron.clone(),
        };
        return ("cron".into(), expr);
    }
    match (&s.every, &s.at) {
        (Some(every), _) => ("every".into(), every.clone()),
        (None, Some(at)) => ("at".into(), at.clone()),
        (None, None) => ("?".into(), maybe(s.invalid.as_ref())),
    }
}

fn schedule_rows(list: &[Schedule]) -> String {
    let headers = ["NAME", "KIND", "WHEN", "JOB TYPE", "STATE"];
    render_each(&headers, list, |s| {
        let (kind, expr) = schedule_kind(s);
        vec![
            cell(&s.name),
            kind,
            cell(&expr),
            maybe(s.job_type.as_ref()),
            if s.paused { "paused" } else { "active" }.into(),
        ]
    })
}

/// Every field the schedule has, one a line, as the API names them.
fn schedule_detail(s: &Schedule) -> String {
    let Ok(Value::Object(fields)) = serde_json::to_value(s) else {
        return String::new();
    };
    fields
        .iter()
        .map(|(k, v)| {
            let text = match v {
                Value::Null => "-".to_owned(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            format!("{k:<16} {}\n", cell(&text))
        })
        .collect()
}

/// Reads schedules from a file: TOML `[[schedule]]` tables or one JSON
/// object (or a list of them).
fn schedules_from_file(path: &std::path::Path) -> Result<Vec<ScheduleInput>, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        CliError::Usage(format!("{} {what}: {e}", path.display()))
    };
    if path.extension().is_some_and(|e| e == "json") {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            Many(Vec<ScheduleInput>),
            One(Box<ScheduleInput>),
        }
        let value: Value = serde_json::from_str(&text).map_err(|e| bad("is not valid JSON", &e))?;
        return match serde_json::from_value::<OneOrMany>(value.clone()) {
            Ok(OneOrMany::Many(list)) => Ok(list),
            Ok(OneOrMany::One(one)) => Ok(vec![*one]),
            // Say what is wrong with the (first) schedule.
            Err(_) => Err(match value {
                Value::Array(list) => {
                    serde_json::from_value::<Vec<ScheduleInput>>(Value::Array(list)).err()
                }
                obj @ Value::Object(_) => serde_json::from_value::<ScheduleInput>(obj).err(),
                _ => None,
            }
            .map_or_else(
                || bad("", &"expected a JSON object or a list of them"),
                |e| bad("is not a schedule", &e),
            )),
        };
    }
    #[derive(serde::Deserialize)]
    struct File {
        schedule: Option<Vec<ScheduleInput>>,
    }
    let file: File = toml::from_str(&text).map_err(|e| bad("is not a schedule file", &e))?;
    file.schedule
        .ok_or_else(|| bad("has no [[schedule]] tables", &""))
}

// Long on purpose: one arm per `belfry schedules` subcommand, each
// request -> answer -> print; kept together so the subcommand table reads
// as one.
async fn schedules(api: &ApiClient, out: &Output, c: &ScheduleCommand) -> Result<(), CliError> {
    let path = |name: &str, rest: &str| format!("/v1/schedules/{}{rest}", encode(name));
    match c {
        ScheduleCommand::Ls { limit, cursor, all } => {
            let query = |cursor| ScheduleQuery {
                limit: Some(*limit),
                cursor,
            };
            list_pages::<ScheduleList, _>(
                api,
                out,
                "/v1/schedules",
                query,
                cursor,
                *all,
                schedule_rows,
            )
            .await?;
        }
        ScheduleCommand::Get { name } => {
            let s: Schedule = api.call(Method::GET, &path(name, ""), NONE, NONE).await?;
            out.show(&s, schedule_detail);
        }
        ScheduleCommand::Add {
            file,
            name,
            job_type,
            fields,
            paused,
        } => {
            let bodies = match file {
                Some(f) => schedules_from_file(f)?,
                None => {
                    let mut body = ScheduleInput {
                        name: name.clone(),
                        job_type: job_type.clone().unwrap_or_default(),
                        ..ScheduleInput::default()
                    };
                    apply_fields(&mut body, fields)?;
                    vec![body]
                }
            };
            let mut created: Vec<Schedule> = Vec::new();
            for mut body in bodies {
                if *paused {
                    body.paused = Some(true);
                }
                match api
                    .call(Method::POST, "/v1/schedules", NONE, Some(&body))
                    .await
                {
                    Ok(s) => created.push(s),
                    Err(e) if created.is_empty() => return Err(e),
                    Err(e) => {
                        // Say what is already stored, so a rerun can skip it.
                        let names: Vec<&str> = created.iter().map(|c| c.name.as_str()).collect();
                        eprintln!("belfry: created before the error: {}", names.join(", "));
                        return Err(e);
                    }
                }
            }
            if let [one] = created.as_slice() {
                out.show(one, |s| schedule_rows(std::slice::from_ref(s)));
            } else {
                out.show(&created, |list| schedule_rows(list));
            }
        }
        ScheduleCommand::Edit {
            name,
            job_type,
            fields,
        } => {
            let current: Schedule = api.call(Method::GET, &path(name, ""), NONE, NONE).await?;
            // The state fields are not sent back: a pause made meanwhile
            // must not be undone by an edit.
            let mut body = current.into_input();
            if let Some(t) = job_type {
                body.job_type.clone_from(t);
            }
            apply_fields(&mut body, fields)?;
            let s: Schedule = api
                .call(Method::PUT, &path(name, ""), NONE, Some(&body))
                .await?;
            out.show(&s, schedule_detail);
        }
        ScheduleCommand::Rm { name } => {
            api.call_no_content(Method::DELETE, &path(name, "")).await?;
            out.show(&serde_json::json!({ "deleted": name }), |_| {
                format!("deleted {name}\n")
            });
        }
        ScheduleCommand::Pause { name, note } => {
            let body = PauseRequest { note: note.clone() };
            let s: Schedule = api
                .call(Method::POST, &path(name, "/pause"), NONE, Some(&body))
                .await?;
            out.show(&s, |_| format!("paused {name}\n"));
        }
        ScheduleCommand::Resume { name, note } => {
            let body = PauseRequest { note: note.clone() };
            let s: Schedule = api
                .call(Method::POST, &path(name, "/resume"), NONE, Some(&body))
                .await?;
            out.show(&s, |_| format!("resumed {name}\n"));
        }
        ScheduleCommand::Trigger { name, force } => {
            let t: Triggered = api
                .call(
                    Method::POST,
                    &path(name, "/trigger"),
                    NONE,
                    Some(&TriggerRequest { force: *force }),
                )
                .await?;
            out.show(&t, |t| {
                let mut s = format!(
                    "{} run {} ({}) trace {}\n",
                    t.outcome,
                    t.run_id,
                    maybe(t.run_key.as_ref()),
                    maybe(t.trace_id.as_ref())
                );
                if let Some(m) = &t.message {
                    s.push_str(&format!("note: {}\n", cell(m)));
                }
                s
            });
        }
        ScheduleCommand::Backfill { name, from, to } => {
            let request = BackfillRequest {
                from: from.clone(),
                to: to.clone(),
                force: false,
            };
            let b: Backfill = api
                .call(Method::POST, &path(name, "/backfill"), NONE, Some(&request))
                .await?;
            out.show(&b, |b| {
                let summary: Vec<String> =
                    b.counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
                format!(
                    "{} instants in [{from}, {to}): {}\n",
                    b.instants,
                    summary.join(", ")
                )
            });
            let failed = b.counts.get(&BackfillOutcome::Failed).copied().unwrap_or(0);
            if failed > 0 {
                return Err(CliError::Partial(format!(
                    "{failed} instants could not be claimed (ledger unreachable); run the same backfill again"
                )));
            }
        }
        ScheduleCommand::Preview { name, count } => {
            let query = belfry_api_types::PreviewQuery {
                count: Some(*count),
            };
            let p: Preview = api
                .call(Method::GET, &path(name, "/preview"), Some(&query), NONE)
                .await?;
            out.show(&p, |p| {
                p.next.iter().map(|t| format!("{}\n", instant(t))).collect()
            });
        }
    }
    Ok(())
}

fn run_rows(list: &[Run]) -> String {
    let headers = [
        "ID",
        "SCHEDULE",
        "SCHEDULED",
        "STATUS",
        "ATTEMPTS",
        "WORKER",
        "ERROR",
    ];
    render_each(&headers, list, |r| {
        vec![
            r.id.to_string(),
            cell(&r.job_name),
            instant(&r.scheduled_at),
            r.status.to_string(),
            r.attempts.to_string(),
            maybe(r.worker.as_ref()),
            maybe(r.last_error.as_ref()),
        ]
    })
}

fn run_detail(d: &RunDetail) -> String {
    let r = &d.run;
    let when = |t: &Option<chrono::DateTime<chrono::Utc>>| maybe(t.as_ref().map(instant));
    let mut s = String::new();
    for (k, v) in [
        ("id", r.id.to_string()),
        ("job_name", cell(&r.job_name)),
        ("run_key", cell(&r.run_key)),
        ("job_type", cell(&r.job_type)),
        ("status", r.status.to_string()),
        ("origin", r.origin.to_string()),
        ("scheduled_at", instant(&r.scheduled_at)),
        ("claimed_at", when(&r.claimed_at)),
        ("dispatched_at", when(&r.dispatched_at)),
        ("started_at", when(&r.started_at)),
        ("finished_at", when(&r.finished_at)),
        ("lateness_ms", maybe(r.lateness_ms.as_ref())),
        ("attempts", r.attempts.to_string()),
        ("claimed_by", maybe(r.claimed_by.as_ref())),
        ("worker", maybe(r.worker.as_ref())),
        ("last_error", maybe(r.last_error.as_ref())),
        ("trace_id", maybe(r.trace_id.as_ref())),
        ("payload", json_cell(&d.payload)),
    ] {
        s.push_str(&format!("{k:<14} {v}\n"));
    }
    if !d.attempt_log.is_empty() {
        s.push_str("\nattempts:\n");
        let headers = ["#", "WORKER", "STARTED", "FINISHED", "OUTCOME", "ERROR"];
        s.push_str(&render_each(&headers, &d.attempt_log, |a| {
            vec![
                a.attempt.to_string(),
                cell(&a.worker),
                instant(&a.started_at),
                instant(&a.finished_at),
                cell(&a.outcome),
                maybe(a.error.as_ref()),
            ]
        }));
    }
    for (title, links) in [("parents", &d.parents), ("follow-ups", &d.children)] {
        if links.is_empty() {
            continue;
        }
        s.push_str(&format!("\n{title}:\n"));
        let headers = ["ID", "RUN_KEY", "STATUS"];
        s.push_str(&render_each(&headers, links, |l| {
            vec![
                l.id.to_string(),
                cell(&l.run_key),
                l.status
                    .map_or_else(|| "gone".to_owned(), |st| st.to_string()),
            ]
        }));
    }
    s
}

/// A user's JSON value (a payload) as a cell: compact JSON, `-` for null.
fn json_cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => cell(s),
        other => cell(&other.to_string()),
    }
}

async fn runs(api: &ApiClient, out: &Output, c: &RunCommand) -> Result<(), CliError> {
    match c {
        RunCommand::Ls {
            schedule,
            job_type,
            status,
            from,
            to,
            limit,
            cursor,
            all,
        } => {
            let query = |cursor| RunQuery {
                schedule: schedule.clone(),
                job_type: job_type.clone(),
                status: status.clone(),
                from: from.clone(),
                to: to.clone(),
                limit: Some(*limit),
                cursor,
            };
            list_pages::<RunList, _>(api, out, "/v1/runs", query, cursor, *all, run_rows).await?;
        }
        RunCommand::Show { id } => {
            let d: RunDetail = api
                .call(Method::GET, &format!("/v1/runs/{}", encode(id)), NONE, NONE)
                .await?;
            out.show(&d, run_detail);
        }
        RunCommand::Logs { id, follow, after } => {
            run_logs(api, out, id, *follow, after.clone()).await?;
        }
        RunCommand::Cancel { id, reason } => {
            let body = CancelRun {
                reason: reason.clone(),
            };
            let a: CancelAnswer = api
                .call(
                    Method::POST,
                    &format!("/v1/runs/{}/cancel", encode(id)),
                    NONE,
                    Some(&body),
                )
                .await?;
            out.show(&a, |a| match a.result {
                CancelResult::Cancelled => format!("run {} cancelled\n", a.run_id),
                CancelResult::CancelRequested => format!(
                    "run {} is running: its worker was told to stop it (status {})\n",
                    a.run_id, a.status
                ),
            });
        }
    }
    Ok(())
}

async fn jobs(api: &ApiClient, out: &Output, c: &JobCommand) -> Result<(), CliError> {
    let JobCommand::Enqueue {
        job_type,
        payload,
        name,
        key,
        at,
        delay,
    } = c;
    let body = JobRequest {
        job_type: job_type.clone(),
        payload: payload
            .as_deref()
            .map(|p| json_arg("payload", p))
            .transpose()?
            .unwrap_or_default(),
        name: name.clone(),
        key: key.clone(),
        at: at.clone(),
        delay: delay.clone(),
        ..JobRequest::default()
    };
    let e: Enqueued = api
        .call(Method::POST, "/v1/jobs", NONE, Some(&body))
        .await?;
    out.show(&e, |e| {
        format!(
            "{} run {} ({}) status {}\n",
            if e.created {
                "enqueued"
            } else {
                "already enqueued:"
            },
            e.run_id,
            cell(&e.run_key),
            maybe(e.status.as_ref())
        )
    });
    Ok(())
}

/// The human form of `GET /v1/alerts`: the channels, then the deliveries.
fn alert_list(a: &AlertList) -> String {
    let mut s = String::new();
    if !a.configured {
        s.push_str("alerts are not configured (BELFRY_ALERTS is unset on the replica)\n");
    } else {
        s.push_str(&render_each(
            &["CHANNEL", "TYPE", "TARGET"],
            &a.channels,
            |c| vec![cell(&c.name), cell(&c.kind), cell(&c.target)],
        ));
    }
    s.push('\n');
    let headers = [
        "OCCURRED",
        "KIND",
        "SUBJECT",
        "CHANNEL",
        "STATUS",
        "TRIES",
        "FOLDED",
        "DETAIL / ERROR",
    ];
    s.push_str(&render_each(&headers, &a.deliveries, |d| {
        let text = match (&d.last_error, d.status.as_str()) {
            (Some(e), "failed" | "pending") => format!("error: {e}"),
            _ => d.detail.clone(),
        };
        vec![
            instant(&d.occurred_at),
            cell(&d.kind),
            cell(&d.subject),
            cell(&d.channel),
            d.status.to_string(),
            d.attempts.to_string(),
            d.folded.to_string(),
            cell(&text.chars().take(120).collect::<String>()),
        ]
    }));
    s
}

async fn alerts(api: &ApiClient, out: &Output, c: &AlertCommand) -> Result<(), CliError> {
    match c {
        AlertCommand::Ls { status, limit } => {
            let query = AlertQuery {
                status: status.clone(),
                limit: Some(*limit),
            };
            let a: AlertList = api
                .call(Method::GET, "/v1/alerts", Some(&query), NONE)
                .await?;
            out.show(&a, alert_list);
        }
        AlertCommand::Test { channel, note } => {
            let body = TestAlert {
                channel: channel.clone(),
                note: note.clone(),
            };
            let a: TestAlertQueued = api
                .call(Method::POST, "/v1/alerts/test", NONE, Some(&body))
                .await?;
            out.show(&a, |a| {
                format!(
                    "test alert to {} queued; `belfry alerts ls` shows its delivery\n",
                    a.channel
                )
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handlers_control_characters_are_printed_escaped_but_newlines_and_tabs_kept() {
        let line: LogLine = serde_json::from_value(serde_json::json!({
            "attempt": 1, "seq": 0, "at": "2026-12-06T03:00:00Z", "kind": "log",
            "level": "info", "message": "a\u{1b}]0;owned\u{7}b\tc\nd",
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let printed = log_line(&line);
        assert!(
            !printed.contains('\u{1b}') && !printed.contains('\u{7}'),
            "{printed:?}"
        );
        assert!(
            printed.ends_with("a\\u{1b}]0;owned\\u{7}b\tc\nd"),
            "{printed:?}"
        );
    }
}
