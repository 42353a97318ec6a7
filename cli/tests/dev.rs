//! `belfry dev`, the real binary, in embedded mode: no Postgres, RabbitMQ or
//! Redis. It fires the schedules of its file, answers the CLI, and survives
//! `kill -9` in the middle of a running job: after a restart the run ends
//! exactly once and the fires missed while it was down follow each
//! schedule's misfire policy.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use belfry_ledger::{Ledger, RunRecord};
use belfry_testkit::{eventually, noop_every_second};
use chrono::{DateTime, Timelike, Utc};
use serde_json::{json, Value};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_belfry");

const SCHEDULES: &str = r#"
[[schedule]]
name = "long"
after = "2s"
job_type = "sleep"
payload = { duration_ms = 5000 }

[[schedule]]
name = "tick-skip"
every = "2s"
job_type = "noop"
misfire = "skip"

[[schedule]]
name = "tick-once"
every = "2s"
job_type = "noop"
misfire = "fire_once"
"#;

/// A running `belfry dev` and the API address it printed.
struct Dev {
    child: Child,
    api: String,
}

/// A new directory under the temporary directory whose `schedules.toml`
/// holds `schedules`.
fn dev_dir(schedules: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("belfry-dev-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("schedules.toml"), schedules).unwrap();
    dir
}

/// The URL of the embedded database `belfry dev` keeps in `dir`.
fn database_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("dev.db").display())
}

/// The setting that puts `belfry dev` of `dir` on its embedded database.
fn embedded_database(dir: &Path) -> [(String, String); 1] {
    [("DATABASE_URL".to_owned(), database_url(dir))]
}

async fn start(dir: &Path) -> Dev {
    start_with(dir, &embedded_database(dir)).await
}

/// `belfry dev` with `env` added (embedded unless it names Postgres).
async fn start_with(dir: &Path, env: &[(String, String)]) -> Dev {
    let (child, api) = belfry_testkit::spawn_with_api(dev_command(dir, env)).await;
    Dev { child, api }
}

/// The `belfry dev` command of `dir` (its `schedules.toml`), with `env`
/// added.
fn dev_command(dir: &Path, env: &[(String, String)]) -> Command {
    let mut command = Command::new(BIN);
    command
        .arg("dev")
        .env_remove("DATABASE_URL")
        .env_remove("AMQP_URL")
        .env_remove("REDIS_URL")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("BELFRY_SCHEDULES", dir.join("schedules.toml"))
        .env("BELFRY_API_ADDR", "127.0.0.1:0")
        .env("BELFRY_MISFIRE_THRESHOLD", "1s")
        .env("BELFRY_RETRY_JITTER", "false")
        .env("RUST_LOG", "info")
        .current_dir(dir)
        .stderr(Stdio::inherit());
    command
}

/// The JSON `url` answers with.
async fn get_json(url: &str) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

async fn runs(api: &str, schedule: &str) -> Vec<Value> {
    let body = get_json(&format!("{api}/v1/runs?schedule={schedule}&limit=100")).await;
    body["runs"].as_array().cloned().unwrap_or_default()
}

/// The newest `succeeded` run of `schedule`, if any.
async fn succeeded(api: &str, schedule: &str) -> Option<Value> {
    runs(api, schedule)
        .await
        .into_iter()
        .find(|r| r["status"] == "succeeded")
}

/// Sleeps until the next instant whose second is odd and whose
/// milliseconds are `millis`: as far as possible from the even seconds the
/// 2 s schedules fire at.
async fn until_odd_second_plus(millis: u32) {
    let now = Utc::now();
    let mut at = now.with_nanosecond(millis * 1_000_000).unwrap();
    while at <= now || at.second().is_multiple_of(2) {
        at += chrono::Duration::seconds(1);
    }
    tokio::time::sleep((at - now).to_std().unwrap()).await;
}

