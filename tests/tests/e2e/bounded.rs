//! Bounded and self-pausing schedules (issue 19): `remaining_runs` counted
//! down with the winning claim (exact with three replicas racing for every
//! fire at once; manual triggers do not count), the pause that says why
//! when it runs out, `start_at`/`end_at` bounding the timetable and the
//! preview, `pause_after_failures`, and pause notes through the API.

use std::sync::Arc;
use std::time::Duration;

use belfry_protocol::ScheduleSpec;
use belfry_scheduler::{FireOutcome, Schedule};
use belfry_server::api::Tokens;
use belfry_testkit::TestEnv;
use belfry_tests::race::{fire_all, replicas};
use belfry_tests::{worker, RunningWorker, TestApi};
use belfry_worker::{Job, JobContext, JobError, Registry};
use chrono::{DateTime, SubsecRound, Utc};
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::api::call;

/// Stores `spec` as the API would, and compiles it.
async fn stored(env: &TestEnv, spec: ScheduleSpec) -> Arc<Schedule> {
    let schedule = Schedule::from_spec(&spec).unwrap();
    env.ledger
        .upsert_schedule(&schedule.to_stored_row(&spec))
        .await
        .unwrap();
    Arc::new(schedule)
}

fn every_10s(name: &str) -> ScheduleSpec {
    ScheduleSpec {
        name: name.into(),
        every: Some("10s".into()),
        job_type: "noop".into(),
        ..ScheduleSpec::default()
    }
}

/// `n` instants of an every-10-s schedule, in the past.
fn instants(n: i64) -> Vec<DateTime<Utc>> {
    let base = Utc::now().trunc_subsecs(0) - chrono::Duration::hours(1);
    let base = base - chrono::Duration::seconds(base.timestamp() % 10);
    (0..n)
        .map(|i| base + chrono::Duration::seconds(10 * i))
        .collect()
}

belfry_testkit::both_backends! {
    async fn remaining_runs_is_exact_with_replicas_racing(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let schedule = stored(&env, ScheduleSpec { remaining_runs: Some(3), ..every_10s("bounded") }).await;
        assert_eq!(env.schedule("bounded").await.remaining_runs, Some(3));
        let replicas = replicas(&env, "r", 3, Some(&belfry_testkit::redis_url())).await;
        // A manual run does not count.
        let manual = replicas[0].trigger(&schedule, false).await;
        assert!(matches!(manual, FireOutcome::Dispatched { .. }), "{manual:?}");
        assert_eq!(env.schedule("bounded").await.remaining_runs, Some(3));
        // Eight instants, each fired by three replicas, all at once.
        let instants = instants(8);
        let outcomes = fire_all(&replicas, &schedule, &instants).await;
        let won = outcomes.iter().filter(|o| matches!(o, FireOutcome::Dispatched { .. })).count();
        assert_eq!(won, 3, "{outcomes:?}");
        let runs: Vec<_> = env
            .all_runs()
            .await
            .into_iter()
            .filter(|r| r.job_name == "bounded" && !r.run_key.contains("manual"))
            .collect();
        assert_eq!(runs.len(), 3, "{runs:?}");
        let row = env.schedule("bounded").await;
        assert_eq!(row.remaining_runs, Some(0));
        assert!(row.paused, "a schedule that ran out is paused");
        assert!(row.pause_note.as_deref().unwrap_or("").starts_with("ran out"), "{row:?}");
        // Later fires (a replica that has not heard yet) are refused.
        let late = replicas[1].fire(&schedule, instants[7] + chrono::Duration::seconds(10)).await;
        assert!(matches!(late, FireOutcome::Skipped { .. }), "{late:?}");
        // A new remaining_runs restarts the count; the same value does not.
        stored(&env, ScheduleSpec { remaining_runs: Some(3), ..every_10s("bounded") }).await;
        assert_eq!(env.schedule("bounded").await.remaining_runs, Some(0));
        stored(&env, ScheduleSpec { remaining_runs: Some(5), ..every_10s("bounded") }).await;
        assert_eq!(env.schedule("bounded").await.remaining_runs, Some(5));
    }
}

