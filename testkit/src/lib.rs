//! Isolated environments on the real services for belfry's tests.
//!
//! Each [`TestEnv`] gets its own Postgres database (`belfry_t_{uuid}`) and a
//! uuid namespace that prefixes every exchange, queue and Redis key, so
//! tests run in parallel against one Postgres, one RabbitMQ and one Redis
//! without seeing each other. [`TestEnv::teardown`] drops all of it.
//!
//! The services come from `BELFRY_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), `BELFRY_TEST_AMQP_URL`
//! and `BELFRY_TEST_REDIS_URL`. When Postgres or RabbitMQ does not answer,
//! a test that asked with [`service_env!`] is skipped with a line saying
//! which service and why; with `BELFRY_REQUIRE_SERVICES=1` (what `.ci/run`
//! sets) it fails instead, so CI never passes a service-backed test that
//! could not run.
//!
//! [`TestEnv::embedded`] is the same environment on the embedded backends
//! (a fresh SQLite file and its job queue): it needs no service at all.
//! [`both_backends!`] runs one test body on each.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use belfry_broker::{Broker, JobQueue, Publisher};
use belfry_ledger::{Ledger, NewRun, RunRecord, RunStatus};
use belfry_protocol::{run_key, JobMessage, JobOptions, Topology, TraceContext, MESSAGE_VERSION};

