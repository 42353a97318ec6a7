//! The fault suite (see `RELIABILITY.md`): 3 scheduler replicas and 2
//! workers as real processes under steady load, every kind of fault
//! injected at a random moment, then the table. Sized by
//! `BELFRY_FAULT_SECONDS`, `BELFRY_FAULT_SCHEDULES`, `BELFRY_FAULT_ROUNDS`
//! and `BELFRY_FAULT_SEED`; `scripts/test` runs the short default (about a
//! minute of load), `scripts/fault-suite` the long one.
//!
//! It restarts the machine's Postgres, Redis and RabbitMQ, so it is its own
//! test binary: cargo runs test binaries one after another, so no other
//! test is running meanwhile.
#![cfg(feature = "failpoints")]

use belfry_tests::fault::{run_suite, FaultConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fire_lost_and_no_finished_run_executed_again_under_faults() {
    if !belfry_testkit::services_available().await {
        return;
    }
    let config = FaultConfig::from_env();
    let report = run_suite(&config).await;
    println!("{report}");
    assert!(report.passed(), "the fault suite failed:\n{report}");
}
