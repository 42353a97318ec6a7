//! A scheduler replica: the timer loop that claims and dispatches fires.
//!
//! [`Replica::start`] wires the real services from a [`SchedulerConfig`];
//! [`Replica::tick_once`] drives one step with an explicit instant (tests);
//! [`Replica::run`] is the loop a `belfry-scheduler` process runs until its
//! shutdown token is cancelled.
//!
//! One concern a file:
//!
//! - this file: the replica, its settings, and its wiring to the services;
//! - [`fire_path`]: a fire (or a batch of them) from claim to dispatch, and
//!   the operator's manual trigger and backfill, which go the same way;
//! - [`claim_order`]: claims of one schedule stored in the order of its
//!   instants, however many batches are in flight;
//! - [`missed_fires`]: what this replica remembers about fires it could not
//!   make (missed, lost at the lock, skipped by a policy) until it can act,
//!   and the record of missed fires it keeps in the ledger meanwhile;
//! - [`recovering`]: the schedules whose misfire recovery is under way,
//!   whose timer fires wait for it;
//! - [`recovery`]: the misfire policies applied to missed fires, fires lost
//!   at the lock and runs that stopped moving;
//! - [`late_claims`]: the pass over fires claimed on time but never
//!   published, which the misfire policies decide before the outbox does;
//! - [`run_loop`]: the loop a process runs, and its background loops.

mod buffer_release;
mod claim_order;
mod fire_path;
mod follow_ups;
mod late_claims;
mod missed_fires;
mod recovering;
mod recovery;
mod run_loop;

pub use late_claims::{LateClaimPass, DEFAULT_LATE_CLAIM_PAGE};
pub use recovering::RecoveryWait;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use belfry_broker::{Broker, JobQueue};
use belfry_ledger::Ledger;
use belfry_protocol::Topology;
use belfry_runtime::SharedClock;
use tokio_util::sync::CancellationToken;

use belfry_dispatch::{Dispatcher, Reconciler};

use crate::claim::Claimer;
use crate::clock_guard::ClockGuard;
use crate::counters::FireCounters;
use crate::keeper_runtime::KeeperRuntime;
use crate::lock::ClaimLock;
use crate::schedule::Schedule;
use crate::schedule_sync::ScheduleSync;
use crate::shard_lease::{PassOutcome, ShardKeeper, ShardSettings};
use crate::timer_progress::TimerProgress;
use crate::{schedule_file, SchedulerConfig, SchedulerError};

/// What happened to one fire on this replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FireOutcome {
    /// This replica won and the broker confirmed the message.
    Dispatched {
        /// The run's id.
        id: Uuid,
    },
    /// Another replica owns the fire.
    Lost,
    /// This replica won but no worker group serves the job type; the run is
    /// `dead`.
    Unroutable {
        /// The run's id.
        id: Uuid,
    },
    /// This replica won but the publish was not confirmed; the run stays
    /// `claimed`.
    NotConfirmed {
        /// The run's id.
        id: Uuid,
        /// Why.
        reason: String,
    },
    /// This replica won, and the schedule's overlap policy holds the run
    /// `buffered` until the previous run ends.
    Buffered {
        /// The run's id.
        id: Uuid,
    },
    /// The fire was not claimed here on purpose (overlap, clock skew, its
    /// schedule's recovery under way).
    Skipped {
        /// Why.
        reason: SkipReason,
    },
    /// The fire could not be claimed (ledger unreachable).
    ClaimFailed {
        /// Why.
        reason: String,
    },
}

/// Why a fire was not claimed on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The schedule's overlap policy skipped it: its previous run is not
    /// finished.
    Overlap,
    /// The schedule's `remaining_runs` is at zero.
    RanOut,
    /// This replica's clock differs from the database's by more than the
    /// threshold, so it claims nothing (another replica does).
    ClockSkew {
        /// The last measured difference.
        skew_ms: i64,
    },
    /// The schedule's misfire recovery is under way: the fire is decided
    /// with the instants it recovers, as soon as it ends (see
    /// `replica::recovering`).
    Recovering,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::Overlap => f.write_str("overlap: the previous run is not finished"),
            SkipReason::RanOut => f.write_str("remaining_runs: the schedule has no runs left"),
            SkipReason::ClockSkew { skew_ms } => write!(
                f,
                "clock skew {skew_ms} ms beyond the threshold; this replica does not claim"
            ),
            SkipReason::Recovering => f.write_str(
                "the schedule's misfire recovery is under way; the fire is decided when it ends",
            ),
        }
    }
}