fn between(runs: &[RunRecord], after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<&RunRecord> {
    runs.iter()
        .filter(|r| r.scheduled_at > after && r.scheduled_at <= until)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_job_then_restart_ends_the_run_once_and_applies_misfire_policies() {
    let dir = dev_dir(SCHEDULES);

    let mut first = start(&dir).await;
    eventually(
        "the long job running, and a tick",
        Duration::from_secs(30),
        || async {
            let running = runs(&first.api, "long").await;
            let ticked = !runs(&first.api, "tick-once").await.is_empty();
            (ticked && running.first().is_some_and(|r| r["status"] == "running")).then_some(())
        },
    )
    .await;
    // The CLI sees the runs.
    let listed = Command::new(BIN)
        .args(["--api", &first.api, "runs", "ls", "--schedule", "tick-once"])
        .output()
        .await
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    assert!(
        String::from_utf8_lossy(&listed.stdout).contains("  tick-once  "),
        "{listed:?}"
    );

    // kill -9 while the 5 s job runs, away from a tick.
    until_odd_second_plus(500).await;
    let killed_at = Utc::now();
    first.child.kill().await.unwrap();

    // Down for three ticks; restarted shortly after an odd second.
    tokio::time::sleep(Duration::from_secs(6)).await;
    until_odd_second_plus(100).await;
    let restarted_at = Utc::now();
    let mut second = start(&dir).await;
    let ready = get_json(&format!("{}/readyz", second.api)).await;
    assert_eq!(
        (
            &ready["status"],
            &ready["mode"],
            &ready["database"],
            &ready["queue"]
        ),
        (
            &json!("ready"),
            &json!("embedded"),
            &json!("up"),
            &json!("up")
        ),
        "{ready}"
    );
    eventually(
        "the interrupted run to finish",
        Duration::from_secs(40),
        || async { succeeded(&second.api, "long").await },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A graceful stop this time.
    let pid = second.child.id().unwrap().to_string();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(term.success());
    let exit = tokio::time::timeout(Duration::from_secs(40), second.child.wait())
        .await
        .expect("belfry dev stops on SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit:?}");

    // The process is gone, so the file can be opened here.
    let ledger = Ledger::connect(&database_url(&dir), 2).await.unwrap();

    let long = ledger.runs_of("long", 100).await.unwrap();
    assert_eq!(long.len(), 1, "{long:?}");
    let run = &long[0];
    assert_eq!(run.status_text, "succeeded", "{run:?}");
    assert_eq!(run.attempts, 2, "the killed attempt stays counted: {run:?}");
    let log = run.attempt_entries().unwrap();
    assert_eq!(log.len(), 1, "only the second attempt finished: {log:?}");
    assert_eq!((log[0].attempt, log[0].outcome.as_str()), (2, "succeeded"));

    let skip = ledger.runs_of("tick-skip", 1000).await.unwrap();
    let once = ledger.runs_of("tick-once", 1000).await.unwrap();
    for r in skip.iter().chain(&once) {
        if r.scheduled_at <= restarted_at + chrono::Duration::milliseconds(500) {
            assert_eq!(r.status_text, "succeeded", "{r:?}");
        }
    }
    assert!(
        skip.iter().any(|r| r.scheduled_at < killed_at),
        "fired before the kill"
    );
    assert!(
        skip.iter().any(|r| r.scheduled_at > restarted_at),
        "fired after the restart"
    );
    let missed_skip = between(
        &skip,
        killed_at,
        restarted_at - chrono::Duration::milliseconds(1500),
    );
    assert!(
        missed_skip.is_empty(),
        "misfire = skip fired missed instants: {missed_skip:?}"
    );
    let missed_once = between(
        &once,
        killed_at,
        restarted_at + chrono::Duration::milliseconds(500),
    );
    assert_eq!(
        missed_once.len(),
        1,
        "misfire = fire_once fires one of the missed instants: {missed_once:?}"
    );
    ledger.close().await;
    drop(ledger);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_file_is_refused_with_a_clear_error() {
    let dir = dev_dir("");
    let first = start(&dir).await;
    let second = dev_command(&dir, &embedded_database(&dir))
        .stderr(Stdio::piped())
        .output()
        .await
        .unwrap();
    let stderr = belfry_testkit::stderr_of_exit_1(&second);
    assert!(
        stderr.contains("another belfry process has it open"),
        "{stderr}"
    );
    drop(first);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_command_runs_the_distributed_mode_on_the_real_services() {
    let env = belfry_testkit::service_env!();
    let dir = dev_dir(&noop_every_second("tick"));
    // DATABASE_URL (Postgres), AMQP_URL, REDIS_URL and a namespace of this
    // test's own.
    let dev = start_with(&dir, &env.process_env()).await;
    let ready = get_json(&format!("{}/readyz", dev.api)).await;
    assert_eq!(
        (
            &ready["mode"],
            &ready["postgres"],
            &ready["rabbitmq"],
            &ready["redis"]
        ),
        (
            &json!("distributed"),
            &json!("up"),
            &json!("up"),
            &json!("up")
        ),
        "{ready}"
    );
    eventually("a tick to run", Duration::from_secs(30), || async {
        succeeded(&dev.api, "tick").await
    })
    .await;
    // The runs are in Postgres, where every other replica sees them.
    let stored = env.ledger.runs_of("tick", 100).await.unwrap();
    assert!(
        stored.iter().any(|r| r.status_text == "succeeded"),
        "{stored:?}"
    );
    drop(dev);
    assert!(
        !dir.join(".belfry").exists(),
        "no embedded database was made"
    );
    let _ = std::fs::remove_dir_all(&dir);
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_view_reads_the_embedded_database() {
    let dir = dev_dir(&noop_every_second("tick"));
    let dev = start(&dir).await;
    let done = eventually("a tick to run", Duration::from_secs(30), || async {
        succeeded(&dev.api, "tick").await
    })
    .await;
    let id = done["id"].as_str().unwrap().to_owned();
    let key = done["run_key"].as_str().unwrap().to_owned();
    // Every page is built from the embedded database's queries (the
    // overview's chart and counts, the strips of recent fires, run lists).
    for (path, expect) in [
        ("/ui".to_owned(), "<rect class=\"ok\""),
        ("/ui/schedules".to_owned(), "tick"),
        ("/ui/schedules/tick".to_owned(), "every 1s"),
        ("/ui/runs?schedule=tick".to_owned(), "succeeded"),
        (format!("/ui/runs/{id}"), key.as_str()),
    ] {
        let page = reqwest::get(format!("{}{path}", dev.api)).await.unwrap();
        assert_eq!(page.status(), 200, "{path}");
        let html = page.text().await.unwrap();
        assert!(html.contains(expect), "{path} lacks {expect:?}: {html}");
    }
    drop(dev);
    let _ = std::fs::remove_dir_all(&dir);
}
