//! Each command: build the request, send it, print the answer.

use reqwest::Method;
use serde_json::{json, Map, Value};

use crate::api_client::{encode, ApiClient, CliError};
use crate::args::{Cli, Command, JobCommand, RunCommand, ScheduleCommand, ScheduleFields};
use crate::table::{cell, render};

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
    fn value(&self, v: &Value, human: impl FnOnce(&Value) -> String) {
        if self.json {
            println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
        } else {
            print!("{}", human(v));
        }
    }
}

fn items(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Lists the items under `key` of `path` (which has a query string) from
/// `cursor`, following every page with `all`; prints them with `rows`, and
/// the cursor of the next page when there is one.
async fn list_pages(
    api: &ApiClient,
    out: &Output,
    path: &str,
    key: &str,
    cursor: &Option<String>,
    all: bool,
    rows: fn(&[Value]) -> String,
) -> Result<(), CliError> {
    let mut cursor = cursor.clone();
    let mut list = Vec::new();
    let next = loop {
        let q = cursor
            .as_ref()
            .map(|c| format!("&cursor={}", encode(c)))
            .unwrap_or_default();
        let page = api.call(Method::GET, &format!("{path}{q}"), None).await?;
        list.extend(items(&page, key));
        match page.get("next_cursor").and_then(Value::as_str) {
            Some(c) if all => cursor = Some(c.to_owned()),
            other => break other.map(str::to_owned),
        }
    };
    let v = json!({ key: list, "next_cursor": next });
    out.value(&v, |_| {
        let mut s = rows(&list);
        if let Some(n) = &next {
            s.push_str(&format!("(more: --cursor {n}, or --all)\n"));
        }
        s
    });
    Ok(())
}

fn json_arg(flag: &str, raw: &str) -> Result<Value, CliError> {
    serde_json::from_str(raw).map_err(|e| {
        CliError::Usage(format!(
            "--{flag} is not valid JSON ({e}); quote it, e.g. --{flag} '{{\"k\": 1}}'"
        ))
    })
}

fn apply_fields(body: &mut Map<String, Value>, f: &ScheduleFields) -> Result<(), CliError> {
    let kinds = [&f.cron, &f.every, &f.at, &f.after];
    if kinds.iter().any(|k| k.is_some()) {
        // A new kind replaces the old one.
        for k in ["cron", "every", "at", "after", "anchor"] {
            body.remove(k);
        }
        if f.cron.is_none() {
            body.remove("timezone");
        }
    }
    for (key, value) in [
        ("cron", &f.cron),
        ("every", &f.every),
        ("at", &f.at),
        ("after", &f.after),
        ("timezone", &f.timezone),
        ("timeout", &f.timeout),
        ("misfire", &f.misfire),
        ("overlap", &f.overlap),
        ("jitter", &f.jitter),
    ] {
        if let Some(v) = value {
            body.insert(key.into(), json!(v));
        }
    }
    if let Some(p) = &f.payload {
        body.insert("payload".into(), json_arg("payload", p)?);
    }
    Ok(())
}

fn schedule_kind(s: &Value) -> (String, String) {
    for k in ["cron", "every", "at"] {
        if let Some(v) = s.get(k).and_then(Value::as_str) {
            let expr = match (k, s.get("timezone").and_then(Value::as_str)) {
                ("cron", Some(tz)) => format!("{v} ({tz})"),
                _ => v.to_owned(),
            };
            return (k.to_owned(), expr);
        }
    }
    ("?".into(), cell(s.get("invalid").unwrap_or(&Value::Null)))
}

fn schedule_rows(list: &[Value]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            let (kind, expr) = schedule_kind(s);
            vec![
                cell(&s["name"]),
                kind,
                expr,
                cell(&s["job_type"]),
                if s["paused"] == json!(true) {
                    "paused".into()
                } else {
                    "active".into()
                },
            ]
        })
        .collect();
    render(&["NAME", "KIND", "WHEN", "JOB TYPE", "STATE"], &rows)
}

fn schedule_detail(s: &Value) -> String {
    let mut out = String::new();
    if let Some(map) = s.as_object() {
        for (k, v) in map {
            out.push_str(&format!("{k:<16} {}\n", cell(v)));
        }
    }
    out
}

