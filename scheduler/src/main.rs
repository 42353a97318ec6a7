//! `belfry-scheduler`: configuration, logging and shutdown around
//! [`belfry_scheduler::Replica`].

use std::sync::Arc;

use belfry_runtime::{init_logging, shutdown_token, Settings, SystemClock};
use belfry_scheduler::{Replica, SchedulerConfig, Timer};

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        tracing::error!("{e}");
        // One line naming what is wrong (service and masked URL, variable,
        // file or schedule); the error's own text already includes its cause.
        eprintln!("belfry-scheduler: {e}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    let config = SchedulerConfig::from_settings(&Settings::from_env())?;
    init_logging(config.log_format);
    tracing::info!(?config, "starting belfry-scheduler");
    let cancel = shutdown_token();
    let (replica, schedules) = Replica::start(&config).await?;
    let timer = Timer::new(schedules, chrono::Utc::now());
    Arc::new(replica)
        .run(timer, Arc::new(SystemClock), cancel)
        .await;
    Ok(())
}
