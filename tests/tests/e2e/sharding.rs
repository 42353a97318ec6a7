//! Sharing the fires (issue 21): replicas hold shard leases and each fires
//! only the schedules of its shards. Driven one step at a time: lease
//! passes, schedule loads and timer ticks at chosen instants; a lease's
//! expiry (the database's clock) is moved by SQL rather than waited for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use belfry_ledger::LedgerError;
use belfry_protocol::ScheduleSpec;
use belfry_scheduler::{
    FireOutcome, PassOutcome, Replica, Schedule, ScheduleChange, ScheduleSync, ShardSettings, Timer,
};
use belfry_testkit::{eventually, redis_url, TestEnv};
use belfry_tests::replica;
use chrono::{DateTime, SubsecRound, Utc};

const LONG: Duration = Duration::from_secs(60);

fn settings(shards: u32) -> ShardSettings {
    ShardSettings {
        shards,
        lease_ttl: LONG,
        ..ShardSettings::default()
    }
}

fn pool(env: &TestEnv) -> &sqlx::PgPool {
    env.ledger.pg_pool().expect("a Postgres ledger")
}

/// A replica of `env` sharding 16 shards, stalled after `stall_after`.
async fn sixteen_shard_replica(env: &TestEnv, name: &str, stall_after: Duration) -> Replica {
    replica(env, name, Some(&redis_url()))
        .await
        .sharded(ShardSettings {
            shards: 16,
            lease_ttl: LONG,
            stall_after,
        })
}

/// Ends `instance`'s heartbeat and leases now, as if it died a while ago.
async fn expire(env: &TestEnv, instance: &str) {
    sqlx::query(
        "UPDATE shard_leases SET expires_at = now() - interval '1 second' WHERE owner = $1",
    )
    .bind(instance)
    .execute(pool(env))
    .await
    .unwrap();
    sqlx::query("UPDATE scheduler_replicas SET expires_at = now() - interval '1 second' WHERE instance = $1")
        .bind(instance)
        .execute(pool(env))
        .await
        .unwrap();
}

/// Who holds each shard now (live leases only).
async fn holders(env: &TestEnv) -> BTreeMap<String, BTreeSet<i32>> {
    let mut out: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for lease in env.ledger.shard_leases().await.unwrap() {
        if let (Some(owner), true) = (lease.owner, lease.live) {
            out.entry(owner).or_default().insert(lease.shard);
        }
    }
    out
}

