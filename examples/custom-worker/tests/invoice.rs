//! The example binary serves its own job type end to end.

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_custom_worker_runs_invoices() {
    let env = belfry_testkit::service_env!();
    let child =
        belfry_testkit::service_command(env!("CARGO_BIN_EXE_custom-worker"), &env, "invoicer")
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    belfry_testkit::wait_consumed(&env, "default", Duration::from_secs(20)).await;
    let at = chrono::Utc::now();
    let wait = Duration::from_secs(15);
    // (run, payload, status it ends in)
    let bills = [
        (
            "bill-c42",
            json!({"customer": "c-42", "cents": 1999}),
            "succeeded",
        ),
        (
            "bill-zero",
            json!({"customer": "c-0", "cents": 0}),
            "failed",
        ),
        ("bill-bad", json!({"customer": "c-1"}), "dead"),
    ];
    let mut messages = Vec::new();
    for (name, payload, _) in &bills {
        messages.push(env.enqueue(name, "invoice", payload.clone(), at).await);
    }
    for ((name, _, status), m) in bills.iter().zip(&messages) {
        let run = env.wait_terminal_of(m, wait).await;
        assert_eq!(run.status_text, *status, "{name}");
    }
    let bad = env.run_of(&messages[2]).await;
    assert!(bad.last_error.unwrap().contains("missing field `cents`"));
    let exit = belfry_testkit::terminate(child).await;
    assert!(exit.success());
    env.teardown(&["default"]).await;
}