impl FireOutcome {
    /// A short name for spans and logs.
    pub fn label(&self) -> &'static str {
        match self {
            FireOutcome::Dispatched { .. } => "dispatched",
            FireOutcome::Lost => "lost",
            FireOutcome::Unroutable { .. } => "unroutable",
            FireOutcome::NotConfirmed { .. } => "not_confirmed",
            FireOutcome::Skipped { .. } => "skipped",
            FireOutcome::Buffered { .. } => "buffered",
            FireOutcome::ClaimFailed { .. } => "claim_failed",
        }
    }
}

/// A fire lost at the lock: the schedule, its instant, when it was lost.
type LockLoss = (Arc<Schedule>, DateTime<Utc>, std::time::Instant);

/// Connections of a sharded replica's lease passes, besides
/// `BELFRY_DB_POOL`: one for the pass, one for a recovery running beside it.
pub const LEASE_POOL: u32 = 2;

/// Default bound on fires in flight.
pub const DEFAULT_MAX_INFLIGHT: usize = 1024;
/// Default largest batch.
pub const DEFAULT_MAX_BATCH: usize = 256;

/// Timing settings of a replica.
#[derive(Debug, Clone)]
pub struct ReplicaTiming {
    /// Fires claimed and published concurrently.
    pub max_inflight: usize,
    /// Most fires claimed and published as one batch (fires due at the
    /// same moment; see [`Replica::fire_batch`]).
    pub max_batch: usize,
    /// How long in-flight fires may finish after shutdown.
    pub shutdown_timeout: Duration,
    /// A claimed run not confirmed by then is republished by the reconciler.
    pub confirm_grace: Duration,
    /// How often the reconciler looks at the outbox.
    pub reconcile_interval: Duration,
    /// Lateness within which a fire is on time (misfire policies).
    pub misfire_threshold: Duration,
    /// Clock skew beyond which this replica stops claiming.
    pub max_clock_skew: Duration,
    /// How often the clock is compared with the database's.
    pub clock_check_interval: Duration,
    /// A run with no progress for this long is reported stuck.
    pub stuck_after: Duration,
    /// Late claims read per page by the late-claim pass (see
    /// [`Replica::skip_late_claims_once`]); values below the largest
    /// `catch_up` `max` of the schedules can keep fewer fires than it says.
    pub late_claim_page: usize,
}

impl Default for ReplicaTiming {
    fn default() -> Self {
        Self {
            max_inflight: DEFAULT_MAX_INFLIGHT,
            max_batch: DEFAULT_MAX_BATCH,
            shutdown_timeout: Duration::from_secs(30),
            confirm_grace: Duration::from_secs(30),
            reconcile_interval: Duration::from_secs(1),
            misfire_threshold: crate::timer::DEFAULT_MISFIRE_THRESHOLD,
            max_clock_skew: Duration::from_secs(2),
            clock_check_interval: Duration::from_secs(10),
            stuck_after: Duration::from_secs(3600),
            late_claim_page: DEFAULT_LATE_CLAIM_PAGE,
        }
    }
}

/// One scheduler replica.
#[derive(Debug)]
pub struct Replica {
    instance: String,
    claimer: Claimer,
    dispatcher: Arc<Dispatcher>,
    reconciler: Reconciler,
    counters: Arc<FireCounters>,
    timing: ReplicaTiming,
    broker: Broker,
    ledger: Ledger,
    guard: Arc<ClockGuard>,
    missed: std::sync::Mutex<std::collections::VecDeque<(Arc<Schedule>, DateTime<Utc>)>>,
    /// Missed fires not yet recorded in the ledger (see [`missed_fires`]).
    unrecorded: std::sync::Mutex<Vec<belfry_ledger::MissedFire>>,
    /// Held while missed fires or skipped spans are stored: a caller that
    /// finds its queues empty must still wait for a write another caller
    /// has in flight before it claims anything newer (or forgets what it
    /// decided), or a crash could leave a newer run stored ahead of them.
    storing: tokio::sync::Mutex<()>,
    /// Cancelled when the run loop stops firing: ends the background
    /// recoveries.
    stopping: CancellationToken,
    recovering: Arc<recovering::Recovering>,
    /// The order in which batches in flight claim fires of a schedule.
    claim_order: Arc<claim_order::ClaimOrder>,
    lock_losses: std::sync::Mutex<std::collections::VecDeque<LockLoss>>,
    /// Spans of fires skipped by misfire policies, not yet recorded in the
    /// ledger (it may be unreachable when they are decided).
    pending_skips: std::sync::Mutex<std::collections::VecDeque<belfry_ledger::SkippedRange>>,
    /// The clock of everything this replica reads the time for outside its
    /// loops (which are handed theirs): confirm deadlines, manual runs'
    /// instants, lateness, operator actions.
    clock: SharedClock,
    /// Whether the timer loop moves (what shard leases are renewed on).
    progress: Arc<TimerProgress>,
    /// This replica's shard leases, when it shares the fires by shard
    /// (`None`: it races every fire).
    shards: Option<Arc<ShardKeeper>>,
    /// The thread and runtime the keeper's loop runs on, when it has its
    /// own (`None`: the caller's runtime).
    keeper_runtime: Option<Arc<KeeperRuntime>>,
}

