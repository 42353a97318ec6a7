//! Leases kept by a heartbeat (issue 16, defect 4): a worker killed mid-job
//! no longer holds its run for the job timeout plus 30 s; another worker
//! takes it over about one lease (`BELFRY_LEASE`, 20 s by default) after
//! the kill, whatever the timeout. The killed worker's binary runs with the
//! defaults users run.

use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_belfry-worker");

/// Kills the process if the test fails before it was stopped, so no worker
/// outlives the test.
struct Reaped(Option<std::process::Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_worker(
    env: &belfry_testkit::TestEnv,
    instance: &str,
    extra: &[(&str, &str)],
) -> std::process::Child {
    belfry_testkit::service_command(BIN, env, instance)
        .env("RUST_LOG", "warn")
        .envs(extra.iter().copied())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn belfry-worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_workers_run_is_taken_over_within_a_lease() {
    let env = belfry_testkit::service_env!();
    let mut first = Reaped(Some(spawn_worker(&env, "doomed", &[])));
    belfry_testkit::wait_consumed(&env, "default", Duration::from_secs(20)).await;
    // Runs far longer than a lease (the default job timeout is 5 min): only
    // a renewed lease keeps it owned.
    let m = env
        .enqueue("long", "sleep", json!({"duration_ms": 30000}), Utc::now())
        .await;
    belfry_testkit::wait_running(&env, &m, Duration::from_secs(10)).await;
    // Past two heartbeats: the lease was renewed, not set once for the
    // whole attempt.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let run = env.run_of(&m).await;
    assert_eq!(
        (run.status_text.as_str(), run.attempts),
        ("running", 1),
        "{run:?}"
    );
    let mut doomed = first.0.take().expect("the first worker");
    doomed.kill().expect("kill -9");
    let killed = Instant::now();
    let _ = doomed.wait();
    let mut second = Reaped(Some(spawn_worker(
        &env,
        "survivor",
        // Stops at once when asked: the taken-over run is handed back.
        &[("BELFRY_SHUTDOWN_TIMEOUT", "1s")],
    )));
    let taken_over = belfry_testkit::wait_run(
        &env,
        &m,
        "attempt 2 to start",
        Duration::from_secs(40),
        |run| run.attempts >= 2,
    )
    .await;
    let took = killed.elapsed();
    eprintln!("kill -9 to the next attempt: {:.1} s", took.as_secs_f64());
    assert_eq!(taken_over.worker.as_deref(), Some("survivor"));
    assert!(
        took < Duration::from_secs(30),
        "the run was held for {took:?} after its worker died"
    );
    let exit = belfry_testkit::terminate(second.0.take().expect("the second worker")).await;
    assert!(exit.success(), "{exit:?}");
    env.teardown(&["default"]).await;
}
