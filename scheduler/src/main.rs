//! `belfry-scheduler`: configuration, logging and shutdown around
//! [`belfry_scheduler::Replica`].

use std::sync::Arc;

use anyhow::Context;
use belfry_runtime::{init_logging, shutdown_token, Settings, SystemClock};
use belfry_scheduler::{Replica, SchedulerConfig, Timer};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::from_env();
    let config = SchedulerConfig::from_settings(&settings).context("invalid configuration")?;
    init_logging(config.log_format);
    tracing::info!(?config, "starting belfry-scheduler");
    let cancel = shutdown_token();
    let (replica, schedules) = Replica::start(&config).await?;
    let timer = Timer::new(schedules, chrono::Utc::now());
    Arc::new(replica).run(timer, Arc::new(SystemClock), cancel).await;
    Ok(())
}
