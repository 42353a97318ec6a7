//! Run logs and progress (issue 23): what a handler writes through
//! `JobContext::log`, `log_with` and `progress` is stored per run and
//! attempt in the order written, with the attempt's failure after its
//! lines; a run's log is bounded (a `truncated` marker, then nothing more,
//! across its attempts); retention removes the lines of runs that are gone
//! and keeps those of runs it keeps. On both backends.

use std::time::Duration;

use belfry_ledger::{LogCursor, LogKind, NewRun, RunLogLine};
use belfry_protocol::JobOptions;
use belfry_scheduler::retention::Retention;
use belfry_testkit::{eventually, TestEnv};
use belfry_tests::{serve, t0};
use belfry_worker::{Job, JobContext, JobError, Registry};
use chrono::Utc;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

/// Logs `lines` lines (with fields, and progress after each), a line with
/// a NUL in its text and fields, then fails its first attempt and
/// succeeds on the next.
#[derive(Clone, Default)]
struct Chatty;

impl Job for Chatty {
    const TYPE: &'static str = "chatty";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, payload: serde_json::Value) -> Result<(), JobError> {
        let lines = payload["lines"].as_u64().unwrap_or(0);
        for i in 0..lines {
            ctx.log_with(tracing::Level::INFO, format!("line {i}"), json!({"i": i}));
            ctx.progress(i + 1, Some(lines), format!("{} of {lines}", i + 1));
        }
        ctx.log_with(tracing::Level::WARN, "nul\u{0}here", json!({"k": "v\u{0}"}));
        if ctx.attempt == 1 {
            return Err(JobError::retryable("first attempt fails"));
        }
        ctx.log(tracing::Level::DEBUG, "done");
        Ok(())
    }
}

