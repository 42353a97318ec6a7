//! Values that parse but cannot be stored (issue 16, defect 1): a message
//! whose run key, payload or trace context holds a NUL character, an
//! over-long run key, and a handler error text with a NUL in it. Each is
//! dead-lettered (or stored escaped) once, with a reason, and never holds up
//! the good traffic around it: no hand-back loop, nothing re-run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use belfry_tests::{serve, t0};
use belfry_worker::{Job, JobContext, JobError, Registry, WorkerCounters};
use chrono::Utc;
use serde_json::json;

/// Succeeds, or fails permanently with a text holding a NUL when the
/// payload asks for it; counts executions per run key.
#[derive(Clone, Default)]
struct Binary {
    runs: Arc<Mutex<HashMap<String, u32>>>,
    calls: Arc<AtomicU32>,
}

impl Job for Binary {
    const TYPE: &'static str = "binary";
    type Payload = serde_json::Value;

    async fn run(&self, ctx: JobContext, payload: serde_json::Value) -> Result<(), JobError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        *self
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(ctx.run_key.clone())
            .or_default() += 1;
        // Long enough that many outcomes are queued together and share
        // one batched write.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if payload["nul"] == json!(true) {
            return Err(JobError::permanent(
                "upstream said: \u{0}\u{1}PNG\u{0} body",
            ));
        }
        Ok(())
    }
}

fn registry(job: &Binary) -> Registry {
    Registry::builder()
        .builtins()
        .job(job.clone())
        .build()
        .unwrap()
}

/// A hand-published v1 body for `noop`.
fn hand_published(
    job_name: &str,
    run_key: &str,
    payload: serde_json::Value,
    traceparent: &str,
) -> Vec<u8> {
    json!({
        "version": 1, "message_id": uuid::Uuid::new_v4(), "job_name": job_name, "job_type": "noop",
        "run_key": run_key, "scheduled_at": "2026-07-26T03:00:00Z",
        "published_at": "2026-07-26T03:00:00Z", "payload": payload,
        "trace": { "traceparent": traceparent },
    })
    .to_string()
    .into_bytes()
}

/// A run claimed in the ledger (not published), and its message.
async fn claimed(env: &belfry_testkit::TestEnv, job_name: &str) -> belfry_protocol::JobMessage {
    let scheduled_at = t0();
    let run_key = belfry_protocol::run_key(job_name, scheduled_at).unwrap();
    let run = belfry_ledger::NewRun {
        id: uuid::Uuid::now_v7(),
        job_name: job_name.into(),
        run_key: run_key.clone(),
        job_type: "noop".into(),
        payload: json!({}),
        scheduled_at,
        claimed_by: "test".into(),
        trace_id: None,
        traceparent: None,
        options: Default::default(),
        next_dispatch_at: Utc::now() + chrono::Duration::seconds(30),
    };
    assert!(env.ledger.claim(&run).await.unwrap());
    belfry_protocol::JobMessage {
        version: belfry_protocol::MESSAGE_VERSION,
        message_id: run.id,
        job_name: job_name.into(),
        job_type: "noop".into(),
        run_key,
        scheduled_at,
        published_at: Utc::now(),
        attempt: 1,
        payload: json!({}),
        trace: None,
        options: Default::default(),
    }
}

const GOOD_TRACE: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

