//! A scheduler replica: the timer loop that claims and dispatches fires.
//!
//! [`Replica::start`] wires the real services from a [`SchedulerConfig`];
//! [`Replica::tick_once`] drives one step with an explicit instant (tests);
//! [`Replica::run`] is the loop a `belfry-scheduler` process runs until its
//! shutdown token is cancelled.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use belfry_broker::Broker;
use belfry_ledger::{LateClaim, Ledger};
use belfry_protocol::{ScheduleSpec, Topology};
use belfry_runtime::SharedClock;

use belfry_dispatch::{DispatchOutcome, Dispatcher, Reconciler};

use crate::claim::{ClaimOutcome, Claimer, FireSource};
use crate::clock_guard::ClockGuard;
use crate::counters::FireCounters;
use crate::lock::ClaimLock;
use crate::misfire::DueInstants;
use crate::schedule::Schedule;
use crate::schedule_sync::{ScheduleChange, ScheduleSync};
use crate::timer::{Skipped, Timer};
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
    /// The fire was not claimed here on purpose (overlap, clock skew).
    Skipped {
        /// Why.
        reason: String,
    },
    /// The fire could not be claimed (ledger unreachable).
    ClaimFailed {
        /// Why.
        reason: String,
    },
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
            FireOutcome::ClaimFailed { .. } => "claim_failed",
        }
    }
}

/// Every fire's outcome, once each slot is filled (a slot left empty would
/// be a bug; it reads as not fired rather than vanishing).
fn settled(outcomes: Vec<Option<FireOutcome>>) -> Vec<FireOutcome> {
    outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or(FireOutcome::ClaimFailed {
                reason: "not fired".into(),
            })
        })
        .collect()
}

/// What a misfire decision's due instants are (see [`Replica::decide`]).
#[derive(Debug, Clone, Copy)]
enum DueSpan<'a> {
    /// Every instant of the schedule in `(after, until]`.
    Between(DateTime<Utc>, DateTime<Utc>),
    /// Exactly these instants (sorted).
    Listed(&'a [DateTime<Utc>]),
}

/// The runs of consecutive instants (by the schedule's timetable) among
/// `instants` (sorted) that are not in `fired`: `(first, last, count)`.
fn consecutive_runs(
    schedule: &Schedule,
    instants: &[DateTime<Utc>],
    fired: &[DateTime<Utc>],
) -> Vec<(DateTime<Utc>, DateTime<Utc>, u64)> {
    let mut runs: Vec<(DateTime<Utc>, DateTime<Utc>, u64)> = Vec::new();
    for at in instants.iter().filter(|at| !fired.contains(at)) {
        match runs.last_mut() {
            Some((_, last, count)) if schedule.next_after(*last) == Some(*at) => {
                *last = *at;
                *count += 1;
            }
            _ => runs.push((*at, *at, 1)),
        }
    }
    runs
}

/// Consecutive late claims of one schedule, in page order.
fn by_schedule(page: Vec<LateClaim>) -> Vec<(String, Vec<LateClaim>)> {
    let mut groups: Vec<(String, Vec<LateClaim>)> = Vec::new();
    for claim in page {
        match groups.last_mut() {
            Some((name, runs)) if *name == claim.job_name => runs.push(claim),
            _ => groups.push((claim.job_name.clone(), vec![claim])),
        }
    }
    groups
}

/// A fire lost at the lock: the schedule, its instant, when it was lost.
type LockLoss = (Arc<Schedule>, DateTime<Utc>, std::time::Instant);

/// Default number of late claims read per page by the late-claim pass. At
/// least the largest `catch_up` `max` (10,000): a policy's decision for a
/// schedule needs its newest `max` late claims on one page.
pub const DEFAULT_LATE_CLAIM_PAGE: usize = 10_000;

/// What one late-claim pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LateClaimPass {
    /// Claims skipped by misfire policies.
    pub skipped: u64,
    /// Pages read (a pass reads every late claim, page by page).
    pub pages: u64,
}

