//! One run, one trace: with an OpenTelemetry layer installed (here an
//! in-memory exporter; in production OTLP), the scheduler's `fire` span
//! starts the trace, the worker's `process` span continues it under the
//! scheduler's `publish` span, and `job_runs.trace_id` names it. Retries,
//! republished runs and ad-hoc jobs enqueued inside a caller's span stay in
//! the trace they belong to.
//!
//! Its own test binary: the span exporter is process-wide.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::{DateTime, DurationRound, Utc};
use opentelemetry::trace::{SpanId, TraceContextExt};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

use belfry_dispatch::{AdHocJob, Client};
use belfry_testkit::{eventually, redis_url, TestEnv};
use belfry_tests::{builtins, every, one_job, replica, serve, Flaky, RunningWorker};
use belfry_worker::Registry;

fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();
    &EXPORTER
        .get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let subscriber = tracing_subscriber::registry()
                .with(belfry_runtime::telemetry::otel_layer(&provider));
            tracing::subscriber::set_global_default(subscriber)
                .unwrap_or_else(|e| panic!("a subscriber was already installed: {e}"));
            (exporter, provider)
        })
        .0
}

/// The finished spans of trace `trace_id` (hex), by span id.
fn spans_of(trace_id: &str) -> HashMap<SpanId, SpanData> {
    exporter()
        .get_finished_spans()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.span_context.trace_id().to_string() == trace_id)
        .map(|s| (s.span_context.span_id(), s))
        .collect()
}

fn named<'a>(spans: &'a HashMap<SpanId, SpanData>, name: &str) -> Vec<&'a SpanData> {
    spans.values().filter(|s| s.name == name).collect()
}

/// Whether `span` descends from `ancestor` through parents inside `spans`.
fn descends(spans: &HashMap<SpanId, SpanData>, span: &SpanData, ancestor: SpanId) -> bool {
    let mut parent = span.parent_span_id;
    for _ in 0..32 {
        if parent == ancestor {
            return true;
        }
        match spans.get(&parent) {
            Some(p) => parent = p.parent_span_id,
            None => return false,
        }
    }
    false
}

/// The hex id of the trace `span` belongs to.
fn trace_id_of(span: &tracing::Span) -> String {
    span.context().span().span_context().trace_id().to_string()
}

/// Now, to the whole second: an instant a schedule fires at.
fn this_second() -> DateTime<Utc> {
    Utc::now()
        .duration_trunc(chrono::Duration::seconds(1))
        .unwrap()
}

/// The span exporter installed, an environment on the real services, and
/// a worker with `registry` and `extra` settings serving it; `None` (the
/// test is skipped, see `belfry_testkit::service_env!`) when the services
/// do not answer.
async fn traced(registry: Registry, extra: &[(&str, &str)]) -> Option<(TestEnv, RunningWorker)> {
    exporter();
    let env = TestEnv::connect().await?;
    let running = serve(&env, registry, extra).await;
    Some((env, running))
}

