//! The worker: start-up wiring, the consume loop and graceful shutdown.
//!
//! Shutdown, in order: stop consuming (the broker sends nothing new), let
//! in-flight jobs finish until the shutdown deadline, then interrupt what is
//! left and hand it back to the queue (its attempt count is durable), and
//! close the channel, which returns any prefetched delivery that was never
//! started.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use belfry_broker::{Broker, JobQueue, PublisherSlot};
use belfry_ledger::{AttemptBatcher, Ledger};
use belfry_protocol::{validate_name, Topology};
use belfry_runtime::shutdown::drain_within;

use crate::counters::WorkerCounters;
use crate::{Registry, RetryPolicy, WorkerConfig, WorkerError};

/// How long interrupted jobs get to hand their runs back after the
/// shutdown deadline.
const HAND_BACK_GRACE: Duration = Duration::from_secs(5);

/// A worker of one group.
#[derive(Debug)]
pub struct Worker {
    pub(crate) instance: String,
    pub(crate) group: String,
    pub(crate) queue: String,
    pub(crate) ledger: Ledger,
    pub(crate) attempts: AttemptBatcher,
    pub(crate) broker: Broker,
    pub(crate) registry: Registry,
    pub(crate) retry: RetryPolicy,
    pub(crate) job_timeout: Duration,
    pub(crate) cancel_grace: Duration,
    pub(crate) requeue_after: Duration,
    pub(crate) prefetch: u16,
    pub(crate) concurrency: usize,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) counters: Arc<WorkerCounters>,
    pub(crate) dead_letters: PublisherSlot,
    pub(crate) leases: crate::lease::Leases,
    /// Where attempts' log lines go (`crate::run_log`).
    pub(crate) run_logs: crate::run_log::RunLogSink,
    /// How much of a run's log is kept.
    pub(crate) run_log_bounds: crate::run_log::RunLogBounds,
    /// Stops the lease heartbeat when the worker is dropped.
    _heartbeat: tokio_util::sync::DropGuard,
}

/// Connections of the lease heartbeat, besides `BELFRY_DB_POOL` (one
/// statement renews every held lease, one at a time).
pub const HEARTBEAT_POOL: u32 = 1;

impl Worker {
    /// Connects to the services of `config`, applies migrations, declares
    /// the topology and binds the group's queue to the registry's job types.
    ///
    /// A `sqlite:` `DATABASE_URL` runs the worker on the embedded database
    /// and its job queue (`AMQP_URL` is not used).
    ///
    /// # Errors
    ///
    /// [`WorkerError`] naming the service (URL masked) or setting that is
    /// wrong.
    pub async fn start(config: &WorkerConfig, registry: Registry) -> Result<Self, WorkerError> {
        // Settings are checked before any service is contacted.
        validate_name("worker group", &config.group)?;
        let registry = match &config.job_types {
            Some(types) => registry.restrict(types)?,
            None => registry,
        };
        let topology = Topology::new(&config.namespace)?;
        let ledger = Ledger::connect_routed(
            &config.database_url,
            config.database_direct_url.as_deref(),
            config.db_pool,
        )
        .await?;
        ledger.migrate().await?;
        // An embedded ledger's file holds the job queue too.
        let queue = ledger
            .embedded_file()
            .map(|f| JobQueue::new(f.reader, f.writer, f.session, f.queue_ready));
        let broker = Broker::embedded_or_connect(
            queue,
            &config.amqp_url,
            &config.amqp_tls,
            topology,
            &format!("belfry-worker {} ({})", config.instance, config.group),
        )
        .await?;
        // The lease heartbeat gets a connection of its own (not the
        // embedded file, which one pool owns): a burst of starts and ends
        // holding every connection of the pool must not delay a renewal
        // past the lease and stop handlers that are running fine.
        let heartbeat = if ledger.is_embedded() {
            ledger.clone()
        } else {
            Ledger::connect_routed(
                &config.database_url,
                config.database_direct_url.as_deref(),
                HEARTBEAT_POOL,
            )
            .await?
        };
        Self::start_on_pools(config, registry, ledger, heartbeat, broker).await
    }

    /// [`Worker::start`] on a ledger and broker the caller opened (the
    /// embedded single-process mode shares one database between the
    /// scheduler and the worker). `config`'s URLs are not used.
    ///
    /// # Errors
    ///
    /// [`WorkerError`] naming the setting that is wrong or the broker
    /// operation that failed.
    pub async fn start_on(
        config: &WorkerConfig,
        registry: Registry,
        ledger: Ledger,
        broker: Broker,
    ) -> Result<Self, WorkerError> {
        Self::start_on_pools(config, registry, ledger.clone(), ledger, broker).await
    }