belfry_testkit::both_backends! {
    async fn unstorable_messages_are_dead_lettered_once_and_good_ones_flow(env: TestEnv) {
        let job = Binary::default();
        let running = serve(&env, registry(&job), &[]).await;
        let counters = running.counters.clone();
        let long_key = format!("long@{}", "x".repeat(300));
        let poison: Vec<(&str, Vec<u8>)> = vec![
            ("run key with NUL", hand_published("nulkey", "nulkey@2026-07-26T03:00:00Z\u{0}", json!({}), GOOD_TRACE)),
            ("payload with NUL", hand_published("nulpay", "nulpay@2026-07-26T03:00:00Z", json!({"a": "x\u{0}y"}), GOOD_TRACE)),
            ("payload key with NUL", hand_published("nulpk", "nulpk@2026-07-26T03:00:00Z", json!({"a\u{0}": 1}), GOOD_TRACE)),
            ("traceparent with NUL", hand_published("nultp", "nultp@2026-07-26T03:00:00Z", json!({}), "00-\u{0}")),
            ("over-long run key", hand_published("long", &long_key, json!({}), GOOD_TRACE)),
            ("run key with a control character", hand_published("ctl", "ctl@2026\u{7}", json!({}), GOOD_TRACE)),
        ];
        let mut good = Vec::new();
        for (i, (_, bytes)) in poison.iter().enumerate() {
            env.publish_raw("noop", bytes).await;
            let ok = env
                .enqueue(&format!("good{i}"), "noop", json!({}), t0())
                .await;
            good.push(ok);
        }
        let started = std::time::Instant::now();
        for ok in &good {
            let run = env.wait_terminal_of(ok, Duration::from_secs(15)).await;
            assert_eq!(run.status_text, "succeeded", "{run:?}");
        }
        let mut dead = Vec::new();
        // Collected over a few reads: until all are in, or past the time
        // the bare minimum would have taken.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while dead.len() < poison.len() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            dead.extend(env.drain_dead_letters().await);
        }
        assert_eq!(dead.len(), poison.len(), "each poison message dead-lettered exactly once: {dead:?}");
        for (what, bytes) in &poison {
            let reason = &dead
                .iter()
                .find(|(b, _)| b == bytes)
                .unwrap_or_else(|| panic!("{what} not dead-lettered as is"))
                .1;
            assert!(reason.starts_with("undecodable message"), "{what}: {reason}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "good messages were held up: {:?}",
            started.elapsed()
        );
        // No delivery was handed back (a data error is not an outage).
        assert_eq!(WorkerCounters::get(&counters.handed_back), 0);
        assert_eq!(WorkerCounters::get(&counters.dead_lettered), poison.len() as u64);
        // Nothing of the poison reached the ledger; every stored row is good.
        let runs = env.all_runs().await;
        assert_eq!(runs.len(), good.len(), "{runs:?}");
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn an_error_text_with_nul_is_stored_escaped_and_its_batch_is_recorded(env: TestEnv) {
        let job = Binary::default();
        let running = serve(&env, registry(&job), &[("BELFRY_CONCURRENCY", "64"), ("BELFRY_PREFETCH", "64")]).await;
        let counters = running.counters.clone();
        let mut messages = Vec::new();
        for i in 0..60 {
            let nul = i % 20 == 7;
            messages.push(
                env.enqueue(&format!("b{i}"), "binary", json!({ "nul": nul }), t0())
                    .await,
            );
        }
        let started = std::time::Instant::now();
        for (i, m) in messages.iter().enumerate() {
            let run = env.wait_terminal_of(m, Duration::from_secs(20)).await;
            if i % 20 == 7 {
                assert_eq!(run.status_text, "failed", "{run:?}");
                let error = run.last_error.clone().unwrap_or_default();
                assert!(!error.contains('\u{0}'), "{error:?}");
                assert!(error.contains("upstream said:") && error.contains("PNG"), "{error:?}");
                assert_eq!(run.attempts, 1, "{run:?}");
            } else {
                assert_eq!(run.status_text, "succeeded", "{run:?}");
            }
        }
        // The NUL outcome did not take its batch down: nothing waited for a
        // hand-back (5 s) or a lease, nothing ran twice.
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "outcomes were delayed: {:?}",
            started.elapsed()
        );
        assert_eq!(WorkerCounters::get(&counters.handed_back), 0);
        let runs = job.runs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(runs.len(), messages.len());
        assert!(runs.values().all(|n| *n == 1), "re-executions: {runs:?}");
        assert_eq!(job.calls.load(Ordering::SeqCst), messages.len() as u32);
        running.stop_and_teardown(env).await;
    }
}

/// A batch of attempt starts holding one run key Postgres refuses (NUL):
/// only that request fails, with a data error; the others start. Run on a
/// current-thread runtime so all requests are queued before the batcher
/// runs, and so share one statement.
#[tokio::test]
async fn a_batched_start_refused_for_one_rows_data_starts_the_others() {
    let env = belfry_testkit::service_env!();
    let mut good = Vec::new();
    for i in 0..5 {
        good.push(claimed(&env, &format!("s{i}")).await);
    }
    let batcher = belfry_ledger::AttemptBatcher::new(env.ledger.clone());
    let request = |job_name: &str, run_key: &str| belfry_ledger::BeginRequest {
        job_name: job_name.into(),
        run_key: run_key.into(),
        worker: "w1".into(),
        lease: Duration::from_secs(60),
    };
    let mut requests: Vec<_> = good
        .iter()
        .map(|m| request(&m.job_name, &m.run_key))
        .collect();
    requests.insert(2, request("s2", "s2@2026-07-26T03:00:00Z\u{0}"));
    let answers = futures::future::join_all(requests.into_iter().map(|r| batcher.begin(r))).await;
    assert_eq!(answers.len(), 6);
    let bad = answers[2].as_ref().expect_err("the NUL key cannot start");
    assert!(bad.is_data_error(), "{bad}");
    for (i, answer) in answers.iter().enumerate().filter(|(i, _)| *i != 2) {
        match answer {
            Ok(Some((_, 1))) => {}
            other => panic!("request {i}: {other:?}"),
        }
    }
    env.teardown(&[]).await;
}

/// Two ends of one run in one batch, from a superseded attempt 1 and the
/// attempt 2 that took its lease over: only attempt 2 is told its outcome
/// was written (defect 3: answers were by run id only).
#[tokio::test]
async fn a_superseded_attempt_sharing_a_batch_with_its_successor_is_told_so() {
    let env = belfry_testkit::service_env!();
    let m = claimed(&env, "sup").await;
    // Attempt 1 under a lease that is over at once; attempt 2 takes it.
    let (_, first) = env.start_attempt(&m, "w1", Duration::ZERO).await;
    assert_eq!(first, 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (_, second) = env.start_attempt(&m, "w2", Duration::from_secs(60)).await;
    assert_eq!(second, 2);
    let batcher = belfry_ledger::AttemptBatcher::new(env.ledger.clone());
    let end =
        |attempt: i32, worker: &str, status: belfry_ledger::RunStatus| belfry_ledger::EndRequest {
            id: m.message_id,
            status,
            entry: belfry_testkit::attempt_entry(attempt, worker, status),
            last_error: None,
            redispatch_at: None,
        };
    let (late, current) = tokio::join!(
        batcher.end(end(1, "w1", belfry_ledger::RunStatus::Failed)),
        batcher.end(end(2, "w2", belfry_ledger::RunStatus::Succeeded)),
    );
    assert!(
        !late.unwrap(),
        "the superseded attempt was told its outcome was written"
    );
    assert!(current.unwrap());
    let run = env.run_of(&m).await;
    assert_eq!(run.status_text, "succeeded");
    env.teardown(&[]).await;
}
