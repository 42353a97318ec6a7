//! Postgres behind a transaction pooler (issue 18): a real PgBouncer 1.18
//! (Debian 12's) in `pool_mode = transaction` with 4 server connections per
//! database shared by every client, started by `scripts/pgbouncer up`
//! (which `scripts/test` runs). Three scheduler replicas and a worker, as
//! real processes, reach the ledger only through it (`DATABASE_URL`), with
//! `BELFRY_DATABASE_DIRECT_URL` for `LISTEN` and the migrations; the
//! guarantees hold as they do on a direct connection: each fire once,
//! nothing lost, a live schedule change followed at once (the resync is an
//! hour away, so only `LISTEN` can bring it), and overlap = forbid keeps
//! runs of one schedule apart.

use std::time::Duration;

use belfry_protocol::ScheduleSpec;
use belfry_scheduler::Schedule;
use belfry_testkit::{eventually, service_command, temp_schedule_file, terminate, TestEnv};
use belfry_tests::fault::fleet::bin_dir;
use belfry_tests::fire_window;
use chrono::{DateTime, Utc};

/// Where `scripts/pgbouncer` listens.
const POOLER: &str = "127.0.0.1:56432";

/// Whether the pooler answers; records a skip (a failure with
/// `BELFRY_REQUIRE_SERVICES=1`) when it does not.
async fn pooler_up() -> bool {
    if tokio::net::TcpStream::connect(POOLER).await.is_ok() {
        return true;
    }
    belfry_testkit::skip(&format!(
        "no PgBouncer answers on {POOLER}; start it with scripts/pgbouncer up"
    ));
    false
}

/// `url` (the test database on the machine's Postgres) through the pooler.
fn through_pooler(url: &str) -> String {
    let pooled = url
        .replacen("127.0.0.1:5432", POOLER, 1)
        .replacen("localhost:5432", POOLER, 1);
    assert_ne!(pooled, url, "the test database URL names 127.0.0.1:5432");
    pooled
}

/// A line of PgBouncer's admin console (`SHOW CLIENTS`, `SHOW SERVERS`):
/// how many of its connections are for `database`.
fn pooler_connections(what: &str, database: &str) -> usize {
    let out = std::process::Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            "56432",
            "-U",
            "postgres",
            "-d",
            "pgbouncer",
        ])
        .args(["-At", "-F", "|", "-c", &format!("SHOW {what}")])
        .output()
        .unwrap_or_else(|e| panic!("psql: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Columns: type|user|database|...
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.split('|').nth(2) == Some(database))
        .count()
}

fn schedule_file(schedules: usize) -> String {
    let mut text = String::new();
    for i in 0..schedules {
        text.push_str(&format!(
            "[[schedule]]\nname = \"pooled-{i:02}\"\nevery = \"1s\"\njob_type = \"noop\"\n\n"
        ));
    }
    // Runs 2.5 s, due every second: forbid must keep runs apart.
    text.push_str(
        "[[schedule]]\nname = \"pooled-slow\"\nevery = \"1s\"\njob_type = \"sleep\"\n\
         overlap = \"forbid\"\npayload = { duration_ms = 2500 }\n",
    );
    text
}

