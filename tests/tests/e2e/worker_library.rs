//! The worker as a library: per-type and per-run policies, long back-offs
//! through the ledger, worker groups, concurrency limits, ad-hoc jobs,
//! hand-written messages, the outbox reconciler and run leases.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use belfry_dispatch::{AdHocJob, Client, DispatchError, Enqueued};
use belfry_ledger::{NewRun, RunStatus};
use belfry_protocol::{JobOptions, RetryOverride, TraceContext};
use belfry_testkit::{eventually, redis_url, run_outcome};
use belfry_tests::{builtins, one_job, replica, serve, t0, worker, Flaky, Gauge, RunningWorker};
use belfry_worker::{Job, JobContext, JobError, Registry, WorkerCounters};
use chrono::Utc;
use serde::Deserialize;
use serde_json::json;

/// A report with a typed payload, served by the `reports` group.
#[derive(Clone, Default)]
struct Report(Arc<AtomicU32>);

#[derive(Deserialize)]
struct ReportPayload {
    pages: u32,
}

impl Job for Report {
    const TYPE: &'static str = "report";
    type Payload = ReportPayload;
    async fn run(&self, _: JobContext, p: ReportPayload) -> Result<(), JobError> {
        self.0.fetch_add(p.pages, Ordering::SeqCst);
        Ok(())
    }
}

fn retry(max_attempts: u32) -> JobOptions {
    JobOptions {
        retry: Some(RetryOverride {
            max_attempts: Some(max_attempts),
            ..Default::default()
        }),
        timeout_ms: None,
        ..JobOptions::default()
    }
}