belfry_testkit::both_backends! {
    async fn bounds_and_counters_show_in_the_api_and_the_preview(env: TestEnv) {
        let (_, api) = TestApi::of_replica(&env, "api", Tokens::default()).await;
        let start = Utc::now().trunc_subsecs(0) + chrono::Duration::hours(1);
        let start = start - chrono::Duration::seconds(start.timestamp() % 60);
        let end = start + chrono::Duration::minutes(3);
        let created = call(
            Method::POST,
            &api.url("/v1/schedules"),
            None,
            Some(json!({"name": "window", "every": "1m", "job_type": "noop",
                        "start_at": start.to_rfc3339(), "end_at": end.to_rfc3339(),
                        "remaining_runs": 2})),
        )
        .await;
        assert_eq!(created.0, StatusCode::CREATED, "{:?}", created.1);
        assert_eq!(created.1["runs_left"], 2);
        // Inside the window, and no more than the runs left.
        let preview = call(Method::GET, &api.url("/v1/schedules/window/preview?count=10"), None, None).await;
        assert_eq!(preview.0, StatusCode::OK, "{:?}", preview.1);
        let next: Vec<String> = serde_json::from_value(preview.1["next"].clone()).unwrap();
        assert_eq!(next, [start, start + chrono::Duration::minutes(1)].map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
        // A wider window without a counter stops at end_at.
        let open = call(
            Method::POST,
            &api.url("/v1/schedules"),
            None,
            Some(json!({"name": "window2", "every": "1m", "job_type": "noop",
                        "start_at": start.to_rfc3339(), "end_at": end.to_rfc3339()})),
        )
        .await;
        assert_eq!(open.0, StatusCode::CREATED, "{:?}", open.1);
        let preview = call(Method::GET, &api.url("/v1/schedules/window2/preview?count=10"), None, None).await;
        assert_eq!(preview.1["next"].as_array().unwrap().len(), 4, "{:?}", preview.1);
        // Refused values name their field.
        for (patch, field) in [
            (json!({"end_at": start.to_rfc3339(), "start_at": end.to_rfc3339()}), "end_at"),
            (json!({"start_at": "soon"}), "start_at"),
            (json!({"remaining_runs": 0}), "remaining_runs"),
            (json!({"pause_after_failures": 0}), "pause_after_failures"),
            (json!({"overlap": "sometimes"}), "overlap"),
        ] {
            let mut body = json!({"name": "bad", "every": "1m", "job_type": "noop"});
            for (k, v) in patch.as_object().unwrap() {
                body[k] = v.clone();
            }
            let got = call(Method::POST, &api.url("/v1/schedules"), None, Some(body)).await;
            assert_eq!(got.0, StatusCode::UNPROCESSABLE_ENTITY, "{patch}: {:?}", got.1);
            assert_eq!(got.1["field"], field, "{:?}", got.1);
        }
        // Pause with a note: shown until resumed.
        let paused = call(
            Method::POST,
            &api.url("/v1/schedules/window/pause"),
            None,
            Some(json!({"note": "vendor outage"})),
        )
        .await;
        assert_eq!(paused.0, StatusCode::OK, "{:?}", paused.1);
        assert_eq!(paused.1["pause_note"], "vendor outage (anonymous)");
        let resumed = call(Method::POST, &api.url("/v1/schedules/window/resume"), None, None).await;
        assert_eq!(resumed.1["paused"], false);
        assert!(resumed.1.get("pause_note").is_none(), "{:?}", resumed.1);
    }
}

/// Always fails permanently.
struct Fails;

impl Job for Fails {
    const TYPE: &'static str = "fails";
    type Payload = serde_json::Value;

    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        Err(JobError::permanent("the vendor said no"))
    }
}

belfry_testkit::both_backends! {
    async fn pause_after_failures_pauses_with_a_note_and_counts_from_the_resume(env: TestEnv) {
        let registry = Registry::builder().job(Fails).build().unwrap();
        let running = RunningWorker::spawn(worker(&env, "w1", "default", registry, &[]).await);
        let schedule = stored(
            &env,
            ScheduleSpec {
                job_type: "fails".into(),
                pause_after_failures: Some(2),
                ..every_10s("flaky")
            },
        )
        .await;
        let replica = belfry_tests::replica(&env, "r", None).await;
        let t = instants(6);
        let fail = |at: DateTime<Utc>| {
            let (replica, schedule, env) = (&replica, &schedule, &env);
            async move {
                assert!(matches!(replica.fire(schedule, at).await, FireOutcome::Dispatched { .. }));
                let key = belfry_protocol::run_key("flaky", at).unwrap();
                env.wait_terminal("flaky", &key, Duration::from_secs(10)).await
            }
        };
        fail(t[0]).await;
        assert!(!env.schedule("flaky").await.paused, "one failure is not two");
        let second = fail(t[1]).await;
        let row = env.schedule("flaky").await;
        assert!(row.paused, "two consecutive failures pause it");
        let note = row.pause_note.unwrap_or_default();
        assert!(
            note.starts_with("paused after 2 consecutive failures")
                && note.contains(&second.run_key)
                && note.contains("the vendor said no"),
            "{note}"
        );
        // Resumed: the count starts again.
        assert!(env.ledger.set_paused("flaky", false, None).await.unwrap());
        fail(t[2]).await;
        assert!(!env.schedule("flaky").await.paused, "failures before the resume count");
        fail(t[3]).await;
        assert!(env.schedule("flaky").await.paused);
        // Resumed by a replace (PUT with "paused": false): the same.
        let row = env.schedule("flaky").await;
        assert!(env.ledger.replace_schedule(&row, Some(false)).await.unwrap());
        let row = env.schedule("flaky").await;
        assert!(!row.paused && row.pause_note.is_none(), "{row:?}");
        fail(t[4]).await;
        assert!(!env.schedule("flaky").await.paused, "failures before the replace count");
        fail(t[5]).await;
        assert!(env.schedule("flaky").await.paused);
        running.stop().await;
    }
}