/// `(job_name, scheduled_at, status, started_at, finished_at)` of every row.
type Row = (
    String,
    DateTime<Utc>,
    String,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

async fn rows(env: &TestEnv) -> Vec<Row> {
    sqlx::query_as(
        "SELECT job_name, scheduled_at, status, started_at, finished_at FROM job_runs \
         ORDER BY job_name, scheduled_at",
    )
    .fetch_all(env.ledger.pg_pool().expect("a Postgres ledger"))
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_and_a_worker_behind_pgbouncer_fire_once_follow_changes_and_forbid_overlap() {
    let env = belfry_testkit::service_env!("noop", "sleep");
    if !pooler_up().await {
        return;
    }
    let schedules = 12;
    let file = temp_schedule_file(&schedule_file(schedules));
    let pooled = through_pooler(&env.database_url);
    let spawn = |bin: &str, instance: &str| {
        service_command(&bin_dir().join(bin).display().to_string(), &env, instance)
            .env("DATABASE_URL", &pooled)
            .env("BELFRY_DATABASE_DIRECT_URL", &env.database_url)
            .env("BELFRY_SCHEDULES", &file)
            // Only LISTEN can bring a change within the test.
            .env("BELFRY_SCHEDULE_RESYNC", "1h")
            .env("BELFRY_CONCURRENCY", "32")
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap_or_else(|e| panic!("{bin}: {e}"))
    };
    let mut processes = belfry_testkit::Reaper(vec![
        spawn("belfry-scheduler", "pooled-s1"),
        spawn("belfry-scheduler", "pooled-s2"),
        spawn("belfry-scheduler", "pooled-s3"),
        spawn("belfry-worker", "pooled-w1"),
    ]);
    // Every process is connected and firing.
    eventually(
        "the first fires through the pooler",
        Duration::from_secs(30),
        || async {
            let rows = rows(&env).await;
            (rows.iter().filter(|r| r.2 == "succeeded").count() >= schedules).then_some(())
        },
    )
    .await;
    let window_start = Utc::now() + chrono::Duration::seconds(1);
    let clients = pooler_connections("CLIENTS", &env.database);
    // A schedule created meanwhile (as the API does: a row, whose trigger
    // notifies): every replica must follow it at once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let created = Utc::now();
    let added = ScheduleSpec {
        name: "pooled-added".into(),
        every: Some("1s".into()),
        job_type: "noop".into(),
        ..Default::default()
    };
    env.ledger
        .upsert_schedule(&Schedule::row_for(&added).unwrap())
        .await
        .unwrap();
    let first_added: DateTime<Utc> = eventually(
        "the added schedule's first fire",
        Duration::from_secs(10),
        || async {
            rows(&env)
                .await
                .into_iter()
                .find(|r| r.0 == "pooled-added")
                .map(|r| r.1)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let window_end = Utc::now() - chrono::Duration::seconds(1);
    // An application's dispatch client through the pooler too: 20 ad-hoc
    // jobs at once, run by the worker.
    let client = belfry_dispatch::Client::connect_routed(
        &pooled,
        Some(&env.database_url),
        &belfry_testkit::amqp_url(),
        &env.namespace,
        "pooled-client",
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let enqueued = futures::future::join_all((0..20).map(|i| {
        client.enqueue(belfry_dispatch::AdHocJob::new(
            "noop",
            serde_json::json!({ "i": i }),
        ))
    }))
    .await;
    assert!(enqueued.iter().all(Result::is_ok), "{enqueued:?}");
    let servers = pooler_connections("SERVERS", &env.database);
    for p in processes.0.drain(..3) {
        assert!(
            terminate(p).await.success(),
            "a replica did not stop cleanly"
        );
    }
    fire_window::wait_every_run_ended(&env, Duration::from_secs(30)).await;
    for p in processes.0.drain(..) {
        assert!(
            terminate(p).await.success(),
            "the worker did not stop cleanly"
        );
    }
    let rows = rows(&env).await;
    // The pooler multiplexed: more clients than its 4 server connections.
    assert!(
        clients > 4 && servers <= 4,
        "{clients} clients, {servers} servers"
    );
    let names: Vec<String> = (0..schedules).map(|i| format!("pooled-{i:02}")).collect();
    fire_window::assert_no_fire_lost(&env, &names, window_start, window_end).await;
    let failed: Vec<&Row> = rows.iter().filter(|r| r.2 != "succeeded").collect();
    assert!(failed.is_empty(), "runs not succeeded: {failed:?}");
    // Followed at once: the first fire of the added schedule came within
    // 3 s of its creation.
    assert!(
        first_added - created < chrono::Duration::seconds(3),
        "created {created}, first fire {first_added}: the change came by resync, not LISTEN"
    );
    // Forbid: each slow run started after the one before it finished, and
    // fires due meanwhile were skipped, not queued.
    let slow: Vec<&Row> = rows.iter().filter(|r| r.0 == "pooled-slow").collect();
    assert!(slow.len() >= 3, "{} slow runs", slow.len());
    for pair in slow.windows(2) {
        let (Some(finished), Some(next_started)) = (pair[0].4, pair[1].3) else {
            panic!("a slow run without its times: {pair:?}");
        };
        assert!(next_started >= finished, "slow runs overlapped: {pair:?}");
    }
    let _ = std::fs::remove_file(file);
}

/// A worker behind the pooler (with `BELFRY_DATABASE_DIRECT_URL`, as it
/// must be configured there) running a 60 s `sleep`, which an operator
/// cancels: the cancel reaches it through `LISTEN` on the direct URL at
/// once, though its heartbeat (with a 60 s lease) is 15 s away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_reach_a_worker_behind_pgbouncer() {
    if !pooler_up().await {
        return;
    }
    let env = belfry_testkit::service_env!("sleep");
    let pooled = through_pooler(&env.database_url);
    let settings = [
        ("DATABASE_URL", pooled.as_str()),
        ("BELFRY_DATABASE_DIRECT_URL", env.database_url.as_str()),
        ("BELFRY_LEASE", "60s"),
    ];
    let registry = belfry_worker::Registry::builder()
        .job(belfry_worker::builtin::Sleep)
        .build()
        .unwrap();
    let running = belfry_tests::RunningWorker::spawn(
        belfry_tests::worker(&env, "pooled-w", "default", registry, &settings).await,
    );
    let m = env
        .enqueue(
            "nap",
            "sleep",
            serde_json::json!({"duration_ms": 60_000}),
            Utc::now(),
        )
        .await;
    belfry_testkit::wait_running(&env, &m, Duration::from_secs(15)).await;
    let asked = std::time::Instant::now();
    let outcome = env
        .ledger
        .cancel_run(&belfry_ledger::CancelRequest {
            id: m.message_id,
            reason: "cancelled by test",
            immediate: false,
        })
        .await
        .unwrap();
    assert_eq!(outcome, belfry_ledger::CancelOutcome::Requested);
    let run = env.wait_terminal_of(&m, Duration::from_secs(30)).await;
    let took = asked.elapsed();
    assert_eq!(run.status_text, "cancelled");
    assert!(took < Duration::from_secs(3), "through LISTEN: {took:?}");
    running.stop().await;
}
