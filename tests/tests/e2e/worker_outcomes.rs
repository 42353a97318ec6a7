//! What a worker does with each kind of delivery: retries with growing
//! delays, exhausted retries, permanent failures, bad payloads, panics,
//! unknown types, undecodable bodies, duplicates, and unroutable fires.

use std::time::Duration;

use belfry_ledger::AttemptEntry;
use belfry_scheduler::FireOutcome;
use belfry_testkit::redis_url;
use belfry_tests::{at, every, replica, serve, t0, Flaky};
use belfry_worker::{Job, JobContext, JobError, Registry, WorkerCounters};
use serde_json::json;

struct Refuses;
impl Job for Refuses {
    const TYPE: &'static str = "refuses";
    type Payload = serde_json::Value;
    async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        Err(JobError::permanent("customer account closed"))
    }
}

struct Panics;
impl Job for Panics {
    const TYPE: &'static str = "panics";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        if ctx.attempt == 1 {
            panic!("handler bug on attempt 1");
        }
        Ok(())
    }
}

fn registry(flaky: &Flaky) -> Registry {
    Registry::builder()
        .builtins()
        .job(flaky.clone())
        .job(Refuses)
        .job(Panics)
        .build()
        .unwrap()
}

fn entries(run: &belfry_ledger::RunRecord) -> Vec<AttemptEntry> {
    run.attempt_entries().unwrap()
}

