//! The example binary serves its own job type end to end.

use std::process::{Command, Stdio};
use std::time::Duration;

use belfry_testkit::{eventually, queue_consumed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_worker_runs_invoices() {
    let env = belfry_testkit::service_env!();
    let child = Command::new(env!("CARGO_BIN_EXE_custom-worker"))
        .envs(env.process_env())
        .env("BELFRY_INSTANCE", "invoicer")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let queue = env.topology.group_queue("default");
    eventually("the worker's queue", Duration::from_secs(20), || async {
        queue_consumed(&env, &queue).await.then_some(())
    })
    .await;
    let at = chrono::Utc::now();
    let ok = env
        .enqueue(
            "bill-c42",
            "invoice",
            serde_json::json!({"customer": "c-42", "cents": 1999}),
            at,
        )
        .await;
    let zero = env
        .enqueue(
            "bill-zero",
            "invoice",
            serde_json::json!({"customer": "c-0", "cents": 0}),
            at,
        )
        .await;
    let bad = env
        .enqueue(
            "bill-bad",
            "invoice",
            serde_json::json!({"customer": "c-1"}),
            at,
        )
        .await;
    let wait = Duration::from_secs(15);
    assert_eq!(
        env.wait_terminal(&ok.job_name, &ok.run_key, wait)
            .await
            .status_text,
        "succeeded"
    );
    assert_eq!(
        env.wait_terminal(&zero.job_name, &zero.run_key, wait)
            .await
            .status_text,
        "failed"
    );
    let bad = env.wait_terminal(&bad.job_name, &bad.run_key, wait).await;
    assert_eq!(bad.status_text, "dead");
    assert!(bad.last_error.unwrap().contains("missing field `cents`"));
    let exit = belfry_testkit::terminate(child).await;
    assert!(exit.success());
    env.teardown(&["default"]).await;
}