belfry_testkit::both_backends! {
    async fn retry_policy_precedence_worker_then_type_then_run(env: TestEnv) {
        let fails = Flaky::failing_first(u32::MAX);
        // Worker default: 5 attempts. The type says 2. One run says 1.
        let registry = Registry::builder()
            .job_with(fails.clone(), retry(2))
            .build()
            .unwrap();
        let extra = [("BELFRY_MAX_ATTEMPTS", "5"), ("BELFRY_RETRY_INITIAL", "10ms")];
        let running = serve(&env, registry, &extra).await;
        let by_type = env.enqueue("by-type", "flaky", json!(null), t0()).await;
        let run = env.wait_terminal_of(&by_type, Duration::from_secs(10)).await;
        assert_eq!(
            (run.status_text.as_str(), run.attempts),
            ("dead", 2),
            "the type's setting beats the worker default"
        );

        let client = Client::new(env.ledger.clone(), env.broker.clone(), "test");
        let per_run = client
            .enqueue(
                AdHocJob::new("flaky", json!(null))
                    .named("by-run")
                    .options(retry(1)),
            )
            .await
            .unwrap();
        let run = env
            .wait_terminal("by-run", per_run.run_key(), Duration::from_secs(10))
            .await;
        assert_eq!(
            (run.status_text.as_str(), run.attempts),
            ("dead", 1),
            "the run's override beats the type"
        );
        assert_eq!(fails.calls(), 3);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn per_type_timeout_cancels_the_handler(env: TestEnv) {
        let short = JobOptions {
            retry: Some(RetryOverride {
                max_attempts: Some(1),
                ..Default::default()
            }),
            timeout_ms: Some(100),
            ..JobOptions::default()
        };
        let registry = Registry::builder()
            .job_with(belfry_worker::builtin::Sleep, short)
            .build()
            .unwrap();
        let running = serve(&env, registry, &[("BELFRY_JOB_TIMEOUT", "1h")]).await;
        let m = env.enqueue("slow", "sleep", json!({"duration_ms": 30_000}), t0()).await;
        let run = env.wait_terminal_of(&m, Duration::from_secs(10)).await;
        assert_eq!(run.status_text, "dead");
        assert!(run.last_error.unwrap().contains("timed out after 100ms"));
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_long_back_off_is_handed_to_the_ledger_and_the_reconciler_resumes_it(env: TestEnv) {
        let job = Flaky::failing_first(1);
        let extra = [("BELFRY_RETRY_INITIAL", "300ms"), ("BELFRY_RETRY_REQUEUE_AFTER", "200ms")];
        let running = serve(&env, one_job(job.clone()), &extra).await;
        let counters = running.counters.clone();
        let m = env.enqueue("deferred", "flaky", json!(null), t0()).await;
        // The failed attempt is recorded, the delivery acked, the retry time kept
        // in the ledger: no prefetch slot is held during the back-off. The
        // worker counts the deferral after the ledger has it, so both are
        // waited for (reading the counter at the first sight of the row
        // raced with the worker, and failed once in CI).
        let waiting = eventually("the deferred retry", Duration::from_secs(10), || async {
            let run = env.run_of(&m).await;
            let counted = WorkerCounters::get(&counters.deferred) == 1;
            (run.status_text == "retrying" && run.next_dispatch_at.is_some() && counted)
                .then_some(run)
        })
        .await;
        assert_eq!(WorkerCounters::get(&counters.deferred), 1);
        assert_eq!(
            belfry_testkit::queue_len(&env, &env.topology.group_queue("default")).await,
            Some(0)
        );
        let due = waiting.next_dispatch_at.unwrap();
        assert!(
            due >= waiting.attempt_entries().unwrap()[0].finished_at
                + chrono::Duration::milliseconds(300)
        );
        // A scheduler replica's reconciler publishes it once due.
        let r = replica(&env, "sched-a", Some(&redis_url())).await;
        let report = eventually(
            "the reconciler to republish",
            Duration::from_secs(10),
            || async {
                let report = r.reconciler().reconcile_once().await.unwrap();
                (report.republished > 0).then_some(report)
            },
        )
        .await;
        assert_eq!(report.republished, 1);
        assert!(Utc::now() >= due);
        let run = env.wait_terminal_of(&m, Duration::from_secs(10)).await;
        assert_eq!((run.status_text.as_str(), run.attempts), ("succeeded", 2));
        assert_eq!(job.calls(), 2);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn worker_groups_receive_only_the_types_they_serve(env: TestEnv) {
        let report = Report::default();
        let default_group = worker(&env, "w-default", "default", builtins(), &[]).await;
        // This binary could run `noop` too, but its group is configured to
        // serve `report` only.
        let reports_registry = Registry::builder()
            .builtins()
            .job(report.clone())
            .build()
            .unwrap();
        let reports_group = worker(
            &env,
            "w-reports",
            "reports",
            reports_registry,
            &[("BELFRY_JOB_TYPES", "report")],
        )
        .await;
        let d = RunningWorker::spawn(default_group);
        let r = RunningWorker::spawn(reports_group);
        let rep = env.enqueue("monthly", "report", json!({"pages": 7}), t0()).await;
        let noop = env.enqueue("tick", "noop", json!({}), t0()).await;
        let rep_run = env.wait_terminal_of(&rep, Duration::from_secs(10)).await;
        let noop_run = env.wait_terminal_of(&noop, Duration::from_secs(10)).await;
        assert_eq!(
            (rep_run.status_text.as_str(), rep_run.worker.as_deref()),
            ("succeeded", Some("w-reports"))
        );
        assert_eq!(
            (noop_run.status_text.as_str(), noop_run.worker.as_deref()),
            ("succeeded", Some("w-default"))
        );
        assert_eq!(report.0.load(Ordering::SeqCst), 7);
        // Each group saw only its own type: nothing was dead-lettered.
        assert_eq!(WorkerCounters::get(&d.counters.deliveries), 1);
        assert_eq!(WorkerCounters::get(&r.counters.deliveries), 1);
        assert!(env.drain_dead_letters().await.is_empty());
        d.stop().await;
        r.stop().await;
        env.teardown(&["default", "reports"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_configured_type_without_handler_is_refused_at_start(env: TestEnv) {
        let mut pairs = env.process_env();
        pairs.push(("BELFRY_JOB_TYPES".into(), "noop,billing".into()));
        let config =
            belfry_worker::WorkerConfig::from_settings(&belfry_runtime::Settings::from_pairs(pairs))
                .unwrap();
        let e = belfry_worker::Worker::start(&config, builtins())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"billing\" is configured but has no handler"),
            "{e}"
        );
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn the_concurrency_limit_holds(env: TestEnv) {
        let gauge = Gauge::default();
        let extra = [("BELFRY_CONCURRENCY", "2"), ("BELFRY_PREFETCH", "10")];
        let running = serve(&env, one_job(gauge.clone()), &extra).await;
        let mut messages = Vec::new();
        for i in 0..6 {
            messages.push(env.enqueue(&format!("g{i}"), "gauge", json!(null), t0()).await);
        }
        for m in &messages {
            env.wait_terminal_of(m, Duration::from_secs(10)).await;
        }
        assert_eq!(gauge.peak.load(Ordering::SeqCst), 2);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn ad_hoc_jobs_now_later_and_idempotent(env: TestEnv) {
        let report = Report::default();
        let running = serve(&env, one_job(report.clone()), &[]).await;
        let client = Client::new(env.ledger.clone(), env.broker.clone(), "app-1");

        // Now, with an idempotency key: a repeat returns the same run.
        let invoice = AdHocJob::new("report", json!({"pages": 3}))
            .named("invoice")
            .idempotency_key("2026-07");
        let first = client.enqueue(invoice.clone()).await.unwrap();
        assert!(
            matches!(
                first,
                Enqueued::Created {
                    published: true,
                    ..
                }
            ),
            "{first:?}"
        );
        assert_eq!(first.run_key(), "invoice@2026-07");
        let again = client.enqueue(invoice).await.unwrap();
        assert!(matches!(again, Enqueued::Existing { .. }), "{again:?}");
        assert_eq!(again.id(), first.id());
        let run = env
            .wait_terminal("invoice", "invoice@2026-07", Duration::from_secs(10))
            .await;
        assert_eq!(run.status_text, "succeeded");
        assert_eq!(run.claimed_by.as_deref(), Some("client:app-1"));
        assert_eq!(report.0.load(Ordering::SeqCst), 3, "ran once");

        // Later: it waits in the outbox until due, then a reconciler publishes it.
        let later = client
            .enqueue(
                AdHocJob::new("report", json!({"pages": 10}))
                    .named("later")
                    .after(Duration::from_millis(800)),
            )
            .await
            .unwrap();
        let Enqueued::Created {
            scheduled_at,
            published: false,
            ..
        } = later
        else {
            panic!("{later:?}")
        };
        let r = replica(&env, "sched-a", Some(&redis_url())).await;
        assert_eq!(
            r.reconciler().reconcile_once().await.unwrap().taken,
            0,
            "not due yet"
        );
        let row = env.ledger.run(later.id()).await.unwrap().unwrap();
        assert_eq!(row.status_text, "claimed");
        eventually(
            "the delayed job to be published",
            Duration::from_secs(10),
            || async { (r.reconciler().reconcile_once().await.unwrap().republished > 0).then_some(()) },
        )
        .await;
        assert!(Utc::now() >= scheduled_at);
        let run = env
            .wait_terminal("later", later.run_key(), Duration::from_secs(10))
            .await;
        assert_eq!(run.status_text, "succeeded");
        assert_eq!(report.0.load(Ordering::SeqCst), 13);

        // Bad input is refused before anything is stored.
        let bad_key = client
            .enqueue(AdHocJob::new("report", json!({})).idempotency_key("has space"))
            .await
            .unwrap_err();
        assert!(matches!(bad_key, DispatchError::BadKey { .. }), "{bad_key}");
        let bad_type = client
            .enqueue(AdHocJob::new("no such type!", json!({})))
            .await
            .unwrap_err();
        assert!(bad_type.to_string().contains("job type"), "{bad_type}");
        assert_eq!(env.all_runs().await.len(), 2);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_hand_written_message_runs_and_is_recorded(env: TestEnv) {
        let report = Report::default();
        let running = serve(&env, one_job(report.clone()), &[]).await;
        // Exactly what a producer in another language would send (see
        // docs/wire-format.md); not built with belfry's Rust types.
        let body = r#"{"version":1,"message_id":"0190f3a4-5b6c-7d8e-9f00-112233445566","job_name":"py-export",
            "job_type":"report","run_key":"py-export@2026-07-26T03:00:00Z","scheduled_at":"2026-07-26T03:00:00Z",
            "published_at":"2026-07-26T03:00:00.120Z","payload":{"pages":4},
            "trace":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}"#;
        env.publish_raw("report", body.as_bytes()).await;
        // Its run key is the one a fire of `py-export` at t0 has.
        let run = env.wait_fire("py-export", t0(), Duration::from_secs(10)).await;
        assert_eq!(run.status_text, "succeeded");
        assert_eq!(run.id.to_string(), "0190f3a4-5b6c-7d8e-9f00-112233445566");
        assert_eq!(
            run.trace_id.as_deref(),
            Some("0af7651916cd43dd8448eb211c80319c")
        );
        assert_eq!(report.0.load(Ordering::SeqCst), 4);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn the_reconciler_publishes_a_fire_whose_claimer_died_before_publishing(env: TestEnv) {
        let report = Report::default();
        let running = serve(&env, one_job(report.clone()), &[]).await;
        // A replica inserted the row and died before publishing: the row is
        // claimed and its confirm deadline has passed.
        let trace = TraceContext::new_root();
        let orphan = NewRun {
            id: uuid::Uuid::now_v7(),
            job_name: "orphan".into(),
            run_key: "orphan@2026-07-26T03:00:00Z".into(),
            job_type: "report".into(),
            payload: json!({"pages": 1}),
            scheduled_at: t0(),
            claimed_by: "dead-replica".into(),
            trace_id: trace.trace_id().map(str::to_owned),
            traceparent: Some(trace.traceparent.clone()),
            options: JobOptions::default(),
            next_dispatch_at: Utc::now() - chrono::Duration::seconds(1),
        };
        assert!(env.ledger.claim(&orphan).await.unwrap());
        // Two replicas reconcile at once: the row is published exactly once.
        let a = replica(&env, "sched-a", Some(&redis_url())).await;
        let b = replica(&env, "sched-b", Some(&redis_url())).await;
        let (ra, rb) = tokio::join!(
            a.reconciler().reconcile_once(),
            b.reconciler().reconcile_once()
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert_eq!(ra.taken + rb.taken, 1, "{ra:?} {rb:?}");
        assert_eq!(ra.republished + rb.republished, 1);
        let run = env.wait_fire("orphan", t0(), Duration::from_secs(10)).await;
        assert_eq!(run.status_text, "succeeded");
        assert_eq!(run.id, orphan.id, "same message id");
        assert_eq!(run.trace_id, orphan.trace_id, "same trace");
        assert_eq!(report.0.load(Ordering::SeqCst), 1);
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_duplicate_delivery_of_a_running_run_does_not_run_it_concurrently(env: TestEnv) {
        let report = Report::default();
        let w = worker(&env, "w1", "default", one_job(report.clone()), &[]).await;
        let m = env.enqueue("held", "report", json!({"pages": 1}), t0()).await;
        // Another worker (simulated) holds the run under a 2-second lease.
        let (id, attempt) = env
            .start_attempt(&m, "other-worker", Duration::from_secs(60))
            .await;
        let running = RunningWorker::spawn(w);
        let counters = running.counters.clone();
        eventually(
            "the delivery to be handed back",
            Duration::from_secs(10),
            || async { (WorkerCounters::get(&counters.handed_back) > 0).then_some(()) },
        )
        .await;
        assert_eq!(
            report.0.load(Ordering::SeqCst),
            0,
            "not run while another attempt holds it"
        );
        // The holder finishes; the redelivery is then a duplicate of a finished run.
        assert!(
            env.end_attempt(id, attempt, "other-worker", RunStatus::Succeeded)
                .await
        );
        eventually(
            "the duplicate to be dropped",
            Duration::from_secs(15),
            || async { (WorkerCounters::get(&counters.duplicates) > 0).then_some(()) },
        )
        .await;
        assert_eq!(report.0.load(Ordering::SeqCst), 0);
        let run = env.run_of(&m).await;
        assert_eq!(run_outcome(&run), ("succeeded", 1, Some("other-worker")));
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn an_attempt_whose_lease_was_taken_over_does_not_overwrite_the_new_one(env: TestEnv) {
        env.declare_default_group(&["report"]).await;
        let m = env.enqueue("stale", "report", json!({"pages": 1}), t0()).await;
        let (id, first) = env
            .start_attempt(&m, "slow-worker", Duration::from_millis(1))
            .await;
        assert_eq!(first, 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The lease expired: another worker takes the run over.
        let second = env
            .start_attempt(&m, "fast-worker", Duration::from_secs(60))
            .await;
        assert_eq!(second, (id, 2));
        // The first attempt's late outcome is refused.
        let late = belfry_ledger::AttemptEntry {
            attempt: 1,
            worker: "slow-worker".into(),
            started_at: Utc::now(),
            finished_at: Utc::now(),
            outcome: "succeeded".into(),
            error: None,
            log_lines: None,
            result: None,
        };
        assert!(!env
            .ledger
            .end_attempt(id, RunStatus::Succeeded, &late, None, None)
            .await
            .unwrap());
        assert!(!env.ledger.hand_back(id, 1, "late").await.unwrap());
        let run = env.run_of(&m).await;
        assert_eq!(
            (run.status_text.as_str(), run.worker.as_deref()),
            ("running", Some("fast-worker"))
        );
        env.teardown(&["default"]).await;
    }
}
