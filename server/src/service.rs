//! A whole scheduler replica as a service: connect (waiting out services
//! that restart), serve `/metrics` and the REST API, follow schedule
//! changes, prune old runs, and run the timer loop until cancelled.
//!
//! `belfry-scheduler`'s `main` calls [`start`] and [`Service::wait`]; tests
//! and embedding programs do the same to run real replicas in-process.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use belfry_alert::AlertDeliverer;
use belfry_runtime::start_retry::retry_start;

/// How often a replica routes new alert events and sends due alerts.
pub const ALERT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

use belfry_scheduler::retention::Retention;
use belfry_scheduler::run_partitions::{RunPartitionKeeper, PREPARE_EVERY};
use belfry_scheduler::{Replica, Schedule, ScheduleSync, Timer};

use crate::api::{self, ApiState};
use crate::{ServerConfig, ServerError};

/// A running replica.
pub struct Service {
    /// Where the REST API listens, when on.
    pub api_addr: Option<SocketAddr>,
    /// Where `/metrics` is served, when on.
    pub metrics_addr: Option<SocketAddr>,
    /// The replica itself.
    pub replica: Arc<Replica>,
    running: JoinHandle<()>,
    /// Routes and sends this replica's share of the alerts.
    pub alerts: Arc<AlertDeliverer>,
}

/// Starts a replica of `config`; it stops when `cancel` fires.
///
/// # Errors
///
/// [`ServerError`] when a service stays unreachable past
/// `BELFRY_START_TIMEOUT`, the schedule file is invalid, or an address
/// cannot be listened on.
pub async fn start(
    config: &ServerConfig,
    cancel: CancellationToken,
) -> Result<Service, ServerError> {
    // A service restarting while this replica starts is waited out.
    let (replica, sync, schedules) = retry_start(
        "scheduler start",
        config.scheduler.start_timeout,
        &cancel,
        belfry_scheduler::SchedulerError::is_transient,
        || Replica::start(&config.scheduler),
    )
    .await?;
    run(config, replica, sync, schedules, cancel).await
}

/// [`start`] on a ledger and broker the caller opened: the embedded
/// single-process mode (`belfry dev`) runs a replica and a worker on one
/// embedded database. No start-up retry: the caller already holds working
/// connections.
///
/// # Errors
///
/// [`ServerError`] when the schedule file is invalid, the database
/// fails, or an address cannot be listened on.
pub async fn start_on(
    config: &ServerConfig,
    ledger: belfry_ledger::Ledger,
    broker: belfry_broker::Broker,
    cancel: CancellationToken,
) -> Result<Service, ServerError> {
    let (replica, sync, schedules) = Replica::start_on(&config.scheduler, ledger, broker).await?;
    run(config, replica, sync, schedules, cancel).await
}

/// Serves and runs a started replica until `cancel`.
async fn run(
    config: &ServerConfig,
    replica: Replica,
    sync: ScheduleSync,
    schedules: Vec<Arc<Schedule>>,
    cancel: CancellationToken,
) -> Result<Service, ServerError> {
    let engine = &config.scheduler;
    let replica = Arc::new(replica);
    // Every replica routes and sends alerts: the ledger's leases make each
    // delivery one replica's at a time.
    let alerts = Arc::new(AlertDeliverer::new(
        replica.ledger().clone(),
        config.alerts.clone(),
        &engine.namespace,
        replica.instance(),
    )?);
    let metrics_addr = match &engine.metrics_addr {
        Some(addr) => {
            let mut registry = replica.metrics_registry();
            registry.register_collector(Box::new(alerts.counters().clone()));
            Some(
                belfry_runtime::metrics_server::serve(addr, Arc::new(registry), cancel.clone())
                    .await?,
            )
        }
        None => None,
    };
    let api_addr = match &config.api_addr {
        Some(addr) => Some(
            api::serve(
                addr,
                ApiState::new(replica.clone(), config.api_tokens.clone())
                    .with_retention(engine.retention)
                    .with_trace_ui(config.trace_ui.clone())
                    .with_alerts(alerts.clone()),
                cancel.clone(),
            )
            .await?,
        ),
        None => None,
    };
    // One clock for the process: the replica's own.
    let clock = replica.clock().clone();
    let timer =
        Timer::new(schedules, clock.now()).with_misfire_threshold(engine.timing.misfire_threshold);
    // Schedule changes (API, another replica's file, SQL by hand) flow from
    // the table to the timer while the replica runs.
    let (changes_tx, changes) = tokio::sync::mpsc::unbounded_channel();
    let following = tokio::spawn(sync.run(changes_tx, engine.schedule_resync, cancel.clone()));
    let pruning = engine.retention.map(|keep| {
        tokio::spawn(
            Retention::new(replica.ledger().clone(), keep)
                .run(engine.retention_interval, cancel.clone()),
        )
    });
    let alerting = tokio::spawn(alerts.clone().run(ALERT_INTERVAL, cancel.clone()));
    // The first pass runs at once (an interval's first tick is immediate).
    let partitioning = tokio::spawn(
        RunPartitionKeeper::new(replica.ledger().clone()).run(PREPARE_EVERY, cancel.clone()),
    );
    let looping = replica.clone();
    let running = tokio::spawn(async move {
        looping
            .run_with_changes(timer, clock, cancel, changes)
            .await;
        // Both end at the same cancel; waited for so nothing outlives the
        // service.
        let _ = following.await;
        let _ = alerting.await;
        let _ = partitioning.await;
        if let Some(p) = pruning {
            let _ = p.await;
        }
    });
    Ok(Service {
        api_addr,
        metrics_addr,
        replica,
        running,
        alerts,
    })
}

impl Service {
    /// Waits until the replica has stopped (after its cancel token fired
    /// and in-flight fires finished or the shutdown deadline passed).
    pub async fn wait(self) {
        let _ = self.running.await;
    }
}
