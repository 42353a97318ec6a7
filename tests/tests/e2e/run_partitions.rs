//! The time-partitioned ledger (issue 21): `key_instant` is a function of
//! the run key, so the unique key is still "one row per run key" across
//! partitions; day partitions are created ahead and take their runs out of
//! the default partition; retention drops whole days but never one with an
//! unfinished run, and keeps each schedule's newest fire for misfire
//! recovery; an existing unpartitioned `job_runs` is converted in place.

use std::borrow::Cow;
use std::time::Duration;

use belfry_ledger::{days_ahead, Ledger, NewRun};
use belfry_scheduler::retention::Retention;
use belfry_testkit::TestEnv;
use chrono::{DateTime, Days, TimeZone, Utc};
use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn pool(env: &TestEnv) -> &PgPool {
    env.ledger.pg_pool().expect("a Postgres ledger")
}

fn run(name: &str, key: &str, at: DateTime<Utc>) -> NewRun {
    NewRun {
        id: Uuid::now_v7(),
        job_name: name.into(),
        run_key: key.into(),
        job_type: "noop".into(),
        payload: serde_json::Value::Null,
        scheduled_at: at,
        claimed_by: "sched-a".into(),
        trace_id: None,
        traceparent: None,
        options: Default::default(),
        next_dispatch_at: at,
    }
}

