//! The fault suite: real `belfry-scheduler` and `belfry-worker` processes
//! under a steady load while faults are injected at random moments, then a
//! table that says whether any fire was lost, recorded twice or run again
//! after it succeeded (see `RELIABILITY.md`).
//!
//! Load: `schedules` interval schedules firing every second, each an `http`
//! job against the [`probe`], which records every handler execution and
//! answers after a random short delay. Schedules use `misfire = "catch_up"`,
//! so every fire instant in the measured window must end up with a row: a
//! fire missed while the ledger was down is caught up, not skipped.
//!
//! Faults, one at a time in a seeded random order, each at a random moment
//! inside its slot of the run (every kind appears `rounds` times):
//! `kill -9` of a scheduler and of a worker (restarted after 1–3 s), SIGSTOP
//! of the replica that claimed the latest fire for longer than the lock TTL,
//! each failpoint (a process restarted with it armed until it aborts), a
//! restart of RabbitMQ, Redis and Postgres (`scripts/service-bounce`), a
//! replica started with its clock 5 s ahead (it must claim nothing), and,
//! as the replicas share the fires by shard (the default), a lease steal
//! (half of one replica's shards handed to another behind their backs) and
//! a replica joining for a while and leaving gracefully; every `kill -9`
//! of a scheduler kills the owner of a quarter to a third of the shards.
//!
//! Alerts: the schedulers send every alert event to a webhook receiver of
//! the suite, which is down (503) for a minute early in the window, and
//! the report counts them ([`alert_tally`]): every event alerted, none
//! recorded twice.

pub mod alert_tally;
pub mod fleet;
pub mod probe;
pub mod report;
pub mod storm;

use std::time::Duration;

use chrono::{DateTime, DurationRound, Utc};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use belfry_testkit::TestEnv;
use fleet::{Fleet, Role};
use probe::Probe;
use report::Report;

/// When the alert receiver goes down, in seconds after the window opens.
const ALERT_RECEIVER_DOWN_AT: f64 = 5.0;
/// How long it stays down.
const ALERT_RECEIVER_DOWN_FOR: f64 = 60.0;

/// Lock TTL of the replicas under test: short, so a SIGSTOP outlives it.
pub const LOCK_TTL: Duration = Duration::from_secs(2);
/// Job timeout of the workers.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(5);
/// The workers' lease: the default users run (`BELFRY_LEASE`).
pub const LEASE: Duration = belfry_worker::lease::DEFAULT_LEASE;
/// Late claims per page of the schedulers' late-claim pass: small enough
/// that a broker outage of the suite builds a backlog several pages deep
/// (the default page of 10,000 is crossed by `tests/backlog.rs`).
pub const LATE_CLAIM_PAGE: usize = 1000;

/// Size and shape of one run, from the environment.
#[derive(Debug, Clone)]
pub struct FaultConfig {
    /// Seconds of load (`BELFRY_FAULT_SECONDS`, default 60); the measured
    /// window is at least this long, longer when faults overrun it.
    pub seconds: u64,
    /// Schedules firing every second (`BELFRY_FAULT_SCHEDULES`, default 100).
    pub schedules: usize,
    /// How many times every fault kind is injected (`BELFRY_FAULT_ROUNDS`,
    /// default 1).
    pub rounds: usize,
    /// Seed of every random choice (`BELFRY_FAULT_SEED`, default random;
    /// printed, so a run can be repeated).
    pub seed: u64,
    /// Scheduler replicas (3) and workers (2).
    pub schedulers: usize,
    /// Worker processes.
    pub workers: usize,
    /// The schedules' misfire policy (`BELFRY_FAULT_MISFIRE`: `fire_once`,
    /// the default users get when they name none, `skip` or `catch_up`).
    /// `fire_once` writes no `misfire` line at all, so the default applies.
    pub misfire: String,
    /// Seconds each service is down in the long outages
    /// (`BELFRY_FAULT_LONG_OUTAGE`, default 30: longer than a worker's
    /// 20 s lease; `scripts/fault-suite` uses 60; 0 leaves them out).
    pub long_outage: u64,
}