async fn owned(env: &TestEnv, instance: &str, shards: u32) -> Vec<u32> {
    env.ledger
        .shard_pass(instance, shards, LONG)
        .await
        .unwrap_or_else(|e| panic!("{instance}: {e}"))
        .owned
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_databases_shard_key_is_the_same_hash_as_belfrys() {
    let env = belfry_testkit::service_env!();
    let long = "x".repeat(100);
    let names = [
        "a",
        "nightly-billing",
        "report.eu-west-1",
        "tenant_42.cleanup",
        "Z",
        "0123456789_-.ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        long.as_str(),
    ];
    let now = Utc::now();
    for name in names {
        let spec = ScheduleSpec {
            name: name.into(),
            every: Some("1h".into()),
            job_type: "noop".into(),
            ..ScheduleSpec::default()
        };
        let row = Schedule::storable_row(&spec, now, true).unwrap();
        env.ledger.upsert_schedule(&row).await.unwrap();
    }
    let stored: Vec<(String, i64)> = sqlx::query_as("SELECT name, shard_key FROM schedules")
        .fetch_all(pool(&env))
        .await
        .unwrap();
    assert_eq!(stored.len(), names.len());
    for (name, key) in stored {
        assert_eq!(key, i64::from(belfry_protocol::shard_key(&name)), "{name}");
    }
    // And a load by shard finds each schedule in its own shard only.
    for name in names {
        let shard = belfry_protocol::shard_of(name, 7);
        let rows = env.ledger.schedules_in_shards(7, &[shard]).await.unwrap();
        assert!(
            rows.iter().any(|r| r.name == name),
            "{name} in shard {shard}"
        );
        assert!(rows
            .iter()
            .all(|r| belfry_protocol::shard_of(&r.name, 7) == shard));
    }
    env.teardown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_split_the_shards_evenly_joins_take_only_excess_and_leaves_and_deaths_hand_them_on(
) {
    let env = belfry_testkit::service_env!();
    // Alone, a replica holds every shard.
    assert_eq!(owned(&env, "a", 256).await.len(), 256);
    // A second steals half; the first learns at its next renewal.
    assert_eq!(owned(&env, "b", 256).await.len(), 128);
    assert_eq!(owned(&env, "a", 256).await.len(), 128);
    // A third takes its share from both, leaving each theirs.
    let c = env.ledger.shard_pass("c", 256, LONG).await.unwrap();
    // Each keeps its share (86): c gets the 84 beyond it.
    assert_eq!((c.owned.len(), c.taken.len(), c.live), (84, 84, 3));
    let held = holders(&env).await;
    let sizes: Vec<usize> = held.values().map(BTreeSet::len).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 256, "{held:?}");
    assert!(sizes.iter().all(|&n| (84..=86).contains(&n)), "{sizes:?}");
    // Passes after settling move nothing.
    let before = env.ledger.shard_leases().await.unwrap();
    for r in ["a", "b", "c", "a"] {
        assert!(env
            .ledger
            .shard_pass(r, 256, LONG)
            .await
            .unwrap()
            .taken
            .is_empty());
    }
    let after = env.ledger.shard_leases().await.unwrap();
    let epochs = |l: &[belfry_ledger::ShardLease]| {
        l.iter()
            .map(|l| (l.shard, l.epoch, l.owner.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        epochs(&before),
        epochs(&after),
        "a settled pass changes no owner"
    );
    // Every steal raised the shard's epoch: c's shards have had two owners.
    let c_epochs: BTreeSet<i64> = after
        .iter()
        .filter(|l| l.owner.as_deref() == Some("c"))
        .map(|l| l.epoch)
        .collect();
    assert!(c_epochs.iter().all(|&e| e >= 2), "{c_epochs:?}");

    // A graceful leave frees c's shards for the others' next pass.
    assert_eq!(env.ledger.leave_shards("c").await.unwrap(), 84);
    // Freed leases read back (their -infinity expiry as 1970), free.
    let freed: Vec<_> = env
        .ledger
        .shard_leases()
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.owner.is_none())
        .collect();
    assert_eq!(freed.len(), 84);
    assert!(freed
        .iter()
        .all(|l| !l.live && l.expires_at.timestamp() == 0));
    assert_eq!(owned(&env, "a", 256).await.len(), 128);
    assert_eq!(owned(&env, "b", 256).await.len(), 128);

    // A death: b's leases and heartbeat lapse; a takes them all.
    expire(&env, "b").await;
    let a = env.ledger.shard_pass("a", 256, LONG).await.unwrap();
    assert_eq!((a.owned.len(), a.taken.len(), a.live), (256, 128, 1));
    // b comes back (a paused process): its old leases are gone; it
    // takes its share anew, from a.
    let b = env.ledger.shard_pass("b", 256, LONG).await.unwrap();
    assert_eq!((b.owned.len(), b.live), (128, 2));
    assert_eq!(owned(&env, "a", 256).await.len(), 128);
    let held = holders(&env).await;
    assert_eq!(held.len(), 2);
    assert!(held["a"].is_disjoint(&held["b"]));
    env.teardown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_shard_count_is_refused_while_replicas_run_and_taken_when_none_do() {
    let env = belfry_testkit::service_env!();
    assert_eq!(owned(&env, "a", 256).await.len(), 256);
    let e = env.ledger.shard_pass("z", 512, LONG).await.unwrap_err();
    assert!(
        matches!(
            e,
            LedgerError::ShardCount {
                configured: 512,
                stored: 256
            }
        ),
        "{e:?}"
    );
    let said = e.to_string();
    assert!(
        said.contains("BELFRY_SHARDS=256") && said.contains("512"),
        "{said}"
    );
    // Refused before announcing itself: a still counts alone.
    assert_eq!(env.ledger.shard_pass("a", 256, LONG).await.unwrap().live, 1);
    // With every replica stopped the new count is taken, leases afresh.
    env.ledger.leave_shards("a").await.unwrap();
    assert_eq!(owned(&env, "z", 512).await.len(), 512);
    assert_eq!(env.ledger.shard_leases().await.unwrap().len(), 512);
    env.teardown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_timer_loop_is_stuck_stops_renewing_its_leases() {
    let env = belfry_testkit::service_env!();
    let stuck = sixteen_shard_replica(&env, "stuck", Duration::from_secs(15)).await;
    let keeper = stuck.shard_keeper().unwrap().clone();
    assert!(
        matches!(keeper.pass_once().await.unwrap(), PassOutcome::Settled(p) if p.owned.len() == 16)
    );
    let expiry = || latest_expiry(&env);
    let renewed = expiry().await;
    // The loop woke 20 s ago and has not come back to wait.
    stuck
        .timer_progress()
        .busy(Utc::now() - chrono::Duration::seconds(20));
    assert!(
        matches!(keeper.pass_once().await.unwrap(), PassOutcome::Stalled(d) if d >= Duration::from_secs(20))
    );
    assert_eq!(expiry().await, renewed, "nothing renewed while stuck");
    // So another replica takes the shards once the leases lapse.
    expire(&env, "stuck").await;
    assert_eq!(owned(&env, "other", 16).await.len(), 16);
    // Back to waiting: the stuck one renews again and takes its share.
    stuck.timer_progress().idle();
    assert!(
        matches!(keeper.pass_once().await.unwrap(), PassOutcome::Settled(p) if p.owned.len() == 8)
    );
    env.teardown(&[]).await;
}

/// The latest expiry of any lease.
async fn latest_expiry(env: &TestEnv) -> DateTime<Utc> {
    sqlx::query_scalar::<_, DateTime<Utc>>("SELECT max(expires_at) FROM shard_leases")
        .fetch_one(pool(env))
        .await
        .unwrap()
}

/// Each shard's owner and fencing epoch (moved by every take).
async fn epochs(env: &TestEnv) -> Vec<(Option<String>, i64)> {
    env.ledger
        .shard_leases()
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.owner, l.epoch))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_renewed_on_time_while_the_replicas_runtime_is_saturated() {
    let env = belfry_testkit::service_env!();
    if env.is_embedded() {
        return;
    }
    // Five passes a second, each lease lasting one.
    let settings = ShardSettings {
        shards: 16,
        lease_ttl: Duration::from_secs(1),
        ..ShardSettings::default()
    };
    let busy = Arc::new(
        replica(&env, "busy", None)
            .await
            .sharded_apart(settings, &env.database_url, None)
            .await
            .unwrap(),
    );
    assert!(matches!(
        busy.first_pass().await.unwrap(),
        Some(PassOutcome::Settled(p)) if p.owned.len() == 16
    ));
    let taken = epochs(&env).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(busy.clone().run(
        Timer::new(Vec::new(), Utc::now()),
        belfry_runtime::process_clock(),
        stop.clone(),
    ));
    // The replica's loop is running (it renewed once since the first
    // pass) when the burst comes.
    let expiry = || latest_expiry(&env);
    let first = expiry().await;
    eventually("the keeper's loop renews", WAIT, || async {
        (expiry().await > first).then_some(())
    })
    .await;
    // Both of the runtime's workers are taken for three lease lifetimes
    // at once (the barrier holds the first until the second has one too),
    // as a burst's tasks take them on a saturated machine.
    let both = Arc::new(std::sync::Barrier::new(2));
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let both = both.clone();
            tokio::spawn(async move {
                both.wait();
                std::thread::sleep(Duration::from_secs(3));
            })
        })
        .collect();
    for hog in hogs {
        hog.await.unwrap();
    }
    // A pass after the hogs, had the leases lapsed, takes them again and
    // moves every epoch.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        epochs(&env).await,
        taken,
        "every lease renewed in time by its owner, none taken again"
    );
    stop.cancel();
    running.await.unwrap();
    // The keeper on its own runtime still leaves at shutdown.
    assert!(epochs(&env).await.iter().all(|(owner, _)| owner.is_none()));
    env.teardown(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_schedules_of_owned_shards_are_not_loaded_stops_renewing() {
    let env = belfry_testkit::service_env!();
    let r = sixteen_shard_replica(&env, "behind", Duration::from_secs(1)).await;
    let keeper = r.shard_keeper().unwrap().clone();
    // A follower that loaded nothing (its loads keep failing).
    keeper.report_loaded(&belfry_scheduler::OwnedShards {
        shards: 16,
        owned: BTreeSet::new(),
    });
    assert!(
        matches!(keeper.pass_once().await.unwrap(), PassOutcome::Settled(p) if p.owned.len() == 16)
    );
    // Behind, but not for long yet: renewed.
    assert!(matches!(
        keeper.pass_once().await.unwrap(),
        PassOutcome::Settled(_)
    ));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(matches!(
        keeper.pass_once().await.unwrap(),
        PassOutcome::FollowerBehind(_)
    ));
    // A load in progress is progress, however long past the bound (up to
    // the load bound): a slow read of many taken schedules does not make
    // the replica let them go.
    keeper.report_loading();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(matches!(
        keeper.pass_once().await.unwrap(),
        PassOutcome::Settled(_)
    ));
    // The load failed: behind again, counted from before it.
    keeper.report_load_failed();
    assert!(matches!(
        keeper.pass_once().await.unwrap(),
        PassOutcome::FollowerBehind(_)
    ));
    // Once it catches up, renewal resumes.
    keeper.report_loaded(&keeper.owned());
    assert!(matches!(
        keeper.pass_once().await.unwrap(),
        PassOutcome::Settled(_)
    ));
    env.teardown(&[]).await;
}

/// Backends of the test's database waiting for an advisory lock.
async fn waiting_for_the_pass_lock(env: &TestEnv) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
    )
    .fetch_one(pool(env))
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_given_up_on_ends_in_the_database_and_stretches_the_next_lease() {
    let env = belfry_testkit::service_env!();
    let ttl = Duration::from_secs(1);
    let r = replica(&env, "slow", Some(&redis_url()))
        .await
        .sharded(ShardSettings {
            shards: 16,
            lease_ttl: ttl,
            stall_after: LONG,
        });
    let keeper = r.shard_keeper().unwrap().clone();
    assert!(
        matches!(keeper.pass_once().await.unwrap(), PassOutcome::Settled(p) if p.owned.len() == 16)
    );
    assert_eq!(
        keeper.lease_ttl(),
        ttl,
        "fast passes: the lease as configured"
    );
    // Another session holds the pass lock (a pass of a replica on a
    // saturated database): this pass waits, and is given up on.
    let mut holder = pool(&env).begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(21, 0)")
        .execute(&mut *holder)
        .await
        .unwrap();
    let e = keeper.pass_once().await.unwrap_err();
    assert!(matches!(e, LedgerError::TimedOut { .. }), "{e:?}");
    assert!(e.is_transient());
    // Given up in the database too: nothing is left queueing for the lock
    // behind the holder (it would take the lock ahead of the next pass).
    eventually(
        "the abandoned pass to end in the database",
        Duration::from_secs(10),
        || async { (waiting_for_the_pass_lock(&env).await == 0).then_some(()) },
    )
    .await;
    holder.commit().await.unwrap();
    // The next lease outlasts a pass as slow as that one, and the pass
    // that writes it is given as long.
    assert_eq!(keeper.lease_ttl(), ttl * 4);
    assert!(matches!(
        keeper.pass_once().await.unwrap(),
        PassOutcome::Settled(_)
    ));
    let left: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM min(expires_at) - now())::float8 FROM shard_leases",
    )
    .fetch_one(pool(&env))
    .await
    .unwrap();
    assert!(left > 3.0, "the lease lasts {left} s");
    env.teardown(&[]).await;
}

