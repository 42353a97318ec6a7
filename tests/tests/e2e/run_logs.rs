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
