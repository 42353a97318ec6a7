//! A scheduler replica: the timer loop that claims and dispatches fires.
//!
//! [`Replica::start`] wires the real services from a [`SchedulerConfig`];
//! [`Replica::tick_once`] drives one step with an explicit instant (tests);
//! [`Replica::run`] is the loop a `belfry-scheduler` process runs until its
//! shutdown token is cancelled.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use belfry_broker::Broker;
use belfry_ledger::Ledger;
use belfry_protocol::Topology;
use belfry_runtime::SharedClock;

use belfry_dispatch::{DispatchOutcome, Dispatcher, Reconciler};

use crate::claim::{ClaimOutcome, Claimer};
use crate::counters::FireCounters;
use crate::lock::ClaimLock;
use crate::schedule::Schedule;
use crate::timer::Timer;
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
    /// The fire could not be claimed (ledger unreachable).
    ClaimFailed {
        /// Why.
        reason: String,
    },
}

/// The longest single sleep of the timer loop. Sleeps run on the monotonic
/// clock while fire instants are wall-clock times; waking at least this
/// often re-reads the wall clock, so an NTP step or a suspended VM delays a
/// far-away fire by at most this much.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// Timing settings of a replica.
#[derive(Debug, Clone)]
pub struct ReplicaTiming {
    /// Fires claimed and published concurrently.
    pub max_inflight: usize,
    /// How long in-flight fires may finish after shutdown.
    pub shutdown_timeout: Duration,
    /// A claimed run not confirmed by then is republished by the reconciler.
    pub confirm_grace: Duration,
    /// How often the reconciler looks at the outbox.
    pub reconcile_interval: Duration,
}