impl Replica {
    /// Connects to the services of `config`, applies migrations, declares
    /// the broker topology, loads the schedule file and stores its
    /// schedules. Returns the replica and its schedules.
    ///
    /// A `sqlite:` `DATABASE_URL` runs the replica on the embedded database
    /// and its job queue (`AMQP_URL` is not used, and no lock is needed:
    /// one process owns the file).
    ///
    /// # Errors
    ///
    /// [`SchedulerError`] naming the service (URL masked), file or schedule
    /// that is wrong.
    pub async fn start(
        config: &SchedulerConfig,
    ) -> Result<(Self, ScheduleSync, Vec<Arc<Schedule>>), SchedulerError> {
        let topology = Topology::new(&config.namespace)?;
        let ledger = Ledger::connect_routed(
            &config.database_url,
            config.database_direct_url.as_deref(),
            config.db_pool,
        )
        .await?;
        // An embedded ledger's file holds the job queue too.
        let queue = ledger
            .embedded_file()
            .map(|f| JobQueue::new(f.reader, f.writer, f.session, f.queue_ready));
        let broker = Broker::embedded_or_connect(
            queue,
            &config.amqp_url,
            &config.amqp_tls,
            topology,
            &format!("belfry-scheduler {}", config.instance),
        )
        .await?;
        Self::start_on(config, ledger, broker).await
    }

    /// [`Replica::start`] on a ledger and broker the caller opened (the
    /// embedded single-process mode shares one database between the
    /// scheduler and the worker). `config`'s service URLs are not used,
    /// except on a distributed ledger: the Redis lock, and for a sharded
    /// replica a pool of [`LEASE_POOL`] connections to `config`'s database
    /// for its lease passes.
    ///
    /// # Errors
    ///
    /// [`SchedulerError`] naming the file or schedule that is wrong, or the
    /// service operation that failed.
    pub async fn start_on(
        config: &SchedulerConfig,
        ledger: Ledger,
        broker: Broker,
    ) -> Result<(Self, ScheduleSync, Vec<Arc<Schedule>>), SchedulerError> {
        let topology = broker.topology().clone();
        let specs = schedule_file::load(&config.schedules_path)?;
        ledger.migrate().await?;
        // The file is synced into the table (rows that did not change are
        // left alone, so replicas starting together do not wake each other);
        // the table is what every replica runs.
        let clock = belfry_runtime::process_clock();
        let now = clock.now();
        // Everything is checked before anything is stored: one bad schedule
        // refuses the file and leaves the stored ones untouched.
        let stored: std::collections::HashSet<String> = ledger
            .schedule_versions()
            .await?
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let mut rows = Vec::with_capacity(specs.len());
        for spec in &specs {
            let known = stored.contains(&spec.name);
            if known && spec.after.is_some() {
                // "after" was turned into an instant when first stored;
                // storing it again would move the run.
                continue;
            }
            // New: a one-shot instant must still be ahead.
            rows.push(Schedule::storable_row(spec, now, !known)?);
        }
        for row in &rows {
            ledger.upsert_schedule(row).await?;
        }
        if config.prune_schedules {
            let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
            for gone in ledger.delete_schedules_except(&names).await? {
                tracing::info!(schedule = %gone, "deleted: not in the schedule file (BELFRY_SCHEDULES_PRUNE)");
            }
        }
        broker.declare_core().await?;
        // One process owns an embedded database: there is nobody to race.
        let redis_url = config.redis_url.as_ref().filter(|_| !ledger.is_embedded());
        let lock = match redis_url {
            Some(url) => match ClaimLock::with_tls(
                url,
                &config.redis_tls,
                topology,
                &config.instance,
                config.lock_ttl,
            ) {
                Ok(lock) => Some(lock),
                Err(e) => {
                    tracing::warn!(error = %e, "REDIS_URL unusable; claiming through the database only");
                    None
                }
            },
            None => None,
        };
        let mut replica = Self::new(
            &config.instance,
            lock,
            ledger.clone(),
            broker,
            config.timing.clone(),
        )
        .with_clock(clock);
        let mut sync = ScheduleSync::new(ledger.clone());
        // One process owns an embedded database: it fires everything.
        if let Some(settings) = config.sharding.clone().filter(|_| !ledger.is_embedded()) {
            // Lease passes get a thread, a runtime and connections of
            // their own (see `Replica::sharded_apart`).
            replica = replica
                .sharded_apart(
                    settings,
                    &config.database_url,
                    config.database_direct_url.as_deref(),
                )
                .await?;
            if let Some(keeper) = &replica.shards {
                // The first pass takes this replica's share (or refuses a
                // shard count the running replicas do not use) before the
                // schedules are loaded: only the owned ones are.
                replica.first_pass().await?;
                sync = sync.with_shards(keeper.clone());
                let ttl = keeper.settings().lease_ttl;
                if ttl + keeper.settings().renew_every() > config.timing.misfire_threshold {
                    tracing::warn!(lease_ttl = ?ttl, misfire_threshold = ?config.timing.misfire_threshold,
                        "a dead replica's shards are taken after about BELFRY_SHARD_LEASE_TTL: \
                         with it above BELFRY_MISFIRE_THRESHOLD, its fires in between follow the misfire policy \
                         (skipped under skip / fire_once) instead of being made late");
                }
            }
        }
        let schedules = sync.load_all().await?;
        Ok((replica, sync, schedules))
    }

