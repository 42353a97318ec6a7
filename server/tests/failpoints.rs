//! Real crashes at the scheduler's most dangerous point, through failpoints
//! (built with `--features belfry-server/failpoints`, as `scripts/test`
//! does): a replica killed between claiming a fire and publishing it loses
//! nothing — another replica's reconciler publishes the fire with the same
//! message id.
#![cfg(feature = "failpoints")]

use std::process::Stdio;
use std::time::Duration;

use belfry_ledger::Ledger;
use belfry_scheduler::{Replica, ReplicaTiming};
use belfry_testkit::{amqp_url, eventually};

const BIN: &str = env!("CARGO_BIN_EXE_belfry-scheduler");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_between_claim_and_publish_loses_no_fire() {
    let env = belfry_testkit::service_env!("noop");
    let file = belfry_testkit::temp_schedule_file(&belfry_testkit::noop_every_second("crashy"));
    let child = belfry_testkit::service_command(BIN, &env, "doomed")
        .env("BELFRY_SCHEDULES", &file)
        .env("BELFRY_RECONCILE_AFTER", "1s")
        .env("BELFRY_FAILPOINTS", "after_claim_before_publish=abort")
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let exit = belfry_testkit::wait_exit(child).await;
    assert!(
        !exit.success(),
        "the failpoint aborts the process: {exit:?}"
    );
    // The fire was claimed and never published.
    let runs = env.all_runs().await;
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        (runs[0].status_text.as_str(), runs[0].claimed_by.as_deref()),
        ("claimed", Some("doomed"))
    );
    // A surviving replica's reconciler publishes it once its confirm
    // deadline passed: same row, same message id.
    let ledger = Ledger::connect(&env.database_url, 2).await.unwrap();
    let broker = belfry_broker::Broker::connect(&amqp_url(), env.topology.clone(), "survivor")
        .await
        .unwrap();
    let survivor = Replica::new("survivor", None, ledger, broker, ReplicaTiming::default());
    eventually(
        "the reconciler to publish the orphaned fire",
        Duration::from_secs(10),
        || async {
            (survivor
                .reconciler()
                .reconcile_once()
                .await
                .unwrap()
                .republished
                == 1)
                .then_some(())
        },
    )
    .await;
    let run = env.ledger.run(runs[0].id).await.unwrap().unwrap();
    assert_eq!(run.status_text, "dispatched");
    assert_eq!(
        belfry_testkit::queue_len(&env, &env.topology.group_queue("default")).await,
        Some(1)
    );
    let _ = std::fs::remove_file(file);
    env.teardown(&["default"]).await;
}