impl Default for ReplicaTiming {
    fn default() -> Self {
        Self {
            max_inflight: 64,
            shutdown_timeout: Duration::from_secs(30),
            confirm_grace: Duration::from_secs(30),
            reconcile_interval: Duration::from_secs(1),
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
}

impl Replica {
    /// Connects to the services of `config`, applies migrations, declares
    /// the broker topology, loads the schedule file and stores its
    /// schedules. Returns the replica and its schedules.
    ///
    /// # Errors
    ///
    /// [`SchedulerError`] naming the service (URL masked), file or schedule
    /// that is wrong.
    pub async fn start(
        config: &SchedulerConfig,
    ) -> Result<(Self, Vec<Arc<Schedule>>), SchedulerError> {
        let schedules = schedule_file::load(&config.schedules_path)?;
        let topology = Topology::new(&config.namespace)?;
        let ledger = Ledger::connect(&config.database_url, config.db_pool).await?;
        ledger.migrate().await?;
        for s in &schedules {
            ledger.upsert_schedule(&s.to_row()).await?;
        }
        let broker = Broker::connect(
            &config.amqp_url,
            topology.clone(),
            &format!("belfry-scheduler {}", config.instance),
        )
        .await?;
        broker.declare_core().await?;
        let lock = match &config.redis_url {
            Some(url) => match ClaimLock::new(url, topology, &config.instance, config.lock_ttl) {
                Ok(lock) => Some(lock),
                Err(e) => {
                    tracing::warn!(error = %e, "REDIS_URL unusable; claiming through the database only");
                    None
                }
            },
            None => None,
        };
        let timing = ReplicaTiming {
            max_inflight: config.max_inflight_fires,
            shutdown_timeout: config.shutdown_timeout,
            confirm_grace: config.confirm_grace,
            reconcile_interval: config.reconcile_interval,
        };
        let replica = Self::new(&config.instance, lock, ledger, broker, timing);
        Ok((replica, schedules.into_iter().map(Arc::new).collect()))
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
            reconciler: Reconciler::new(ledger, dispatcher.clone(), Duration::from_secs(30), 500),
            dispatcher,
            counters,
            timing: ReplicaTiming {
                max_inflight: timing.max_inflight.max(1),
                ..timing
            },
            broker,
        }
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

    /// This replica's counters.
    pub fn counters(&self) -> &Arc<FireCounters> {
        &self.counters
    }

    /// Claims and, when won, dispatches the fire of `schedule` at `at`.
    pub async fn fire(&self, schedule: &Schedule, at: DateTime<Utc>) -> FireOutcome {
        FireCounters::add(&self.counters.fires, 1);
        let run = match self.claimer.claim(schedule, at).await {
            Ok(ClaimOutcome::Won(run)) => run,
            Ok(ClaimOutcome::LostAtLock | ClaimOutcome::LostAtLedger) => return FireOutcome::Lost,
            Err(e) => {
                FireCounters::add(&self.counters.claim_errors, 1);
                tracing::error!(schedule = %schedule.name, %at, error = %e, "fire could not be claimed");
                return FireOutcome::ClaimFailed {
                    reason: e.to_string(),
                };
            }
        };
        tracing::info!(run_key = %run.run_key, id = %run.id, trace_id = run.trace_id.as_deref().unwrap_or(""), "fire claimed");
        match self.dispatcher.dispatch(&run.to_message()).await {
            Ok(DispatchOutcome::Dispatched) => {
                FireCounters::add(&self.counters.published, 1);
                FireOutcome::Dispatched { id: run.id }
            }
            Ok(DispatchOutcome::Unroutable) => {
                FireCounters::add(&self.counters.unroutable, 1);
                FireOutcome::Unroutable { id: run.id }
            }
            Ok(DispatchOutcome::NotConfirmed(reason)) => {
                FireCounters::add(&self.counters.publish_errors, 1);
                FireOutcome::NotConfirmed { id: run.id, reason }
            }
            Err(e) => {
                FireCounters::add(&self.counters.publish_errors, 1);
                tracing::error!(run_key = %run.run_key, error = %e, "dispatch could not be recorded; the run stays claimed");
                FireOutcome::NotConfirmed {
                    id: run.id,
                    reason: e.to_string(),
                }
            }
        }
    }

    /// One step of the loop at instant `now`: fires everything `timer` has
    /// due and waits for all of them.
    pub async fn tick_once(&self, timer: &mut Timer, now: DateTime<Utc>) -> Vec<FireOutcome> {
        let fires = timer.due(now);
        self.count_skipped(&fires);
        futures::future::join_all(fires.iter().map(|f| self.fire(&f.schedule, f.at))).await
    }

    fn count_skipped(&self, fires: &[crate::Fire]) {
        for f in fires.iter().filter(|f| f.skipped > 0) {
            FireCounters::add(&self.counters.misfires_skipped, f.skipped);
            tracing::warn!(schedule = %f.schedule.name, skipped = f.skipped, fired = %f.at,
                "timer woke late; fired the latest due instant and skipped the earlier ones");
        }
    }

    /// Runs the timer loop and the outbox reconciler until `cancel`,
    /// reading time from `clock`.
    ///
    /// On cancellation it stops firing, then waits up to the shutdown
    /// timeout for in-flight claims and publishes to finish.
    pub async fn run(
        self: Arc<Self>,
        mut timer: Timer,
        clock: SharedClock,
        cancel: CancellationToken,
    ) {
        let reconciling = {
            let this = self.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                this.reconciler
                    .run(this.timing.reconcile_interval, cancel)
                    .await
            })
        };
        let permits = Arc::new(Semaphore::new(self.timing.max_inflight));
        let mut inflight = JoinSet::new();
        tracing::info!(instance = %self.instance, schedules = timer.len(), "scheduler replica running");
        'ticks: loop {
            while inflight.try_join_next().is_some() {}
            let wait = match timer.next_at() {
                Some(next) => (next - clock.now()).to_std().unwrap_or(Duration::ZERO),
                None => MAX_SLEEP,
            };
            tokio::select! {
                // Biased towards shutdown: once cancelled, no new fire is
                // claimed even if one is due at the same moment.
                biased;
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(wait.min(MAX_SLEEP)) => {}
            }
            let fires = timer.due(clock.now());
            self.count_skipped(&fires);
            for fire in fires {
                // Waiting for a permit bounds in-flight fires; the timer
                // catches up afterwards because instants come from the
                // schedule, not from when this loop gets to them. Shutdown
                // ends the wait: fires not yet started are not claimed.
                let permit = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break 'ticks,
                    p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'ticks },
                };
                let this = self.clone();
                inflight.spawn(async move {
                    let _permit = permit;
                    this.fire(&fire.schedule, fire.at).await
                });
            }
        }
        let pending = inflight.len();
        tracing::info!(
            pending,
            "stopping: finishing in-flight claims and publishes"
        );
        let drained = tokio::time::timeout(self.timing.shutdown_timeout, async {
            while inflight.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                left = inflight.len(),
                "shutdown deadline passed; unfinished fires stay claimed for the reconciler"
            );
            inflight.abort_all();
        }
        let _ = reconciling.await;
        self.broker.close().await;
        tracing::info!(instance = %self.instance, "scheduler replica stopped");
    }
}