/// One sharded replica with its follower and timer.
struct Member {
    replica: Arc<Replica>,
    sync: ScheduleSync,
    timer: Timer,
}

impl Member {
    async fn start(env: &TestEnv, name: &str, shards: u32, t0: DateTime<Utc>) -> Self {
        let replica = Arc::new(
            replica(env, name, Some(&redis_url()))
                .await
                .sharded(settings(shards)),
        );
        let keeper = replica.shard_keeper().unwrap().clone();
        keeper.pass_once().await.unwrap();
        let mut sync = ScheduleSync::new(replica.ledger().clone()).with_shards(keeper.clone());
        let timer = Timer::new(sync.load_all().await.unwrap(), t0);
        Self {
            replica,
            sync,
            timer,
        }
    }

    /// A lease pass, and the schedule changes it brings applied to the
    /// timer as the replica's loop applies them (taken schedules go through
    /// misfire recovery in the background); returns the names taken.
    async fn pass(&mut self, now: DateTime<Utc>) -> BTreeSet<String> {
        let keeper = self.replica.shard_keeper().unwrap().clone();
        keeper.pass_once().await.unwrap();
        let mut taken = BTreeSet::new();
        for change in self.sync.follow_shards().await.unwrap() {
            if let ScheduleChange::Taken(schedules) = &change {
                taken.extend(schedules.iter().map(|s| s.name.clone()));
            }
            self.replica.apply_change(&mut self.timer, change, now);
        }
        taken
    }