fn registry() -> Registry {
    Registry::builder()
        .job(Chatty)
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Every stored line of run `id`, read a page of 7 at a time (so paging
/// is exercised), once `enough` of them are there.
async fn all_lines(env: &TestEnv, id: Uuid, enough: usize) -> Vec<RunLogLine> {
    eventually("the run's log lines", Duration::from_secs(20), || async {
        let mut out = Vec::new();
        let mut after = LogCursor::START;
        loop {
            let page = env.ledger.run_logs(id, after, 7).await.ok()?;
            out.extend(page.iter().cloned());
            match page.last() {
                Some(last) if page.len() == 7 => after = last.cursor(),
                _ => break,
            }
        }
        (out.len() >= enough).then_some(out)
    })
    .await
}

belfry_testkit::both_backends! {
    async fn a_handlers_lines_and_progress_are_stored_in_order_with_the_failure_after_them(env: TestEnv) {
        env.declare_default_group(&["chatty"]).await;
        let running = serve(&env, registry(), &[("BELFRY_RETRY_INITIAL", "10ms")]).await;
        let m = env.enqueue("chatty-job", "chatty", json!({"lines": 4}), t0()).await;
        let run = env.wait_terminal_of(&m, Duration::from_secs(20)).await;
        assert_eq!((run.status_text.as_str(), run.attempts), ("succeeded", 2));
        // Attempt 1: 4 × (line, progress), the NUL line, the error;
        // attempt 2: the same 9, then "done".
        let lines = all_lines(&env, m.message_id, 20).await;
        let shape: Vec<(i32, i32, LogKind)> = lines.iter().map(|l| (l.attempt, l.seq, l.kind)).collect();
        let mut expected = Vec::new();
        for attempt in [1, 2] {
            for i in 0..4 {
                expected.push((attempt, 2 * i, LogKind::Log));
                expected.push((attempt, 2 * i + 1, LogKind::Progress));
            }
            expected.push((attempt, 8, LogKind::Log));
            expected.push((attempt, 9, if attempt == 1 { LogKind::Error } else { LogKind::Log }));
        }
        assert_eq!(shape, expected);
        assert_eq!(lines[0].message, "line 0");
        assert_eq!(lines[0].fields, Some(json!({"i": 0})));
        assert_eq!(lines[0].level, "info");
        assert_eq!((lines[7].done, lines[7].total, lines[7].message.as_str()), (Some(4), Some(4), "4 of 4"));
        // Hostile text is stored, escaped, and does not cost its batch.
        assert_eq!(lines[8].message, "nul\\0here");
        assert_eq!(lines[8].fields, Some(json!({"k": "v\u{0}"})));
        assert_eq!(lines[8].level, "warn");
        assert_eq!(lines[9].message, "first attempt fails");
        assert_eq!(lines[9].level, "error");
        assert_eq!((lines[19].message.as_str(), lines[19].level.as_str()), ("done", "debug"));
        // A cursor after the last line reads nothing more.
        let last = lines[19].cursor();
        assert!(env.ledger.run_logs(m.message_id, last, 100).await.unwrap().is_empty());
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_runs_log_is_bounded_across_its_attempts_and_still_ends_with_the_failure(env: TestEnv) {
        env.declare_default_group(&["chatty"]).await;
        let running = serve(
            &env,
            registry(),
            &[("BELFRY_RETRY_INITIAL", "10ms"), ("BELFRY_RUN_LOG_MAX_LINES", "5")],
        )
        .await;
        let m = env.enqueue("chatty-job", "chatty", json!({"lines": 10}), t0()).await;
        let run = env.wait_terminal_of(&m, Duration::from_secs(20)).await;
        assert_eq!(run.status_text, "succeeded");
        let lines = all_lines(&env, m.message_id, 8).await;
        let shape: Vec<(i32, LogKind)> = lines.iter().map(|l| (l.attempt, l.kind)).collect();
        // Attempt 1: 5 lines, the marker, the error. Attempt 2 starts from
        // the run's 7 stored lines: its first line is past the bound.
        assert_eq!(
            shape,
            [
                (1, LogKind::Log),
                (1, LogKind::Progress),
                (1, LogKind::Log),
                (1, LogKind::Progress),
                (1, LogKind::Log),
                (1, LogKind::Truncated),
                (1, LogKind::Error),
                (2, LogKind::Truncated),
            ]
        );
        assert!(lines[5].message.contains("bound of 5 lines"), "{}", lines[5].message);
        // Nothing more arrives (the worker's writer is flushed by stopping).
        running.stop().await;
        let after = env.ledger.run_logs(m.message_id, LogCursor::START, 100).await.unwrap();
        assert_eq!(after.len(), 8);
        env.teardown(&["default"]).await;
    }
}

fn line(run_id: Uuid, seq: i32, at: chrono::DateTime<Utc>) -> RunLogLine {
    RunLogLine {
        run_id,
        attempt: 1,
        seq,
        at,
        kind: LogKind::Log,
        level: "info".into(),
        message: format!("line {seq}"),
        fields: None,
        done: None,
        total: None,
    }
}

belfry_testkit::both_backends! {
    async fn retention_removes_the_lines_of_runs_that_are_gone_and_keeps_the_rest(env: TestEnv) {
        let old = Utc::now() - chrono::Duration::days(30);
        // A run retention keeps (unfinished), with old lines.
        let kept = NewRun {
            id: Uuid::now_v7(),
            job_name: "kept".into(),
            run_key: belfry_protocol::run_key("kept", old).unwrap(),
            job_type: "chatty".into(),
            payload: json!(null),
            scheduled_at: old,
            claimed_by: "test".into(),
            trace_id: None,
            traceparent: None,
            options: JobOptions::default(),
            next_dispatch_at: Utc::now() + chrono::Duration::hours(1),
        };
        assert!(env.ledger.claim(&kept).await.unwrap());
        let gone = Uuid::now_v7();
        let mut lines: Vec<RunLogLine> = (0..1_500).map(|i| line(gone, i, old)).collect();
        lines.extend((0..3).map(|i| line(kept.id, i, old)));
        // A recent line of a gone run: not yet past the horizon.
        let recent = Uuid::now_v7();
        lines.push(line(recent, 0, Utc::now()));
        assert_eq!(env.ledger.append_run_logs(&lines).await.unwrap(), 1_504);
        // Sent again (an answer lost): nothing is stored twice.
        assert_eq!(env.ledger.append_run_logs(&lines[..10]).await.unwrap(), 0);

        let retention = Retention::new(env.ledger.clone(), Duration::from_secs(7 * 86_400));
        let pruned = retention.prune_once(Utc::now(), &CancellationToken::new()).await.unwrap();
        assert_eq!(pruned.log_lines, 1_500);
        let count = |id| {
            let ledger = env.ledger.clone();
            async move { ledger.run_logs(id, LogCursor::START, 10_000).await.unwrap().len() }
        };
        assert_eq!(count(gone).await, 0);
        assert_eq!(count(kept.id).await, 3);
        assert_eq!(count(recent).await, 1);
        env.teardown(&[]).await;
    }
}

/// Logs "before", waits until the test opens its gate (at most 20 s), logs
/// "after" and succeeds.
#[derive(Clone, Default)]
struct Gated {
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Job for Gated {
    const TYPE: &'static str = "gated";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        ctx.log(tracing::Level::INFO, "before");
        ctx.progress(1, Some(2), "half way");
        for _ in 0..2_000 {
            if self.open.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        ctx.log(tracing::Level::INFO, "after");
        Ok(())
    }
}

/// The `line` events' messages and the `end` event's data, read from an
/// SSE body until `end` (or 30 s).
async fn read_events(
    mut resp: reqwest::Response,
    on_first_line: impl FnOnce(),
) -> (Vec<String>, String) {
    let mut on_first_line = Some(on_first_line);
    let (mut buf, mut lines) = (String::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let chunk = tokio::time::timeout_at(deadline, resp.chunk())
            .await
            .expect("the stream ended with `end` within 30 s")
            .unwrap()
            .expect("the stream ended before its `end` event");
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find("\n\n") {
            let event: String = buf.drain(..i + 2).collect();
            let field = |name: &str| {
                event.lines().find_map(|l| {
                    l.strip_prefix(&format!("{name}:"))
                        .map(|v| v.trim().to_owned())
                })
            };
            match field("event").as_deref() {
                Some("line") => {
                    let line: serde_json::Value =
                        serde_json::from_str(&field("data").unwrap()).unwrap();
                    lines.push(line["message"].as_str().unwrap().to_owned());
                    if let Some(f) = on_first_line.take() {
                        f();
                    }
                }
                Some("end") => return (lines, field("data").unwrap()),
                other => assert!(other.is_none(), "unexpected event {event:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_pages_a_runs_log_and_streams_it_live_until_the_run_ends() {
    let env = belfry_testkit::service_env!("gated");
    let job = Gated::default();
    let registry = Registry::builder().job(job.clone()).build().unwrap();
    let running = serve(&env, registry, &[]).await;
    let (_, api) =
        belfry_tests::TestApi::of_replica(&env, "logs-api", belfry_server::api::Tokens::default())
            .await;
    let m = env.enqueue("gated-job", "gated", json!(null), t0()).await;
    let http = reqwest::Client::new();
    let logs = api.url(&format!("/v1/runs/{}/logs", m.message_id));
    // The running run's page: its first lines, its progress, not complete.
    let page: belfry_api_types::RunLogPage =
        eventually("the first lines", Duration::from_secs(20), || async {
            let p: belfry_api_types::RunLogPage =
                http.get(&logs).send().await.ok()?.json().await.ok()?;
            (p.lines.len() == 2).then_some(p)
        })
        .await;
    assert_eq!(page.status, belfry_api_types::RunStatus::Running);
    assert!(!page.complete);
    assert_eq!(page.next, "1.1");
    let progress = page.progress.unwrap();
    assert_eq!(
        (progress.done, progress.total, progress.message.as_str()),
        (Some(1), Some(2), "half way")
    );
    // From a cursor: nothing yet after the last line.
    let after: belfry_api_types::RunLogPage = http
        .get(format!("{logs}?after=1.1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(after.lines.is_empty() && !after.complete && after.next == "1.1");
    // A bad cursor names the parameter.
    let bad = http.get(format!("{logs}?after=one")).send().await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("after"));

    // The stream from the start: both old lines, then the gate opens and
    // the new line arrives live, then `end`.
    let stream = http.get(format!("{logs}/stream")).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let open = job.open.clone();
    let (lines, end) = read_events(stream, move || {
        open.store(true, std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    assert_eq!(lines, ["before", "half way", "after"]);
    assert_eq!(end, "succeeded");
    // A stream resumed after its last event (Last-Event-ID) gets only `end`.
    let resumed = http
        .get(format!("{logs}/stream"))
        .header("Last-Event-ID", "1.2")
        .send()
        .await
        .unwrap();
    let (lines, end) = read_events(resumed, || {}).await;
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(end, "succeeded");
    // The page of a finished run is complete once its last lines settled.
    let done: belfry_api_types::RunLogPage =
        eventually("a complete page", Duration::from_secs(20), || async {
            let p: belfry_api_types::RunLogPage = http
                .get(format!("{logs}?after=1.2"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            p.complete.then_some(p)
        })
        .await;
    assert_eq!(done.status, belfry_api_types::RunStatus::Succeeded);
    let missing = http
        .get(api.url(&format!("/v1/runs/{}/logs", Uuid::now_v7())))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    drop(api);
    running.stop_and_teardown(env).await;
}

/// Emits `tracing` events from its handler and from a task it spawns in
/// its span, at several levels; registered with `capture_tracing` (INFO)
/// or without it, under two type names.
#[derive(Clone, Copy, Default)]
struct Traced;

async fn traced_run(ctx: &JobContext) {
    ctx.log(tracing::Level::INFO, "own line");
    tracing::info!(target: "billing", invoice = 7, "charged {}", "acme");
    tracing::debug!(target: "billing", "below the captured level");
    let task = tokio::spawn(
        async { tracing::warn!(target: "billing", "from a spawned task") }
            .instrument(ctx.span.clone()),
    );
    let _ = task.await;
}

impl Job for Traced {
    const TYPE: &'static str = "traced";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        traced_run(&ctx).await;
        Ok(())
    }
}

/// [`Traced`] under a type that did not opt in.
#[derive(Clone, Copy, Default)]
struct Untraced;

impl Job for Untraced {
    const TYPE: &'static str = "untraced";
    type Payload = serde_json::Value;
    async fn run(&self, ctx: JobContext, _: serde_json::Value) -> Result<(), JobError> {
        traced_run(&ctx).await;
        Ok(())
    }
}

/// The process's subscriber with the run-log capture layer, as
/// `belfry-worker` installs it (once per test binary; DEBUG, so the
/// capture's own level is what keeps the DEBUG event out).
fn install_capture() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let installed = tracing_subscriber::registry()
            .with(tracing_subscriber::filter::LevelFilter::DEBUG)
            .with(belfry_worker::RunLogCapture::layer())
            .try_init();
        assert!(
            installed.is_ok(),
            "another global subscriber was installed first"
        );
    });
}

belfry_testkit::both_backends! {
    async fn tracing_events_in_a_handlers_span_are_stored_for_the_types_that_opted_in(env: TestEnv) {
        install_capture();
        env.declare_default_group(&["traced", "untraced"]).await;
        let registry = Registry::builder()
            .job(Traced)
            .capture_tracing::<Traced>(tracing::Level::INFO)
            .job(Untraced)
            .build()
            .unwrap();
        let running = serve(&env, registry, &[]).await;
        let traced = env.enqueue("traced-job", "traced", json!(null), t0()).await;
        let untraced = env.enqueue("untraced-job", "untraced", json!(null), t0()).await;
        for m in [&traced, &untraced] {
            let run = env.wait_terminal_of(m, Duration::from_secs(20)).await;
            assert_eq!(run.status_text, "succeeded");
        }
        // Stopping flushes the worker's writer: every line is stored.
        running.stop().await;
        let read = |id| {
            let ledger = env.ledger.clone();
            async move { ledger.run_logs(id, LogCursor::START, 100).await.unwrap() }
        };
        let lines = read(traced.message_id).await;
        let got: Vec<(&str, &str)> = lines.iter().map(|l| (l.level.as_str(), l.message.as_str())).collect();
        assert_eq!(
            got,
            [("info", "own line"), ("info", "charged acme"), ("warn", "from a spawned task")]
        );
        assert_eq!(lines[1].fields, Some(json!({"invoice": 7, "target": "billing"})));
        // A type that did not opt in keeps only its ctx.log lines (the
        // worker's own events are left out too: the unit test of
        // log_capture checks that).
        let other: Vec<String> = read(untraced.message_id).await.into_iter().map(|l| l.message).collect();
        assert_eq!(other, ["own line"]);
        env.teardown(&["default"]).await;
    }
}

#[test]
fn capture_tracing_of_a_type_not_registered_is_refused_with_the_fix() {
    let e = Registry::builder()
        .capture_tracing::<Traced>(tracing::Level::INFO)
        .job(Traced)
        .build()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        e.contains("\"traced\"") && e.contains("call .job(..) for the type first"),
        "{e}"
    );
}

/// A `chatty` run `name` whose first attempt has started (no worker):
/// its id and attempt.
async fn started(env: &TestEnv, name: &str) -> (Uuid, i32) {
    env.declare_default_group(&["chatty"]).await;
    let message = env.enqueue(name, "chatty", json!(null), t0()).await;
    let start = env
        .ledger
        .begin_attempt(&message, "w1", Duration::from_secs(60))
        .await
        .unwrap();
    let belfry_ledger::AttemptStart::Started { id, attempt } = start else {
        panic!("{start:?}");
    };
    (id, attempt)
}

belfry_testkit::both_backends! {
    async fn a_finished_runs_log_is_complete_when_every_line_its_attempts_sent_is_stored(env: TestEnv) {
        let (id, attempt) = started(&env, "counted").await;
        // The attempt sent 3 lines; its outcome is stored before the last.
        let entry = belfry_ledger::AttemptEntry {
            attempt,
            worker: "w1".into(),
            started_at: Utc::now(),
            finished_at: Utc::now(),
            outcome: "succeeded".into(),
            error: None,
            log_lines: Some(3),
            result: None,
        };
        assert!(env
            .ledger
            .end_attempt(id, belfry_ledger::RunStatus::Succeeded, &entry, None, None)
            .await
            .unwrap());
        let mut lines: Vec<RunLogLine> = (0..3).map(|i| line(id, i, Utc::now())).collect();
        let last = lines.pop().unwrap();
        env.ledger.append_run_logs(&lines).await.unwrap();
        let (_, api) =
            belfry_tests::TestApi::of_replica(&env, "logs-complete", belfry_server::api::Tokens::default())
                .await;
        let http = reqwest::Client::new();
        let logs = api.url(&format!("/v1/runs/{id}/logs?after=1.1"));
        let page = || async {
            let p: belfry_api_types::RunLogPage =
                http.get(&logs).send().await.unwrap().json().await.unwrap();
            p
        };
        // Final, nothing after 1.1 yet, but line 1.2 is still on its way.
        let p = page().await;
        assert!(p.lines.is_empty() && p.status == belfry_api_types::RunStatus::Succeeded);
        assert!(!p.complete, "complete while the attempt's third line is not stored");
        env.ledger.append_run_logs(&[last]).await.unwrap();
        let p = page().await;
        assert_eq!(p.lines.len(), 1);
        // Read past it: complete now, not some seconds after the run ended.
        let after = api.url(&format!("/v1/runs/{id}/logs?after=1.2"));
        let p: belfry_api_types::RunLogPage = http.get(&after).send().await.unwrap().json().await.unwrap();
        assert!(p.complete, "not complete although every line the attempt sent is stored");
        drop(api);
        env.teardown(&["default"]).await;
    }
}

belfry_testkit::both_backends! {
    async fn an_attempt_handed_back_without_a_count_keeps_the_cancelled_runs_log_open_a_moment(env: TestEnv) {
        let (id, attempt) = started(&env, "handed-back").await;
        // A stopping worker hands the attempt back (no entry, no count) and
        // the run is cancelled at once; the attempt's lines are still on
        // their way (its worker writes them at its shutdown flush).
        assert!(env.ledger.hand_back(id, attempt, "worker stopping").await.unwrap());
        let (_, api) =
            belfry_tests::TestApi::of_replica(&env, "logs-handed-back", belfry_server::api::Tokens::default())
                .await;
        let http = reqwest::Client::new();
        let cancelled = http
            .post(api.url(&format!("/v1/runs/{id}/cancel")))
            .json(&json!({"reason": "not needed"}))
            .send()
            .await
            .unwrap();
        assert!(cancelled.status().is_success(), "{}", cancelled.text().await.unwrap());
        let logs = api.url(&format!("/v1/runs/{id}/logs"));
        let page = || async {
            let p: belfry_api_types::RunLogPage =
                http.get(&logs).send().await.unwrap().json().await.unwrap();
            p
        };
        let p = page().await;
        assert_eq!(p.status, belfry_api_types::RunStatus::Cancelled);
        assert!(!p.complete, "complete at once although attempt 1 recorded no count of its lines");
        env.ledger.append_run_logs(&[line(id, 0, Utc::now())]).await.unwrap();
        assert_eq!(page().await.lines.len(), 1);
        // Read past it: complete, a few seconds after the run ended.
        let after = api.url(&format!("/v1/runs/{id}/logs?after=1.0"));
        eventually("a complete page", Duration::from_secs(15), || async {
            let p: belfry_api_types::RunLogPage =
                http.get(&after).send().await.ok()?.json().await.ok()?;
            p.complete.then_some(())
        })
        .await;
        drop(api);
        env.teardown(&["default"]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_streams_past_the_bound_are_refused_and_a_closed_one_frees_its_place() {
    let env = belfry_testkit::service_env!("bounded-streams");
    // A running run (its attempt started, no worker): a stream of it stays
    // open.
    let (id, _) = started(&env, "streamed").await;
    let replica = std::sync::Arc::new(
        belfry_tests::replica(&env, "logs-bounded", Some(&belfry_testkit::redis_url())).await,
    );
    let state = belfry_server::api::ApiState::new(replica, belfry_server::api::Tokens::default())
        .with_max_log_streams(1);
    let api = belfry_tests::TestApi::serve_state(state).await;
    let http = reqwest::Client::new();
    let url = api.url(&format!("/v1/runs/{id}/logs/stream"));
    let first = http.get(&url).send().await.unwrap();
    assert_eq!(first.status(), 200);
    let refused = http.get(&url).send().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused
        .text()
        .await
        .unwrap()
        .contains("too many log streams"));
    // The page form still answers.
    let page = http
        .get(api.url(&format!("/v1/runs/{id}/logs")))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    // The first client goes: its place is free again.
    drop(first);
    eventually(
        "a stream once the first closed",
        Duration::from_secs(15),
        || async {
            let r = http.get(&url).send().await.ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    drop(api);
    env.teardown(&["default"]).await;
}