    /// [`Worker::start_on`], with the lease heartbeat on `heartbeat` (a
    /// pool of its own: [`Worker::start`] opens one of [`HEARTBEAT_POOL`]
    /// connections) and everything else on `ledger`.
    ///
    /// # Errors
    ///
    /// As [`Worker::start_on`].
    pub async fn start_on_pools(
        config: &WorkerConfig,
        registry: Registry,
        ledger: Ledger,
        heartbeat: Ledger,
        broker: Broker,
    ) -> Result<Self, WorkerError> {
        validate_name("worker group", &config.group)?;
        let registry = match &config.job_types {
            Some(types) => registry.restrict(types)?,
            None => registry,
        };
        broker.declare_core().await?;
        let queue = broker
            .declare_group(&config.group, &registry.types())
            .await?;
        tracing::info!(group = %config.group, %queue, types = ?registry.types(), "worker group queue bound");
        // The heartbeat runs for as long as the worker exists, so attempts
        // started through `process_one` alone are renewed too.
        let leases = crate::lease::Leases::new(config.lease);
        let heartbeat_stop = CancellationToken::new();
        {
            let leases = leases.clone();
            let stop = heartbeat_stop.clone();
            tokio::spawn(async move { leases.run(heartbeat, stop).await });
        }
        tokio::spawn(crate::cancel_listener::follow_cancels(
            leases.clone(),
            ledger.clone(),
            heartbeat_stop.clone(),
        ));
        let counters = Arc::new(WorkerCounters::default());
        Ok(Self {
            leases,
            _heartbeat: heartbeat_stop.drop_guard(),
            run_logs: crate::run_log::RunLogSink::start(
                ledger.clone(),
                counters.run_log_dropped.clone(),
                counters.run_log_late.clone(),
            ),
            run_log_bounds: config.run_log,
            instance: config.instance.clone(),
            group: config.group.clone(),
            queue,
            attempts: AttemptBatcher::new(ledger.clone()),
            ledger,
            dead_letters: PublisherSlot::new(broker.clone()),
            broker,
            registry,
            retry: config.retry.clone(),
            job_timeout: config.job_timeout,
            cancel_grace: config.cancel_grace,
            requeue_after: config.requeue_after,
            prefetch: config.prefetch,
            concurrency: config.concurrency.max(1),
            shutdown_timeout: config.shutdown_timeout,
            counters,
        })
    }

    /// Waits until every run log line written so far is stored, or
    /// `within` passed (the database may be down); whether all were.
    pub async fn flush_run_logs(&self, within: Duration) -> bool {
        self.run_logs.flush(within).await
    }

    /// This worker's counters.
    pub fn counters(&self) -> &Arc<WorkerCounters> {
        &self.counters
    }