/// Reads schedules from a file: TOML `[[schedule]]` tables or one JSON
/// object (or a list of them).
fn schedules_from_file(path: &std::path::Path) -> Result<Vec<Value>, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))?;
    let is_json = path.extension().is_some_and(|e| e == "json");
    if is_json {
        return match serde_json::from_str::<Value>(&text) {
            Ok(Value::Array(list)) => Ok(list),
            Ok(obj @ Value::Object(_)) => Ok(vec![obj]),
            Ok(_) => Err(CliError::Usage(format!(
                "{}: expected a JSON object or a list of them",
                path.display()
            ))),
            Err(e) => Err(CliError::Usage(format!(
                "{} is not valid JSON: {e}",
                path.display()
            ))),
        };
    }
    let doc: toml::Value = toml::from_str(&text)
        .map_err(|e| CliError::Usage(format!("{} is not valid TOML: {e}", path.display())))?;
    let list = doc
        .get("schedule")
        .and_then(toml::Value::as_array)
        .cloned()
        .ok_or_else(|| CliError::Usage(format!("{} has no [[schedule]] tables", path.display())))?;
    list.into_iter()
        .map(|t| {
            serde_json::to_value(t).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))
        })
        .collect()
}

async fn schedules(api: &ApiClient, out: &Output, c: &ScheduleCommand) -> Result<(), CliError> {
    let path = |name: &str, rest: &str| format!("/v1/schedules/{}{rest}", encode(name));
    match c {
        ScheduleCommand::Ls { limit, cursor, all } => {
            list_pages(
                api,
                out,
                &format!("/v1/schedules?limit={limit}"),
                "schedules",
                cursor,
                *all,
                schedule_rows,
            )
            .await?;
        }
        ScheduleCommand::Get { name } => {
            let v = api.call(Method::GET, &path(name, ""), None).await?;
            out.value(&v, schedule_detail);
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
                    let mut body = Map::new();
                    body.insert("name".into(), json!(name));
                    body.insert("job_type".into(), json!(job_type));
                    apply_fields(&mut body, fields)?;
                    vec![Value::Object(body)]
                }
            };
            let mut created = Vec::new();
            for body in bodies {
                let Value::Object(mut body) = body else {
                    return Err(CliError::Usage(
                        "each schedule must be a JSON object (a [[schedule]] table)".into(),
                    ));
                };
                if *paused {
                    body.insert("paused".into(), json!(true));
                }
                let made = api
                    .call(Method::POST, "/v1/schedules", Some(&Value::Object(body)))
                    .await;
                match made {
                    Ok(v) => created.push(v),
                    Err(e) if created.is_empty() => return Err(e),
                    Err(e) => {
                        // Say what is already stored, so a rerun can skip it.
                        let names: Vec<String> = created.iter().map(|c| cell(&c["name"])).collect();
                        eprintln!("belfry: created before the error: {}", names.join(", "));
                        return Err(e);
                    }
                }
            }
            let v = if created.len() == 1 {
                created[0].clone()
            } else {
                Value::Array(created.clone())
            };
            out.value(&v, |_| schedule_rows(&created));
        }
        ScheduleCommand::Edit {
            name,
            job_type,
            fields,
        } => {
            let mut current = api.call(Method::GET, &path(name, ""), None).await?;
            let body = current.as_object_mut().ok_or_else(|| CliError::Response {
                url: path(name, ""),
                message: "not an object".into(),
            })?;
            // The state fields are not sent back: a pause made meanwhile
            // must not be undone by an edit.
            body.remove("paused");
            body.remove("updated_at");
            if let Some(t) = job_type {
                body.insert("job_type".into(), json!(t));
            }
            apply_fields(body, fields)?;
            let v = api
                .call(Method::PUT, &path(name, ""), Some(&current))
                .await?;
            out.value(&v, schedule_detail);
        }
        ScheduleCommand::Rm { name } => {
            api.call(Method::DELETE, &path(name, ""), None).await?;
            out.value(&json!({ "deleted": name }), |_| format!("deleted {name}\n"));
        }
        ScheduleCommand::Pause { name } => {
            let v = api.call(Method::POST, &path(name, "/pause"), None).await?;
            out.value(&v, |_| format!("paused {name}\n"));
        }
        ScheduleCommand::Resume { name } => {
            let v = api.call(Method::POST, &path(name, "/resume"), None).await?;
            out.value(&v, |_| format!("resumed {name}\n"));
        }
        ScheduleCommand::Trigger { name, force } => {
            let v = api
                .call(
                    Method::POST,
                    &path(name, "/trigger"),
                    Some(&json!({ "force": force })),
                )
                .await?;
            out.value(&v, |v| {
                let mut s = format!(
                    "{} run {} ({}) trace {}\n",
                    cell(&v["outcome"]),
                    cell(&v["run_id"]),
                    cell(&v["run_key"]),
                    cell(&v["trace_id"])
                );
                if let Some(m) = v.get("message").and_then(Value::as_str) {
                    s.push_str(&format!("note: {m}\n"));
                }
                s
            });
        }
        ScheduleCommand::Backfill { name, from, to } => {
            let v = api
                .call(
                    Method::POST,
                    &path(name, "/backfill"),
                    Some(&json!({ "from": from, "to": to })),
                )
                .await?;
            out.value(&v, |v| {
                let counts = v["counts"].as_object().cloned().unwrap_or_default();
                let summary: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
                format!(
                    "{} instants in [{from}, {to}): {}\n",
                    cell(&v["instants"]),
                    summary.join(", ")
                )
            });
            let failed = v["counts"]["failed"].as_u64().unwrap_or(0);
            if failed > 0 {
                return Err(CliError::Partial(format!(
                    "{failed} instants could not be claimed (ledger unreachable); run the same backfill again"
                )));
            }
        }
        ScheduleCommand::Preview { name, count } => {
            let v = api
                .call(
                    Method::GET,
                    &format!("{}?count={count}", path(name, "/preview")),
                    None,
                )
                .await?;
            out.value(&v, |v| {
                items(v, "next")
                    .iter()
                    .map(|t| format!("{}\n", cell(t)))
                    .collect()
            });
        }
    }
    Ok(())
}

