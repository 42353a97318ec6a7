//! Starting and stopping a one-process belfry.

use std::net::SocketAddr;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use belfry_broker::{Broker, JobQueue};
use belfry_ledger::Ledger;
use belfry_protocol::Topology;
use belfry_runtime::Settings;
use belfry_server::service::Service;
use belfry_server::ServerConfig;
use belfry_worker::{Registry, Worker, WorkerConfig, WorkerError};

use crate::Mode;

/// What can stop a one-process belfry from starting.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    /// The environment asks for something that cannot run.
    #[error("{0}")]
    Config(String),
    /// A setting has an unusable value.
    #[error(transparent)]
    Setting(#[from] belfry_runtime::SettingError),
    /// The embedded database cannot be opened or migrated.
    #[error(transparent)]
    Ledger(#[from] belfry_ledger::LedgerError),
    /// The scheduler replica could not start.
    #[error(transparent)]
    Scheduler(#[from] belfry_server::ServerError),
    /// The worker could not start.
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// A running one-process belfry.
pub struct Dev {
    /// The backends it runs on.
    pub mode: Mode,
    /// Where the REST API (and the web view under `/ui`) listens, when on.
    pub api_addr: Option<SocketAddr>,
    service: Service,
    worker: JoinHandle<Result<(), WorkerError>>,
}

/// Starts a scheduler replica, a worker serving `registry` and the API in
/// this process, on the backends `env` asks for (see [`Mode`]); they stop
/// when `cancel` fires.
///
/// `env` is the process environment as pairs (later pairs win), so callers
/// and tests can add to it; every `belfry-scheduler` and `belfry-worker`
/// setting applies. The worker starts first, so its queue is bound before
/// the first fire.
///
/// # Errors
///
/// [`DevError`] naming the setting, file, database or service that is
/// wrong.
pub async fn start(
    env: Vec<(String, String)>,
    registry: Registry,
    cancel: CancellationToken,
) -> Result<Dev, DevError> {
    let mode = Mode::from_env(&env)?;
    let mut env = env;
    if let Mode::Embedded { database_url } = &mode {
        env.push(("DATABASE_URL".into(), database_url.clone()));
    }
    let settings = Settings::from_pairs(env);
    let server = ServerConfig::from_settings(&settings)?;
    let scheduler = &server.scheduler;
    let worker_config = WorkerConfig::from_settings(&settings)?;
    let (service, worker) = match &mode {
        Mode::Embedded { database_url } => {
            let ledger = Ledger::connect(database_url, scheduler.db_pool.max(4)).await?;
            ledger.migrate().await?;
            let file = ledger.embedded_file().ok_or_else(|| {
                DevError::Config(format!("{database_url} is not an embedded database"))
            })?;
            let queue = JobQueue::new(file.reader, file.writer, file.session, file.queue_ready);
            let broker = Broker::embedded(
                queue,
                Topology::new(&scheduler.namespace).map_err(|e| DevError::Config(e.to_string()))?,
            );
            let worker =
                Worker::start_on(&worker_config, registry, ledger.clone(), broker.clone()).await?;
            let service =
                belfry_server::service::start_on(&server, ledger, broker, cancel.clone()).await?;
            (service, worker)
        }
        Mode::Distributed => {
            let worker = Worker::start(&worker_config, registry).await?;
            let service = belfry_server::service::start(&server, cancel.clone()).await?;
            (service, worker)
        }
    };
    let worker = tokio::spawn(worker.run(cancel));
    Ok(Dev {
        mode,
        api_addr: service.api_addr,
        service,
        worker,
    })
}

impl Dev {
    /// Waits until the replica and the worker have stopped (after the
    /// cancel token fired and in-flight work finished or was handed back).
    ///
    /// # Errors
    ///
    /// [`DevError::Worker`] when the worker's loop failed.
    pub async fn wait(self) -> Result<(), DevError> {
        self.service.wait().await;
        match self.worker.await {
            Ok(result) => Ok(result?),
            Err(e) => Err(DevError::Config(format!("the worker task failed: {e}"))),
        }
    }
}
