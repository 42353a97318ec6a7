//! The built-in `http` and `sleep` job types against real endpoints, and
//! migrations applied by several replicas at once.

use std::time::Duration;

use belfry_tests::loopback::serve_loopback;
use belfry_tests::{builtins, serve, t0};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A minimal HTTP server on port 0 answering each path with the status in
/// it (`/status/503` → 503).
async fn status_server() -> String {
    let (addr, _accepting) = serve_loopback("status server", |mut sock, _| async move {
        let mut buf = vec![0u8; 4096];
        let n = sock.read(&mut buf).await.unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]);
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.strip_prefix("/status/"))
            .and_then(|c| c.parse::<u16>().ok())
            .unwrap_or(200);
        let reply = format!("HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        let _ = sock.write_all(reply.as_bytes()).await;
    })
    .await;
    format!("http://{addr}")
}

belfry_testkit::both_backends! {
    async fn http_maps_statuses_to_outcomes(env: TestEnv) {
        let base = status_server().await;
        let extra = [("BELFRY_MAX_ATTEMPTS", "2"), ("BELFRY_RETRY_INITIAL", "10ms")];
        let running = serve(&env, builtins(), &extra).await;
        // The payload of a call to the status server answering `code`.
        let status = |code: u16| json!({"url": format!("{base}/status/{code}")});
        let down = json!({"url": "http://127.0.0.1:1/", "timeout_ms": 500});
        // (name, payload, expected status, expected attempts, why)
        let cases = [
            ("h-ok", status(204), "succeeded", 1, "2xx succeeds"),
            ("h-5xx", status(503), "dead", 2, "5xx is retried"),
            ("h-429", status(429), "dead", 2, "429 is retried"),
            ("h-4xx", status(404), "failed", 1, "4xx is permanent"),
            ("h-down", down, "dead", 2, "connection errors are retried"),
            ("h-bad-url", json!({"url": "not a url"}), "failed", 1, "an invalid url is permanent"),
        ];
        let mut messages = Vec::new();
        for (name, payload, ..) in &cases {
            messages.push(env.enqueue(name, "http", payload.clone(), t0()).await);
        }
        for ((name, _, status, attempts, why), m) in cases.iter().zip(&messages) {
            let run = env.wait_terminal_of(m, Duration::from_secs(10)).await;
            assert_eq!(
                (run.status_text.as_str(), run.attempts),
                (*status, *attempts),
                "{name}: {why}: {run:?}"
            );
        }
        running.stop_and_teardown(env).await;
    }
}

belfry_testkit::both_backends! {
    async fn a_timed_out_attempt_is_cancelled_and_retried(env: TestEnv) {
        let extra = [
            ("BELFRY_MAX_ATTEMPTS", "2"),
            ("BELFRY_RETRY_INITIAL", "10ms"),
            ("BELFRY_JOB_TIMEOUT", "200ms"),
        ];
        let running = serve(&env, builtins(), &extra).await;
        let m = env.enqueue("slow", "sleep", json!({"duration_ms": 60_000}), t0()).await;
        let run = env.wait_terminal_of(&m, Duration::from_secs(10)).await;
        assert_eq!((run.status_text.as_str(), run.attempts), ("dead", 2));
        let log = run.attempt_entries().unwrap();
        assert!(log.iter().all(|e| e.outcome == "timeout"), "{log:?}");
        assert!(log
            .iter()
            .all(|e| e.finished_at - e.started_at < chrono::Duration::seconds(5)));
        running.stop_and_teardown(env).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_safe_when_replicas_start_together() {
    let env = belfry_testkit::service_env!();
    // A fresh database (the env's own is already migrated).
    let fresh = belfry_testkit::service_env!();
    sqlx::query("DROP TABLE job_runs, schedules, _sqlx_migrations")
        .execute(fresh.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .unwrap();
    let mut handles = Vec::new();
    for _ in 0..6 {
        let url = fresh.database_url.clone();
        handles.push(tokio::spawn(async move {
            let ledger = belfry_ledger::Ledger::connect(&url, 2).await.unwrap();
            ledger.migrate().await
        }));
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(fresh.ledger.pg_pool().expect("a Postgres ledger"))
        .await
        .unwrap();
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
        })
        .count();
    assert_eq!(
        usize::try_from(n).unwrap(),
        files,
        "each migration applied exactly once"
    );
    fresh.teardown(&[]).await;
    env.teardown(&[]).await;
}