    fn names(&self) -> BTreeSet<String> {
        self.timer
            .schedules()
            .iter()
            .map(|s| s.name.clone())
            .collect()
    }
}

async fn runs_at(env: &TestEnv, at: DateTime<Utc>) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT job_name, claimed_by FROM job_runs WHERE scheduled_at = $1 ORDER BY job_name",
    )
    .bind(at)
    .fetch_all(pool(env))
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sharded_replicas_fire_each_instant_once_without_racing_through_a_join_and_a_death() {
    let env = belfry_testkit::service_env!();
    env.declare_default_group(&["noop"]).await;
    const SCHEDULES: usize = 40;
    let now = Utc::now();
    for i in 0..SCHEDULES {
        let spec = ScheduleSpec {
            name: format!("s-{i:02}"),
            every: Some("1s".into()),
            job_type: "noop".into(),
            misfire: Some("catch_up".into()),
            ..ScheduleSpec::default()
        };
        let row = Schedule::storable_row(&spec, now, true).unwrap();
        env.ledger.upsert_schedule(&row).await.unwrap();
    }
    let t0 = now.trunc_subsecs(0) + chrono::Duration::seconds(2);
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let mut members = Vec::new();
    for name in ["a", "b", "c"] {
        members.push(Member::start(&env, name, 16, t0).await);
    }
    // Earlier members learn what later ones took.
    for m in &mut members {
        m.pass(t0).await;
    }
    let all: BTreeSet<String> = (0..SCHEDULES).map(|i| format!("s-{i:02}")).collect();
    let mut union = BTreeSet::new();
    for m in &members {
        let names = m.names();
        assert!(union.is_disjoint(&names), "a schedule in two timers");
        union.extend(names);
    }
    assert_eq!(union, all, "every schedule in exactly one timer");

    // Two instants: every fire dispatched by its owner, none raced.
    for s in [1, 2] {
        for m in &mut members {
            let outcomes = m.replica.tick_once(&mut m.timer, at(s)).await;
            assert!(
                outcomes
                    .iter()
                    .all(|o| matches!(o, FireOutcome::Dispatched { .. })),
                "{outcomes:?}"
            );
        }
        assert_eq!(runs_at(&env, at(s)).await.len(), SCHEDULES);
    }

    // A fourth joins and takes its share; the old owners fire the stolen
    // shards once more before they see it: still one run per instant.
    let mut d = Member::start(&env, "d", 16, at(2)).await;
    assert!(!d.names().is_empty(), "the joiner took schedules");
    members.push(d);
    for m in &mut members {
        m.replica.tick_once(&mut m.timer, at(3)).await;
    }
    assert_eq!(runs_at(&env, at(3)).await.len(), SCHEDULES);
    for m in &mut members {
        m.pass(at(3)).await;
    }
    let mut lost = 0;
    for m in &mut members {
        for o in m.replica.tick_once(&mut m.timer, at(4)).await {
            lost += usize::from(matches!(o, FireOutcome::Lost));
        }
    }
    assert_eq!(lost, 0, "settled owners do not race");
    assert_eq!(runs_at(&env, at(4)).await.len(), SCHEDULES);

    // The joiner dies after firing 4; its leases lapse and the others take
    // them, recovering the instants it missed (5 and 6) under catch_up.
    d = members.pop().unwrap();
    let orphaned = d.names();
    expire(&env, "d").await;
    for m in &mut members {
        m.replica.tick_once(&mut m.timer, at(5)).await;
        m.replica.tick_once(&mut m.timer, at(6)).await;
    }
    assert_eq!(runs_at(&env, at(6)).await.len(), SCHEDULES - orphaned.len());
    let mut taken_names = BTreeSet::new();
    for m in &mut members {
        taken_names.extend(m.pass(at(6)).await);
    }
    assert_eq!(taken_names, orphaned, "the others took what d held");
    for s in [5, 6] {
        belfry_testkit::eventually(
            "the taken schedules' missed instants to be made",
            Duration::from_secs(20),
            || async { (runs_at(&env, at(s)).await.len() == SCHEDULES).then_some(()) },
        )
        .await;
    }
    for s in 1..=6 {
        let runs = runs_at(&env, at(s)).await;
        let names: BTreeSet<String> = runs.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(runs.len(), SCHEDULES, "instant {s}: one run each");
        assert_eq!(names, all);
    }
    env.teardown(&["default"]).await;
}

