//! The test environments clean up after themselves even when a test does
//! not reach its teardown (it panicked, or never called it): a leftover
//! quorum queue holds file handles on the broker, and a few hundred of
//! them stopped a RabbitMQ node with the usual 1,024-handle limit from
//! accepting connections halfway through a CI run (RELIABILITY.md).

use belfry_testkit::{queue_len, TestEnv};
use sqlx::{Connection, PgConnection};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_environment_dropped_without_teardown_leaves_no_queue_or_database() {
    let env = belfry_testkit::service_env!("noop");
    let probe = belfry_testkit::service_env!();
    let queues: Vec<String> = belfry_protocol::Priority::ALL
        .iter()
        .map(|p| env.topology.group_queue_at("default", *p))
        .chain([env.topology.dead_letter_queue()])
        .collect();
    for queue in &queues {
        assert_eq!(queue_len(&probe, queue).await, Some(0), "{queue} declared");
    }
    let database = env.database.clone();

    drop(env);

    for queue in &queues {
        assert_eq!(
            queue_len(&probe, queue).await,
            None,
            "{queue} is still on the broker after its environment was dropped"
        );
    }
    let mut admin = PgConnection::connect(&belfry_testkit::admin_database_url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(&database)
        .fetch_one(&mut admin)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        left, 0,
        "database {database} is left after its environment was dropped"
    );
    probe.teardown(&["default"]).await;
}

/// `teardown` is still what a test calls: it removes the same objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teardown_removes_the_queues_of_the_groups_it_names() {
    let env = belfry_testkit::service_env!();
    env.broker
        .declare_group("reports", &["report"])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let probe = TestEnv::new().await;
    let queue = env.topology.group_queue("reports");
    let dead_letters = env.topology.dead_letter_queue();
    assert_eq!(queue_len(&probe, &queue).await, Some(0));
    // No `default` group was declared: deleting its absent queues (always
    // part of a teardown) must not stop the rest.
    env.teardown(&["reports"]).await;
    assert_eq!(queue_len(&probe, &queue).await, None);
    assert_eq!(queue_len(&probe, &dead_letters).await, None);
    probe.teardown(&[]).await;
}