/// Admin URL of the Postgres server tests create databases on.
pub fn admin_database_url() -> String {
    std::env::var("BELFRY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// RabbitMQ URL for tests.
pub fn amqp_url() -> String {
    std::env::var("BELFRY_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Redis URL for tests.
pub fn redis_url() -> String {
    std::env::var("BELFRY_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into())
}

/// A Redis URL where nothing listens: for tests of Redis being down.
pub const DEAD_REDIS_URL: &str = "redis://127.0.0.1:1/";

/// Whether service-backed tests must run (`BELFRY_REQUIRE_SERVICES=1`):
/// an unreachable service is then a failure, not a skip.
pub fn services_required() -> bool {
    std::env::var("BELFRY_REQUIRE_SERVICES").is_ok_and(|v| v == "1")
}

/// Whether something accepts TCP connections at `addr` (within 5 s); the
/// error names `service`.
async fn answers(service: &str, addr: &str) -> Result<(), String> {
    match tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(addr.to_owned()),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("{service} at {addr} is not reachable: {e}")),
        Err(_) => Err(format!("{service} at {addr} did not answer within 5 s")),
    }
}

/// Whether Postgres, RabbitMQ and Redis answer; when they do not, the
/// calling test is recorded as skipped (see [`skip`]) and `false` returned.
///
/// # Panics
///
/// When a service does not answer and `BELFRY_REQUIRE_SERVICES=1`.
pub async fn services_available() -> bool {
    match TestEnv::reach_services().await {
        Ok(()) => true,
        Err(why) => {
            skip(&format!(
                "{why}; start the services (scripts/services-up) to run it"
            ));
            false
        }
    }
}

/// Records that the calling test is skipped because `why` (a missing
/// service or tool, and how to get it): printed to stderr and appended to
/// the file named by `BELFRY_SKIP_LOG` (which `scripts/test` summarises).
///
/// # Panics
///
/// When `BELFRY_REQUIRE_SERVICES=1`: there, a test that cannot run fails.
pub fn skip(why: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    if services_required() {
        panic!("{test} could not run (BELFRY_REQUIRE_SERVICES=1): {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    if let Ok(path) = std::env::var("BELFRY_SKIP_LOG") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// A [`TestEnv`] on the real services, or `return` from the calling test
/// after saying why it was skipped (see the crate docs). Given job types
/// (`service_env!("noop")`), its worker group `default` is declared too,
/// bound to them (see [`TestEnv::declare_default_group`]).
#[macro_export]
macro_rules! service_env {
    () => {
        match $crate::TestEnv::connect().await {
            Some(env) => env,
            None => return,
        }
    };
    ($($job_type:expr),+ $(,)?) => {{
        let env = $crate::service_env!();
        env.declare_default_group(&[$($job_type),+]).await;
        env
    }};
}

/// Runs one test body on both backends: `distributed` (Postgres, RabbitMQ,
/// skipped without them, see [`service_env!`]) and `embedded` (SQLite and
/// its queue, always). The body is an `async fn(env: TestEnv)`.
#[macro_export]
macro_rules! both_backends {
    ($(#[$meta:meta])* async fn $name:ident($env:ident: TestEnv) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($env: $crate::TestEnv) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn distributed() {
                let env = $crate::service_env!();
                body(env).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                body($crate::TestEnv::embedded().await).await
            }
        }
    };
}

/// One test's private slice of the real services (or of an embedded
/// database).
pub struct TestEnv {
    /// The database name.
    pub database: String,
    /// URL of the private database.
    pub database_url: String,
    /// The private namespace.
    pub namespace: String,
    /// Names within the namespace.
    pub topology: Topology,
    /// The ledger on the private database, migrated.
    pub ledger: Ledger,
    /// A broker connection in the namespace, core topology declared.
    pub broker: Broker,
    /// The embedded database's directory (embedded environments only).
    embedded_dir: Option<std::path::PathBuf>,
    /// Set by [`TestEnv::teardown`]; an environment dropped without it (a
    /// test that panicked or never tore down) is removed by `Drop`.
    torn_down: bool,
}

impl TestEnv {
    /// Creates the database, applies migrations, declares the core topology.
    ///
    /// # Panics
    ///
    /// When a service does not answer: the message names the service and
    /// URL so CI shows why the test could not run.
    pub async fn new() -> Self {
        match Self::reach_services().await {
            Ok(()) => Self::create().await,
            Err(why) => panic!("service-backed test could not run: {why}"),
        }
    }

    /// [`TestEnv::new`], or `None` (after printing why) when Postgres,
    /// RabbitMQ or Redis does not answer and services are not required.
    ///
    /// # Panics
    ///
    /// When a service does not answer and `BELFRY_REQUIRE_SERVICES=1`.
    pub async fn connect() -> Option<Self> {
        if services_available().await {
            Some(Self::create().await)
        } else {
            None
        }
    }

    /// Whether Postgres, RabbitMQ and Redis answer (nothing recorded).
    pub async fn services_reachable() -> bool {
        Self::reach_services().await.is_ok()
    }

    /// Checks that Postgres, RabbitMQ and Redis answer; the error names the
    /// one that does not.
    async fn reach_services() -> Result<(), String> {
        let admin = admin_database_url();
        let pg = tokio::time::timeout(Duration::from_secs(5), PgConnection::connect(&admin)).await;
        match pg {
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
            }
            Ok(Err(e)) => {
                return Err(format!(
                    "Postgres at {} is not reachable: {e}",
                    belfry_runtime::masked(&admin)
                ))
            }
            Err(_) => {
                return Err(format!(
                    "Postgres at {} did not answer within 5 s",
                    belfry_runtime::masked(&admin)
                ))
            }
        }
        let amqp = amqp_url();
        let addr = amqp
            .split('@')
            .next_back()
            .and_then(|rest| rest.split('/').next())
            .unwrap_or("127.0.0.1:5672")
            .to_owned();
        answers("RabbitMQ", &addr).await?;
        let redis = redis_url();
        let addr = redis
            .trim_start_matches("redis://")
            .split(['/', '?'])
            .next()
            .map(|hostport| hostport.rsplit('@').next().unwrap_or(hostport))
            .unwrap_or("127.0.0.1:6379")
            .to_owned();
        answers("Redis", &addr).await
    }

    /// The same environment on the embedded backends: a fresh SQLite
    /// database in a temporary directory and its job queue as the broker.
    ///
    /// # Panics
    ///
    /// When the temporary directory or database cannot be created.
    pub async fn embedded() -> Self {
        let id = Uuid::new_v4().simple().to_string();
        let dir = std::env::temp_dir().join(format!("belfry_t_{id}"));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let path = dir.join("belfry.db");
        let database_url = format!("sqlite://{}", path.display());
        let (ledger, namespace, topology) = migrated_in_namespace(&database_url, 8, &id).await;
        let queue =
            embedded_queue(&ledger).unwrap_or_else(|| panic!("an embedded ledger has a job queue"));
        let broker = Broker::embedded(queue, topology.clone());
        Self {
            database: path.display().to_string(),
            database_url,
            namespace,
            topology,
            ledger,
            broker,
            embedded_dir: Some(dir),
            torn_down: false,
        }
    }

    /// Whether this environment runs on the embedded backends.
    pub fn is_embedded(&self) -> bool {
        self.embedded_dir.is_some()
    }

    async fn create() -> Self {
        let id = Uuid::new_v4().simple().to_string();
        let database = format!("belfry_t_{id}");
        let admin = admin_database_url();
        let mut conn = PgConnection::connect(&admin).await.unwrap_or_else(|e| {
            panic!(
                "service-backed test could not run: Postgres at {} is not reachable: {e}",
                belfry_runtime::masked(&admin)
            )
        });
        sqlx::query(&format!("CREATE DATABASE {database}"))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("cannot create test database {database}: {e}"));
        let _ = conn.close().await;
        let database_url = with_database(&admin, &database);
        let (ledger, namespace, topology) = migrated_in_namespace(&database_url, 10, &id).await;
        let broker = Broker::connect(&amqp_url(), topology.clone(), "belfry-test")
            .await
            .unwrap_or_else(|e| panic!("service-backed test could not run: {e}"));
        broker
            .declare_core()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            database,
            database_url,
            namespace,
            topology,
            ledger,
            broker,
            embedded_dir: None,
            torn_down: false,
        }
    }

    /// Environment variables that point a `belfry-scheduler` or
    /// `belfry-worker` process at this environment.
    pub fn process_env(&self) -> Vec<(String, String)> {
        vec![
            ("DATABASE_URL".into(), self.database_url.clone()),
            ("AMQP_URL".into(), amqp_url()),
            ("REDIS_URL".into(), redis_url()),
            ("BELFRY_NAMESPACE".into(), self.namespace.clone()),
            // Several schedulers share the host: each API on a free port.
            ("BELFRY_API_ADDR".into(), "127.0.0.1:0".into()),
        ]
    }

    /// A confirming publisher in this namespace.
    pub async fn publisher(&self) -> Publisher {
        self.broker
            .publisher()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Claims a fire the way a scheduler does (row `claimed`) and publishes
    /// its message; returns the message. For worker tests that need no
    /// scheduler.
    pub async fn enqueue(
        &self,
        job_name: &str,
        job_type: &str,
        payload: serde_json::Value,
        at: DateTime<Utc>,
    ) -> JobMessage {
        self.enqueue_with(job_name, job_type, payload, at, JobOptions::default())
            .await
    }

    /// [`TestEnv::enqueue`] of a run carrying `options` (a schedule's or an
    /// ad-hoc request's: retry, timeout, limits), in its row and message.
    pub async fn enqueue_with(
        &self,
        job_name: &str,
        job_type: &str,
        payload: serde_json::Value,
        at: DateTime<Utc>,
        options: JobOptions,
    ) -> JobMessage {
        let trace = TraceContext::new_root();
        let key = run_key(job_name, at).unwrap_or_else(|e| panic!("{e}"));
        let run = NewRun {
            id: Uuid::now_v7(),
            job_name: job_name.into(),
            run_key: key.clone(),
            job_type: job_type.into(),
            payload: payload.clone(),
            scheduled_at: at,
            claimed_by: "test".into(),
            trace_id: trace.trace_id().map(str::to_owned),
            traceparent: Some(trace.traceparent.clone()),
            options: options.clone(),
            next_dispatch_at: Utc::now() + chrono::Duration::seconds(30),
        };
        assert!(
            self.ledger
                .claim(&run)
                .await
                .unwrap_or_else(|e| panic!("{e}")),
            "run {key} already exists"
        );
        let message = JobMessage {
            version: MESSAGE_VERSION,
            message_id: run.id,
            job_name: job_name.into(),
            job_type: job_type.into(),
            run_key: key,
            scheduled_at: at,
            published_at: Utc::now(),
            attempt: 1,
            payload,
            trace: Some(trace),
            options,
        };
        let outcome = self
            .publisher()
            .await
            .publish(&message)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            outcome,
            belfry_broker::PublishOutcome::Confirmed,
            "publish of {} not confirmed",
            message.run_key
        );
        message
    }

    /// Publishes raw bytes to the job exchange with `routing_key`.
    pub async fn publish_raw(&self, routing_key: &str, body: &[u8]) {
        if let Some(queue) = embedded_queue(&self.ledger) {
            let message = belfry_broker::OutgoingMessage {
                routing_key,
                body,
                message_id: None,
                traceparent: None,
            };
            queue
                .publish(&[message])
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            return;
        }
        let channel = self.broker_channel().await;
        channel
            .basic_publish(
                &self.topology.jobs_exchange(),
                routing_key,
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    async fn broker_channel(&self) -> lapin::Channel {
        let conn = lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        conn.create_channel()
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Takes every message now in the dead-letter queue: `(body, reason)`.
    pub async fn drain_dead_letters(&self) -> Vec<(Vec<u8>, String)> {
        if let Some(queue) = embedded_queue(&self.ledger) {
            return queue
                .drain_dead_letters()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let channel = self.broker_channel().await;
        let mut out = Vec::new();
        while let Some(msg) = channel
            .basic_get(
                &self.topology.dead_letter_queue(),
                BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
        {
            let reason = msg
                .delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| {
                    h.inner()
                        .get(belfry_protocol::topology::HEADER_DEAD_REASON)
                        .cloned()
                })
                .and_then(|v| v.as_long_string().map(|s| s.to_string()))
                .unwrap_or_default();
            out.push((msg.delivery.data.clone(), reason));
        }
        out
    }

    /// Waits until the run `(job_name, run_key)` is terminal, up to `within`.
    ///
    /// # Panics
    ///
    /// When it is not terminal in time; the message shows its last state.
    pub async fn wait_terminal(
        &self,
        job_name: &str,
        run_key: &str,
        within: Duration,
    ) -> RunRecord {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let run = self
                .ledger
                .run_by_key(job_name, run_key)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            if let Some(run) = &run {
                if run.status().is_ok_and(RunStatus::is_terminal) {
                    return run.clone();
                }
            }
            if tokio::time::Instant::now() > deadline {
                panic!("run {run_key} not terminal within {within:?}: {run:?}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// [`TestEnv::wait_terminal`] for the run of `message`.
    ///
    /// # Panics
    ///
    /// When it is not terminal in time.
    pub async fn wait_terminal_of(&self, message: &JobMessage, within: Duration) -> RunRecord {
        self.wait_terminal(&message.job_name, &message.run_key, within)
            .await
    }

    /// [`TestEnv::wait_terminal`] for the run of schedule `name`'s fire at
    /// `at`.
    ///
    /// # Panics
    ///
    /// When it is not terminal in time.
    pub async fn wait_fire(&self, name: &str, at: DateTime<Utc>, within: Duration) -> RunRecord {
        let key = run_key(name, at).unwrap_or_else(|e| panic!("{e}"));
        self.wait_terminal(name, &key, within).await
    }

    /// The stored schedule `name`.
    ///
    /// # Panics
    ///
    /// When there is no such schedule.
    pub async fn schedule(&self, name: &str) -> belfry_ledger::ScheduleRow {
        self.ledger
            .schedule(name)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no schedule {name:?}"))
    }

    /// Whether the stored schedule `name` is paused.
    ///
    /// # Panics
    ///
    /// When there is no such schedule.
    pub async fn paused(&self, name: &str) -> bool {
        self.schedule(name).await.paused
    }

    /// Starts an attempt of the run of `message` as `worker` would, under
    /// a lease of `lease`: the run's id and the attempt's number.
    ///
    /// # Panics
    ///
    /// When the run does not start (it is missing, finished, or another
    /// attempt holds its lease).
    pub async fn start_attempt(
        &self,
        message: &JobMessage,
        worker: &str,
        lease: Duration,
    ) -> (Uuid, i32) {
        let started = self
            .ledger
            .begin_attempt(message, worker, lease)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let belfry_ledger::AttemptStart::Started { id, attempt } = started else {
            panic!("run {} could not start: {started:?}", message.run_key)
        };
        (id, attempt)
    }

    /// Ends attempt `attempt` of run `id`, held by `worker`, with `status`,
    /// as that worker would; whether the ledger recorded it.
    pub async fn end_attempt(
        &self,
        id: Uuid,
        attempt: i32,
        worker: &str,
        status: RunStatus,
    ) -> bool {
        let entry = attempt_entry(attempt, worker, status);
        self.ledger
            .end_attempt(id, status, &entry, None, None)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Takes the run of `message` to `status` as `worker` would: starts an
    /// attempt and ends it.
    ///
    /// # Panics
    ///
    /// When the run cannot be started or the end is not recorded.
    pub async fn finish(&self, message: &JobMessage, worker: &str, status: RunStatus) {
        let (id, attempt) = self
            .start_attempt(message, worker, Duration::from_secs(60))
            .await;
        assert!(
            self.end_attempt(id, attempt, worker, status).await,
            "the end of {} was not recorded",
            message.run_key
        );
    }

    /// The run of `message`.
    ///
    /// # Panics
    ///
    /// When it has no row.
    pub async fn run_of(&self, message: &JobMessage) -> RunRecord {
        self.ledger
            .run_by_key(&message.job_name, &message.run_key)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no row for {}", message.run_key))
    }

    /// Every run of the environment, oldest fire first.
    pub async fn all_runs(&self) -> Vec<RunRecord> {
        let mut runs = self
            .ledger
            .list_runs(&belfry_ledger::RunFilter::default(), None, i64::MAX)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        runs.sort_by(|a, b| (a.scheduled_at, &a.job_name).cmp(&(b.scheduled_at, &b.job_name)));
        runs
    }

    /// Declares the worker group `default`, bound to `job_types` (most
    /// tests run one group of that name and tear it down at the end).
    pub async fn declare_default_group(&self, job_types: &[&str]) {
        self.broker
            .declare_group("default", job_types)
            .await
            .unwrap_or_else(|e| panic!("declaring the default group: {e}"));
    }

    /// Drops the database, the namespace's AMQP objects (for `groups`, and
    /// the `default` group, which a test's processes may have declared
    /// whatever the test names) and its Redis keys.
    pub async fn teardown(mut self, groups: &[&str]) {
        self.torn_down = true;
        let mut all = groups.to_vec();
        all.extend(DROPPED_ENV_GROUPS.iter().filter(|g| !groups.contains(g)));
        let _ = self.broker.delete_namespace(&all).await;
        self.broker.close().await;
        self.ledger.close().await;
        if let Some(dir) = &self.embedded_dir {
            let _ = std::fs::remove_dir_all(dir);
            return;
        }
        remove_database_and_keys(&self.database, &self.namespace).await;
    }
}

/// The groups whose queues an environment dropped without
/// [`TestEnv::teardown`] deletes: the one most tests run. A test of other
/// groups tears down with their names. Leftovers (other groups, or a queue
/// a worker still running declared again after the delete) are swept by
/// `scripts/rabbitmq-sweep`, which `scripts/test` runs before and after.
const DROPPED_ENV_GROUPS: &[&str] = &["default"];

/// How long a dropped environment's clean-up may take.
const DROP_CLEANUP_WITHIN: Duration = Duration::from_secs(20);

impl Drop for TestEnv {
    /// Removes what a test that panicked or never called
    /// [`TestEnv::teardown`] left: its queues above all. Each leftover
    /// quorum queue holds file handles on the broker (three on RabbitMQ
    /// 3.10), and a node started with the usual limit of 1,024 stops
    /// accepting connections after about 300 of them: every later test
    /// then fails with "no answer" (issue 24's CI run, RELIABILITY.md).
    fn drop(&mut self) {
        if self.torn_down {
            return;
        }
        if let Some(dir) = &self.embedded_dir {
            let _ = std::fs::remove_dir_all(dir);
            return;
        }
        let (topology, database, namespace) = (
            self.topology.clone(),
            self.database.clone(),
            self.namespace.clone(),
        );
        // Drop runs inside the test's runtime, where blocking on another
        // future panics: the clean-up runs on a thread with a runtime of
        // its own (and its own broker connection), joined so that it ends
        // before the test does.
        let cleanup = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            // Bounded: a service that stopped answering (the fault suite
            // restarts them) must not hold the test up; the sweep of
            // `scripts/test` removes what is left.
            runtime.block_on(async move {
                let _ = tokio::time::timeout(DROP_CLEANUP_WITHIN, async {
                    if let Ok(broker) =
                        Broker::connect(&amqp_url(), topology, "belfry-test-cleanup").await
                    {
                        let _ = broker.delete_namespace(DROPPED_ENV_GROUPS).await;
                        broker.close().await;
                    }
                    remove_database_and_keys(&database, &namespace).await;
                })
                .await;
            });
        });
        let _ = cleanup.join();
    }
}

/// Drops a test's database (its connections too) and its Redis keys.
async fn remove_database_and_keys(database: &str, namespace: &str) {
    if let Ok(mut conn) = PgConnection::connect(&admin_database_url()).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
            .execute(&mut conn)
            .await;
    }
    if let Ok(client) = redis::Client::open(redis_url()) {
        if let Ok(mut conn) = client.get_multiplexed_async_connection().await {
            // KEYS is fine here: a test Redis holds a handful of keys.
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{namespace}:*"))
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: Result<(), _> = redis::AsyncCommands::del(&mut conn, keys).await;
            }
        }
    }
}

/// Spawns `command` (a `belfry dev`-like process that prints `API
/// http://host:port/v1` in its banner), waits up to 60 s for that line and
/// returns the child and the API's base URL (`http://host:port`). The
/// child's stdout is drained in the background for its whole life (logs go
/// there too), so it never blocks on a full pipe.
///
/// # Panics
///
/// When the process cannot start or prints no API line in time.
pub async fn spawn_with_api(
    mut command: tokio::process::Command,
) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt as _;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the process: {e}"));
    let stdout = child
        .stdout
        .take()
        .unwrap_or_else(|| panic!("no stdout pipe"));
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let url = line
                .trim_start()
                .strip_prefix("API")
                .and_then(|rest| rest.split_whitespace().next());
            if let Some(url) = url.filter(|u| u.starts_with("http")) {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(url.trim_end_matches("/v1").to_owned());
                }
            }
        }
    });
    let api = tokio::time::timeout(Duration::from_secs(60), rx)
        .await
        .unwrap_or_else(|_| panic!("no API line within 60 s"))
        .unwrap_or_else(|_| panic!("the process ended without an API line"));
    (child, api)
}

/// A new file under the temporary directory holding `text`: a schedule
/// file for a process under test (the caller removes it).
///
/// # Panics
///
/// When it cannot be written.
pub fn temp_schedule_file(text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("belfry-{}.toml", Uuid::new_v4().simple()));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// The text of a schedule file holding one schedule, `name`: a `noop`
/// every second.
pub fn noop_every_second(name: &str) -> String {
    format!("[[schedule]]\nname = \"{name}\"\nevery = \"1s\"\njob_type = \"noop\"\n")
}

/// Kills the processes it still holds when dropped: a failed assertion
/// leaves no binary running after the test. Take a process out of `.0`
/// to stop it gracefully ([`terminate`]).
#[derive(Debug, Default)]
pub struct Reaper(pub Vec<std::process::Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A command for the service binary `bin` (`belfry-scheduler`,
/// `belfry-worker` or a worker built on belfry) pointed at `env` (see
/// [`TestEnv::process_env`]) as instance `instance`, its stdout discarded.
pub fn service_command(bin: &str, env: &TestEnv, instance: &str) -> std::process::Command {
    let mut command = std::process::Command::new(bin);
    command
        .envs(env.process_env())
        .env("BELFRY_INSTANCE", instance)
        .stdout(std::process::Stdio::null());
    command
}

/// The stderr of a finished process that must have exited with code 1,
/// as the binaries do on bad settings and unreachable services.
///
/// # Panics
///
/// When it exited otherwise.
pub fn stderr_of_exit_1(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// [`stderr_of_exit_1`] where the error must be one line: the only line
/// on stderr that is not blank.
///
/// # Panics
///
/// When the process did not exit with 1 or wrote more or fewer lines.
pub fn one_line_exit_1(out: &std::process::Output) -> String {
    let stderr = stderr_of_exit_1(out);
    let lines = stderr.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(lines, 1, "one line expected: {stderr}");
    stderr
}

/// Waits for a child process to exit, off the async runtime's threads.
///
/// # Panics
///
/// When waiting fails.
pub async fn wait_exit(mut child: std::process::Child) -> std::process::ExitStatus {
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Sends SIGTERM to a child process and waits for it to exit.
///
/// # Panics
///
/// When the signal cannot be sent or waiting fails.
pub async fn terminate(child: std::process::Child) -> std::process::ExitStatus {
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(sent.success(), "kill -TERM {} failed", child.id());
    wait_exit(child).await
}

/// Whether `queue` exists (a passive declare succeeds).
pub async fn queue_exists(env: &TestEnv, queue: &str) -> bool {
    queue_len(env, queue).await.is_some()
}

/// Whether a worker consumes `queue`: it has a consumer, which a worker only
/// starts after binding the queue to its job types, so a publish from now
/// on is routed (a queue that merely exists may not be bound yet).
pub async fn queue_consumed(env: &TestEnv, queue: &str) -> bool {
    passive_declare(env, queue)
        .await
        .is_some_and(|q| q.consumer_count() > 0)
}

/// Waits (up to `within`) until a consumer is attached to `group`'s queue:
/// a worker process has started and bound it.
///
/// # Panics
///
/// When no consumer appears in time.
pub async fn wait_consumed(env: &TestEnv, group: &str, within: Duration) {
    let queue = env.topology.group_queue(group);
    eventually("the worker's queue", within, || async {
        queue_consumed(env, &queue).await.then_some(())
    })
    .await;
}

/// Waits (up to `within`) until the run of `message` is `running`.
///
/// # Panics
///
/// When it is not in time.
pub async fn wait_running(env: &TestEnv, message: &JobMessage, within: Duration) {
    wait_run(env, message, "the job to start", within, |run| {
        run.status_text == "running"
    })
    .await;
}

/// Waits (up to `within`) until the run of `message` has a row for which
/// `ready` holds, and returns that row; `what` says what was awaited.
///
/// # Panics
///
/// When it is not in time.
pub async fn wait_run(
    env: &TestEnv,
    message: &JobMessage,
    what: &str,
    within: Duration,
    ready: impl Fn(&RunRecord) -> bool,
) -> RunRecord {
    eventually(what, within, || async {
        let run = env
            .ledger
            .run_by_key(&message.job_name, &message.run_key)
            .await
            .ok()
            .flatten()?;
        ready(&run).then_some(run)
    })
    .await
}

/// The job queue in an embedded ledger's file; `None` on Postgres.
pub fn embedded_queue(ledger: &Ledger) -> Option<JobQueue> {
    ledger
        .embedded_file()
        .map(|f| JobQueue::new(f.reader, f.writer, f.session, f.queue_ready))
}

/// Counts messages currently in `queue`, or `None` when it does not exist.
pub async fn queue_len(env: &TestEnv, queue: &str) -> Option<u32> {
    if let Some(q) = embedded_queue(&env.ledger) {
        let ready = q.depth(queue).await.unwrap_or_else(|e| panic!("{e}"));
        return u32::try_from(ready).ok();
    }
    passive_declare(env, queue).await.map(|q| q.message_count())
}

/// The broker's view of `queue`, or `None` when it does not exist.
async fn passive_declare(env: &TestEnv, queue: &str) -> Option<lapin::Queue> {
    // A passive declare fails, and closes its channel, when the queue is
    // missing: every call opens a fresh channel.
    let channel = env.broker_channel().await;
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue, passive, FieldTable::default())
        .await
        .ok()
}

/// A run's status, attempts and worker, to check all three in one
/// `assert_eq!`.
pub fn run_outcome(run: &RunRecord) -> (&str, i32, Option<&str>) {
    (
        run.status_text.as_str(),
        run.attempts,
        run.worker.as_deref(),
    )
}

/// An attempt of `worker` that started and ended now with `status`.
pub fn attempt_entry(attempt: i32, worker: &str, status: RunStatus) -> belfry_ledger::AttemptEntry {
    belfry_ledger::AttemptEntry {
        attempt,
        worker: worker.into(),
        started_at: Utc::now(),
        finished_at: Utc::now(),
        outcome: status.as_str().into(),
        error: None,
        log_lines: None,
        result: None,
    }
}

/// Polls `check` every 20 ms until it returns `Some`, up to `within`.
///
/// # Panics
///
/// When `within` passes first; the message says what was awaited.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The ledger at `database_url` (at most `connections`), migrated, and the
/// namespace `t{id}` with its names.
async fn migrated_in_namespace(
    database_url: &str,
    connections: u32,
    id: &str,
) -> (Ledger, String, Topology) {
    let ledger = Ledger::connect(database_url, connections)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    ledger.migrate().await.unwrap_or_else(|e| panic!("{e}"));
    let namespace = format!("t{id}");
    let topology = Topology::new(&namespace).unwrap_or_else(|e| panic!("{e}"));
    (ledger, namespace, topology)
}

/// `url` (a Postgres URL) with its database replaced by `database`.
pub fn with_database(url: &str, database: &str) -> String {
    // Replace the path of the admin URL with the new database's name.
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_start = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = base[authority_start..]
        .find('/')
        .map(|i| i + authority_start)
        .unwrap_or(base.len());
    let mut out = format!("{}/{database}", &base[..path_start]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn replaces_the_database() {
        assert_eq!(
            super::with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            super::with_database("postgres://h?sslmode=off", "x"),
            "postgres://h/x?sslmode=off"
        );
    }
}