/// A clock the test sets.
#[derive(Debug)]
struct ManualClock(std::sync::Mutex<DateTime<Utc>>);

impl belfry_runtime::Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

impl ManualClock {
    fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().unwrap() = at;
    }
}

/// Holds the claim of each fire of `names` at `at` in an open transaction
/// (a row with its key, not committed), so a replica's claim of any of
/// them waits until the transaction ends.
async fn hold_claims(
    env: &TestEnv,
    names: &[String],
    at: DateTime<Utc>,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool(env).begin().await.unwrap();
    for name in names {
        sqlx::query(
            "INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at, \
                 claimed_by, key_instant) \
             VALUES ($1, $2, $3, 'noop', 'claimed', 'null', $4, 'holder', belfry_key_instant($2, $3))",
        )
        .bind(uuid::Uuid::now_v7())
        .bind(name)
        .bind(belfry_protocol::run_key(name, at).unwrap())
        .bind(at)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    tx
}

/// Whether a statement of the test's database waits for a lock.
async fn a_claim_waits(env: &TestEnv) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                        WHERE datname = current_database() AND wait_event_type = 'Lock')",
    )
    .fetch_one(pool(env))
    .await
    .unwrap()
}

/// How many runs `instance` claimed.
async fn claimed_by(env: &TestEnv, instance: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM job_runs WHERE claimed_by = $1")
        .bind(instance)
        .fetch_one(pool(env))
        .await
        .unwrap()
}