belfry_testkit::both_backends! {
    async fn fails_twice_then_succeeds_with_growing_delays(env: TestEnv) {
        let job = Flaky::failing_first(2);
        let running = serve(
            &env,
            registry(&job),
            &[
                ("BELFRY_MAX_ATTEMPTS", "5"),
                ("BELFRY_RETRY_INITIAL", "150ms"),
                ("BELFRY_RETRY_MULTIPLIER", "3"),
            ],
        )
        .await;
        let m = env.enqueue("flaky-job", "flaky", json!(null), t0()).await;
        let run = env.wait_terminal_of(&m, Duration::from_secs(20)).await;
        assert_eq!(run.status_text, "succeeded");
        assert_eq!(run.attempts, 3);
        assert_eq!(job.calls(), 3);
        let log = entries(&run);
        let outcomes: Vec<_> = log.iter().map(|e| e.outcome.as_str()).collect();
        assert_eq!(outcomes, ["retry", "retry", "succeeded"]);
        assert_eq!(log[0].error.as_deref(), Some("transient failure 1"));
        let gap1 = log[1].started_at - log[0].finished_at;
        let gap2 = log[2].started_at - log[1].finished_at;
        // The policy asks for 150 ms, then 450 ms: the waits are at least that,
        // and the second is longer than the first.
        assert!(gap1 >= chrono::Duration::milliseconds(150), "{gap1}");
        assert!(gap2 >= chrono::Duration::milliseconds(450), "{gap2}");
        assert!(gap2 > gap1, "{gap1} then {gap2}");
        assert!(run.last_error.is_none());
        assert_eq!(run.worker.as_deref(), Some("w1"));
        assert!(run.started_at.is_some() && run.finished_at.is_some());
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn always_failing_is_dead_after_max_attempts_and_the_worker_goes_on(env: TestEnv) {
        let job = Flaky::failing_first(u32::MAX);
        let extra = [("BELFRY_MAX_ATTEMPTS", "3"), ("BELFRY_RETRY_INITIAL", "20ms")];
        let running = serve(&env, registry(&job), &extra).await;
        let counters = running.counters.clone();
        let bad = env.enqueue("always-fails", "flaky", json!(null), t0()).await;
        let run = env.wait_terminal_of(&bad, Duration::from_secs(20)).await;
        assert_eq!(run.status_text, "dead");
        assert_eq!(run.attempts, 3);
        assert_eq!(job.calls(), 3);
        let err = run.last_error.clone().unwrap();
        assert!(
            err.contains("retries exhausted after 3 attempts") && err.contains("transient failure 3"),
            "{err}"
        );
        // The worker still serves other jobs.
        let ok = env
            .enqueue("after", "noop", json!({}), at("2026-07-26T03:00:01Z"))
            .await;
        let run = env.wait_terminal_of(&ok, Duration::from_secs(10)).await;
        assert_eq!(run.status_text, "succeeded");
        let dead = env.drain_dead_letters().await;
        assert_eq!(dead.len(), 1, "{dead:?}");
        let body: serde_json::Value = serde_json::from_slice(&dead[0].0).unwrap();
        assert_eq!(body["run_key"], bad.run_key.as_str());
        assert!(dead[0].1.contains("retries exhausted"), "{}", dead[0].1);
        assert_eq!(WorkerCounters::get(&counters.dead_lettered), 1);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn malformed_json_is_dead_lettered_and_consuming_goes_on(env: TestEnv) {
        let running = serve(&env, registry(&Flaky::failing_first(0)), &[]).await;
        let counters = running.counters.clone();
        env.publish_raw("noop", b"{this is not json").await;
        // A well-formed message of an unknown type, routed to this group by hand.
        let unknown = json!({
            "version": 1, "message_id": uuid::Uuid::new_v4(), "job_name": "ghost", "job_type": "mystery",
            "run_key": "ghost@2026-07-26T03:00:00Z", "scheduled_at": "2026-07-26T03:00:00Z",
            "published_at": "2026-07-26T03:00:00Z"
        });
        env.publish_raw("noop", unknown.to_string().as_bytes())
            .await;
        let ok = env
            .enqueue("after", "noop", json!({}), at("2026-07-26T03:00:01Z"))
            .await;
        let run = env.wait_terminal_of(&ok, Duration::from_secs(10)).await;
        assert_eq!(run.status_text, "succeeded");
        let ghost = env.wait_fire("ghost", t0(), Duration::from_secs(10)).await;
        assert_eq!(ghost.status_text, "dead");
        assert!(
            ghost
                .last_error
                .as_deref()
                .unwrap_or("")
                .contains("no handler for job type \"mystery\""),
            "{ghost:?}"
        );
        let dead = env.drain_dead_letters().await;
        assert_eq!(dead.len(), 2, "{dead:?}");
        let garbage = dead
            .iter()
            .find(|(body, _)| body == b"{this is not json")
            .expect("garbage dead-lettered as is");
        assert!(
            garbage.1.starts_with("undecodable message"),
            "{}",
            garbage.1
        );
        assert_eq!(WorkerCounters::get(&counters.dead_lettered), 2);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn permanent_errors_bad_payloads_and_panics(env: TestEnv) {
        let extra = [("BELFRY_MAX_ATTEMPTS", "3"), ("BELFRY_RETRY_INITIAL", "10ms")];
        let running = serve(&env, registry(&Flaky::failing_first(0)), &extra).await;
        let t = t0();
        let refused = env.enqueue("refused", "refuses", json!(null), t).await;
        let bad_payload = env
            .enqueue("bad-payload", "sleep", json!({"duration": "soon"}), t)
            .await;
        let panicky = env.enqueue("panicky", "panics", json!(null), t).await;

        let run = env.wait_terminal_of(&refused, Duration::from_secs(10)).await;
        assert_eq!((run.status_text.as_str(), run.attempts), ("failed", 1));
        assert_eq!(run.last_error.as_deref(), Some("customer account closed"));

        let run = env.wait_terminal_of(&bad_payload, Duration::from_secs(10)).await;
        assert_eq!(
            (run.status_text.as_str(), run.attempts),
            ("dead", 1),
            "no retries wasted on a bad payload"
        );
        let err = run.last_error.unwrap();
        assert!(
            err.contains("payload does not match job type \"sleep\"") && err.contains("duration"),
            "{err}"
        );

        let run = env.wait_terminal_of(&panicky, Duration::from_secs(10)).await;
        assert_eq!(
            (run.status_text.as_str(), run.attempts),
            ("succeeded", 2),
            "the panic counted as a failed attempt"
        );
        let log = entries(&run);
        assert_eq!(log[0].outcome, "panicked");
        assert!(log[0]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("handler bug on attempt 1"));

        let dead = env.drain_dead_letters().await;
        assert_eq!(
            dead.len(),
            1,
            "only the bad payload is dead-lettered: {dead:?}"
        );
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_redelivered_message_of_a_finished_run_is_dropped(env: TestEnv) {
        let job = Flaky::failing_first(0);
        let running = serve(&env, registry(&job), &[]).await;
        let counters = running.counters.clone();
        let m = env.enqueue("once", "flaky", json!(null), t0()).await;
        env.wait_terminal_of(&m, Duration::from_secs(10)).await;
        // The same message again, as a broker redelivery or a republish would.
        let outcome = env.publisher().await.publish(&m).await.unwrap();
        assert_eq!(outcome, belfry_broker::PublishOutcome::Confirmed);
        belfry_testkit::eventually(
            "the duplicate delivery",
            Duration::from_secs(10),
            || async { (WorkerCounters::get(&counters.duplicates) > 0).then_some(()) },
        )
        .await;
        assert_eq!(job.calls(), 1, "finished work ran again");
        let run = env.run_of(&m).await;
        assert_eq!((run.status_text.as_str(), run.attempts), ("succeeded", 1));
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_job_type_no_group_serves_is_recorded_dead_not_dropped(env: TestEnv) {
        env.declare_default_group(&["noop"]).await;
        let r = replica(&env, "sched-a", Some(&redis_url())).await;
        let s = every("orphan", "1s", "nobody-serves-this");
        let outcome = r.fire(&s, t0()).await;
        assert!(
            matches!(outcome, FireOutcome::Unroutable { .. }),
            "{outcome:?}"
        );
        let run = env
            .ledger
            .run_by_key("orphan", "orphan@2026-07-26T03:00:00Z")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(run.status_text, "dead");
        assert!(run
            .last_error
            .unwrap()
            .contains("no worker group serves job type \"nobody-serves-this\""));
        env.teardown(&["default"]).await;
    }
}