/// The partition holding run key `key` of `name`.
async fn partition_of(pool: &PgPool, name: &str, key: &str) -> String {
    sqlx::query_scalar(
        "SELECT tableoid::regclass::text FROM job_runs WHERE job_name = $1 AND run_key = $2",
    )
    .bind(name)
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The names of `job_runs`' partitions, oldest first.
async fn partition_names(ledger: &Ledger) -> Vec<String> {
    ledger
        .run_partitions()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Fails the run with key `key` by hand; the `run.failed` alert events
/// then stored (one per failed run unless a trigger fires twice).
async fn fail_and_count_alerts(pool: &PgPool, key: &str) -> i64 {
    sqlx::query(
        "UPDATE job_runs SET status = 'failed', attempts = 1, finished_at = now(), last_error = 'boom' \
         WHERE run_key = $1",
    )
    .bind(key)
    .execute(pool)
    .await
    .unwrap();
    count(
        pool,
        "SELECT count(*) FROM alert_events WHERE kind = 'run.failed'",
    )
    .await
}

fn day(at: DateTime<Utc>) -> String {
    format!("job_runs_p{}", at.format("%Y%m%d"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_instant_is_a_function_of_the_key_and_keeps_keys_unique() {
    let env = belfry_testkit::service_env!();
    let pool = pool(&env);
    for (key, instant) in [
        ("a@2026-02-28T23:59:59Z", "2026-02-28T23:59:59Z"),
        ("a@2024-02-29T00:00:00Z", "2024-02-29T00:00:00Z"),
        // Not days, not run-key instants, other names: the keyed sentinel.
        ("a@2026-02-29T00:00:00Z", "1970-01-01T00:00:00Z"),
        ("a@2026-12-31T23:59:60Z", "1970-01-01T00:00:00Z"),
        ("a@2026-01-01T00:00:00+00:00", "1970-01-01T00:00:00Z"),
        ("b@2026-01-01T00:00:00Z", "1970-01-01T00:00:00Z"),
        ("a@invoice-2026-07", "1970-01-01T00:00:00Z"),
        // A UUIDv7 names its millisecond clock (to the second); v4 does not.
        (
            "a@019ae4a0-1234-7abc-8def-0123456789ab",
            "2025-12-03T14:31:27Z",
        ),
        (
            "a@019AE4A0-1234-7ABC-8DEF-0123456789AB",
            "1970-01-01T00:00:00Z",
        ),
        (
            "a@6f1c2d3e-1234-4abc-8def-0123456789ab",
            "1970-01-01T00:00:00Z",
        ),
    ] {
        let got: DateTime<Utc> = sqlx::query_scalar("SELECT belfry_key_instant('a', $1)")
            .bind(key)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(
            got.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            instant,
            "{key}"
        );
    }
    // A fresh ledger: the keyed partition, today and three days ahead
    // (made by the migration), the default.
    let now = Utc::now();
    let names = partition_names(&env.ledger).await;
    let mut expected = vec!["job_runs_keyed".to_owned()];
    for d in days_ahead(now.date_naive(), 3) {
        expected.push(format!("job_runs_p{}", d.format("%Y%m%d")));
    }
    expected.push("job_runs_default".to_owned());
    assert_eq!(names, expected);
    // Another replica's pass finds them all.
    assert!(env
        .ledger
        .prepare_run_partitions(&days_ahead(now.date_naive(), 3))
        .await
        .unwrap()
        .is_empty());
    // Every kind of key: the second claim of the same key loses, wherever
    // the key's partition is (day, keyed, default).
    let at = Utc.timestamp_opt(now.timestamp(), 0).unwrap();
    let far = Utc.with_ymd_and_hms(2999, 1, 1, 0, 0, 0).unwrap();
    let v7 = Uuid::now_v7().to_string();
    for (key, partition) in [
        (belfry_protocol::run_key("a", at).unwrap(), day(at)),
        (format!("a@{v7}"), day(now)),
        ("a@invoice-7".to_owned(), "job_runs_keyed".to_owned()),
        (
            belfry_protocol::run_key("a", far).unwrap(),
            "job_runs_default".to_owned(),
        ),
    ] {
        assert!(
            env.ledger.claim(&run("a", &key, at)).await.unwrap(),
            "{key}"
        );
        // Another id, another scheduled_at: still the same run key.
        let again = run("a", &key, at + chrono::Duration::hours(1));
        assert!(
            !env.ledger.claim(&again).await.unwrap(),
            "{key} claimed twice"
        );
        assert_eq!(partition_of(pool, "a", &key).await, partition, "{key}");
        assert!(env.ledger.run_by_key("a", &key).await.unwrap().is_some());
    }
    let rows = count(pool, "SELECT count(*) FROM job_runs").await;
    assert_eq!(rows, 4);
    env.teardown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_day_takes_its_runs_out_of_the_default_partition() {
    let env = belfry_testkit::service_env!();
    let pool = pool(&env);
    let today = Utc::now().date_naive();
    let later = today.checked_add_days(Days::new(10)).unwrap();
    let at = later.and_hms_opt(12, 0, 0).unwrap().and_utc();
    let key = belfry_protocol::run_key("x", at).unwrap();
    // No partition for that day yet: the claim lands in the default.
    assert!(env.ledger.claim(&run("x", &key, at)).await.unwrap());
    assert_eq!(partition_of(pool, "x", &key).await, "job_runs_default");
    let created = env.ledger.prepare_run_partitions(&[later]).await.unwrap();
    assert_eq!(created, [day(at)]);
    assert_eq!(partition_of(pool, "x", &key).await, day(at));
    // Moved, not copied, and still unique in its new home.
    assert!(!env.ledger.claim(&run("x", &key, at)).await.unwrap());
    let in_default = count(pool, "SELECT count(*) FROM job_runs_default").await;
    assert_eq!(in_default, 0);
    // A second pass (another replica) finds the day and creates nothing.
    assert!(env
        .ledger
        .prepare_run_partitions(&[later])
        .await
        .unwrap()
        .is_empty());
    // The alert triggers are on the moved day too: a failed run there makes
    // one event, not two.
    assert_eq!(fail_and_count_alerts(pool, &key).await, 1);
    env.teardown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_drops_finished_days_whole_and_keeps_what_matters() {
    let env = belfry_testkit::service_env!();
    let pool = pool(&env);
    let now = Utc::now();
    let ago = |days: u64| {
        now.date_naive()
            .checked_sub_days(Days::new(days))
            .unwrap()
            .and_hms_opt(6, 0, 0)
            .unwrap()
            .and_utc()
    };
    let days: Vec<_> = [40, 39, 38, 20]
        .iter()
        .map(|d| ago(*d).date_naive())
        .collect();
    env.ledger.prepare_run_partitions(&days).await.unwrap();
    // Day -40: finished long ago (1,000 fires of "done", the newest at
    // 06:16:39, and a fire of "monthly", its only one). Day -39: one run
    // still retrying and a finished ad-hoc run. Day -38: a run that
    // finished an hour ago. Day -20: inside retention.
    let insert = |name: &'static str,
                  at: DateTime<Utc>,
                  status: &'static str,
                  finished: Option<DateTime<Utc>>| {
        let key = belfry_protocol::run_key(name, at).unwrap();
        async move {
            sqlx::query(
                "INSERT INTO job_runs (id, job_name, run_key, job_type, status, scheduled_at, claimed_by, \
                     finished_at, key_instant) \
                 VALUES ($1, $2, $3, 'noop', $4, $5, \
                         CASE WHEN $2 = 'adhoc' THEN 'client:app' ELSE 'sched-a' END, \
                         $6, belfry_key_instant($2, $3))",
            )
            .bind(Uuid::now_v7())
            .bind(name)
            .bind(&key)
            .bind(status)
            .bind(at)
            .bind(finished)
            .execute(pool)
            .await
            .unwrap();
        }
    };
    for i in 0..1000 {
        let at = ago(40) + chrono::Duration::seconds(i);
        insert("done", at, "succeeded", Some(at)).await;
    }
    insert("monthly", ago(40), "succeeded", Some(ago(40))).await;
    insert("stuck", ago(39), "retrying", None).await;
    insert(
        "adhoc",
        ago(39) + chrono::Duration::seconds(1),
        "succeeded",
        Some(ago(39)),
    )
    .await;
    insert(
        "late",
        ago(38),
        "succeeded",
        Some(now - chrono::Duration::hours(1)),
    )
    .await;
    insert("recent", ago(20), "succeeded", Some(ago(20))).await;

    let retention = Retention::new(env.ledger.clone(), Duration::from_secs(30 * 24 * 3600));
    let pruned = retention
        .prune_once(now, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(pruned.partitions, 1, "{pruned:?}");
    let names = partition_names(&env.ledger).await;
    assert!(!names.contains(&day(ago(40))), "{names:?}");
    for kept in [ago(39), ago(38), ago(20)] {
        assert!(names.contains(&day(kept)), "{names:?}");
    }
    let left: Vec<String> = sqlx::query_scalar("SELECT job_name FROM job_runs ORDER BY job_name")
        .fetch_all(pool)
        .await
        .unwrap();
    // The kept day -39's finished ad-hoc run went row by row (a fire
    // would stay as its schedule's newest, as row-by-row retention always
    // kept); its retrying run and the late and recent ones stay.
    assert_eq!(left, ["late", "recent", "stuck"]);
    // Misfire recovery still sees the dropped schedules' newest fires.
    let last = env
        .ledger
        .last_fires(&["done".into(), "monthly".into(), "recent".into()])
        .await
        .unwrap();
    assert_eq!(last["done"], ago(40) + chrono::Duration::seconds(999));
    assert_eq!(last["monthly"], ago(40));
    assert_eq!(last["recent"], ago(20));
    // A second pass: nothing more to drop while the blockers stay.
    let again = retention
        .prune_once(now, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((again.partitions, again.runs), (0, 0));
    env.teardown(&[]).await;
}

/// Applies the migrations before the partitioning one to a new database,
/// fills an old-style `job_runs`, then migrates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_unpartitioned_table_is_converted_in_place() {
    if !belfry_testkit::services_available().await {
        return;
    }
    let admin = belfry_testkit::admin_database_url();
    let database = format!("belfry_mig_{}", Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {database}"))
        .execute(&mut conn)
        .await
        .unwrap();
    let url = belfry_testkit::with_database(&admin, &database);
    let pool = PgPool::connect(&url).await.unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let mut before = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    let n = before
        .migrations
        .iter()
        .position(|m| m.description.contains("partitioned runs"))
        .expect("the partitioning migration");
    before.migrations = Cow::Owned(before.migrations[..n].to_vec());
    before.run(&pool).await.unwrap();

    let now = Utc.timestamp_opt(Utc::now().timestamp(), 0).unwrap();
    let v7 = Uuid::now_v7();
    let keys = [
        belfry_protocol::run_key("old", now - chrono::Duration::days(2)).unwrap(),
        belfry_protocol::run_key("old", now).unwrap(),
        format!("old@{v7}"),
        "old@invoice-1".to_owned(),
        belfry_protocol::run_key("old", Utc.with_ymd_and_hms(2999, 1, 1, 0, 0, 0).unwrap())
            .unwrap(),
    ];
    for key in &keys {
        sqlx::query(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, scheduled_at, claimed_by) \
             VALUES ($1, 'old', $2, 'noop', 'claimed', $3, 'sched-a')",
        )
        .bind(Uuid::now_v7())
        .bind(key)
        .bind(now)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    let ledger = Ledger::connect(&url, 4).await.unwrap();
    ledger.migrate().await.unwrap();
    let pool = ledger.pg_pool().unwrap();
    let kind: String =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = 'job_runs'::regclass")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(kind, "p", "job_runs is partitioned");
    // Every old row kept, with its key instant; the far-future one in the
    // default partition, the rest in the keyed partition (old history).
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT run_key, tableoid::regclass::text FROM job_runs ORDER BY run_key")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), keys.len());
    for (key, partition) in &rows {
        let expect = if key.starts_with("old@2999") {
            "job_runs_default"
        } else {
            "job_runs_keyed"
        };
        assert_eq!(partition, expect, "{key}");
    }
    // Old keys stay unique against new claims of the same key.
    for key in &keys {
        assert!(
            !ledger.claim(&run("old", key, now)).await.unwrap(),
            "{key} claimed again"
        );
    }
    // The migration created the days after the old history; the day of
    // the upgrade is covered by the keyed partition and skipped.
    let names: Vec<String> = partition_names(&ledger).await;
    let days = days_ahead(now.date_naive(), 3);
    let mut expected = vec!["job_runs_keyed".to_owned()];
    for d in &days[1..] {
        expected.push(format!("job_runs_p{}", d.format("%Y%m%d")));
    }
    expected.push("job_runs_default".to_owned());
    assert_eq!(names, expected);
    // One trigger of each kind: a run failing in the old partition makes
    // one alert event.
    assert_eq!(fail_and_count_alerts(pool, &keys[2]).await, 1);
    ledger.close().await;
    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
        .execute(&mut conn)
        .await;
}

/// Claims racing the creation of their day: a claim routed to the default
/// partition just before the day is attached must not fail ("violates
/// partition constraint") — found by the browser test, whose replica
/// created today's partition while the test claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_racing_the_creation_of_their_day_never_fail() {
    let env = belfry_testkit::service_env!();
    let base = Utc::now()
        .date_naive()
        .checked_add_days(Days::new(30))
        .unwrap();
    for d in 0..8u64 {
        let day = base.checked_add_days(Days::new(d)).unwrap();
        let midnight = day.and_hms_opt(0, 0, 0).unwrap().and_utc();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut claimers = Vec::new();
        for t in 0..3i64 {
            let ledger = env.ledger.clone();
            let stop = stop.clone();
            claimers.push(tokio::spawn(async move {
                let mut i = 0i64;
                let mut failures = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let at = midnight + chrono::Duration::seconds(i * 3 + t);
                    let key = belfry_protocol::run_key("race", at).unwrap();
                    if let Err(e) = ledger.claim(&run("race", &key, at)).await {
                        failures.push(e.to_string());
                    }
                    i += 1;
                }
                failures
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        env.ledger.prepare_run_partitions(&[day]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for c in claimers {
            let failures = c.await.unwrap();
            assert!(failures.is_empty(), "day {day}: {failures:?}");
        }
    }
    let in_default = count(pool(&env), "SELECT count(*) FROM job_runs_default").await;
    assert_eq!(in_default, 0);
    env.teardown(&[]).await;
}

/// Ids are unique per partition only in the primary key (it must hold the
/// partition key): a hand-published message whose id another run (another
/// key, another day) holds is still refused as an id conflict, not
/// recorded as a second run with that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_reusing_another_runs_id_on_another_day_is_refused() {
    let env = belfry_testkit::service_env!();
    let now = Utc.timestamp_opt(Utc::now().timestamp(), 0).unwrap();
    let first = run("h", &belfry_protocol::run_key("h", now).unwrap(), now);
    assert!(env.ledger.claim(&first).await.unwrap());
    // The same id, a key two days ahead (another partition).
    let later = now + chrono::Duration::days(2);
    let mut message = run("h", &belfry_protocol::run_key("h", later).unwrap(), later).to_message();
    message.message_id = first.id;
    let e = env
        .ledger
        .begin_attempt(&message, "w-1", Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        matches!(e, belfry_ledger::LedgerError::IdConflict { .. }),
        "{e}"
    );
    let with_id = count(
        pool(&env),
        &format!("SELECT count(*) FROM job_runs WHERE id = '{}'", first.id),
    )
    .await;
    assert_eq!(with_id, 1);
    // And the key instant is the key's, whoever writes the row.
    let e = sqlx::query(
        "INSERT INTO job_runs (id, job_name, run_key, job_type, status, scheduled_at, key_instant) \
         VALUES (gen_random_uuid(), 'h', 'h@x', 'noop', 'claimed', now(), now())",
    )
    .execute(pool(&env))
    .await
    .unwrap_err();
    assert!(e.to_string().contains("job_runs_key_instant_check"), "{e}");
    env.teardown(&[]).await;
}

/// Statements that name their partitions as values compute `key_instant`
/// in Rust (`belfry_protocol::key_instant`); it must agree with the
/// database's `belfry_key_instant` on every kind of key, or those
/// statements would look in the wrong partition (a start would fall back
/// to the slow path every time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_key_instant_agrees_with_the_database() {
    let env = belfry_testkit::service_env!("noop");
    if env.is_embedded() {
        return;
    }
    let mut keys: Vec<(String, String)> = Vec::new();
    let names = ["n", "report.daily", "a-b_c", "ünï", "x@y", "(re)+gex"];
    for name in names {
        for year in [1000, 1969, 1970, 2000, 2024, 2025, 2100, 9999] {
            for (month, day) in [
                (1, 1),
                (2, 28),
                (2, 29),
                (2, 30),
                (4, 31),
                (12, 31),
                (13, 1),
                (0, 1),
            ] {
                for time in ["00:00:00", "23:59:59", "24:00:00", "12:60:00", "12:00:60"] {
                    keys.push((
                        name.into(),
                        format!("{name}@{year:04}-{month:02}-{day:02}T{time}Z"),
                    ));
                }
            }
        }
        for k in [
            "0999-12-31T23:59:59Z",
            "2026-07-26T03:00:00",
            "2026-07-26T03:00:00z",
            "2026-07-26 03:00:00Z",
            "2026-07-26T03:00:00.5Z",
            "2026-7-26T03:00:00Z",
            "２026-07-26T03:00:00Z",
            "invoice-42",
            "",
            "01938f2a-1c3e-7abc-8def-0123456789ab",
            "01938F2A-1C3E-7ABC-8DEF-0123456789AB",
            "01938f2a-1c3e-4abc-8def-0123456789ab",
            "01938f2a-1c3e-7abc-cdef-0123456789ab",
            "01938f2a1c3e7abc8def0123456789ab",
            "ffffffff-ffff-7fff-bfff-ffffffffffff",
            "00000000-0000-7000-8000-000000000000",
        ] {
            keys.push((name.into(), format!("{name}@{k}")));
            keys.push((name.into(), format!("other@{k}")));
            keys.push((name.into(), format!("{name}{k}")));
        }
        for _ in 0..50 {
            keys.push((name.into(), format!("{name}@{}", Uuid::now_v7())));
        }
    }
    let (names, run_keys): (Vec<String>, Vec<String>) = keys.iter().cloned().unzip();
    let in_db: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "SELECT belfry_key_instant(n, k) FROM unnest($1::text[], $2::text[]) \
         WITH ORDINALITY AS t(n, k, i) ORDER BY i",
    )
    .bind(&names)
    .bind(&run_keys)
    .fetch_all(pool(&env))
    .await
    .unwrap();
    assert_eq!(in_db.len(), keys.len());
    let mut named = 0;
    for ((name, key), db) in keys.iter().zip(&in_db) {
        assert_eq!(
            belfry_protocol::key_instant(name, key),
            *db,
            "key_instant({name:?}, {key:?})"
        );
        named += usize::from(db.timestamp() != 0);
    }
    assert!(named > 500, "the corpus names instants too ({named})");
    env.teardown(&[]).await;
}

/// A worker's end and heartbeat name the run's partition when the same
/// ledger handle started it, and search every partition when it did not
/// (another handle, or hints forgotten): both forms find the run, and a
/// stale attempt is refused by either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_end_and_renew_with_and_without_partition_hints() {
    let env = belfry_testkit::service_env!("noop");
    if env.is_embedded() {
        return;
    }
    let other = Ledger::connect(&env.database_url, 2).await.unwrap();
    let lease = Duration::from_secs(60);
    let yesterday = Utc::now() - chrono::Duration::days(1);
    for (i, ender) in [&env.ledger, &other].into_iter().enumerate() {
        // Yesterday's run: not in the partition of today's.
        let at = yesterday + chrono::Duration::seconds(i64::try_from(i).unwrap());
        let message = env
            .enqueue("hinted", "noop", serde_json::json!({}), at)
            .await;
        let (id, attempt) = env.start_attempt(&message, "w", lease).await;
        let renewed = ender
            .renew_leases(&[(id, attempt), (id, attempt + 1)], lease)
            .await
            .unwrap();
        assert!(
            renewed.renewed.contains(&(id, attempt)),
            "handle {i}: renewed"
        );
        assert!(
            !renewed.renewed.contains(&(id, attempt + 1)),
            "handle {i}: a stale attempt is not"
        );
        let ok = belfry_ledger::RunStatus::Succeeded;
        let stale = belfry_testkit::attempt_entry(attempt + 1, "w", ok);
        assert!(
            !ender.end_attempt(id, ok, &stale, None, None).await.unwrap(),
            "handle {i}: a stale attempt's outcome is refused"
        );
        // The refusal kept the hint of the attempt that holds the run.
        let entry = belfry_testkit::attempt_entry(attempt, "w", ok);
        assert!(
            ender.end_attempt(id, ok, &entry, None, None).await.unwrap(),
            "handle {i}: the outcome is written"
        );
        let run = env.ledger.run(id).await.unwrap().unwrap();
        assert_eq!(run.status().unwrap(), ok);
    }
    env.teardown(&[]).await;
}

/// A worker's batched writes name the day partition's own table when
/// every run of a statement lies in it (`partition_map`). Retention can drop
/// that table after the worker read the list of partitions, and a late run
/// of that day then lives in the default partition: the batched start, the
/// heartbeat and the end (each probed once, on a day of its own) find the
/// table gone and write through the parent instead, with the same result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_writes_survive_the_drop_of_the_day_table_they_named() {
    use belfry_ledger::{AttemptBatcher, BeginRequest, RunStatus};
    let env = belfry_testkit::service_env!("noop");
    if env.is_embedded() {
        return;
    }
    // Another handle, which starts runs when the worker's must not (so the
    // worker's map is not read again before the write under test).
    let other = AttemptBatcher::new(env.ledger.clone());
    let lease = Duration::from_secs(60);
    let ok = RunStatus::Succeeded;
    let name = "daytable";
    let begin = |key: &str| BeginRequest {
        job_name: name.into(),
        run_key: key.into(),
        worker: "w".into(),
        lease,
    };
    for (probe, ago) in ["begin", "renew", "end"].into_iter().zip(10u64..) {
        let date = Utc::now().date_naive() - Days::new(ago);
        let at = |h| date.and_hms_opt(h, 0, 0).unwrap().and_utc();
        env.ledger.prepare_run_partitions(&[date]).await.unwrap();
        // The worker's handle, new for each probe: it reads the list of
        // partitions (now with this day) at its first write, and keeps it.
        let worker = Ledger::connect(&env.database_url, 2).await.unwrap();
        let batcher = AttemptBatcher::new(worker.clone());
        // A run of the day through the worker's handle: its start reads
        // the partitions, and its writes name the day's table.
        let first = belfry_protocol::run_key(name, at(1)).unwrap();
        worker
            .claim_many(&[run(name, &first, at(1))])
            .await
            .unwrap();
        let (id, attempt) = batcher
            .begin(begin(&first))
            .await
            .unwrap()
            .expect("started");
        let entry = belfry_testkit::attempt_entry(attempt, "w", ok);
        assert!(worker
            .end_attempt(id, ok, &entry, None, None)
            .await
            .unwrap());
        assert_eq!(partition_of(pool(&env), name, &first).await, day(at(1)));
        // Retention drops the day (its only run finished before the
        // cutoff); a late run of that day lands in the default partition.
        let dropped = env
            .ledger
            .drop_expired_run_partitions(Utc::now() + chrono::Duration::seconds(1))
            .await
            .unwrap();
        assert!(
            dropped.dropped.contains(&day(at(1))),
            "{probe}: {dropped:?}"
        );
        let late = belfry_protocol::run_key(name, at(2)).unwrap();
        // Claimed through the worker's handle, which so knows its
        // partition key (as a worker sharing a process with a replica).
        worker.claim_many(&[run(name, &late, at(2))]).await.unwrap();
        assert_eq!(
            partition_of(pool(&env), name, &late).await,
            "job_runs_default"
        );
        let starter = if probe == "begin" { &batcher } else { &other };
        let (id, attempt) = starter
            .begin(begin(&late))
            .await
            .unwrap_or_else(|e| panic!("{probe}: {e}"))
            .unwrap_or_else(|| panic!("{probe}: the late run did not start"));
        if probe == "renew" {
            let renewed = worker
                .renew_leases(&[(id, attempt)], lease)
                .await
                .unwrap_or_else(|e| panic!("{probe}: {e}"));
            assert!(renewed.renewed.contains(&(id, attempt)), "{probe}");
        }
        let entry = belfry_testkit::attempt_entry(attempt, "w", ok);
        assert!(
            worker
                .end_attempt(id, ok, &entry, None, None)
                .await
                .unwrap_or_else(|e| panic!("{probe}: {e}")),
            "{probe}: the outcome is written"
        );
        let run = env.ledger.run(id).await.unwrap().unwrap();
        assert_eq!(run.status().unwrap(), ok, "{probe}");
    }
    env.teardown(&[]).await;
}

/// `idx_scan` of the index `index` as the statistics say (they reach the
/// view within about a second of a backend going idle).
async fn index_scans(pool: &PgPool, index: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes WHERE indexrelname = $1",
    )
    .bind(index)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The worker's batched start and end find their rows by run key and id,
/// never through the partial index of unfinished runs on `(status,
/// updated_at)`: that index keeps an entry for every version of every run
/// that was once waiting or running until a vacuum, so a plan through it
/// reads every run finished since (in the benchmark the end slowed from
/// 1.3 to 3.9 ms in 17 s). Postgres chooses that index once the statistics
/// say few runs are running, which is the state every busy ledger is in:
/// this test makes it so, then starts and ends runs one statement at a time
/// on one connection (so the statements' generic plans are made too) and
/// reads the index's scan count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_batched_start_and_end_never_scan_the_index_of_unfinished_runs() {
    use belfry_ledger::{AttemptBatcher, BeginRequest, EndRequest, RunStatus};
    let env = belfry_testkit::service_env!("noop");
    if env.is_embedded() {
        return;
    }
    let worker = Ledger::connect(&env.database_url, 1).await.unwrap();
    let batcher = AttemptBatcher::new(worker.clone());
    let ok = RunStatus::Succeeded;
    let name = "unindexed";
    let lease = Duration::from_secs(60);
    let today = Utc::now().date_naive();
    let at = |i: i64| today.and_hms_opt(0, 0, 0).unwrap().and_utc() + chrono::Duration::seconds(i);
    let key = |i: i64| belfry_protocol::run_key(name, at(i)).unwrap();
    let begin = |i: i64| BeginRequest {
        job_name: name.into(),
        run_key: key(i),
        worker: "w".into(),
        lease,
    };
    let end = |(id, attempt): (Uuid, i32)| EndRequest {
        id,
        status: ok,
        entry: belfry_testkit::attempt_entry(attempt, "w", ok),
        last_error: None,
        redispatch_at: None,
    };
    // 2,000 runs of today; all but the last 20 started and ended (in
    // batches), so the statistics see a few waiting runs among many done.
    let runs: Vec<NewRun> = (0..2000).map(|i| run(name, &key(i), at(i))).collect();
    worker.claim_many(&runs).await.unwrap();
    let started = futures::future::join_all((0..1980).map(|i| batcher.begin(begin(i)))).await;
    let started: Vec<(Uuid, i32)> = started.into_iter().map(|s| s.unwrap().unwrap()).collect();
    for e in futures::future::join_all(started.into_iter().map(|s| batcher.end(end(s)))).await {
        assert!(e.unwrap());
    }
    sqlx::query("ANALYZE job_runs")
        .execute(pool(&env))
        .await
        .unwrap();
    // The day partition's copies of the two indexes, found by definition.
    let index_on = |columns: &'static str| {
        let partition = day(at(0));
        let pool = pool(&env).clone();
        async move {
            let name: String = sqlx::query_scalar(
                "SELECT indexname::text FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE $2",
            )
            .bind(&partition)
            .bind(format!("%({columns})%"))
            .fetch_one(&pool)
            .await
            .unwrap_or_else(|e| panic!("no index on ({columns}) of {partition}: {e}"));
            name
        }
    };
    let status_index = index_on("status, updated_at").await;
    let pkey = index_on("id, key_instant").await;
    let before = (
        index_scans(pool(&env), &status_index).await,
        index_scans(pool(&env), &pkey).await,
    );
    // One at a time, on the handle's one connection: past five executions
    // Postgres may switch a statement to its generic plan.
    for i in 1980..2000 {
        let s = batcher.begin(begin(i)).await.unwrap().unwrap();
        assert!(batcher.end(end(s)).await.unwrap());
    }
    // The statistics of the worker's connection reach the view once it is
    // idle; its ends' probes of the primary key show they have.
    belfry_testkit::eventually(
        "the statistics to show the ends' primary key probes",
        Duration::from_secs(30),
        || async { (index_scans(pool(&env), &pkey).await >= before.1 + 20).then_some(()) },
    )
    .await;
    assert_eq!(
        index_scans(pool(&env), &status_index).await,
        before.0,
        "a start or an end scanned {status_index}"
    );
    env.teardown(&[]).await;
}
