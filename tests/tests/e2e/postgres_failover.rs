//! A Postgres failover under racing replicas: the primary stops at once
//! (`-m immediate`, as a crash) and its synchronous standby is promoted
//! (`scripts/pg-failover`, Debian's Postgres). `DATABASE_URL` names both
//! hosts; the ledger finds the new primary by itself.
//!
//! What must hold: every fire claimed before the failover is still claimed
//! after it (synchronous replication: no committed row lost), so racing it
//! again wins nothing; the fires after it are claimed once each on the new
//! primary; and claiming resumes within seconds, with nothing but the URL
//! configured.

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use belfry_ledger::Ledger;
use belfry_scheduler::FireOutcome;
use belfry_testkit::eventually;
use belfry_tests::process_window::{Process, ProcessFleet};
use belfry_tests::{at, every, race};
use chrono::{DateTime, Utc};
use sqlx::Connection as _;

const PRIMARY: &str = "127.0.0.1:55441";

/// The tests fail the one pair over: one at a time.
static PAIR: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const STANDBY: &str = "127.0.0.1:55442";

fn script(arg: &str) -> Result<String, String> {
    let out = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/pg-failover"
    ))
    .arg(arg)
    .output()
    .map_err(|e| format!("scripts/pg-failover could not run: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "scripts/pg-failover {arg} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn instants(from: &str, count: i64) -> Vec<DateTime<Utc>> {
    let base = at(from);
    (0..count)
        .map(|i| base + chrono::Duration::seconds(i))
        .collect()
}

/// The rows of schedule `name` at `instants`: their run keys must be
/// distinct and as many as the instants.
async fn assert_one_row_each(ledger: &Ledger, name: &str, instants: &[DateTime<Utc>]) {
    let keys: HashSet<String> = instants
        .iter()
        .map(|at| belfry_protocol::run_key(name, *at).expect("run key"))
        .collect();
    let rows: Vec<_> = ledger
        .list_runs(&belfry_ledger::RunFilter::default(), None, i64::MAX)
        .await
        .expect("runs")
        .into_iter()
        .filter(|r| r.job_name == name && keys.contains(&r.run_key))
        .collect();
    let distinct: HashSet<_> = rows.iter().map(|r| r.run_key.clone()).collect();
    assert_eq!(
        (rows.len(), distinct.len()),
        (instants.len(), instants.len()),
        "one row per fire: {rows:?}"
    );
}

/// Points `env` at a database of its own on a healthy pair (created on the
/// primary, replicated to the standby), both hosts in its URL; `false`
/// after recording a skip when the pair cannot be built.
async fn on_the_pair(env: &mut belfry_testkit::TestEnv) -> bool {
    if let Err(why) = script("up") {
        belfry_testkit::skip(&why);
        return false;
    }
    let database = format!("belfry_failover_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&format!("postgres://postgres@{PRIMARY}/postgres"))
        .await
        .expect("the primary answers");
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&mut admin)
        .await
        .expect("CREATE DATABASE");
    drop(admin);
    let url = format!("postgres://postgres@{PRIMARY},{STANDBY}/{database}");
    env.ledger = Ledger::connect(&url, 4).await.expect("the ledger connects");
    env.ledger.migrate().await.expect("migrations");
    env.database_url = url;
    true
}

fn postgres_node(replica: &belfry_scheduler::Replica) -> String {
    replica
        .service_nodes()
        .current()
        .into_iter()
        .find(|(service, _)| *service == "postgres")
        .map(|(_, node)| node)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ledger_follows_a_promoted_standby_and_no_fire_is_lost_or_claimed_twice() {
    let mut env = belfry_testkit::service_env!("noop");
    let _pair = PAIR.lock().await;
    if !on_the_pair(&mut env).await {
        return;
    }
    let name = "failover";
    let schedule = every(name, "1s", "noop");
    let replicas = race::replicas(&env, name, 2, None).await;
    assert!(
        postgres_node(&replicas[0]).starts_with(PRIMARY),
        "{}",
        postgres_node(&replicas[0])
    );

    // Before: the database alone decides each race (no Redis lock here).
    let before = instants("2026-07-26T03:00:00Z", 5);
    let outcomes = race::fire_all(&replicas, &schedule, &before).await;
    race::assert_one_run_each(&env, name, &before, &outcomes).await;

    // The failover.
    script("fail").unwrap_or_else(|e| panic!("{e}"));
    let failed_at = Instant::now();

    // Claims resume on the promoted standby, found by the ledger itself.
    let after = instants("2026-07-26T04:00:00Z", 5);
    let first = after[0];
    eventually(
        "a claim on the new primary",
        Duration::from_secs(30),
        || {
            let replicas = &replicas;
            let schedule = &schedule;
            async move {
                let outcomes = race::fire_all(replicas, schedule, &[first]).await;
                outcomes
                    .iter()
                    .any(|o| matches!(o, FireOutcome::Dispatched { .. }))
                    .then_some(())
            }
        },
    )
    .await;
    let resumed_after = failed_at.elapsed();
    eprintln!("claims resumed {resumed_after:?} after the primary stopped");
    let outcomes = race::fire_all(&replicas, &schedule, &after[1..]).await;
    race::assert_one_run_each(&env, name, &after[1..], &outcomes).await;
    assert_one_row_each(&env.ledger, name, &after).await;

    // Every claim made before the failover survived it: racing those fires
    // again wins nothing.
    let again = race::fire_all(&replicas, &schedule, &before).await;
    assert!(
        again.iter().all(|o| matches!(o, FireOutcome::Lost)),
        "{again:?}"
    );
    assert_one_row_each(&env.ledger, name, &before).await;
    for r in &replicas {
        assert!(
            postgres_node(r).starts_with(STANDBY),
            "{}",
            postgres_node(r)
        );
    }
    env.teardown(&["default"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_scheduler_and_a_worker_process_run_through_a_postgres_failover() {
    let mut env = belfry_testkit::service_env!("noop");
    let _pair = PAIR.lock().await;
    if !on_the_pair(&mut env).await {
        return;
    }
    let fleet = ProcessFleet::start(
        &env,
        "pg-fleet",
        5,
        &[
            Process {
                bin: "belfry-scheduler",
                instance: "pf-s1",
            },
            Process {
                bin: "belfry-worker",
                instance: "pf-w1",
            },
        ],
        // Claims whose publish failed during the failover are republished
        // this long after their claim.
        &[("BELFRY_RECONCILE_AFTER", "3s".into())],
    )
    .await;
    let window_start = Utc::now() + chrono::Duration::seconds(1);
    let node = eventually(
        "/readyz to name the primary",
        Duration::from_secs(10),
        || fleet.readyz_node("pf-s1", "postgres"),
    )
    .await;
    assert!(node.starts_with(PRIMARY), "{node}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    script("fail").unwrap_or_else(|e| panic!("{e}"));
    eventually(
        "/readyz to name the promoted standby",
        Duration::from_secs(15),
        || async {
            let node = fleet.readyz_node("pf-s1", "postgres").await?;
            node.starts_with(STANDBY).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let window_end = Utc::now() - chrono::Duration::seconds(1);
    let table = fleet.finish(&env, window_start, window_end).await;
    assert!(table.holds(), "{table}");
    env.teardown(&["default"]).await;
}