/// How often fires this replica could not claim are looked at again.
const RECOVERY_INTERVAL: Duration = Duration::from_secs(5);
/// How long after losing a fire at the lock this replica checks that the
/// winner recorded it: far longer than a claim takes.
const LOCK_LOSS_CHECK_AFTER: Duration = Duration::from_secs(5);
/// Most missed fires remembered for recovery.
const MAX_REMEMBERED_MISSES: usize = 100_000;

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
    guard: ClockGuard,
    missed: std::sync::Mutex<std::collections::VecDeque<(Arc<Schedule>, DateTime<Utc>)>>,
    lock_losses: std::sync::Mutex<std::collections::VecDeque<LockLoss>>,
    /// Spans of fires skipped by misfire policies, not yet recorded in the
    /// ledger (it may be unreachable when they are decided).
    pending_skips: std::sync::Mutex<std::collections::VecDeque<belfry_ledger::SkippedRange>>,
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
        let ledger = Ledger::connect(&config.database_url, config.db_pool).await?;
        let broker = Broker::for_ledger(
            &ledger,
            &config.amqp_url,
            topology,
            &format!("belfry-scheduler {}", config.instance),
        )
        .await?;
        Self::start_on(config, ledger, broker).await
    }

    /// [`Replica::start`] on a ledger and broker the caller opened (the
    /// embedded single-process mode shares one database between the
    /// scheduler and the worker). `config`'s service URLs are not used;
    /// the Redis lock is only taken on a distributed ledger.
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
        let now = chrono::Utc::now();
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
        let mut sync = ScheduleSync::new(ledger.clone());
        let schedules = sync.load_all().await?;
        broker.declare_core().await?;
        // One process owns an embedded database: there is nobody to race.
        let redis_url = config.redis_url.as_ref().filter(|_| !ledger.is_embedded());
        let lock = match redis_url {
            Some(url) => match ClaimLock::new(url, topology, &config.instance, config.lock_ttl) {
                Ok(lock) => Some(lock),
                Err(e) => {
                    tracing::warn!(error = %e, "REDIS_URL unusable; claiming through the database only");
                    None
                }
            },
            None => None,
        };
        let replica = Self::new(
            &config.instance,
            lock,
            ledger,
            broker,
            config.timing.clone(),
        );
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
            guard: ClockGuard::new(timing.max_clock_skew),
            missed: std::sync::Mutex::new(std::collections::VecDeque::new()),
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
        }
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

    /// This replica's counters.
    pub fn counters(&self) -> &Arc<FireCounters> {
        &self.counters
    }

    /// Claims and, when won, dispatches the fire of `schedule` at `at`.
    ///
    /// A fire that cannot be claimed here (the ledger is unreachable, or
    /// this replica's clock is skewed) is remembered as missed; the recovery
    /// loop applies the schedule's misfire policy to it once claiming works
    /// again.
    pub async fn fire(&self, schedule: &Arc<Schedule>, at: DateTime<Utc>) -> FireOutcome {
        self.fire_with(schedule, at, FireSource::Timer).await
    }

    async fn fire_with(
        &self,
        schedule: &Arc<Schedule>,
        at: DateTime<Utc>,
        source: FireSource,
    ) -> FireOutcome {
        // The root of the run's trace: claim and publish are its children,
        // and the worker's spans continue under the publish span.
        // Its children carry only what they add (the instance is the
        // exporter's `service.instance.id`).
        let span = tracing::info_span!("fire", job.name = %schedule.name, job.type = %schedule.job_type,
            belfry.fire_at = %at, belfry.run_key = tracing::field::Empty,
            trace_id = tracing::field::Empty, belfry.outcome = tracing::field::Empty);
        let outcome = self
            .fire_inner(schedule, at, source, &span)
            .instrument(span.clone())
            .await;
        span.record("belfry.outcome", outcome.label());
        outcome
    }

    async fn fire_inner(
        &self,
        schedule: &Arc<Schedule>,
        at: DateTime<Utc>,
        source: FireSource,
        span: &tracing::Span,
    ) -> FireOutcome {
        FireCounters::add(&self.counters.fires, 1);
        if !self.guard.allows_claims() {
            FireCounters::add(&self.counters.skipped_clock_skew, 1);
            self.remember_missed_from(source, schedule, at);
            return FireOutcome::Skipped {
                reason: format!(
                    "clock skew {} ms beyond the threshold",
                    self.guard.last_skew_ms()
                ),
            };
        }
        let claimed = self.claimer.claim_from(schedule, at, source).await;
        let run = match claimed {
            Ok(ClaimOutcome::Won(run)) => {
                belfry_runtime::failpoint::hit("after_claim_before_publish");
                run
            }
            Ok(ClaimOutcome::LostAtLock) => {
                // Another replica holds the lock; if it dies before
                // recording the fire, nobody would. Check later that the
                // fire was recorded.
                self.remember_lock_loss(schedule, at);
                return FireOutcome::Lost;
            }
            Ok(ClaimOutcome::LostAtLedger) => return FireOutcome::Lost,
            Ok(ClaimOutcome::Overlapped) => {
                return FireOutcome::Skipped {
                    reason: "overlap: the previous run is not finished".into(),
                }
            }
            Err(e) => {
                FireCounters::add(&self.counters.claim_errors, 1);
                tracing::error!(schedule = %schedule.name, %at, error = %e, "fire could not be claimed; the misfire policy decides once the ledger is back");
                self.remember_missed_from(source, schedule, at);
                return FireOutcome::ClaimFailed {
                    reason: e.to_string(),
                };
            }
        };
        self.dispatch_won(&run, at, source, span).await
    }

    /// Claims and dispatches `fires` as one batch: one pipelined Redis
    /// round trip for the locks, one multi-row insert, publishes pipelined
    /// under a confirm window, one update marking the confirmed ones
    /// `dispatched`. Outcomes per fire, in order, exactly as [`Replica::fire`]
    /// would give them (a fire that could not be claimed is remembered for
    /// its misfire policy); every fire keeps its own `fire` span and trace.
    /// Schedules that forbid overlap take the single-fire path. A batch of
    /// one is a single fire. `source` says whether the lock is taken and how
    /// the runs are recorded (see [`FireSource`]).
    pub async fn fire_batch(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
    ) -> Vec<FireOutcome> {
        if let [(schedule, at)] = fires {
            return vec![self.fire_with(schedule, *at, source).await];
        }
        let (exclusive, shared): (Vec<usize>, Vec<usize>) = (0..fires.len())
            .partition(|i| fires[*i].0.overlap == crate::schedule::OverlapPolicy::Forbid);
        let single = futures::future::join_all(
            exclusive
                .iter()
                .map(|i| self.fire_with(&fires[*i].0, fires[*i].1, source)),
        );
        let shared_fires: Vec<(Arc<Schedule>, DateTime<Utc>)> =
            shared.iter().map(|i| fires[*i].clone()).collect();
        let batched = self.fire_shared(&shared_fires, source);
        let (single, batched) = tokio::join!(single, batched);
        let mut outcomes: Vec<Option<FireOutcome>> = vec![None; fires.len()];
        for (i, o) in exclusive.into_iter().zip(single) {
            outcomes[i] = Some(o);
        }
        for (i, o) in shared.into_iter().zip(batched) {
            outcomes[i] = Some(o);
        }
        settled(outcomes)
    }

    async fn fire_shared(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
    ) -> Vec<FireOutcome> {
        if fires.is_empty() {
            return Vec::new();
        }
        FireCounters::add(&self.counters.fires, fires.len() as u64);
        // Each fire is the root of its run's trace, as in the single path.
        let fire_spans: Vec<tracing::Span> = fires
            .iter()
            .map(|(schedule, at)| {
                tracing::info_span!(parent: None, "fire", job.name = %schedule.name, job.type = %schedule.job_type,
                    belfry.fire_at = %at, belfry.run_key = tracing::field::Empty,
                    trace_id = tracing::field::Empty, belfry.outcome = tracing::field::Empty)
            })
            .collect();
        let outcomes = self.fire_shared_inner(fires, source, &fire_spans).await;
        for (span, outcome) in fire_spans.iter().zip(&outcomes) {
            span.record("belfry.outcome", outcome.label());
        }
        outcomes
    }

    async fn fire_shared_inner(
        &self,
        fires: &[(Arc<Schedule>, DateTime<Utc>)],
        source: FireSource,
        fire_spans: &[tracing::Span],
    ) -> Vec<FireOutcome> {
        if !self.guard.allows_claims() {
            let reason = format!(
                "clock skew {} ms beyond the threshold",
                self.guard.last_skew_ms()
            );
            return fires
                .iter()
                .map(|(schedule, at)| {
                    FireCounters::add(&self.counters.skipped_clock_skew, 1);
                    self.remember_missed_from(source, schedule, *at);
                    FireOutcome::Skipped {
                        reason: reason.clone(),
                    }
                })
                .collect();
        }
        let claim_spans: Vec<tracing::Span> = fire_spans
            .iter()
            .map(|parent| {
                tracing::info_span!(parent: parent, "claim",
                    belfry.lock = source.uses_lock() && self.claimer.lock().is_some(),
                    belfry.claim = tracing::field::Empty)
            })
            .collect();
        let asked: Vec<(&Schedule, DateTime<Utc>)> =
            fires.iter().map(|(s, at)| (s.as_ref(), *at)).collect();
        let claims = self.claimer.claim_batch(&asked, &claim_spans, source).await;
        drop(claim_spans);
        let mut outcomes: Vec<Option<FireOutcome>> = vec![None; fires.len()];
        let mut won = Vec::new();
        for (i, claim) in claims.into_iter().enumerate() {
            let (schedule, at) = &fires[i];
            outcomes[i] = match claim {
                Ok(ClaimOutcome::Won(run)) => {
                    won.push((i, run));
                    None
                }
                Ok(ClaimOutcome::LostAtLock) => {
                    self.remember_lock_loss(schedule, *at);
                    Some(FireOutcome::Lost)
                }
                Ok(ClaimOutcome::LostAtLedger) => Some(FireOutcome::Lost),
                Ok(ClaimOutcome::Overlapped) => Some(FireOutcome::Skipped {
                    reason: "overlap: the previous run is not finished".into(),
                }),
                Err(reason) => {
                    FireCounters::add(&self.counters.claim_errors, 1);
                    self.remember_missed_from(source, schedule, *at);
                    Some(FireOutcome::ClaimFailed { reason })
                }
            };
        }
        if outcomes
            .iter()
            .any(|o| matches!(o, Some(FireOutcome::ClaimFailed { .. })))
        {
            tracing::error!(fires = fires.len(), "a batch of fires could not be claimed; the misfire policy decides once the ledger is back");
        }
        if !won.is_empty() {
            belfry_runtime::failpoint::hit("after_claim_before_publish");
            let mut messages = Vec::with_capacity(won.len());
            let mut parents = Vec::with_capacity(won.len());
            for (i, run) in &won {
                let span = &fire_spans[*i];
                span.record("belfry.run_key", run.run_key.as_str());
                span.record("trace_id", run.trace_id.as_deref().unwrap_or(""));
                span.in_scope(|| tracing::info!(run_key = %run.run_key, id = %run.id, trace_id = run.trace_id.as_deref().unwrap_or(""), "fire claimed"));
                messages.push(run.to_message());
                parents.push(span.clone());
            }
            let publishing = std::time::Instant::now();
            let dispatched = self.dispatcher.dispatch_many(&messages, &parents).await;
            let took = publishing.elapsed().as_secs_f64();
            for ((i, run), outcome) in won.into_iter().zip(dispatched) {
                outcomes[i] = Some(self.record_dispatch(run.id, fires[i].1, source, outcome, took));
            }
        }
        settled(outcomes)
    }

    /// Counts a dispatched fire and turns the broker's answer into its
    /// outcome.
    fn record_dispatch(
        &self,
        id: Uuid,
        at: DateTime<Utc>,
        source: FireSource,
        outcome: DispatchOutcome,
        publish_seconds: f64,
    ) -> FireOutcome {
        match outcome {
            DispatchOutcome::Dispatched => {
                FireCounters::add(&self.counters.published, 1);
                self.counters.publish_seconds.observe(publish_seconds);
                // A backfilled instant is late on purpose (days, maybe);
                // the lateness histogram is about the timer.
                if matches!(source, FireSource::Timer | FireSource::Recovery) {
                    let late = (Utc::now() - at).num_microseconds().unwrap_or(i64::MAX);
                    self.counters
                        .lateness_seconds
                        .observe(late.max(0) as f64 / 1e6);
                }
                FireOutcome::Dispatched { id }
            }
            DispatchOutcome::Unroutable => {
                FireCounters::add(&self.counters.unroutable, 1);
                FireOutcome::Unroutable { id }
            }
            DispatchOutcome::NotConfirmed(reason) => {
                FireCounters::add(&self.counters.publish_errors, 1);
                FireOutcome::NotConfirmed { id, reason }
            }
        }
    }

    /// Publishes a run this replica just claimed and records the outcome.
    async fn dispatch_won(
        &self,
        run: &belfry_ledger::NewRun,
        at: DateTime<Utc>,
        source: FireSource,
        span: &tracing::Span,
    ) -> FireOutcome {
        span.record("belfry.run_key", run.run_key.as_str());
        span.record("trace_id", run.trace_id.as_deref().unwrap_or(""));
        tracing::info!(run_key = %run.run_key, id = %run.id, trace_id = run.trace_id.as_deref().unwrap_or(""), "fire claimed");
        let publishing = std::time::Instant::now();
        match self.dispatcher.dispatch(&run.to_message()).await {
            Ok(outcome) => self.record_dispatch(
                run.id,
                at,
                source,
                outcome,
                publishing.elapsed().as_secs_f64(),
            ),
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

    /// Runs `schedule` now, outside its timetable (an operator's manual
    /// trigger): a run with its own run key, subject to the schedule's
    /// overlap policy unless `force`, published like any fire. Works on a
    /// paused schedule too: the operator asked for this run.
    pub async fn trigger(&self, schedule: &Schedule, force: bool) -> FireOutcome {
        let span = tracing::info_span!("trigger", job.name = %schedule.name, job.type = %schedule.job_type,
            belfry.force = force, belfry.run_key = tracing::field::Empty,
            trace_id = tracing::field::Empty, belfry.outcome = tracing::field::Empty);
        let outcome = async {
            if !self.guard.allows_claims() {
                return FireOutcome::Skipped {
                    reason: format!(
                        "clock skew {} ms beyond the threshold; this replica does not claim",
                        self.guard.last_skew_ms()
                    ),
                };
            }
            match self.claimer.claim_manual(schedule, force).await {
                Ok(ClaimOutcome::Won(run)) => {
                    self.dispatch_won(&run, run.scheduled_at, FireSource::Manual, &span)
                        .await
                }
                Ok(ClaimOutcome::Overlapped) => FireOutcome::Skipped {
                    reason: "overlap: the previous run is not finished (force to run anyway)"
                        .into(),
                },
                Ok(ClaimOutcome::LostAtLock | ClaimOutcome::LostAtLedger) => FireOutcome::Lost,
                Err(e) => {
                    FireCounters::add(&self.counters.claim_errors, 1);
                    FireOutcome::ClaimFailed {
                        reason: e.to_string(),
                    }
                }
            }
        }
        .instrument(span.clone())
        .await;
        span.record("belfry.outcome", outcome.label());
        outcome
    }

    /// Fires every instant of `schedule` in `instants` through the normal
    /// claim path as [`FireSource::Backfill`] (the ledger decides; no lock,
    /// which a timer may hold for the same instant), in batches: instants
    /// that already ran are found taken and not repeated. With `force`, a
    /// schedule that forbids overlap has its instants claimed as if it
    /// allowed it (they may then run at the same time).
    pub async fn backfill(
        &self,
        schedule: &Arc<Schedule>,
        instants: &[DateTime<Utc>],
        force: bool,
    ) -> Vec<(DateTime<Utc>, FireOutcome)> {
        let schedule = if force && schedule.overlap == crate::schedule::OverlapPolicy::Forbid {
            Arc::new(Schedule {
                overlap: crate::schedule::OverlapPolicy::Allow,
                ..Schedule::clone(schedule)
            })
        } else {
            schedule.clone()
        };
        let fires: Vec<(Arc<Schedule>, DateTime<Utc>)> =
            instants.iter().map(|at| (schedule.clone(), *at)).collect();
        let mut out = Vec::with_capacity(fires.len());
        for chunk in fires.chunks(self.timing.max_batch) {
            let outcomes = self.fire_batch(chunk, FireSource::Backfill).await;
            out.extend(chunk.iter().map(|(_, at)| *at).zip(outcomes));
        }
        out
    }

    /// Applies one schedule change to `timer`.
    pub fn apply_change(
        self: &Arc<Self>,
        timer: &mut Timer,
        change: ScheduleChange,
        now: DateTime<Utc>,
    ) {
        match change {
            ScheduleChange::Upsert(schedule) => {
                let changed = timer.upsert(schedule.clone(), now);
                tracing::info!(schedule = %schedule.name, changed, "schedule added, resumed or changed");
                if changed {
                    // A changed definition continues from now: its new
                    // instants before now were never due.
                    return;
                }
                // Fires missed while it was paused or absent follow its
                // misfire policy (nothing happens when it ran recently).
                let this = self.clone();
                tokio::spawn(async move {
                    if let Err(e) = this.recover_after_downtime(&[schedule], now).await {
                        tracing::warn!(error = %e, "misfire recovery for a changed schedule failed");
                    }
                });
            }
            ScheduleChange::Remove(name) => {
                if timer.remove(&name) {
                    tracing::info!(schedule = %name, "schedule removed or paused");
                }
            }
        }
    }

    /// One step of the loop at instant `now`: fires everything `timer` has
    /// due and waits for all of them.
    pub async fn tick_once(&self, timer: &mut Timer, now: DateTime<Utc>) -> Vec<FireOutcome> {
        let due = timer.due(now);
        self.count_skipped(&due.skipped);
        futures::future::join_all(due.fires.iter().map(|f| self.fire(&f.schedule, f.at))).await
    }

    /// Counts fires skipped by misfire policies and queues their spans for
    /// the ledger (see [`Replica::record_skipped_once`]), so no skipped
    /// instant is silently absent.
    fn count_skipped(&self, skipped: &[Skipped]) {
        let mut pending = self.pending_skips.lock().unwrap_or_else(|p| p.into_inner());
        for s in skipped {
            FireCounters::add(&self.counters.misfires_skipped, s.count);
            tracing::warn!(schedule = %s.schedule.name, skipped = s.count, policy = ?s.schedule.misfire,
                "missed fires skipped by the misfire policy");
            if let Some((after, until)) = s.span {
                pending.push_back(belfry_ledger::SkippedRange {
                    job_name: s.schedule.name.clone(),
                    after,
                    until,
                    skipped: s.count,
                    reason: format!(
                        "skipped by misfire policy {:?}: missed (no replica could claim them in time)",
                        s.schedule.misfire
                    ),
                    recorded_by: self.instance.clone(),
                });
            }
        }
        while pending.len() > MAX_REMEMBERED_MISSES {
            pending.pop_front();
        }
    }

    /// Records the queued spans of skipped fires in the ledger; returns how
    /// many. They stay queued when the ledger cannot be reached.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached.
    pub async fn record_skipped_once(&self) -> Result<usize, SchedulerError> {
        let taken: Vec<belfry_ledger::SkippedRange> = {
            let mut pending = self.pending_skips.lock().unwrap_or_else(|p| p.into_inner());
            pending.drain(..).collect()
        };
        if taken.is_empty() {
            return Ok(0);
        }
        let mut written = 0;
        for chunk in taken.chunks(1000) {
            if let Err(e) = self.ledger.record_skipped_ranges(chunk).await {
                // What was not written goes back in front, in its order.
                let mut pending = self.pending_skips.lock().unwrap_or_else(|p| p.into_inner());
                for r in taken[written..].iter().rev() {
                    pending.push_front(r.clone());
                }
                return Err(e.into());
            }
            written += chunk.len();
        }
        Ok(taken.len())
    }

    /// Remembers a fire that could not be claimed, for its misfire policy;
    /// a backfilled instant is not a miss (the operator learns it failed
    /// and backfills again).
    fn remember_missed_from(
        &self,
        source: FireSource,
        schedule: &Arc<Schedule>,
        at: DateTime<Utc>,
    ) {
        if source != FireSource::Backfill {
            self.remember_missed(schedule, at);
        }
    }

    fn remember_missed(&self, schedule: &Arc<Schedule>, at: DateTime<Utc>) {
        let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a very long outage keeps the latest instants (the
        // policies only ever need those) and counts the rest as skipped.
        if missed.len() >= MAX_REMEMBERED_MISSES {
            missed.pop_front();
            FireCounters::add(&self.counters.misfires_skipped, 1);
        }
        missed.push_back((schedule.clone(), at));
    }

    /// This replica's Prometheus metrics (see [`FireCounters`]), for
    /// [`belfry_runtime::metrics_server::serve`].
    pub fn metrics_registry(&self) -> prometheus_client::registry::Registry {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(self.counters.clone()));
        registry
    }

    /// Reports runs that stopped moving (see
    /// [`belfry_ledger::Ledger::mark_stuck`]): an error log line and a
    /// counter for each, and a `stuck: ...` reason in `job_runs`. Returns
    /// how many were found.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached.
    pub async fn report_stuck_once(&self) -> Result<usize, SchedulerError> {
        let stuck = self
            .ledger
            .mark_stuck(self.timing.stuck_after, 1_000)
            .await?;
        for (run_key, status, reason) in &stuck {
            FireCounters::add(&self.counters.stuck_runs, 1);
            tracing::error!(%run_key, %status, %reason, "run is stuck");
        }
        Ok(stuck.len())
    }

    fn remember_lock_loss(&self, schedule: &Arc<Schedule>, at: DateTime<Utc>) {
        let mut losses = self.lock_losses.lock().unwrap_or_else(|p| p.into_inner());
        if losses.len() >= MAX_REMEMBERED_MISSES {
            losses.pop_front();
        }
        losses.push_back((schedule.clone(), at, std::time::Instant::now()));
    }

    /// Checks the fires this replica lost at the Redis lock at least
    /// `after` ago: any that no replica recorded in the ledger (the lock
    /// holder died between the lock and the insert) is treated as missed
    /// and goes through the misfire policy, claimed through the ledger
    /// alone. Returns how many were missing.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be read (the
    /// entries are kept for the next pass).
    pub async fn verify_lock_losses_once(&self, after: Duration) -> Result<usize, SchedulerError> {
        let ready: Vec<(Arc<Schedule>, DateTime<Utc>)> = {
            let mut losses = self.lock_losses.lock().unwrap_or_else(|p| p.into_inner());
            let mut ready = Vec::new();
            while losses
                .front()
                .is_some_and(|(_, _, when)| when.elapsed() >= after)
            {
                if let Some((s, at, _)) = losses.pop_front() {
                    ready.push((s, at));
                }
            }
            ready
        };
        if ready.is_empty() {
            return Ok(0);
        }
        // Pairs are built together so a fire and its key can never drift apart
        // (a run key always builds for a validated schedule name).
        let ready: Vec<(Arc<Schedule>, DateTime<Utc>, String)> = ready
            .into_iter()
            .filter_map(|(s, at)| {
                belfry_protocol::run_key(&s.name, at)
                    .ok()
                    .map(|k| (s, at, k))
            })
            .collect();
        let keys: Vec<(String, String)> = ready
            .iter()
            .map(|(s, _, k)| (s.name.clone(), k.clone()))
            .collect();
        let recorded = match self.ledger.recorded_keys(&keys).await {
            Ok(r) => r,
            Err(e) => {
                let mut losses = self.lock_losses.lock().unwrap_or_else(|p| p.into_inner());
                for (s, at, _) in ready {
                    losses.push_front((s, at, std::time::Instant::now()));
                }
                return Err(e.into());
            }
        };
        let mut missing = 0;
        for (schedule, at, key) in &ready {
            if !recorded.contains(key) {
                missing += 1;
                tracing::warn!(run_key = %key, "a fire lost at the lock was never recorded (its holder died?); recovering it");
                self.remember_missed(schedule, *at);
            }
        }
        Ok(missing)
    }

    /// Applies each schedule's misfire policy to the fires this replica
    /// could not claim (ledger down, clock skewed), once claiming works
    /// again; returns the outcomes of the fires it made.
    pub async fn recover_missed_once(&self, now: DateTime<Utc>) -> Vec<FireOutcome> {
        let taken: std::collections::VecDeque<(Arc<Schedule>, DateTime<Utc>)> = {
            let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
            if missed.is_empty() {
                return Vec::new();
            }
            std::mem::take(&mut *missed)
        };
        if !self.guard.allows_claims() || !self.ledger.ping().await {
            // Still unable to claim: keep them for the next pass.
            let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
            missed.extend(taken);
            while missed.len() > MAX_REMEMBERED_MISSES {
                missed.pop_front();
                FireCounters::add(&self.counters.misfires_skipped, 1);
            }
            return Vec::new();
        }
        let mut by_schedule: std::collections::BTreeMap<
            String,
            (Arc<Schedule>, Vec<DateTime<Utc>>),
        > = Default::default();
        for (schedule, at) in taken {
            by_schedule
                .entry(schedule.name.clone())
                .or_insert_with(|| (schedule.clone(), Vec::new()))
                .1
                .push(at);
        }
        let mut fires = Vec::new();
        for (_, (schedule, mut instants)) in by_schedule {
            instants.sort_unstable();
            instants.dedup();
            let due = DueInstants {
                total: u64::try_from(instants.len()).unwrap_or(u64::MAX),
                latest: instants,
            };
            fires.extend(self.decide(&schedule, &due, now, DueSpan::Listed(&due.latest)));
        }
        let outcomes = self.fire_recovered(fires).await;
        if let Err(e) = self.record_skipped_once().await {
            tracing::warn!(error = %e, "cannot record skipped fires yet; retrying");
        }
        outcomes
    }

    /// Applies each schedule's misfire policy to the fires missed while no
    /// replica was running: the instants between the schedule's latest run
    /// in the ledger and `now`. Every replica does this at start; the claim
    /// path makes each recovered fire happen once.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be read.
    pub async fn recover_after_downtime(
        &self,
        schedules: &[Arc<Schedule>],
        now: DateTime<Utc>,
    ) -> Result<Vec<FireOutcome>, SchedulerError> {
        let names: Vec<String> = schedules.iter().map(|s| s.name.clone()).collect();
        let last = self.ledger.last_fires(&names).await?;
        let mut fires = Vec::new();
        for schedule in schedules {
            // Never ran: only a one-shot whose instant passed has a miss.
            let from = match last.get(&schedule.name) {
                Some(last) => *last,
                None => match schedule.first_instant() {
                    Some(at) => at - chrono::Duration::seconds(1),
                    None => continue,
                },
            };
            // Lateness counts from each fire's wake-up, as in the timer.
            let until = now - schedule.jitter_offset;
            let due = crate::misfire::due_between(schedule, from, until, schedule.misfire.keep());
            if due.total > 0 {
                fires.extend(self.decide(schedule, &due, now, DueSpan::Between(from, until)));
            }
        }
        let outcomes = self.fire_recovered(fires).await;
        self.record_skipped_once().await?;
        Ok(outcomes)
    }

    /// Applies misfire policies to fires that were claimed on time but never
    /// reached the broker (it was unreachable, or the claiming replica died)
    /// and are now late: the policy decides which of them the reconciler
    /// still publishes; the others become `dead` and are recorded in
    /// `skipped_fires`. Without this a ten-minute broker outage would
    /// publish six hundred fires of a one-second `fire_once` schedule at
    /// once.
    ///
    /// One pass reads every late claim, a page at a time, with a cursor:
    /// each page starts strictly after the last row decided, so a pass ends
    /// however many late claims there are (an hourly burst of thousands of
    /// schedules while the broker is down), and claims the policies keep do
    /// not make it read the same page again. A schedule is decided on the
    /// page holding its newest late claims, all of them when they fit; a
    /// schedule cut by the end of a page starts the next one instead. A
    /// schedule with more late claims than a page is decided on its newest
    /// page's worth, and its older claims on the following pages are skipped
    /// (no policy keeps more than the newest `max` ≤ a page). Returns how
    /// many were skipped.
    ///
    /// # Errors
    ///
    /// [`SchedulerError::Ledger`] when the ledger cannot be reached (what
    /// earlier pages decided stands).
    pub async fn skip_late_claims_once(
        &self,
        now: DateTime<Utc>,
    ) -> Result<LateClaimPass, SchedulerError> {
        let grace = self.timing.confirm_grace;
        let page_size = self.timing.late_claim_page.max(1);
        let limit = i64::try_from(page_size).unwrap_or(i64::MAX);
        let mut pass = LateClaimPass::default();
        let mut cursor: Option<(String, DateTime<Utc>)> = None;
        // The schedule whose newest claims were decided on an earlier page:
        // its rows on later pages are older than anything a policy keeps.
        let mut decided: Option<String> = None;
        loop {
            let page = self
                .ledger
                .late_claims(
                    self.timing.misfire_threshold,
                    grace,
                    limit,
                    cursor.as_ref().map(|(name, at)| (name.as_str(), *at)),
                )
                .await?;
            pass.pages += 1;
            let full = page.len() >= page_size;
            let mut groups = by_schedule(page);
            if full && groups.len() > 1 {
                // The last schedule may continue past the page: it starts
                // the next page, with its newest claims.
                groups.pop();
            }
            // Progress is a condition of looping: the next page starts after
            // the last row kept here, which is after the current cursor.
            let next = groups
                .last()
                .and_then(|(name, runs)| runs.last().map(|r| (name.clone(), r.scheduled_at)));
            // One statement per policy (the reason names it), not per
            // schedule: a burst of thousands of schedules costs a few.
            let mut drops: Vec<(crate::MisfirePolicy, Vec<uuid::Uuid>)> = Vec::new();
            for (name, runs) in &groups {
                let (policy, drop) = if decided.as_deref() == Some(name.as_str()) {
                    (
                        Self::schedule_of(runs).0,
                        runs.iter().map(|r| r.id).collect(),
                    )
                } else {
                    self.late_drops(runs, now)
                };
                match drops.iter_mut().find(|(p, _)| *p == policy) {
                    Some((_, ids)) => ids.extend(drop),
                    None => drops.push((policy, drop)),
                }
            }
            for (policy, ids) in drops {
                if ids.is_empty() {
                    continue;
                }
                let reason = format!("skipped by misfire policy {policy:?}: claimed on time but not published before it was late");
                let n = self
                    .ledger
                    .skip_claimed(&ids, &reason, &self.instance, grace)
                    .await?;
                if n > 0 {
                    FireCounters::add(&self.counters.misfires_skipped, n);
                    tracing::warn!(
                        ?policy,
                        skipped = n,
                        "late unpublished fires skipped by the misfire policy"
                    );
                }
                pass.skipped += n;
            }
            match next {
                Some(next) if full => {
                    decided = Some(next.0.clone());
                    cursor = Some(next);
                }
                _ => return Ok(pass),
            }
        }
    }

    /// The misfire policy and jitter of the schedule `runs` belong to, from
    /// the definition stored with them (the default policy when it cannot be
    /// read).
    fn schedule_of(runs: &[LateClaim]) -> (crate::MisfirePolicy, chrono::Duration) {
        runs.first()
            .and_then(|r| r.spec.clone())
            .and_then(|s| serde_json::from_value::<ScheduleSpec>(s).ok())
            .and_then(|s| Schedule::from_spec(&s).ok())
            .map_or(
                (crate::MisfirePolicy::default(), chrono::Duration::zero()),
                |s| (s.misfire, s.jitter_offset),
            )
    }

    /// Which of one schedule's newest late claims its policy skips.
    fn late_drops(
        &self,
        runs: &[LateClaim],
        now: DateTime<Utc>,
    ) -> (crate::MisfirePolicy, Vec<uuid::Uuid>) {
        let (policy, jitter) = Self::schedule_of(runs);
        let due = DueInstants {
            latest: runs.iter().rev().map(|r| r.scheduled_at).collect(),
            total: u64::try_from(runs.len()).unwrap_or(u64::MAX),
        };
        // Lateness counts from when the fire should have reached the broker
        // at the latest: its wake-up plus the confirm grace. A publish
        // retried right after the grace is on time.
        let grace = chrono::Duration::from_std(self.timing.confirm_grace).unwrap_or_default();
        let reference = now - grace - jitter;
        let mut keep = policy
            .decide(&due, reference, self.timing.misfire_threshold)
            .fire;
        if policy == crate::MisfirePolicy::FireOnce {
            // fire_once fires a missed instant only when no later fire made
            // it: a later published fire supersedes them all.
            keep.retain(|at| !runs.iter().any(|r| r.scheduled_at == *at && r.superseded));
        }
        let drop = runs
            .iter()
            .filter(|r| !keep.contains(&r.scheduled_at))
            .map(|r| r.id)
            .collect();
        (policy, drop)
    }

    /// The fires `schedule`'s misfire policy keeps of `due`, judged at
    /// `now`. Lateness counts from each fire's wake-up (its instant plus the
    /// schedule's jitter), as in the timer and the late-claim pass, so a
    /// jittered fire recovered soon after its wake-up is on time.
    ///
    /// `span` is what the due instants are: every instant of the schedule
    /// in `(after, until]`, or exactly the listed ones; the skipped ones are
    /// recorded as spans either way.
    fn decide(
        &self,
        schedule: &Arc<Schedule>,
        due: &DueInstants,
        now: DateTime<Utc>,
        span: DueSpan<'_>,
    ) -> Vec<(Arc<Schedule>, DateTime<Utc>)> {
        let decision = schedule.misfire.decide(
            due,
            now - schedule.jitter_offset,
            self.timing.misfire_threshold,
        );
        if decision.skipped > 0 {
            let skipped: Vec<Skipped> = match span {
                DueSpan::Between(after, until) => vec![Skipped {
                    schedule: schedule.clone(),
                    count: decision.skipped,
                    span: decision.skipped_span(after, until),
                }],
                // Listed instants need not be consecutive (others were
                // claimed meanwhile): one span per run of consecutive
                // skipped instants, so no span covers an instant nobody
                // decided on.
                DueSpan::Listed(instants) => consecutive_runs(schedule, instants, &decision.fire)
                    .into_iter()
                    .map(|(first, last, count)| Skipped {
                        schedule: schedule.clone(),
                        count,
                        span: Some((first - chrono::Duration::seconds(1), last)),
                    })
                    .collect(),
            };
            self.count_skipped(&skipped);
        }
        decision
            .fire
            .into_iter()
            .map(|at| (schedule.clone(), at))
            .collect()
    }

    async fn fire_recovered(&self, fires: Vec<(Arc<Schedule>, DateTime<Utc>)>) -> Vec<FireOutcome> {
        if !fires.is_empty() {
            tracing::info!(
                fires = fires.len(),
                "firing missed fires kept by the misfire policies"
            );
            FireCounters::add(
                &self.counters.misfires_recovered,
                u64::try_from(fires.len()).unwrap_or(u64::MAX),
            );
        }
        let mut outcomes = Vec::with_capacity(fires.len());
        // One batch at a time, each as large as the timer's.
        for chunk in fires.chunks(self.timing.max_batch) {
            outcomes.extend(self.fire_batch(chunk, FireSource::Recovery).await);
        }
        outcomes
    }

    /// Runs the timer loop and the outbox reconciler until `cancel`,
    /// reading time from `clock`.
    ///
    /// On cancellation it stops firing, then waits up to the shutdown
    /// timeout for in-flight claims and publishes to finish.
    pub async fn run(self: Arc<Self>, timer: Timer, clock: SharedClock, cancel: CancellationToken) {
        // No schedule changes arrive: the sender is kept (not dropped) so
        // the receiver never reports closed.
        let (_keep, changes) = mpsc::unbounded_channel();
        self.run_with_changes(timer, clock, cancel, changes).await;
    }

    /// [`Replica::run`], also applying schedule changes from `changes`
    /// (see [`crate::schedule_sync`]) to the timer as they arrive. A
    /// changed or resumed schedule first goes through misfire recovery for
    /// the fires it missed while paused or absent.
    pub async fn run_with_changes(
        self: Arc<Self>,
        mut timer: Timer,
        clock: SharedClock,
        cancel: CancellationToken,
        mut changes: mpsc::UnboundedReceiver<ScheduleChange>,
    ) {
        // The clock is checked once before anything is claimed (first
        // tick, misfire recovery), so a replica started with a wrong clock
        // claims nothing early (or late) while the guard's loop has not run
        // yet. A failed check keeps claims
        // allowed: the loop retries, and run keys cannot collide anyway.
        if let Err(e) = self.guard.check_once(&self.ledger, &clock).await {
            tracing::warn!(error = %e, "first clock check failed; the guard retries");
        }
        let reconciling = {
            let this = self.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                // Each pass: misfire policies for late unpublished fires
                // first, then the outbox, so the reconciler never publishes
                // a fire the policy skips.
                loop {
                    // A pass reads every late claim and always ends, so the
                    // outbox below runs after every pass, whatever the
                    // backlog.
                    if let Err(e) = this.skip_late_claims_once(chrono::Utc::now()).await {
                        tracing::warn!(error = %e, "late-claim pass failed; retrying");
                    }
                    let full = match this.reconciler.reconcile_once().await {
                        Ok(report) => {
                            FireCounters::add(
                                &this.counters.republished,
                                report.republished as u64,
                            );
                            report.more
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "outbox pass failed; retrying");
                            false
                        }
                    };
                    if full && !cancel.is_cancelled() {
                        continue;
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(this.timing.reconcile_interval) => {}
                    }
                }
            })
        };
        let guarding = {
            let this = self.clone();
            let cancel = cancel.clone();
            let clock = clock.clone();
            tokio::spawn(async move {
                this.guard
                    .run(
                        &this.ledger,
                        &clock,
                        this.timing.clock_check_interval,
                        cancel,
                    )
                    .await
            })
        };
        let recovering = {
            let this = self.clone();
            let cancel = cancel.clone();
            let clock = clock.clone();
            let schedules = timer.schedules();
            tokio::spawn(async move {
                // Fires missed while every replica was down, then fires this
                // replica could not claim, every few seconds.
                if let Err(e) = this.recover_after_downtime(&schedules, clock.now()).await {
                    tracing::error!(error = %e, "misfire recovery after downtime failed; those fires are not made");
                }
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(RECOVERY_INTERVAL) => {}
                    }
                    if let Err(e) = this.report_stuck_once().await {
                        tracing::warn!(error = %e, "cannot look for stuck runs; retrying");
                    }
                    if let Err(e) = this.verify_lock_losses_once(LOCK_LOSS_CHECK_AFTER).await {
                        tracing::warn!(error = %e, "cannot check fires lost at the lock; retrying");
                    }
                    this.recover_missed_once(clock.now()).await;
                    // Spans the timer skipped (a stalled timer) since the
                    // last pass.
                    if let Err(e) = this.record_skipped_once().await {
                        tracing::warn!(error = %e, "cannot record skipped fires yet; retrying");
                    }
                }
            })
        };
        let permits = Arc::new(Semaphore::new(self.timing.max_inflight));
        let mut inflight = JoinSet::new();
        tracing::info!(instance = %self.instance, schedules = timer.len(), "scheduler replica running");
        'ticks: loop {
            while inflight.try_join_next().is_some() {}
            let change = tokio::select! {
                // Biased towards shutdown: once cancelled, no new fire is
                // claimed even if one is due at the same moment. Due fires
                // come before schedule changes, so a burst of changes cannot
                // delay them; a change is applied between fires.
                biased;
                _ = cancel.cancelled() => break,
                _ = timer.wait(&clock) => None,
                change = changes.recv() => change,
            };
            // What is due is handed off before a change is applied, so a
            // change arriving just as its schedule is due does not lose
            // that fire.
            let due = timer.due(clock.now());
            self.count_skipped(&due.skipped);
            let due_fires: Vec<(Arc<Schedule>, DateTime<Utc>)> =
                due.fires.into_iter().map(|f| (f.schedule, f.at)).collect();
            for batch in due_fires.chunks(self.timing.max_batch) {
                // Everything due now goes out in batches (a lone fire is a
                // batch of one, sent at once). Waiting for permits (one per
                // fire) bounds in-flight fires; the timer catches up
                // afterwards because instants come from the schedule, not
                // from when this loop gets to them. Shutdown ends the wait:
                // fires not yet started are not claimed.
                let wanted = u32::try_from(batch.len()).unwrap_or(u32::MAX);
                let permit = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break 'ticks,
                    p = permits.clone().acquire_many_owned(wanted) => match p { Ok(p) => p, Err(_) => break 'ticks },
                };
                let this = self.clone();
                let batch = batch.to_vec();
                inflight.spawn(async move {
                    let _permit = permit;
                    this.fire_batch(&batch, FireSource::Timer).await
                });
            }
            if let Some(change) = change {
                self.apply_change(&mut timer, change, clock.now());
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
        let _ = guarding.await;
        let _ = recovering.await;
        self.broker.close().await;
        tracing::info!(instance = %self.instance, "scheduler replica stopped");
    }
}
