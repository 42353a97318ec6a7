//! The `belfry-scheduler` binary as a process: it fires its schedule file,
//! exits 0 on SIGTERM leaving nothing `claimed`, and refuses bad input with
//! one clear line.

use std::process::{Command, Stdio};
use std::time::Duration;

use belfry_testkit::temp_schedule_file;

const BIN: &str = env!("CARGO_BIN_EXE_belfry-scheduler");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fires_and_stops_cleanly_on_sigterm() {
    let env = belfry_testkit::service_env!("noop");
    let file = temp_schedule_file(&belfry_testkit::noop_every_second("every-second"));
    let child = belfry_testkit::service_command(BIN, &env, "sched-under-test")
        .env("BELFRY_SCHEDULES", &file)
        .env("RUST_LOG", "info")
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    belfry_testkit::eventually("two fires", Duration::from_secs(20), || async {
        (env.all_runs().await.len() >= 2).then_some(())
    })
    .await;
    let exit = belfry_testkit::terminate(child).await;
    assert!(exit.success(), "{exit:?}");
    let runs = env.all_runs().await;
    assert!(
        runs.iter().all(|r| r.status_text == "dispatched"),
        "nothing left claimed: {runs:?}"
    );
    assert!(runs
        .iter()
        .all(|r| r.claimed_by.as_deref() == Some("sched-under-test")));
    // The schedule file was synced into `schedules`.
    let stored = env.ledger.schedules().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        (stored[0].name.as_str(), stored[0].every_ms),
        ("every-second", Some(1000))
    );
    let _ = std::fs::remove_file(file);
    env.teardown(&["default"]).await;
}

fn run_expecting_failure(envs: &[(&str, &str)]) -> String {
    let out = Command::new(BIN)
        .envs(envs.iter().copied())
        .env("BELFRY_START_TIMEOUT", "0s")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    belfry_testkit::one_line_exit_1(&out)
}

#[test]
fn an_invalid_schedule_names_the_schedule_and_the_field() {
    let file = temp_schedule_file(
        "[[schedule]]\nname = \"nightly\"\ncron = \"0 0 25 * * *\"\njob_type = \"noop\"\n",
    );
    let stderr = run_expecting_failure(&[("BELFRY_SCHEDULES", file.to_str().unwrap())]);
    assert!(
        stderr.contains("schedule \"nightly\": field `cron`"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn unreachable_services_name_the_url_with_the_password_masked() {
    let env = belfry_testkit::service_env!();
    let file = temp_schedule_file("");
    let stderr = run_expecting_failure(&[
        ("BELFRY_SCHEDULES", file.to_str().unwrap()),
        ("DATABASE_URL", &env.database_url),
        ("AMQP_URL", "amqp://guest:s3cret@127.0.0.1:1/%2f"),
    ]);
    assert!(
        stderr.contains("cannot connect to RabbitMQ at amqp://guest:***@127.0.0.1:1/%2f"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cret"));
    let stderr = run_expecting_failure(&[
        ("BELFRY_SCHEDULES", file.to_str().unwrap()),
        (
            "DATABASE_URL",
            "postgres://postgres:pw@127.0.0.1:1/postgres",
        ),
    ]);
    assert!(
        stderr
            .contains("cannot connect to Postgres at postgres://postgres:***@127.0.0.1:1/postgres"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(file);
    env.teardown(&[]).await;
}
