//! `belfry-scheduler`: configuration, logging and shutdown around
//! [`belfry_server::service`] (a replica with its API and web view); `belfry-scheduler preview ...` prints the
//! next fire instants of an expression ([`belfry_scheduler::preview`]).

use belfry_runtime::{exit_on_error, init_telemetry, shutdown_token, Settings};
use belfry_server::ServerConfig;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("preview") {
        let printed = belfry_scheduler::preview::parse_args(&args[1..])
            .and_then(|request| belfry_scheduler::preview::preview(&request, chrono::Utc::now()));
        match printed {
            Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
            Err(e) => {
                eprintln!("belfry-scheduler preview: {e}");
                std::process::exit(2);
            }
        }
        return;
    }
    exit_on_error("belfry-scheduler", run().await);
}

async fn run() -> anyhow::Result<()> {
    // First: from here on SIGTERM is a graceful stop, even during start-up.
    let cancel = shutdown_token();
    let config = ServerConfig::from_settings(&Settings::from_env())?;
    let telemetry = init_telemetry(
        "belfry-scheduler",
        &config.scheduler.instance,
        config.scheduler.log_format,
    )?;
    tracing::info!(
        ?config,
        exporting_traces = telemetry.exporting(),
        "starting belfry-scheduler"
    );
    telemetry.flush_after(serve(&config, cancel)).await
}

async fn serve(config: &ServerConfig, cancel: CancellationToken) -> anyhow::Result<()> {
    belfry_server::service::start(config, cancel)
        .await?
        .wait()
        .await;
    Ok(())
}
