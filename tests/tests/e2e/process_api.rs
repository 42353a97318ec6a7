//! The REST API of a real `belfry-scheduler` process: wired by `main`,
//! guarded by its configured tokens, one audit line per change naming who,
//! what and which schedule, secrets never in the log, exit 0 on SIGTERM.

use std::process::{Command, Stdio};
use std::time::Duration;

use belfry_testkit::{eventually, terminate};
use belfry_tests::fault::fleet::bin_dir;
use serde_json::{json, Value};

const SECRET: &str = "s3cret-admin-token-0123456789";

fn log_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_api_with_tokens_and_audits_every_change() {
    let env = belfry_testkit::service_env!();
    let dir = std::env::temp_dir().join(format!("belfry-api-{}", env.namespace));
    std::fs::create_dir_all(&dir).unwrap();
    let schedules = dir.join("schedules.toml");
    std::fs::write(&schedules, "").unwrap();
    let log = dir.join("scheduler.log");
    let child = Command::new(bin_dir().join("belfry-scheduler"))
        .envs(env.process_env())
        .env("BELFRY_SCHEDULES", &schedules)
        .env("BELFRY_INSTANCE", "api-proc")
        .env("BELFRY_LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .env("BELFRY_API_ADMIN_TOKENS", format!("ops:{SECRET}"))
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let addr = eventually(
        "the API address in the log",
        Duration::from_secs(20),
        || async {
            log_lines(&log).iter().find_map(|v| {
                v["message"]
                    .as_str()?
                    .starts_with("API listening")
                    .then(|| v["addr"].as_str().map(str::to_owned))?
            })
        },
    )
    .await;
    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://{addr}{p}");
    let anonymous = http.get(url("/v1/schedules")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let created = http
        .post(url("/v1/schedules"))
        .bearer_auth(SECRET)
        .json(&json!({"name": "audited", "every": "1h", "job_type": "noop"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let paused = http
        .post(url("/v1/schedules/audited/pause"))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(paused.status(), 200);
    let ready = http.get(url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);

    let exit = terminate(child).await;
    assert!(exit.success(), "{exit:?}");
    let lines = log_lines(&log);
    let audits: Vec<(String, String, String)> = lines
        .iter()
        .filter(|v| v["target"] == "belfry::audit")
        .map(|v| {
            let f = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
            (f("who"), f("action"), f("schedule"))
        })
        .collect();
    assert_eq!(
        audits,
        [
            ("ops".into(), "schedule.create".into(), "audited".into()),
            ("ops".into(), "schedule.pause".into(), "audited".into()),
        ]
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains(SECRET), "a token secret reached the log");
    let _ = std::fs::remove_dir_all(dir);
    env.teardown(&[]).await;
}
