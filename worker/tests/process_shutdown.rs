//! The `belfry-worker` binary as a process: SIGTERM during a job lets the
//! job finish and be recorded before the process exits 0; an unreachable
//! service gives one clear line with the URL masked.

use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_belfry-worker");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_three_second_job_finishes_and_records_it() {
    let env = belfry_testkit::service_env!();
    let child = belfry_testkit::service_command(BIN, &env, "worker-under-test")
        .env("BELFRY_SHUTDOWN_TIMEOUT", "20s")
        .env("RUST_LOG", "info")
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn belfry-worker");
    // Wait until the worker has bound its queue (it declares it at start).
    belfry_testkit::wait_consumed(&env, "default", Duration::from_secs(20)).await;
    let m = env
        .enqueue("long", "sleep", json!({"duration_ms": 3000}), Utc::now())
        .await;
    // Wait until the job is running, then ask the worker to stop.
    belfry_testkit::wait_running(&env, &m, Duration::from_secs(10)).await;
    let term_sent = Utc::now();
    let exit = belfry_testkit::terminate(child).await;
    assert!(exit.success(), "worker exited with {exit:?}");
    let run = env.run_of(&m).await;
    assert_eq!(run.status_text, "succeeded", "{run:?}");
    assert_eq!(run.worker.as_deref(), Some("worker-under-test"));
    let finished = run.finished_at.unwrap();
    assert!(
        finished > term_sent,
        "the job finished after SIGTERM, not before"
    );
    assert!(finished - run.started_at.unwrap() >= chrono::Duration::milliseconds(3000));
    env.teardown(&["default"]).await;
}

#[test]
fn an_unreachable_database_is_one_clear_line_with_the_password_masked() {
    let out = Command::new(BIN)
        .env("DATABASE_URL", "postgres://app:hunter2@127.0.0.1:1/belfry")
        .env("BELFRY_START_TIMEOUT", "0s")
        .env("RUST_LOG", "off")
        .output()
        .expect("run belfry-worker");
    let stderr = belfry_testkit::one_line_exit_1(&out);
    assert!(
        stderr.contains("cannot connect to Postgres at postgres://app:***@127.0.0.1:1/belfry"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[test]
fn a_bad_setting_names_the_variable() {
    let out = Command::new(BIN)
        .env("BELFRY_PREFETCH", "lots")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let stderr = belfry_testkit::stderr_of_exit_1(&out);
    assert!(
        stderr.contains("BELFRY_PREFETCH=\"lots\" is invalid"),
        "{stderr}"
    );
}

#[test]
fn start_up_retries_an_unreachable_database_until_the_start_timeout() {
    let started = std::time::Instant::now();
    let out = Command::new(BIN)
        .env("DATABASE_URL", "postgres://app:hunter2@127.0.0.1:1/belfry")
        // Each connection attempt waits up to the pool's 5 s acquire timeout.
        .env("BELFRY_START_TIMEOUT", "6s")
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .output()
        .expect("run belfry-worker");
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1));
    let logs = String::from_utf8_lossy(&out.stdout);
    assert!(
        logs.matches("worker start failed; retrying").count() >= 1,
        "retries are logged: {logs}"
    );
    assert!(
        took >= std::time::Duration::from_secs(6),
        "gave up after {took:?}, before BELFRY_START_TIMEOUT"
    );
    assert!(!logs.contains("hunter2"), "the password is masked: {logs}");
}
