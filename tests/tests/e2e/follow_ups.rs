//! Follow-up jobs (issue 22): runs enqueued when another run ends, with
//! run keys derived from the parent's, exactly once under redelivered
//! outcomes and replicas passing at once; joins that wait for several
//! parents; the child in its parent's trace, seeing its parents' outcome.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_ledger::{AttemptEntry, AttemptStart, RunStatus};
use belfry_protocol::{FollowUp, FollowUps, JobMessage, JobOptions, ParentRun};
use belfry_testkit::{eventually, TestEnv};
use belfry_tests::{reconciling, replica, t0, worker, RunningWorker};
use belfry_worker::{Job, JobContext, JobError, Registry};
use chrono::Utc;
use serde_json::json;

/// Succeeds (with its payload's `result` as the run's result, if any), or
/// fails for good when its payload says `"fail"`.
#[derive(Clone, Default)]
struct Step;

impl Job for Step {
    const TYPE: &'static str = "step";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, payload: serde_json::Value) -> Result<(), JobError> {
        if let Some(result) = payload.get("result") {
            ctx.set_result(result)?;
        }
        if payload == json!("fail") || payload["fail"] == json!(true) {
            return Err(JobError::permanent("told to fail"));
        }
        Ok(())
    }
}

/// A follow-up run's key and the parents it saw.
type Seen = (String, Vec<ParentRun>);

/// Records what each follow-up run saw.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Job for Recorder {
    const TYPE: &'static str = "recorder";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        self.seen
            .lock()
            .map_err(|_| JobError::permanent("poisoned"))?
            .push((ctx.run_key.clone(), ctx.parents.clone()));
        Ok(())
    }
}

fn child(name: &str, job_type: &str) -> FollowUp {
    FollowUp {
        job_name: name.into(),
        job_type: job_type.into(),
        ..FollowUp::default()
    }
}

fn with_follow_ups(follow_ups: FollowUps) -> JobOptions {
    JobOptions {
        follow_ups,
        ..JobOptions::default()
    }
}

/// Ends `message`'s run as `status` the way a worker does (an attempt
/// started, then ended), and returns the run's id.
async fn finish(env: &TestEnv, message: &JobMessage, status: RunStatus) -> uuid::Uuid {
    let start = env
        .ledger
        .begin_attempt(message, "w1", Duration::from_secs(60))
        .await
        .unwrap();
    let AttemptStart::Started { id, attempt } = start else {
        panic!("{start:?}");
    };
    let entry = AttemptEntry {
        attempt,
        worker: "w1".into(),
        started_at: Utc::now(),
        finished_at: Utc::now(),
        outcome: status.as_str().into(),
        error: (status != RunStatus::Succeeded).then(|| "it broke".to_owned()),
        log_lines: None,
        // A succeeded run's result names it (the join test reads them).
        result: (status == RunStatus::Succeeded).then(|| json!({"job": message.job_name})),
    };
    let error = entry.error.clone();
    assert!(env
        .ledger
        .end_attempt(id, status, &entry, error.as_deref(), None)
        .await
        .unwrap());
    id
}

