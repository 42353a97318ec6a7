//! A worker killed after recording an outcome and before acking it: the
//! broker redelivers the message, the next worker sees a finished run and
//! drops the delivery; the job ran once. Built with
//! `--features belfry-worker/failpoints`, as `scripts/test` does.
#![cfg(feature = "failpoints")]

use std::process::Stdio;
use std::time::Duration;

use belfry_testkit::{eventually, queue_len, run_outcome, TestEnv};
use chrono::Utc;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_belfry-worker");

fn worker(env: &TestEnv, name: &str, failpoints: &str) -> std::process::Child {
    belfry_testkit::service_command(BIN, env, name)
        .env("BELFRY_FAILPOINTS", failpoints)
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_before_ack_does_not_run_the_job_twice() {
    let env = belfry_testkit::service_env!("noop", "sleep", "http");
    let m = env
        .enqueue("once-only", "sleep", json!({"duration_ms": 10}), Utc::now())
        .await;
    let first = worker(&env, "doomed-worker", "before_ack=abort");
    let exit = belfry_testkit::wait_exit(first).await;
    assert!(
        !exit.success(),
        "the failpoint aborts the process: {exit:?}"
    );
    let run = env.run_of(&m).await;
    assert_eq!(
        (run.status_text.as_str(), run.attempts),
        ("succeeded", 1),
        "recorded before the crash"
    );
    // The unacked delivery is back in the queue; the next worker drops it.
    let second = worker(&env, "next-worker", "");
    let queue = env.topology.group_queue("default");
    eventually(
        "the redelivery to be consumed",
        Duration::from_secs(20),
        || async { (queue_len(&env, &queue).await == Some(0)).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let run = env.run_of(&m).await;
    assert_eq!(run_outcome(&run), ("succeeded", 1, Some("doomed-worker")));
    let exit = belfry_testkit::terminate(second).await;
    assert!(exit.success());
    env.teardown(&["default"]).await;
}
