//! The user's own job type in embedded mode: `custom-worker dev` (the real
//! binary, no services) fires schedules of type `invoice` and its handler's
//! outcomes are recorded: a good invoice `succeeded`, a 0-cent one `failed`
//! (a permanent error, not retried).

use std::time::Duration;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_custom-worker");

async fn first_run(api: &str, schedule: &str) -> Option<Value> {
    let body: Value = reqwest::get(format!("{api}/v1/runs?schedule={schedule}"))
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    body["runs"].as_array()?.first().cloned()
}

/// The schedule file entry of `name`: an `invoice` every second with
/// `payload` (a TOML inline table).
fn invoice_schedule(name: &str, payload: &str) -> String {
    format!(
        "[[schedule]]\nname = \"{name}\"\nevery = \"1s\"\njob_type = \"invoice\"\npayload = {payload}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invoice_runs_in_embedded_mode() {
    let dir = std::env::temp_dir().join(format!("belfry-custom-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let schedules = [
        invoice_schedule("invoice-ok", r#"{ customer = "c-42", cents = 1999 }"#),
        invoice_schedule("invoice-zero", r#"{ customer = "c-0", cents = 0 }"#),
    ];
    std::fs::write(dir.join("schedules.toml"), schedules.join("\n")).unwrap();
    let mut command = tokio::process::Command::new(BIN);
    command
        .arg("dev")
        .env_remove("AMQP_URL")
        .env_remove("REDIS_URL")
        .env(
            "DATABASE_URL",
            format!("sqlite://{}", dir.join("dev.db").display()),
        )
        .env("BELFRY_SCHEDULES", dir.join("schedules.toml"))
        .env("BELFRY_API_ADDR", "127.0.0.1:0");
    let (mut child, api) = belfry_testkit::spawn_with_api(command).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (ok, zero) = loop {
        let ok = first_run(&api, "invoice-ok").await;
        let zero = first_run(&api, "invoice-zero").await;
        let done = |r: &Option<Value>| {
            r.as_ref().is_some_and(|r| {
                ["succeeded", "failed", "dead"].contains(&r["status"].as_str().unwrap_or(""))
            })
        };
        if done(&ok) && done(&zero) {
            break (ok.unwrap(), zero.unwrap());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no finished invoice runs: {ok:?} {zero:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(ok["status"], "succeeded", "{ok}");
    assert_eq!(zero["status"], "failed", "{zero}");
    assert_eq!(
        zero["attempts"], 1,
        "a permanent error is not retried: {zero}"
    );
    child.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