    /// This worker's instance name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// This worker's Prometheus metrics (see [`WorkerCounters`]), for
    /// [`belfry_runtime::metrics_server::serve`].
    pub fn metrics_registry(&self) -> prometheus_client::registry::Registry {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(self.counters.clone()));
        let (ledger, broker) = (self.ledger.clone(), self.broker.clone());
        registry.register_collector(Box::new(
            belfry_runtime::service_nodes::ServiceNodes::default()
                .with("postgres", move || ledger.node())
                .with("rabbitmq", move || broker.node()),
        ));
        registry
    }

    /// Serves `/metrics` on `metrics_addr` when set, then [`Worker::run`]s
    /// until `cancel`: what a worker binary's `main` calls.
    ///
    /// # Errors
    ///
    /// [`WorkerError::Metrics`] when the metrics address cannot be bound;
    /// otherwise as [`Worker::run`].
    pub async fn serve(
        self,
        metrics_addr: Option<&str>,
        cancel: CancellationToken,
    ) -> Result<(), WorkerError> {
        if let Some(addr) = metrics_addr {
            let registry = Arc::new(self.metrics_registry());
            belfry_runtime::metrics_server::serve(addr, registry, cancel.clone()).await?;
        }
        self.run(cancel).await
    }

    /// The group queue this worker consumes (its `normal` level; the
    /// `high` and `low` queues are named after it, see
    /// `belfry_protocol::priority`).
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The broker handle (tests publish through it).
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Consumes until `cancel`, then shuts down gracefully (see the module
    /// docs). A lost connection or channel is survived: the loop logs it,
    /// backs off (1 s doubling to 30 s), reconnects and consumes again; jobs
    /// in flight on the lost channel are redelivered by the broker and their
    /// leases keep them from running twice at once.
    ///
    /// # Errors
    ///
    /// None at present once started; the `Result` leaves room for fatal
    /// conditions.
    // Long on purpose: the consume loop and its drain, kept whole so the
    // shutdown order (stop taking, finish or hand back, close) reads top to
    // bottom.
    pub async fn run(self, cancel: CancellationToken) -> Result<(), WorkerError> {
        let this = Arc::new(self);
        let permits = Arc::new(Semaphore::new(this.concurrency));
        let hard_stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let mut backoff = Duration::from_secs(1);
        // The live consumer when shutdown starts (at most one).
        let mut consumers = Vec::new();
        'connect: while !cancel.is_cancelled() {
            let tag = format!("{}-{}", this.instance, uuid::Uuid::new_v4().simple());
            // Re-declaring is idempotent and restores a queue deleted while
            // we were away.
            let consumed = match this
                .broker
                .declare_group(&this.group, &this.registry.types())
                .await
            {
                // Every priority's queue of the group, highest first.
                Ok(_) => {
                    this.broker
                        .consume_group(&this.group, &tag, this.prefetch)
                        .await
                }
                Err(e) => Err(e),
            };
            let mut consumption = match consumed {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "cannot consume; retrying");
                    tokio::select! {
                        _ = cancel.cancelled() => break 'connect,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue 'connect;
                }
            };
            backoff = Duration::from_secs(1);
            // Cancelled when this channel is lost: its deliveries are
            // redelivered, so tasks waiting out a back-off on them stop.
            let channel_lost = CancellationToken::new();
            tracing::info!(instance = %this.instance, queue = %this.queue, prefetch = this.prefetch,
                concurrency = this.concurrency, "worker consuming");
            loop {
                while tasks.try_join_next().is_some() {}
                // A permit first, so at most `concurrency` jobs run;
                // deliveries beyond that wait in the prefetch buffer.
                let permit = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => { consumers.push(consumption); break 'connect; }
                    p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => { consumers.push(consumption); break 'connect; } },
                };
                // Shutdown is checked first so no delivery is started after it.
                let delivery = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => { consumers.push(consumption); break 'connect; }
                    d = consumption.next() => d,
                };
                match delivery {
                    Some(Ok(delivery)) => {
                        let worker = this.clone();
                        let stop = hard_stop.clone();
                        let lost = channel_lost.clone();
                        tasks.spawn(async move {
                            let _permit = permit;
                            worker.process_on_channel(delivery, &stop, &lost).await
                        });
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "consumer failed (connection or channel lost); reconnecting");
                        break;
                    }
                    None => {
                        tracing::warn!(queue = %this.queue, "the broker closed the consumer; reconnecting");
                        break;
                    }
                }
            }
            // The lost channel's unacked deliveries are requeued by the
            // broker; nothing more can be done on it.
            channel_lost.cancel();
            consumption.close().await;
        }
        // Stop deliveries before waiting: the broker keeps prefetched but
        // unstarted deliveries unacked and requeues them when the channel
        // closes below.
        for consumption in &consumers {
            consumption.cancel().await;
        }
        let in_flight = tasks.len();
        tracing::info!(in_flight, deadline = ?this.shutdown_timeout, "worker stopping: finishing in-flight jobs");
        if !drain_within(&mut tasks, this.shutdown_timeout).await {
            tracing::warn!(
                left = tasks.len(),
                "shutdown deadline passed; interrupting and handing back the rest"
            );
            hard_stop.cancel();
            if !drain_within(&mut tasks, HAND_BACK_GRACE).await {
                tasks.abort_all();
            }
        }
        for consumption in consumers {
            consumption.close().await;
        }
        // The finished attempts' last log lines (their outcomes are stored
        // already): a short, bounded wait, as the kubelet's grace period
        // is counted from SIGTERM.
        if !this.run_logs.flush(HAND_BACK_GRACE).await {
            tracing::warn!("run log lines not stored before shutdown; they are lost");
        }
        this.broker.close().await;
        tracing::info!(instance = %this.instance, "worker stopped");
        Ok(())
    }
}