impl FaultConfig {
    /// Reads the environment.
    ///
    /// # Panics
    ///
    /// When a variable is set but not a number.
    pub fn from_env() -> Self {
        fn num(name: &str, default: u64) -> u64 {
            match std::env::var(name) {
                Ok(v) => v
                    .trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
                Err(_) => default,
            }
        }
        Self {
            seconds: num("BELFRY_FAULT_SECONDS", 60),
            schedules: usize::try_from(num("BELFRY_FAULT_SCHEDULES", 100)).unwrap_or(100),
            rounds: usize::try_from(num("BELFRY_FAULT_ROUNDS", 1))
                .unwrap_or(1)
                .max(1),
            seed: num("BELFRY_FAULT_SEED", rand::random::<u64>() >> 12),
            schedulers: 3,
            workers: 2,
            misfire: std::env::var("BELFRY_FAULT_MISFIRE")
                .map(|v| v.trim().to_owned())
                .unwrap_or_else(|_| "fire_once".into()),
            long_outage: num("BELFRY_FAULT_LONG_OUTAGE", 30),
        }
    }
}

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` a scheduler replica, restart it 1–3 s later.
    KillScheduler,
    /// `kill -9` a worker, restart it 1–3 s later.
    KillWorker,
    /// SIGSTOP the replica that claimed the latest fire for longer than
    /// the lock TTL, then SIGCONT.
    StopLockHolder,
    /// Restart a replica (after a graceful stop) with a scheduler
    /// failpoint armed, wait for it to abort, restart it normally.
    SchedulerFailpoint(&'static str),
    /// The same for a worker failpoint.
    WorkerFailpoint(&'static str),
    /// Restart a service: `postgres`, `redis` or `rabbitmq`.
    Bounce(&'static str),
    /// Restart a replica with its clock 5 s ahead for a while.
    SkewedClock,
    /// A service down for the long outage (60–120 s): for RabbitMQ, the
    /// fires claimed meanwhile build a backlog above every batch and page
    /// size.
    LongBounce(&'static str),
    /// SIGSTOP a worker past its lease, then SIGCONT: its runs are taken
    /// over, and it must not record over them when it wakes.
    StopWorker,
    /// A foreign producer's poison messages interleaved with good ones.
    PoisonStorm,
    /// Half of one replica's shard leases handed to another replica in the
    /// ledger, behind both their backs (a lease table gone wrong).
    StealLease,
    /// A fourth replica joins (taking its share of the shards), runs for
    /// a while, and leaves gracefully (handing them back).
    JoinLeave,
}

impl Fault {
    /// Every kind, once.
    pub const ALL: [Fault; 18] = [
        Fault::KillScheduler,
        Fault::KillWorker,
        Fault::StopLockHolder,
        Fault::SchedulerFailpoint("after_claim_before_publish"),
        Fault::SchedulerFailpoint("after_publish_before_dispatched"),
        Fault::WorkerFailpoint("inside_handler"),
        Fault::WorkerFailpoint("before_ack"),
        Fault::Bounce("rabbitmq"),
        Fault::Bounce("redis"),
        Fault::Bounce("postgres"),
        Fault::SkewedClock,
        Fault::LongBounce("rabbitmq"),
        Fault::LongBounce("redis"),
        Fault::LongBounce("postgres"),
        Fault::StopWorker,
        Fault::PoisonStorm,
        Fault::StealLease,
        Fault::JoinLeave,
    ];
}

/// A worker's `kill -9`: when, and the `(run, attempt)` it was running.
pub type WorkerKill = (DateTime<Utc>, Vec<(uuid::Uuid, i32)>);

/// What faults left behind for the report to check.
#[derive(Debug, Default)]
pub struct Observations {
    /// Each `kill -9` of a worker: when, and the `(run, attempt)` it was
    /// running then.
    pub worker_kills: Vec<WorkerKill>,
    /// Every poison storm, merged.
    pub storm: storm::Storm,
    /// When each service restart began and ended: a run cannot be taken
    /// over while the ledger or the broker is down.
    pub outages: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// When each worker was frozen (SIGSTOP) and thawed: the runs of a
    /// worker killed meanwhile can be redelivered into the frozen one's
    /// prefetch, where they wait for the thaw (with two workers, the only
    /// other consumer).
    pub worker_freezes: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

/// A fault as it happened.
#[derive(Debug, Clone)]
pub struct Injected {
    /// Seconds after the window opened.
    pub at: f64,
    /// How long it took.
    pub took: f64,
    /// What was done, to whom.
    pub what: String,
}

/// Runs the whole suite and returns its report (the caller asserts).
///
/// # Panics
///
/// When a service is unreachable, a process cannot start, a failpoint is
/// never hit (binaries built without the feature) or a service restart
/// fails.
pub async fn run_suite(config: &FaultConfig) -> Report {
    let env = TestEnv::new().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed);
    let probe = Probe::start(config.seed, 80).await;
    let dir = std::env::temp_dir().join(format!("belfry-fault-{}", env.namespace));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let alert_sink =
        std::sync::Arc::new(crate::alert_sink::WebhookSink::start(alert_tally::SECRET).await);
    let alerts_file = dir.join("alerts.toml");
    std::fs::write(&alerts_file, alert_tally::alerts_file(&alert_sink.url()))
        .unwrap_or_else(|e| panic!("{}: {e}", alerts_file.display()));
    let schedule_file = dir.join("schedules.toml");
    std::fs::write(&schedule_file, schedule_file_text(config, &probe.url()))
        .unwrap_or_else(|e| panic!("{}: {e}", schedule_file.display()));
    println!(
        "fault suite: seed {} ({} schedules/s, {} s, {} round(s), misfire {}, long outages {} s); logs in {}",
        config.seed,
        config.schedules,
        config.seconds,
        config.rounds,
        config.misfire,
        config.long_outage,
        dir.display()
    );
    let pairs = |list: &[(&str, String)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    };
    let mut common = env.process_env();
    common.push(("RUST_LOG".into(), "warn".into()));
    common.push(("BELFRY_SHUTDOWN_TIMEOUT".into(), "10s".into()));
    // A process (re)started by one fault while a long outage of another is
    // under way retries its start-up for BELFRY_START_TIMEOUT (30 s by
    // default) and then exits 1 by design, for its supervisor to restart.
    // The suite is that supervisor only for the faults it injects, so its
    // processes wait out its longest outage.
    common.push((
        "BELFRY_START_TIMEOUT".into(),
        format!("{}s", config.long_outage.max(3) + 60),
    ));
    let mut fleet = Fleet::new(
        dir.clone(),
        common,
        pairs(&[
            ("BELFRY_SCHEDULES", schedule_file.display().to_string()),
            ("BELFRY_LOCK_TTL", format!("{}s", LOCK_TTL.as_secs())),
            ("BELFRY_RECONCILE_AFTER", "3s".into()),
            ("BELFRY_MAX_CLOCK_SKEW", "2s".into()),
            ("BELFRY_CLOCK_CHECK_INTERVAL", "1s".into()),
            ("BELFRY_MAX_INFLIGHT_FIRES", "256".into()),
            ("BELFRY_LATE_CLAIM_PAGE", LATE_CLAIM_PAGE.to_string()),
            ("BELFRY_ALERTS", alerts_file.display().to_string()),
            (alert_tally::SECRET_VAR, alert_tally::SECRET.to_owned()),
        ]),
        pairs(&[
            ("BELFRY_WORKER_GROUP", "default".into()),
            ("BELFRY_CONCURRENCY", "64".into()),
            ("BELFRY_PREFETCH", "64".into()),
            ("BELFRY_MAX_ATTEMPTS", "20".into()),
            ("BELFRY_RETRY_INITIAL", "200ms".into()),
            ("BELFRY_RETRY_MAX_DELAY", "2s".into()),
            ("BELFRY_JOB_TIMEOUT", format!("{}s", JOB_TIMEOUT.as_secs())),
        ]),
    );
    // Workers first, so their queue is bound before the first publish.
    for i in 1..=config.workers {
        fleet.add(Role::Worker, &format!("w{i}"));
    }
    let queue = env.topology.group_queue("default");
    belfry_testkit::eventually(
        "the workers to declare their queue",
        Duration::from_secs(30),
        || async {
            belfry_testkit::queue_consumed(&env, &queue)
                .await
                .then_some(())
        },
    )
    .await;
    for i in 1..=config.schedulers {
        fleet.add(Role::Scheduler, &format!("s{i}"));
    }
    // Every replica has loaded the schedules once rows appear from each
    // of them... or at least the first fires land; then the window opens
    // on a whole second with every process warmed up.
    let ledger = env.ledger.clone();
    belfry_testkit::eventually(
        "the first fires to be recorded",
        Duration::from_secs(60),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM job_runs")
                .fetch_one(ledger.pg_pool().expect("a Postgres ledger"))
                .await
                .ok()?;
            (n >= i64::try_from(config.schedules).unwrap_or(i64::MAX)).then_some(())
        },
    )
    .await;
    let window_start = whole_second(Utc::now()) + chrono::Duration::seconds(2);
    sleep_until(window_start).await;
    // The alert receiver is down for a minute early in the window (it
    // answers 503): the alerts of that minute must arrive after, once each.
    let receiver_down = {
        let sink = alert_sink.clone();
        tokio::spawn(async move {
            sleep_until(window_start + secs(ALERT_RECEIVER_DOWN_AT)).await;
            sink.answer(503);
            sleep_until(window_start + secs(ALERT_RECEIVER_DOWN_AT + ALERT_RECEIVER_DOWN_FOR))
                .await;
            sink.answer(200);
        })
    };

    let mut plan: Vec<Fault> = (0..config.rounds)
        .flat_map(|_| Fault::ALL)
        .filter(|f| config.long_outage > 0 || !matches!(f, Fault::LongBounce(_)))
        .collect();
    let mut observed = Observations::default();
    plan.shuffle(&mut rng);
    // Slots share the load time; each fault starts at a random point in
    // the first half of its slot (later when the previous one overran).
    let usable = config.seconds.saturating_sub(8).max(1) as f64;
    let slot = usable / plan.len() as f64;
    let mut injected = Vec::new();
    for (k, fault) in plan.iter().enumerate() {
        let offset = 2.0 + slot * k as f64 + rng.random_range(0.0..(slot / 2.0).max(0.01));
        sleep_until(window_start + secs(offset)).await;
        fleet.check_alive();
        let began = Utc::now();
        let what = inject(
            *fault,
            &mut fleet,
            &env,
            &mut rng,
            config,
            &probe,
            &mut observed,
        )
        .await;
        let took = (Utc::now() - began).num_milliseconds() as f64 / 1000.0;
        let at = (began - window_start).num_milliseconds() as f64 / 1000.0;
        println!("fault suite: t+{at:>6.1}s ({took:>4.1}s) {what}");
        injected.push(Injected { at, took, what });
    }
    injected.push(Injected {
        at: ALERT_RECEIVER_DOWN_AT,
        took: ALERT_RECEIVER_DOWN_FOR,
        what: format!("alert receiver answering 503 for {ALERT_RECEIVER_DOWN_FOR} s (beside the faults above)"),
    });
    // The window closes at the planned end, or 5 s after the last fault.
    let planned_end =
        window_start + chrono::Duration::seconds(i64::try_from(config.seconds).unwrap_or(60));
    let window_end = whole_second(planned_end.max(Utc::now() + chrono::Duration::seconds(5)));
    sleep_until(window_end).await;
    fleet.check_alive();

    // Drain: every fire of the window recorded and finished, then the
    // schedulers stop (graceful), then whatever they published finishes,
    // then the workers stop (graceful).
    let drained = report::wait_settled(
        &env,
        config,
        window_start,
        window_end,
        Duration::from_secs(120),
    )
    .await;
    for i in fleet.of(Role::Scheduler) {
        fleet.stop(i, Duration::from_secs(30)).await;
    }
    let all_done = report::wait_all_terminal(&env, Duration::from_secs(90)).await;
    fleet.check_alive();
    for i in fleet.of(Role::Worker) {
        fleet.stop(i, Duration::from_secs(30)).await;
    }
    let _ = receiver_down.await;
    let alerts = alert_tally::settle_and_count(&env, &alert_sink, Duration::from_secs(60)).await;
    let mut report = Report::collect(
        &env,
        config,
        window_start,
        window_end,
        &probe.executions(),
        injected,
        &observed,
    )
    .await;
    report.alerts = alerts;
    report.unexpected_exits = fleet.unexpected_exits.clone();
    report.unclean_stops = fleet.unclean_stops.clone();
    report.settled = drained && all_done;
    if !report.passed() {
        report.log_tails = fleet.log_tails(15);
        // What the fleet said about the runs that overlapped: which
        // workers held them, and when their leases were lost or taken.
        let runs: Vec<String> = report
            .overlapping_executions
            .iter()
            .map(|(run, _)| run.to_string())
            .collect();
        report.log_tails.push_str(&fleet.log_lines_naming(&runs));
    }
    drop(fleet);
    env.teardown(&["default"]).await;
    let _ = std::fs::remove_dir_all(&dir);
    report
}

/// Carries out one fault; returns what was done.
async fn inject(
    fault: Fault,
    fleet: &mut Fleet,
    env: &TestEnv,
    rng: &mut rand::rngs::StdRng,
    config: &FaultConfig,
    probe: &Probe,
    observed: &mut Observations,
) -> String {
    let pick = |fleet: &Fleet, role: Role, rng: &mut rand::rngs::StdRng| {
        let of = fleet.of(role);
        of[rng.random_range(0..of.len())]
    };
    match fault {
        Fault::KillScheduler | Fault::KillWorker => {
            let role = if fault == Fault::KillScheduler {
                Role::Scheduler
            } else {
                Role::Worker
            };
            let i = pick(fleet, role, rng);
            if role == Role::Worker {
                // Killed mid-job: waits (up to 5 s) until it runs something,
                // and remembers what, to time how soon each run's next
                // attempt starts elsewhere.
                let mut running: Vec<(uuid::Uuid, i32)> = Vec::new();
                for _ in 0..50 {
                    running = sqlx::query_as(
                        // Held now (an unexpired lease), not left `running` by
                        // an attempt that could not record its hand-back.
                        "SELECT id, attempts FROM job_runs \
                         WHERE status = 'running' AND worker = $1 AND lease_until > now()",
                    )
                    .bind(&fleet.members[i].name)
                    .fetch_all(env.ledger.pg_pool().expect("a Postgres ledger"))
                    .await
                    .unwrap_or_default();
                    if !running.is_empty() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                fleet.kill(i).await;
                observed.worker_kills.push((Utc::now(), running));
            } else {
                fleet.kill(i).await;
            }
            let down = rng.random_range(1000..3000);
            tokio::time::sleep(Duration::from_millis(down)).await;
            fleet.restart(i);
            format!(
                "kill -9 {}, restarted after {down} ms",
                fleet.members[i].name
            )
        }
        Fault::StopLockHolder => {
            let holder: Option<String> = sqlx::query_scalar(
                "SELECT claimed_by FROM job_runs ORDER BY claimed_at DESC NULLS LAST LIMIT 1",
            )
            .fetch_optional(env.ledger.pg_pool().expect("a Postgres ledger"))
            .await
            .ok()
            .flatten()
            .flatten();
            let i = holder
                .as_deref()
                .and_then(|h| fleet.find(h))
                .unwrap_or_else(|| pick(fleet, Role::Scheduler, rng));
            let stopped = LOCK_TTL + Duration::from_secs(2);
            let why = format!("lock TTL {LOCK_TTL:?}");
            freeze(fleet, i, " (latest claimer)", stopped, &why).await
        }
        Fault::SchedulerFailpoint(point) | Fault::WorkerFailpoint(point) => {
            let role = if matches!(fault, Fault::SchedulerFailpoint(_)) {
                Role::Scheduler
            } else {
                Role::Worker
            };
            let i = pick(fleet, role, rng);
            let name = fleet.members[i].name.clone();
            fleet.stop(i, Duration::from_secs(30)).await;
            fleet.restart_as(
                i,
                &name,
                &[(belfry_runtime::failpoint::ENV, format!("{point}=abort"))],
            );
            let crashed = fleet.wait_crash(i, Duration::from_secs(60)).await;
            assert!(
                crashed,
                "{name} armed with {point} never hit it within 60 s: are the binaries \
                 built with the failpoints features?\n{}",
                fleet.log_tails(20)
            );
            fleet.restart(i);
            format!("SIGTERM {name}, restarted with {point}=abort, aborted there, restarted")
        }
        Fault::Bounce(service) | Fault::LongBounce(service) => {
            let down = if matches!(fault, Fault::LongBounce(_)) {
                config.long_outage
            } else {
                3
            };
            let began = Utc::now();
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/service-bounce");
            let out = tokio::task::spawn_blocking(move || {
                std::process::Command::new(script)
                    .args([service, &down.to_string()])
                    .output()
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{script}: {e}"));
            assert!(
                out.status.success(),
                "restarting {service} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            observed.outages.push((began, Utc::now()));
            format!("{service} restarted (down {down} s)")
        }
        Fault::StopWorker => {
            let i = pick(fleet, Role::Worker, rng);
            let stopped = LEASE + Duration::from_secs(5);
            let began = Utc::now();
            let what = freeze(fleet, i, "", stopped, &format!("lease {LEASE:?}")).await;
            observed.worker_freezes.push((began, Utc::now()));
            what
        }
        Fault::PoisonStorm => {
            let storm = storm::publish_storm(env, &probe.url(), 5).await;
            let what = format!(
                "poison storm: {} poison messages interleaved with {} good ones",
                storm.poison.len(),
                storm.good.len()
            );
            observed.storm.poison.extend(storm.poison);
            observed.storm.good.extend(storm.good);
            what
        }
        Fault::StealLease => {
            let pool = env.ledger.pg_pool().expect("a Postgres ledger");
            let owners: Vec<String> = sqlx::query_scalar(
                "SELECT DISTINCT owner FROM shard_leases \
                 WHERE owner IS NOT NULL AND expires_at > now() ORDER BY owner",
            )
            .fetch_all(pool)
            .await
            .unwrap_or_default();
            if owners.len() < 2 {
                return format!(
                    "lease steal skipped: {} replica(s) hold shards",
                    owners.len()
                );
            }
            let from = rng.random_range(0..owners.len());
            let to = (from + rng.random_range(1..owners.len())) % owners.len();
            let moved = sqlx::query(
                "UPDATE shard_leases SET owner = $2, epoch = epoch + 1 \
                 WHERE owner = $1 AND expires_at > now() AND shard % 2 = 0",
            )
            .bind(&owners[from])
            .bind(&owners[to])
            .execute(pool)
            .await
            .map(|done| done.rows_affected())
            .unwrap_or_else(|e| panic!("stealing leases: {e}"));
            format!(
                "lease steal: {moved} shards of {} handed to {} in the ledger",
                owners[from], owners[to]
            )
        }
        Fault::JoinLeave => {
            let name = format!("s-join-{}", Utc::now().timestamp() % 100_000);
            fleet.add(Role::Scheduler, &name);
            let stay = rng.random_range(5000..10_000);
            tokio::time::sleep(Duration::from_millis(stay)).await;
            if let Some(i) = fleet.find(&name) {
                fleet.stop(i, Duration::from_secs(30)).await;
                // Gone for good: no later fault restarts it.
                fleet.members.remove(i);
            }
            format!("{name} joined for {stay} ms, then left (SIGTERM)")
        }
        Fault::SkewedClock => {
            let i = pick(fleet, Role::Scheduler, rng);
            let name = fleet.members[i].name.clone();
            let skewed = format!("{name}-skewed");
            fleet.stop(i, Duration::from_secs(30)).await;
            fleet.restart_as(
                i,
                &skewed,
                &[(belfry_runtime::clock::FAULT_SKEW_ENV, "5000".into())],
            );
            tokio::time::sleep(Duration::from_secs(6)).await;
            fleet.stop(i, Duration::from_secs(30)).await;
            fleet.restart(i);
            format!(
                "{name} restarted with its clock 5 s ahead for 6 s (as {skewed}), then normally"
            )
        }
    }
}

/// Freezes fleet member `i` with SIGSTOP for `stopped`, then lets it go on
/// with SIGCONT; the line that reports it (`note` follows the member's
/// name, `why` says what `stopped` is measured against), or that it was
/// skipped because the member is not running.
async fn freeze(fleet: &Fleet, i: usize, note: &str, stopped: Duration, why: &str) -> String {
    let name = &fleet.members[i].name;
    let Some(pid) = fleet.pid(i) else {
        return format!("SIGSTOP skipped: {name} not running");
    };
    fleet::signal(pid, "STOP");
    tokio::time::sleep(stopped).await;
    fleet::signal(pid, "CONT");
    format!("SIGSTOP {name}{note} for {stopped:?} ({why}), SIGCONT")
}

fn schedule_file_text(config: &FaultConfig, url: &str) -> String {
    let policy = match config.misfire.as_str() {
        // The default: no line at all, as most users write it.
        "fire_once" => String::new(),
        "catch_up" => {
            "misfire = \"catch_up\"\ncatch_up_window = \"30m\"\ncatch_up_max = 5000\n".into()
        }
        other => format!("misfire = \"{other}\"\n"),
    };
    let mut out = String::new();
    for i in 0..config.schedules {
        out.push_str(&format!(
            "[[schedule]]\nname = \"fault-{i:04}\"\nevery = \"1s\"\njob_type = \"http\"\n\
             {policy}payload = {{ url = \"{url}\", timeout_ms = 4000 }}\n\n"
        ));
        // Every tenth schedule has a follow-up on success (an `http` run
        // too, so the probe sees its executions): each succeeded fire of
        // it must get exactly one, whatever the faults (see `report`).
        if report::has_follow_up(i) {
            out.push_str(&format!(
                "[[schedule.on_success]]\nname = \"{}\"\njob_type = \"http\"\n\
                 payload = {{ url = \"{url}\", timeout_ms = 4000 }}\n\n",
                report::follow_up_name(i)
            ));
        }
    }
    out
}

fn whole_second(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(chrono::Duration::seconds(1)).unwrap_or(t) + chrono::Duration::seconds(1)
}

fn secs(s: f64) -> chrono::Duration {
    chrono::Duration::milliseconds((s * 1000.0) as i64)
}

async fn sleep_until(t: DateTime<Utc>) {
    if let Ok(d) = (t - Utc::now()).to_std() {
        tokio::time::sleep(d).await;
    }
}