belfry_testkit::both_backends! {
    async fn a_follow_up_runs_once_in_its_parents_trace_seeing_its_outcome(env: TestEnv) {
        let recorder = Recorder::default();
        let registry = Registry::builder()
            .job(Step)
            .job(recorder.clone())
            .build()
            .unwrap();
        let w = RunningWorker::spawn(worker(&env, "w1", "default", registry, &[]).await);
        let r = Arc::new(replica(&env, "sched-a", None).await);
        let loop_ = reconciling(r);
        let lists = FollowUps {
            on_success: vec![child("load", "recorder")],
            on_failure: vec![child("page-oncall", "recorder")],
            ..FollowUps::default()
        };
        let ok = env
            .enqueue_with("extract-ok", "step", json!({"result": {"rows": 42}}), t0(), with_follow_ups(lists.clone()))
            .await;
        // Sets a result, then fails: a failed run passes no result on.
        let bad = env
            .enqueue_with("extract-bad", "step", json!({"result": {"rows": 1}, "fail": true}), t0(), with_follow_ups(lists))
            .await;
        let ok_run = env.wait_terminal_of(&ok, Duration::from_secs(30)).await;
        let bad_run = env.wait_terminal_of(&bad, Duration::from_secs(30)).await;
        assert_eq!((ok_run.status_text.as_str(), bad_run.status_text.as_str()), ("succeeded", "failed"));
        let load = env.wait_terminal("load", "load@2026-07-26T03:00:00Z", Duration::from_secs(30)).await;
        let page = env
            .wait_terminal("page-oncall", "page-oncall@2026-07-26T03:00:00Z", Duration::from_secs(30))
            .await;
        assert_eq!((load.status_text.as_str(), page.status_text.as_str()), ("succeeded", "succeeded"));
        // In the parent's trace.
        assert_eq!(load.trace_id, ok_run.trace_id);
        assert_eq!(page.trace_id, bad_run.trace_id);
        // The handler saw its parent and how it ended.
        let seen = recorder.seen.lock().unwrap().clone();
        let of = |key: &str| seen.iter().find(|(k, _)| k == key).map(|(_, p)| p.clone()).unwrap();
        let parents = of("load@2026-07-26T03:00:00Z");
        assert_eq!((parents.len(), parents[0].id, parents[0].status.as_str()), (1, ok_run.id, "succeeded"));
        // And the result its parent's handler set, kept with its attempt.
        assert_eq!(parents[0].result, Some(json!({"rows": 42})));
        let entries = ok_run.attempt_entries().unwrap();
        assert_eq!(entries[0].result, Some(json!({"rows": 42})));
        let parents = of("page-oncall@2026-07-26T03:00:00Z");
        assert_eq!((parents[0].id, parents[0].status.as_str()), (bad_run.id, "failed"));
        assert_eq!(parents[0].error.as_deref(), Some("told to fail"));
        assert_eq!(parents[0].result, None);
        // Each end enqueued its own list only, once.
        assert_eq!(seen.len(), 2, "{seen:?}");
        for (name, key) in [("page-oncall", "page-oncall@2026-07-26T03:00:00Z"), ("load", "load@2026-07-26T03:00:00Z")] {
            assert_eq!(env.ledger.runs_of(name, 10).await.unwrap().len(), 1, "{key}");
        }
        loop_.cancel();
        w.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn follow_ups_are_enqueued_once_under_redelivery_and_replica_races(env: TestEnv) {
        const PARENTS: usize = 40;
        env.declare_default_group(&["step"]).await;
        let lists = FollowUps {
            on_success: vec![child("child", "step")],
            on_finish: vec![child("audit", "step")],
            ..FollowUps::default()
        };
        let mut ids = Vec::new();
        for i in 0..PARENTS {
            let at = t0() + chrono::Duration::minutes(i as i64);
            let m = env
                .enqueue_with("parent", "step", json!(null), at, with_follow_ups(lists.clone()))
                .await;
            ids.push(finish(&env, &m, RunStatus::Succeeded).await);
            // The same message again (a redelivery): the run has ended, and
            // its outcome cannot be written twice.
            let again = env.ledger.begin_attempt(&m, "w2", Duration::from_secs(60)).await.unwrap();
            assert!(matches!(again, AttemptStart::AlreadyFinished { .. }), "{again:?}");
        }
        // Three replicas pass at once, in pages of 5 (so their passes
        // overlap on the 40 parents), until a pass finds nothing.
        let passes = futures::future::join_all(["sched-a", "sched-b", "sched-c"].map(|by| {
            let ledger = env.ledger.clone();
            async move {
                let mut enqueued = 0;
                let mut pages = 0;
                loop {
                    let pass = ledger.settle_follow_ups(5, by).await.unwrap();
                    if pass.parents == 0 {
                        return (enqueued, pages);
                    }
                    enqueued += pass.enqueued.len();
                    pages += 1;
                }
            }
        }))
        .await;
        let enqueued: usize = passes.iter().map(|(e, _)| e).sum();
        assert_eq!(enqueued, 2 * PARENTS, "each child counted once by the pass that inserted it: {passes:?}");
        for name in ["child", "audit"] {
            let runs = env.ledger.runs_of(name, 1000).await.unwrap();
            assert_eq!(runs.len(), PARENTS, "{name}");
            let mut keys: Vec<_> = runs.iter().map(|r| r.run_key.clone()).collect();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), PARENTS, "{name}: one run per parent");
            assert!(runs.iter().all(|r| r.status_text == "claimed"), "{name}: due for the outbox");
        }
        // Decided: another pass (a replica's whole loop) finds no parent.
        let r = replica(&env, "sched-d", None).await;
        assert_eq!(r.settle_follow_ups_once().await.unwrap(), 0);
        assert_eq!(env.ledger.settle_follow_ups(200, "sched-a").await.unwrap().parents, 0);
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_join_runs_once_every_parent_succeeded_and_is_cancelled_when_one_failed(env: TestEnv) {
        let join = |other: &str| FollowUps {
            on_success: vec![FollowUp { after: vec![other.into()], ..child("load", "step") }],
            ..FollowUps::default()
        };
        env.declare_default_group(&["step"]).await;
        let r = replica(&env, "sched-a", None).await;
        // Fire 1: A succeeds first; its join waits for B.
        let a1 = env.enqueue_with("extract-a", "step", json!(null), t0(), with_follow_ups(join("extract-b"))).await;
        let b1 = env.enqueue_with("extract-b", "step", json!(null), t0(), with_follow_ups(join("extract-a"))).await;
        let a1_id = finish(&env, &a1, RunStatus::Succeeded).await;
        assert_eq!(r.settle_follow_ups_once().await.unwrap(), 0);
        assert!(env.ledger.run_by_key("load", "load@2026-07-26T03:00:00Z").await.unwrap().is_none());
        // B succeeds: its pass sees A succeeded, and enqueues the child once.
        let b1_id = finish(&env, &b1, RunStatus::Succeeded).await;
        assert_eq!(r.settle_follow_ups_once().await.unwrap(), 1);
        let load = env.ledger.run_by_key("load", "load@2026-07-26T03:00:00Z").await.unwrap().unwrap();
        let options: JobOptions = serde_json::from_value(load.options.clone()).unwrap();
        let mut parents: Vec<_> = options.parents.iter().map(|p| p.id).collect();
        parents.sort();
        let mut expected = vec![a1_id, b1_id];
        expected.sort();
        assert_eq!(parents, expected);
        // Both parents' results: the pass's own parent (B) and the other
        // one it looked up (A).
        for p in &options.parents {
            assert_eq!(p.result, Some(json!({"job": p.job_name})), "{p:?}");
        }
        // A's join, looked at again (a second later), finds the child
        // there: A is decided with nothing more enqueued.
        let again = eventually("A's join looked at again", Duration::from_secs(10), || async {
            let pass = env.ledger.settle_follow_ups(200, "sched-b").await.unwrap();
            (pass.parents > 0).then_some(pass)
        })
        .await;
        assert_eq!((again.parents, again.enqueued.len(), again.waiting), (1, 0, 0), "{again:?}");
        assert_eq!(env.ledger.settle_follow_ups(200, "sched-b").await.unwrap().parents, 0);
        assert_eq!(env.ledger.runs_of("load", 10).await.unwrap().len(), 1);
        // Fire 2: A succeeds, B fails: the child is recorded cancelled, with why.
        let t1 = t0() + chrono::Duration::hours(1);
        let a2 = env.enqueue_with("extract-a", "step", json!(null), t1, with_follow_ups(join("extract-b"))).await;
        let b2 = env.enqueue_with("extract-b", "step", json!(null), t1, with_follow_ups(join("extract-a"))).await;
        finish(&env, &a2, RunStatus::Succeeded).await;
        r.settle_follow_ups_once().await.unwrap();
        finish(&env, &b2, RunStatus::Failed).await;
        let skipped = eventually("the join child recorded", Duration::from_secs(10), || async {
            r.settle_follow_ups_once().await.unwrap();
            env.ledger.run_by_key("load", "load@2026-07-26T04:00:00Z").await.unwrap()
        })
        .await;
        assert_eq!(skipped.status_text, "cancelled");
        let why = skipped.last_error.unwrap_or_default();
        assert!(why.contains("parent extract-b@2026-07-26T04:00:00Z ended failed"), "{why}");
        assert_eq!(env.ledger.runs_of("load", 10).await.unwrap().len(), 2);
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn the_api_takes_follow_ups_and_shows_parents_and_children(env: TestEnv) {
        use reqwest::{Method, StatusCode};
        env.declare_default_group(&["step"]).await;
        let (r, api) =
            belfry_tests::TestApi::of_replica(&env, "api-replica", Default::default()).await;
        let jobs = api.url("/v1/jobs");
        let made = crate::api::call(
            Method::POST,
            &jobs,
            None,
            Some(json!({"job_type": "step", "name": "extract", "key": "2026-12-05",
                        "on_success": [{"name": "load", "job_type": "step",
                                        "payload": {"table": "orders"}, "timeout": "5m",
                                        "on_failure": [{"name": "page-oncall", "job_type": "step"}]}]})),
        )
        .await;
        assert_eq!(made.0, StatusCode::CREATED, "{:?}", made.1);
        let parent_id: uuid::Uuid = made.1["run_id"].as_str().unwrap().parse().unwrap();
        let parent = env.ledger.run(parent_id).await.unwrap().unwrap();
        assert_eq!(parent.options["follow_ups"]["on_success"][0]["options"]["timeout_ms"], 300_000);
        finish(&env, &parent.to_message(), RunStatus::Succeeded).await;
        assert_eq!(r.settle_follow_ups_once().await.unwrap(), 1);
        let shown = crate::api::call(Method::GET, &api.url(&format!("/v1/runs/{parent_id}")), None, None).await;
        assert_eq!(shown.0, StatusCode::OK, "{:?}", shown.1);
        let child = &shown.1["children"][0];
        assert_eq!(child["run_key"], "load@2026-12-05", "{:?}", shown.1);
        assert_eq!(child["status"], "claimed");
        let child_id = child["id"].as_str().unwrap().to_owned();
        let shown = crate::api::call(Method::GET, &api.url(&format!("/v1/runs/{child_id}")), None, None).await;
        assert_eq!(shown.1["parents"][0]["id"], parent_id.to_string(), "{:?}", shown.1);
        assert_eq!(shown.1["payload"], json!({"table": "orders"}));
        // The web view links both ways.
        let page = |id: String| {
            let url = api.url(&format!("/ui/runs/{id}"));
            async move { reqwest::get(&url).await.unwrap().text().await.unwrap() }
        };
        let html = page(parent_id.to_string()).await;
        assert!(html.contains("<h2>Follow-ups</h2>") && html.contains(&format!("/ui/runs/{child_id}")), "{html}");
        let html = page(child_id.clone()).await;
        assert!(html.contains("<h2>Parents</h2>") && html.contains(&format!("/ui/runs/{parent_id}")), "{html}");
        // Bad lists are refused by field, nothing stored.
        for (body, field) in [
            (json!({"job_type": "step", "name": "x", "on_success": [{"name": "x", "job_type": "step"}]}), "on_success"),
            (json!({"job_type": "step", "on_failure": [{"name": "y", "job_type": "bad type"}]}), "on_failure"),
            (json!({"job_type": "step", "on_finish": [{"name": "y", "job_type": "step", "timeout": "soon"}]}), "on_finish"),
            (json!({"job_type": "step", "on_success": [{"name": "y", "job_type": "step", "after": ["step"]}]}), "on_success"),
        ] {
            crate::api::assert_error(
                &crate::api::call(Method::POST, &jobs, None, Some(body)).await,
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid",
                Some(field),
            );
        }
        assert_eq!(env.ledger.runs_of("x", 10).await.unwrap().len(), 0);
        drop(api);
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_message_with_a_bad_follow_up_is_dead_lettered_once_and_its_neighbour_runs(env: TestEnv) {
        let registry = Registry::builder().job(Step).build().unwrap();
        let running = belfry_tests::serve(&env, registry, &[]).await;
        // Published by hand (another language): the follow-up takes its
        // parent's name, so its run key would be the parent's own.
        let bad = json!({
            "version": 1, "message_id": uuid::Uuid::new_v4(), "job_name": "bad-chain",
            "job_type": "step", "run_key": "bad-chain@2026-07-26T03:00:00Z",
            "scheduled_at": "2026-07-26T03:00:00Z", "published_at": "2026-07-26T03:00:00Z",
            "options": {"follow_ups": {"on_success": [{"job_name": "bad-chain", "job_type": "step"}]}},
        });
        env.publish_raw("step", bad.to_string().as_bytes()).await;
        let good = env.enqueue("good", "step", json!(null), t0()).await;
        assert_eq!(env.wait_terminal_of(&good, Duration::from_secs(15)).await.status_text, "succeeded");
        let run = env
            .wait_terminal("bad-chain", "bad-chain@2026-07-26T03:00:00Z", Duration::from_secs(15))
            .await;
        assert_eq!((run.status_text.as_str(), run.attempts), ("dead", 0), "{run:?}");
        let said = run.last_error.unwrap_or_default();
        assert!(said.contains("options.follow_ups.on_success[0].job_name") && said.contains("parent's own name"), "{said}");
        let dead = eventually("the dead letter", Duration::from_secs(10), || {
            let env = &env;
            async move { Some(env.drain_dead_letters().await).filter(|d| !d.is_empty()) }
        })
        .await;
        assert_eq!(dead.len(), 1, "dead-lettered once: {dead:?}");
        // Refused, not mistaken for an outage: nothing handed back.
        assert_eq!(belfry_worker::WorkerCounters::get(&running.counters.handed_back), 0);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_join_listed_by_one_parent_waits_and_a_later_look_enqueues_only_the_join(env: TestEnv) {
        env.declare_default_group(&["step"]).await;
        // Only A lists the join (B has no follow-ups), beside a plain
        // follow-up that runs at once.
        let lists = FollowUps {
            on_success: vec![
                FollowUp { after: vec!["extract-b".into()], ..child("load", "step") },
                child("notify", "step"),
            ],
            ..FollowUps::default()
        };
        let a = env.enqueue_with("extract-a", "step", json!(null), t0(), with_follow_ups(lists)).await;
        let b = env.enqueue("extract-b", "step", json!(null), t0()).await;
        finish(&env, &a, RunStatus::Succeeded).await;
        let first = env.ledger.settle_follow_ups(200, "sched-a").await.unwrap();
        assert_eq!(
            (first.enqueued.clone(), first.waiting),
            (vec![("notify".to_owned(), "notify@2026-07-26T03:00:00Z".to_owned())], 1)
        );
        // Retention (shorter than the join's wait) runs meanwhile: it
        // prunes the finished plain follow-up, and keeps A, whose join
        // waits (a later fire of extract-a is its schedule's newest).
        let notify = env.ledger.run_by_key("notify", "notify@2026-07-26T03:00:00Z").await.unwrap().unwrap();
        finish(&env, &notify.to_message(), RunStatus::Succeeded).await;
        let a_later = env.enqueue("extract-a", "step", json!(null), t0() + chrono::Duration::hours(1)).await;
        finish(&env, &a_later, RunStatus::Succeeded).await;
        let pruned = env.ledger.prune_finished_runs(Utc::now() + chrono::Duration::hours(1), 1000).await.unwrap();
        assert_eq!(pruned, 1, "only the plain follow-up");
        assert!(env.ledger.run_by_key("notify", "notify@2026-07-26T03:00:00Z").await.unwrap().is_none());
        assert!(env.ledger.run_by_key("extract-a", &a.run_key).await.unwrap().is_some());
        // B succeeds: it lists nothing, so A's later look sees it.
        finish(&env, &b, RunStatus::Succeeded).await;
        let later = eventually("A looked at again", Duration::from_secs(10), || async {
            let pass = env.ledger.settle_follow_ups(200, "sched-a").await.unwrap();
            (pass.parents > 0).then_some(pass)
        })
        .await;
        assert_eq!(
            (later.enqueued, later.waiting),
            (vec![("load".to_owned(), "load@2026-07-26T03:00:00Z".to_owned())], 0)
        );
        assert!(env.ledger.run_by_key("notify", "notify@2026-07-26T03:00:00Z").await.unwrap().is_none());
        let load = env.ledger.run_by_key("load", "load@2026-07-26T03:00:00Z").await.unwrap().unwrap();
        assert_eq!(load.claimed_by.as_deref(), Some("follow-up:sched-a"));
        env.teardown(&["default"]).await;
    }
}