    /// A replica from already connected parts.
    pub fn new(
        instance: &str,
        lock: Option<ClaimLock>,
        ledger: Ledger,
        broker: Broker,
        timing: ReplicaTiming,
    ) -> Self {
        let counters = Arc::new(FireCounters::default());
        let dispatcher = Arc::new(Dispatcher::new(broker.clone(), ledger.clone()));
        Self {
            instance: instance.to_owned(),
            claimer: Claimer::new(
                lock,
                ledger.clone(),
                instance,
                counters.clone(),
                timing.confirm_grace,
            ),
            // The lease outlives a publish (10 s confirm timeout) with room.
            reconciler: Reconciler::new(
                ledger.clone(),
                dispatcher.clone(),
                Duration::from_secs(30),
                500,
            ),
            ledger,
            guard: Arc::new(ClockGuard::new(timing.max_clock_skew).for_instance(instance)),
            missed: std::sync::Mutex::new(std::collections::VecDeque::new()),
            unrecorded: std::sync::Mutex::new(Vec::new()),
            storing: tokio::sync::Mutex::new(()),
            stopping: CancellationToken::new(),
            recovering: Arc::default(),
            claim_order: Arc::default(),
            lock_losses: std::sync::Mutex::new(std::collections::VecDeque::new()),
            pending_skips: std::sync::Mutex::new(std::collections::VecDeque::new()),
            dispatcher,
            counters,
            timing: ReplicaTiming {
                max_inflight: timing.max_inflight.max(1),
                // A batch holds one permit per fire, so it can never need
                // more permits than exist.
                max_batch: timing.max_batch.clamp(1, timing.max_inflight.max(1)),
                ..timing
            },
            broker,
            clock: belfry_runtime::process_clock(),
            progress: Arc::default(),
            shards: None,
            keeper_runtime: None,
        }
    }

    /// The same replica sharing the fires by shard with `settings` (see
    /// [`crate::shard_lease`]): it fires only the schedules of the shards
    /// it holds. Give it its clock first ([`Replica::with_clock`]); the
    /// leases are taken by its loop, or by [`ShardKeeper::pass_once`].
    pub fn sharded(self, settings: ShardSettings) -> Self {
        let ledger = self.ledger.clone();
        self.sharded_on(settings, ledger)
    }

    /// [`Replica::sharded`], its lease passes on `ledger`: a handle of the
    /// same database with a pool of its own, so a lease is renewed on time
    /// while a burst's claims hold every connection of the replica's pool
    /// (a pass waiting in that pool's queue past the lease's expiry would
    /// lose the replica its shards in the middle of the burst).
    pub fn sharded_on(self, settings: ShardSettings, ledger: Ledger) -> Self {
        let keeper = ShardKeeper::new(
            ledger,
            &self.instance,
            settings,
            self.progress.clone(),
            self.clock.clone(),
        )
        .with_clock_guard(self.guard.clone());
        Self {
            shards: Some(Arc::new(keeper)),
            ..self
        }
    }

