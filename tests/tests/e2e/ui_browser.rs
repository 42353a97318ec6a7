//! The web view in a real browser: headless Chromium (Debian's package)
//! driven by `ui-tests/e2e.mjs` (playwright-core), against a real replica
//! (`service::start`: timer, API, web view) and a worker. The script opens
//! the overview, waits for a schedule's strip to turn green, pauses it from
//! its page and sees no more fires, triggers it, reads a failed run's error,
//! watches a running run's log grow live on its page (issue 23), and checks
//! that a schedule name holding `<script>` is shown as text.
//!
//! Needs `node`, `ui-tests/node_modules` and `/usr/bin/chromium`:
//! `scripts/ui-deps` installs them (scripts/test runs it). Missing, the test
//! fails saying so; it never passes without running.

use std::path::Path;
use std::time::Duration;

use belfry_ledger::{AttemptEntry, NewRun, RunStatus};
use belfry_runtime::Settings;
use belfry_server::ServerConfig;
use belfry_worker::Registry;
use chrono::{SubsecRound, Utc};
use tokio_util::sync::CancellationToken;

/// Logs a line and a progress report, waits (at most 2 minutes) until the
/// file its payload names exists, logs one more line and succeeds.
#[derive(Clone, Default)]
struct Gated;

impl belfry_worker::Job for Gated {
    const TYPE: &'static str = "gated";
    type Payload = serde_json::Value;
    async fn run(
        &self,
        ctx: belfry_worker::JobContext,
        payload: serde_json::Value,
    ) -> Result<(), belfry_worker::JobError> {
        ctx.log(tracing::Level::INFO, "first line");
        ctx.progress(1, Some(2), "half way");
        let gate = payload["gate"].as_str().unwrap_or_default().to_owned();
        for _ in 0..6_000 {
            if Path::new(&gate).exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        ctx.log(tracing::Level::INFO, "line after the gate");
        ctx.progress(2, Some(2), "done");
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_web_view_works_in_headless_chromium() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !(root.join("ui-tests/node_modules/playwright-core").exists()
        && Path::new(&chromium).exists())
    {
        belfry_testkit::skip(&format!(
            "ui-tests/node_modules or {chromium} is missing; run scripts/ui-deps"
        ));
        return;
    }
    let env = belfry_testkit::service_env!();
    let registry = Registry::builder().builtins().job(Gated).build().unwrap();
    let worker = belfry_tests::serve(&env, registry, &[]).await;
    let file = std::env::temp_dir().join(format!("belfry-ui-{}.toml", env.namespace));
    std::fs::write(&file, "").unwrap();
    let mut pairs = env.process_env();
    pairs.push(("BELFRY_INSTANCE".into(), "ui-e2e".into()));
    pairs.push(("BELFRY_SCHEDULES".into(), file.display().to_string()));
    let config = ServerConfig::from_settings(&Settings::from_pairs(pairs)).unwrap();
    let stop = CancellationToken::new();
    let service = belfry_server::service::start(&config, stop.clone())
        .await
        .unwrap();
    let base = format!("http://{}", service.api_addr.expect("API on"));

    // The schedule the browser watches, created through the API.
    let created = reqwest::Client::new()
        .post(format!("{base}/v1/schedules"))
        .json(&serde_json::json!({"name": "e2e-tick", "every": "1s", "job_type": "noop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    // A failed run with markup in its error.
    let at = Utc::now().trunc_subsecs(0) - chrono::Duration::minutes(1);
    let run = NewRun {
        id: uuid::Uuid::now_v7(),
        job_name: "e2e-fail".into(),
        run_key: belfry_protocol::run_key("e2e-fail", at).unwrap(),
        job_type: "noop".into(),
        payload: serde_json::Value::Null,
        scheduled_at: at,
        claimed_by: "ui-e2e".into(),
        trace_id: None,
        traceparent: None,
        options: Default::default(),
        // Not due for the outbox while the test takes it through an
        // attempt: the running replica's reconcile pass would otherwise
        // publish it (or skip it as a late claim) between the claim and the
        // attempt's start.
        next_dispatch_at: Utc::now() + chrono::Duration::hours(1),
    };
    assert!(env.ledger.claim(&run).await.unwrap());
    let stored = env.ledger.run(run.id).await.unwrap().unwrap();
    env.ledger
        .begin_attempt(&stored.to_message(), "w-e2e", Duration::from_secs(60))
        .await
        .unwrap();
    let error = "boom: <b>not bold</b>";
    let entry = AttemptEntry {
        attempt: 1,
        worker: "w-e2e".into(),
        started_at: Utc::now(),
        finished_at: Utc::now(),
        outcome: "failed".into(),
        error: Some(error.into()),
        log_lines: None,
        result: None,
    };
    assert!(env
        .ledger
        .end_attempt(run.id, RunStatus::Failed, &entry, Some(error), None)
        .await
        .unwrap());
    // A row written by hand whose name is markup.
    sqlx::query(
        "INSERT INTO schedules (name, every_ms, job_type, paused) \
         VALUES ('<script>window.__belfry_xss = 1</script>', 1000, 'noop', true)",
    )
    .execute(env.ledger.pg_pool().expect("a Postgres ledger"))
    .await
    .unwrap();

    // A run whose handler logs, then waits for the script to open its gate.
    let gate = std::env::temp_dir().join(format!("belfry-ui-gate-{}", env.namespace));
    let enqueued: serde_json::Value = reqwest::Client::new()
        .post(format!("{base}/v1/jobs"))
        .json(&serde_json::json!({"job_type": "gated", "payload": {"gate": gate.display().to_string()}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let log_run = enqueued["run_id"].as_str().expect("a run id").to_owned();

    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(root.join("ui-tests/e2e.mjs"))
        .arg(&base)
        .env("CHROMIUM", &chromium)
        .env("E2E_LOG_RUN", &log_run)
        .env("E2E_LOG_GATE", &gate);
    if let Ok(dir) = std::env::var("BELFRY_UI_SCREENSHOTS") {
        cmd.arg(dir);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("the browser test finished within 3 minutes")
        .expect("node runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "browser test failed:\n{text}");
    assert!(text.contains("e2e: ok"), "{text}");

    stop.cancel();
    service.wait().await;
    worker.stop().await;
    let _ = std::fs::remove_file(file);
    let _ = std::fs::remove_file(gate);
    env.teardown(&["default"]).await;
}
