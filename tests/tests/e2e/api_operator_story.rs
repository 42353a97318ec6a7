//! The operator's story through the REST API alone, on two real replicas
//! (`service::start`, as `belfry-scheduler` runs them) and one worker:
//! create a schedule, see every fire run exactly once, pause it (no more
//! fires), resume it, backfill the paused window (each missed fire exactly
//! once), fetch a run and its trace id.

use std::collections::BTreeMap;
use std::time::Duration;

use belfry_runtime::Settings;
use belfry_server::ServerConfig;
use belfry_testkit::eventually;
use belfry_worker::Registry;
use chrono::{DateTime, SubsecRound, Utc};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

async fn call(method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, &url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Every run of `schedule`, through the API, following the cursor.
async fn all_runs(base: &str, schedule: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = call(
            reqwest::Method::GET,
            format!("{base}/v1/runs?schedule={schedule}&limit=500{cursor}"),
            None,
        )
        .await;
        assert_eq!(status, 200, "{page:?}");
        out.extend(page["runs"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return out,
        }
    }
}

fn instants(runs: &[Value]) -> BTreeMap<DateTime<Utc>, usize> {
    let mut by = BTreeMap::new();
    for r in runs {
        let at: DateTime<Utc> = serde_json::from_value(r["scheduled_at"].clone()).unwrap();
        *by.entry(at).or_default() += 1;
    }
    by
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_fire_pause_resume_backfill_and_trace_through_the_api() {
    let env = belfry_testkit::service_env!();
    let worker =
        belfry_tests::serve(&env, Registry::builder().builtins().build().unwrap(), &[]).await;
    let file = std::env::temp_dir().join(format!("belfry-empty-{}.toml", env.namespace));
    std::fs::write(&file, "").unwrap();
    let stop = CancellationToken::new();
    let mut services = Vec::new();
    for name in ["sched-a", "sched-b"] {
        let mut pairs = env.process_env();
        pairs.push(("BELFRY_INSTANCE".into(), name.into()));
        pairs.push(("BELFRY_SCHEDULES".into(), file.display().to_string()));
        // Fires more than 1 s late follow the misfire policy (default
        // fire_once): a few seconds of pause leave real gaps to backfill.
        pairs.push(("BELFRY_MISFIRE_THRESHOLD".into(), "1s".into()));
        let config = ServerConfig::from_settings(&Settings::from_pairs(pairs)).unwrap();
        services.push(
            belfry_server::service::start(&config, stop.clone())
                .await
                .unwrap(),
        );
    }
    let base: Vec<String> = services
        .iter()
        .map(|s| format!("http://{}", s.api_addr.expect("API on")))
        .collect();
    let (a, b) = (&base[0], &base[1]);

    // Create on replica A; both replicas fire it.
    let (status, created) = call(
        reqwest::Method::POST,
        format!("{a}/v1/schedules"),
        Some(json!({"name": "story", "every": "1s", "job_type": "noop"})),
    )
    .await;
    assert_eq!(status, 201, "{created:?}");
    eventually(
        "5 succeeded runs, read through replica B",
        Duration::from_secs(20),
        || async {
            let runs = all_runs(b, "story").await;
            (runs.iter().filter(|r| r["status"] == "succeeded").count() >= 5).then_some(())
        },
    )
    .await;

    // Pause through B: no fire after the pause took effect.
    let (status, paused) = call(
        reqwest::Method::POST,
        format!("{b}/v1/schedules/story/pause"),
        None,
    )
    .await;
    assert_eq!((status, &paused["paused"]), (200, &json!(true)));
    let paused_at = Utc::now().trunc_subsecs(0);
    // Long enough for four fires had it kept firing.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let before_resume = instants(&all_runs(a, "story").await);
    let last_before = *before_resume.keys().last().unwrap();
    assert!(
        last_before <= paused_at + chrono::Duration::seconds(1),
        "fired at {last_before} after the pause at {paused_at}"
    );

    // Resume through A: firing continues.
    let (status, _) = call(
        reqwest::Method::POST,
        format!("{a}/v1/schedules/story/resume"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let resumed_at = Utc::now().trunc_subsecs(0);
    eventually(
        "fires after the resume",
        Duration::from_secs(15),
        || async {
            let runs = instants(&all_runs(a, "story").await);
            (runs
                .keys()
                .last()
                .is_some_and(|t| *t > resumed_at + chrono::Duration::seconds(1)))
            .then_some(())
        },
    )
    .await;

    // Backfill the paused window through B: each missing instant once, the
    // ones that ran are not repeated.
    let first = *before_resume.keys().next().unwrap();
    let to = resumed_at + chrono::Duration::seconds(1);
    let (status, filled) = call(
        reqwest::Method::POST,
        format!("{b}/v1/schedules/story/backfill"),
        Some(json!({"from": first.to_rfc3339(), "to": to.to_rfc3339()})),
    )
    .await;
    assert_eq!(status, 200, "{filled:?}");
    let total = usize::try_from((to - first).num_seconds()).unwrap();
    assert_eq!(filled["instants"], total);
    let dispatched = filled["counts"]["dispatched"].as_u64().unwrap_or(0);
    assert!(
        dispatched >= 2,
        "the paused seconds were missing: {filled:?}"
    );
    assert_eq!(
        dispatched + filled["counts"]["already_ran"].as_u64().unwrap_or(0),
        total as u64,
        "{filled:?}"
    );
    let by_instant = instants(&all_runs(a, "story").await);
    for k in 0..total {
        let at = first + chrono::Duration::seconds(k as i64);
        assert_eq!(
            by_instant.get(&at),
            Some(&1),
            "instant {at}: {by_instant:?}"
        );
    }
    assert!(
        by_instant.values().all(|n| *n == 1),
        "a duplicate: {by_instant:?}"
    );

    // Every backfilled run finishes; one run's detail carries its trace id.
    eventually(
        "backfilled runs succeeded",
        Duration::from_secs(20),
        || async {
            let runs = all_runs(b, "story").await;
            runs.iter()
                .filter(|r| {
                    let at: DateTime<Utc> =
                        serde_json::from_value(r["scheduled_at"].clone()).unwrap();
                    at < to
                })
                .all(|r| r["status"] == "succeeded")
                .then_some(())
        },
    )
    .await;
    let any = all_runs(a, "story").await.last().cloned().unwrap();
    let (status, detail) = call(
        reqwest::Method::GET,
        format!("{b}/v1/runs/{}", any["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let trace = detail["trace_id"].as_str().unwrap_or_default();
    assert!(
        trace.len() == 32 && trace.chars().all(|c| c.is_ascii_hexdigit()),
        "{detail:?}"
    );
    assert!(
        detail["claimed_by"]
            .as_str()
            .is_some_and(|c| c == "sched-a" || c == "sched-b"),
        "{detail:?}"
    );

    stop.cancel();
    for s in services {
        s.wait().await;
    }
    worker.stop().await;
    let _ = std::fs::remove_file(file);
    env.teardown(&["default"]).await;
}