    /// [`Replica::sharded`], its keeper on a thread and runtime of its own
    /// (see [`crate::keeper_runtime`]) and its lease passes on a pool of
    /// [`LEASE_POOL`] connections to `url` (through `direct_url` when the
    /// ledger is behind a pooler) opened on that runtime: the leases are
    /// renewed on time while this replica's runtime is saturated by a
    /// burst and its pool is held by the burst's claims.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::KeeperThread`] when the thread cannot be started;
    /// [`SchedulerError::Ledger`] when the pool cannot connect.
    pub async fn sharded_apart(
        self,
        settings: ShardSettings,
        url: &str,
        direct_url: Option<&str>,
    ) -> Result<Self, SchedulerError> {
        let runtime = KeeperRuntime::start(&format!("belfry-keeper {}", self.instance))
            .map_err(SchedulerError::KeeperThread)?;
        let (url, direct_url) = (url.to_owned(), direct_url.map(str::to_owned));
        let leases =
            runtime
                .run(async move {
                    Ledger::connect_routed(&url, direct_url.as_deref(), LEASE_POOL).await
                })
                .await?;
        Ok(Self {
            keeper_runtime: Some(Arc::new(runtime)),
            ..self.sharded_on(settings, leases)
        })
    }

    /// One lease pass where the keeper's loop runs (its own runtime, when
    /// it has one), as the replica's first: nothing when it does not shard.
    ///
    /// # Errors
    ///
    /// As [`ShardKeeper::pass_once`].
    pub async fn first_pass(&self) -> Result<Option<PassOutcome>, belfry_ledger::LedgerError> {
        let Some(keeper) = self.shards.clone() else {
            return Ok(None);
        };
        let pass = async move { keeper.pass_once().await };
        match &self.keeper_runtime {
            Some(runtime) => runtime.run(pass).await.map(Some),
            None => pass.await.map(Some),
        }
    }

    /// Spawns the keeper's loop where it runs (its own runtime, when it
    /// has one), when this replica shards.
    pub(crate) fn spawn_keeper(
        &self,
        cancel: CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let keeping = self.shards.clone()?.run(cancel);
        Some(match &self.keeper_runtime {
            Some(runtime) => runtime.spawn(keeping),
            None => tokio::spawn(keeping),
        })
    }

    /// This replica's shard leases, when it shards.
    pub fn shard_keeper(&self) -> Option<&Arc<ShardKeeper>> {
        self.shards.as_ref()
    }

    /// Whether this replica's timer loop moves (see
    /// [`crate::timer_progress`]).
    pub fn timer_progress(&self) -> &Arc<TimerProgress> {
        &self.progress
    }

    /// The same replica on `clock` instead of the process's clock (tests,
    /// and applications with a clock of their own). Run its loop on the
    /// same clock ([`Replica::clock`]).
    pub fn with_clock(self, clock: SharedClock) -> Self {
        Self {
            claimer: self.claimer.with_clock(clock.clone()),
            clock,
            ..self
        }
    }

    /// This replica's clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The clock-skew guard of this replica (tests drive it one check at a
    /// time).
    pub fn clock_guard(&self) -> &ClockGuard {
        &self.guard
    }

    /// The outbox reconciler of this replica (tests drive it one pass at a
    /// time).
    pub fn reconciler(&self) -> &Reconciler {
        &self.reconciler
    }

    /// This replica's instance name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The ledger this replica claims in.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The broker connection this replica publishes on.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Whether each service answers now, for readiness: Postgres, RabbitMQ,
    /// and Redis (`None` when no lock is configured).
    pub async fn service_health(&self) -> (bool, bool, Option<bool>) {
        let redis = async {
            match self.claimer.lock() {
                Some(lock) => Some(lock.ping().await),
                None => None,
            }
        };
        tokio::join!(self.ledger.ping(), self.broker.is_connected(), redis)
    }

    /// The node of each service this replica uses (see
    /// [`belfry_runtime::service_nodes`]): the ledger's, the broker's
    /// (which follows a cluster failover) and the lock's.
    pub fn service_nodes(&self) -> belfry_runtime::service_nodes::ServiceNodes {
        let ledger = self.ledger.clone();
        let broker = self.broker.clone();
        let redis = self.claimer.lock().map(ClaimLock::node_source);
        belfry_runtime::service_nodes::ServiceNodes::default()
            .with("postgres", move || ledger.node())
            .with("rabbitmq", move || broker.node())
            .with("redis", move || redis.as_ref().and_then(|node| node()))
    }

    /// This replica's counters.
    pub fn counters(&self) -> &Arc<FireCounters> {
        &self.counters
    }

    /// This replica's Prometheus metrics (see [`FireCounters`]), for
    /// `belfry_runtime::metrics_server::serve` (feature `metrics-server`).
    pub fn metrics_registry(&self) -> prometheus_client::registry::Registry {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(self.counters.clone()));
        registry.register_collector(Box::new(self.service_nodes()));
        registry
    }
}