fn run_rows(list: &[Value]) -> String {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|r| {
            vec![
                cell(&r["id"]),
                cell(&r["job_name"]),
                cell(&r["scheduled_at"]),
                cell(&r["status"]),
                cell(&r["attempts"]),
                cell(&r["worker"]),
                cell(&r["last_error"]),
            ]
        })
        .collect();
    render(
        &[
            "ID",
            "SCHEDULE",
            "SCHEDULED",
            "STATUS",
            "ATTEMPTS",
            "WORKER",
            "ERROR",
        ],
        &rows,
    )
}

fn run_detail(r: &Value) -> String {
    let mut s = String::new();
    for k in [
        "id",
        "job_name",
        "run_key",
        "job_type",
        "status",
        "origin",
        "scheduled_at",
        "claimed_at",
        "dispatched_at",
        "started_at",
        "finished_at",
        "lateness_ms",
        "attempts",
        "claimed_by",
        "worker",
        "last_error",
        "trace_id",
        "payload",
    ] {
        s.push_str(&format!("{k:<14} {}\n", cell(&r[k])));
    }
    let attempts = items(r, "attempt_log");
    if !attempts.is_empty() {
        s.push_str("\nattempts:\n");
        let rows: Vec<Vec<String>> = attempts
            .iter()
            .map(|a| {
                vec![
                    cell(&a["attempt"]),
                    cell(&a["worker"]),
                    cell(&a["started_at"]),
                    cell(&a["finished_at"]),
                    cell(&a["outcome"]),
                    cell(a.get("error").unwrap_or(&Value::Null)),
                ]
            })
            .collect();
        s.push_str(&render(
            &["#", "WORKER", "STARTED", "FINISHED", "OUTCOME", "ERROR"],
            &rows,
        ));
    }
    s
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
            let mut filters = format!("limit={limit}");
            for (k, v) in [
                ("schedule", schedule),
                ("job_type", job_type),
                ("status", status),
                ("from", from),
                ("to", to),
            ] {
                if let Some(v) = v {
                    filters.push_str(&format!("&{k}={}", encode(v)));
                }
            }
            list_pages(
                api,
                out,
                &format!("/v1/runs?{filters}"),
                "runs",
                cursor,
                *all,
                run_rows,
            )
            .await?;
        }
        RunCommand::Show { id } => {
            let v = api
                .call(Method::GET, &format!("/v1/runs/{}", encode(id)), None)
                .await?;
            out.value(&v, run_detail);
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
    let mut body = Map::new();
    body.insert("job_type".into(), json!(job_type));
    if let Some(p) = payload {
        body.insert("payload".into(), json_arg("payload", p)?);
    }
    for (k, v) in [("name", name), ("key", key), ("at", at), ("delay", delay)] {
        if let Some(v) = v {
            body.insert(k.into(), json!(v));
        }
    }
    let v = api
        .call(Method::POST, "/v1/jobs", Some(&Value::Object(body)))
        .await?;
    out.value(&v, |v| {
        format!(
            "{} run {} ({}) status {}\n",
            if v["created"] == json!(true) {
                "enqueued"
            } else {
                "already enqueued:"
            },
            cell(&v["run_id"]),
            cell(&v["run_key"]),
            cell(&v["status"])
        )
    });
    Ok(())
}