/// Waits until the trace holds a finished `process` span (it ends after
/// the ack, just after the outcome is recorded).
async fn trace_with_process(trace_id: &str) -> HashMap<SpanId, SpanData> {
    eventually(
        "the worker's process span",
        Duration::from_secs(10),
        || async {
            let spans = spans_of(trace_id);
            (!named(&spans, "process").is_empty()).then_some(spans)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_is_one_trace_from_tick_to_outcome() {
    let Some((env, running)) = traced(builtins(), &[]).await else {
        return;
    };
    let r = replica(&env, "traced-r1", Some(&redis_url())).await;
    let schedule = every("traced", "1s", "noop");
    let at = this_second();
    let outcome = r.fire(&schedule, at).await;
    assert_eq!(outcome.label(), "dispatched", "{outcome:?}");
    assert_one_trace(&env, "traced", at).await;
    running.stop_and_teardown(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fire_of_a_batch_is_a_trace_of_its_own() {
    let Some((env, running)) = traced(builtins(), &[]).await else {
        return;
    };
    let r = replica(&env, "traced-batch", Some(&redis_url())).await;
    let at = this_second();
    let names = ["batch-a", "batch-b", "batch-c"];
    let fires: Vec<_> = names.iter().map(|n| (every(n, "1s", "noop"), at)).collect();
    let outcomes = r
        .fire_batch(&fires, belfry_scheduler::FireSource::Timer)
        .await;
    assert!(
        outcomes.iter().all(|o| o.label() == "dispatched"),
        "{outcomes:?}"
    );
    let mut traces = std::collections::HashSet::new();
    for name in names {
        traces.insert(assert_one_trace(&env, name, at).await);
    }
    assert_eq!(traces.len(), 3, "each run its own trace");
    running.stop_and_teardown(env).await;
}

/// Waits for the run of `name` at `at` to succeed and checks its trace:
/// one `fire` root, `claim` and `publish` under it, the worker's
/// `process`, `attempt` and `record` under `publish`. Returns the trace id.
async fn assert_one_trace(env: &TestEnv, name: &str, at: DateTime<Utc>) -> String {
    let run = env.wait_fire(name, at, Duration::from_secs(10)).await;
    assert_eq!(run.status_text, "succeeded");
    let trace_id = run.trace_id.clone().expect("the run has a trace id");
    let spans = trace_with_process(&trace_id).await;
    for span in ["fire", "claim", "publish", "process", "attempt", "record"] {
        assert_eq!(
            named(&spans, span).len(),
            1,
            "one {span} span in the trace of {name}: {:?}",
            spans.values().map(|s| &s.name).collect::<Vec<_>>()
        );
    }
    let fire = named(&spans, "fire")[0];
    assert_eq!(fire.parent_span_id, SpanId::INVALID, "fire is the root");
    let claim = named(&spans, "claim")[0];
    assert!(descends(&spans, claim, fire.span_context.span_id()));
    let publish = named(&spans, "publish")[0];
    let process = named(&spans, "process")[0];
    assert!(descends(&spans, publish, fire.span_context.span_id()));
    assert!(
        descends(&spans, process, publish.span_context.span_id()),
        "the worker's process span is a descendant of the scheduler's publish span"
    );
    let attempt = named(&spans, "attempt")[0];
    assert!(descends(&spans, attempt, process.span_context.span_id()));
    trace_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_of_a_retried_run_is_in_its_trace() {
    // Fails its first two attempts.
    let registry = one_job(Flaky::failing_first(2));
    let Some((env, running)) = traced(registry, &[("BELFRY_RETRY_INITIAL", "50ms")]).await else {
        return;
    };
    let r = replica(&env, "traced-r2", Some(&redis_url())).await;
    let schedule = every("flaky-traced", "1s", "flaky");
    let at = this_second();
    r.fire(&schedule, at).await;
    let run = env
        .wait_fire("flaky-traced", at, Duration::from_secs(10))
        .await;
    assert_eq!((run.status_text.as_str(), run.attempts), ("succeeded", 3));
    let spans = trace_with_process(run.trace_id.as_deref().unwrap()).await;
    let process = named(&spans, "process")[0];
    let attempts = named(&spans, "attempt");
    assert_eq!(
        attempts.len(),
        3,
        "all three attempts are in the run's trace"
    );
    assert!(attempts
        .iter()
        .all(|a| descends(&spans, a, process.span_context.span_id())));
    running.stop_and_teardown(env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ad_hoc_job_joins_the_callers_trace_and_a_republished_run_keeps_its_trace() {
    let Some((env, running)) = traced(builtins(), &[]).await else {
        return;
    };
    // A request span of the calling service.
    let request = tracing::info_span!("POST /invoices");
    let caller_trace = trace_id_of(&request);
    let client = Client::new(env.ledger.clone(), env.broker.clone(), "api");
    let enqueued = client
        .enqueue(AdHocJob::new("noop", json!({})).named("from-request"))
        .instrument(request.clone())
        .await
        .unwrap();
    drop(request);
    let run = env
        .wait_terminal("from-request", enqueued.run_key(), Duration::from_secs(10))
        .await;
    assert_eq!(run.trace_id.as_deref(), Some(caller_trace.as_str()));
    let spans = trace_with_process(&caller_trace).await;
    let root = named(&spans, "POST /invoices");
    assert_eq!(root.len(), 1);
    assert!(descends(
        &spans,
        named(&spans, "process")[0],
        root[0].span_context.span_id()
    ));

    // Enqueued outside any span: the run's own new trace holds the publish
    // and the worker's spans.
    let outside = client
        .enqueue(AdHocJob::new("noop", json!({})).named("no-span"))
        .await
        .unwrap();
    let run = env
        .wait_terminal("no-span", outside.run_key(), Duration::from_secs(10))
        .await;
    let spans = trace_with_process(run.trace_id.as_deref().unwrap()).await;
    assert_eq!(named(&spans, "publish").len(), 1);

    // A run claimed by a replica that died before publishing: the
    // reconciler's republish stays in the run's trace.
    let r = replica(&env, "traced-r3", None).await;
    let schedule = every("orphan-traced", "1s", "noop");
    let at = this_second();
    let orphan = tracing::info_span!("fire");
    let trace = trace_id_of(&orphan);
    let claimed = belfry_scheduler::Claimer::new(
        None,
        env.ledger.clone(),
        "dead-replica",
        r.counters().clone(),
        Duration::ZERO,
    )
    .claim(&schedule, at)
    .instrument(orphan.clone())
    .await
    .unwrap();
    drop(orphan);
    assert!(matches!(claimed, belfry_scheduler::ClaimOutcome::Won(_)));
    eventually(
        "the reconciler to republish",
        Duration::from_secs(10),
        || async {
            (r.reconciler().reconcile_once().await.unwrap().republished == 1).then_some(())
        },
    )
    .await;
    let run = env
        .wait_fire("orphan-traced", at, Duration::from_secs(10))
        .await;
    assert_eq!(run.trace_id.as_deref(), Some(trace.as_str()));
    let spans = trace_with_process(&trace).await;
    let republish = named(&spans, "republish");
    assert_eq!(
        republish.len(),
        1,
        "{:?}",
        spans.values().map(|s| &s.name).collect::<Vec<_>>()
    );
    assert!(descends(
        &spans,
        named(&spans, "process")[0],
        republish[0].span_context.span_id()
    ));
    running.stop_and_teardown(env).await;
}