/// How long the burst test waits for each step.
const WAIT: Duration = Duration::from_secs(30);

/// The real timer loop through an instant with more fires than one batch:
/// each batch it hands off is progress, so a burst that outlasts the stall
/// bound batch after batch (a million schedules on one top of the hour)
/// does not make the replica stop renewing its shards; and a batch that
/// took long (a saturated database) stretches the bound to three times its
/// time, so the loop waiting as long for the next batch's permits is not a
/// stall either; a hand-off that does not come for the stretched bound
/// still is one. Fifteen fires due at one
/// instant, batches of five with five in flight: the claims of the first
/// two batches are held in transactions of the test's (so the loop waits
/// for a batch's permits before handing off the next, and is busy, not
/// waiting for a wake-up, until the third is handed off), and the loop's
/// clock is the test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_handed_off_batch_after_batch_is_progress_not_a_stall() {
    let env = belfry_testkit::service_env!("noop");
    if env.is_embedded() {
        return;
    }
    let names: Vec<String> = (0..15).map(|i| format!("burst-{i}")).collect();
    let schedules: Vec<Arc<Schedule>> = names
        .iter()
        .map(|n| belfry_tests::every(n, "1h", "noop"))
        .collect();
    // Fires of one instant leave the timer in the order the schedules were
    // given: the first five are the first batch.
    let mut timer = Timer::new(schedules, Utc::now());
    let t0 = timer.next_at().unwrap();
    let clock = Arc::new(ManualClock(std::sync::Mutex::new(
        t0 - chrono::Duration::seconds(1),
    )));
    let timing = belfry_scheduler::ReplicaTiming {
        max_inflight: 5,
        max_batch: 5,
        // The test's clock runs ahead of the database's.
        max_clock_skew: Duration::from_secs(86_400),
        shutdown_timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let instance = "burst";
    let ledger = belfry_ledger::Ledger::connect(&env.database_url, 4)
        .await
        .unwrap();
    let broker =
        belfry_broker::Broker::connect(&belfry_testkit::amqp_url(), env.topology.clone(), instance)
            .await
            .unwrap();
    let replica =
        Arc::new(Replica::new(instance, None, ledger, broker, timing).with_clock(clock.clone()));
    let progress = replica.timer_progress().clone();
    let bound = Duration::from_secs(15);
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let first = hold_claims(&env, &names[..5], t0).await;
    let second = hold_claims(&env, &names[5..10], t0).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(replica.clone().run(timer, clock.clone(), stop.clone()));
    // Fires due before the first recovery ended would wait for it and go
    // out with it, not as the timer's batches this test times.
    eventually("the first recovery ends", WAIT, || async {
        (belfry_scheduler::FireCounters::get(&replica.counters().recoveries) == 1).then_some(())
    })
    .await;
    // The instant comes: the loop wakes and hands off the first batch,
    // whose claims wait for the test's transaction.
    clock.set(t0);
    eventually("the first batch's claims wait", WAIT, || async {
        a_claim_waits(&env).await.then_some(())
    })
    .await;
    // Ten seconds later the first batch's claims go through; the loop hands
    // off the second, whose claims wait in turn, and waits for their
    // permits to hand off the third.
    clock.set(at(10));
    first.rollback().await.unwrap();
    eventually("the first batch is claimed", WAIT, || async {
        (claimed_by(&env, instance).await == 5).then_some(())
    })
    .await;
    eventually("the second batch's claims wait", WAIT, || async {
        a_claim_waits(&env).await.then_some(())
    })
    .await;
    // 24 s after the wake, 14 s after the second hand-off: not stalled
    // (counted from the wake, it would be 24 s past a 15 s bound).
    eventually("the second hand-off counts as progress", WAIT, || async {
        progress.stalled(at(24), bound).is_none().then_some(())
    })
    .await;
    // The first batch took 10 s: the loop may wait 30 s for the second's
    // permits (a fixed bound would call 16 s a stall).
    eventually(
        "the first batch's time stretches the bound",
        WAIT,
        || async { (progress.bound(bound) == Duration::from_secs(30)).then_some(()) },
    )
    .await;
    assert_eq!(progress.stalled(at(26), bound), None);
    // Nothing handed off for longer than the stretched bound is a stall.
    assert_eq!(
        progress.stalled(at(41), bound),
        Some(Duration::from_secs(31))
    );
    second.rollback().await.unwrap();
    eventually("the last batches are claimed", WAIT, || async {
        (claimed_by(&env, instance).await == 15).then_some(())
    })
    .await;
    stop.cancel();
    running.await.unwrap();
    env.teardown(&[]).await;
}
