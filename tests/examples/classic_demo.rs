//! The classic demo: two scheduler replicas share a schedule that fires
//! every 2 seconds; after 6 seconds `job_runs` holds 3 rows, not 6, each
//! naming the replica that won its fire.
//!
//! Needs Postgres, Redis and RabbitMQ on their default local ports (see the
//! README); runs in a private database and namespace it removes afterwards.
//!
//! ```text
//! cargo run -p belfry-tests --example classic-demo
//! ```

use std::sync::Arc;
use std::time::Duration;

use belfry_runtime::SystemClock;
use belfry_scheduler::Timer;
use belfry_testkit::{redis_url, TestEnv};
use belfry_tests::{every, replica, worker};
use belfry_worker::Registry;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let env = TestEnv::new().await;
    let schedule = every("demo", "2s", "noop");
    let worker = worker(
        &env,
        "worker-1",
        "default",
        Registry::builder()
            .builtins()
            .build()
            .unwrap_or_else(|e| panic!("{e}")),
        &[],
    )
    .await;
    let stop_worker = CancellationToken::new();
    let worker_task = tokio::spawn(worker.run(stop_worker.clone()));

    let stop = CancellationToken::new();
    let mut replicas = Vec::new();
    for name in ["replica-a", "replica-b"] {
        let r = Arc::new(replica(&env, name, Some(&redis_url())).await);
        // Start both timers at the same instant, as two processes started
        // together would.
        replicas.push(r);
    }
    // Start half-way through a second: any 6-second window that starts
    // and ends off the second boundaries holds exactly three even seconds.
    let millis = i64::from(chrono::Utc::now().timestamp_subsec_millis());
    tokio::time::sleep(Duration::from_millis(
        u64::try_from((1500 - millis) % 1000).unwrap_or(0),
    ))
    .await;
    println!("two replicas, schedule \"demo\" every 2s, running for 6 seconds...");
    let mut tasks = Vec::new();
    for r in &replicas {
        let timer = Timer::new(vec![schedule.clone()], chrono::Utc::now());
        tasks.push(tokio::spawn(r.clone().run(
            timer,
            Arc::new(SystemClock),
            stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let runs = env.all_runs().await;
    for run in &runs {
        env.wait_terminal(&run.job_name, &run.run_key, Duration::from_secs(10))
            .await;
    }
    stop_worker.cancel();
    let _ = worker_task.await;
    let fired: u64 = replicas
        .iter()
        .map(|r| belfry_scheduler::FireCounters::get(&r.counters().fires))
        .sum();
    let runs = env.all_runs().await;
    println!(
        "fires computed by the replicas: {fired}; rows in job_runs: {}",
        runs.len()
    );
    for run in &runs {
        println!(
            "  {}  claimed by {}  {}",
            run.run_key,
            run.claimed_by.as_deref().unwrap_or("?"),
            run.status_text
        );
    }
    env.teardown(&["default"]).await;
}
