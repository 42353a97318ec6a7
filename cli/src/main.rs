//! `belfry`: parses the command line and runs it ([`belfry::commands`]);
//! the exit code says what happened (see [`belfry::exit`]). `belfry dev`
//! instead wires a whole one-process belfry ([`belfry_embedded`]) with
//! logging and Ctrl-C / SIGTERM shutdown.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = belfry::Cli::parse();
    if matches!(cli.command, belfry::args::Command::Dev) {
        return match dev().await {
            Ok(()) => std::process::ExitCode::from(belfry::exit::OK),
            Err(e) => {
                eprintln!("belfry dev: {e}");
                std::process::ExitCode::from(belfry::exit::OTHER)
            }
        };
    }
    match belfry::commands::run(&cli).await {
        Ok(()) => std::process::ExitCode::from(belfry::exit::OK),
        Err(e) => {
            eprintln!("belfry: {e}");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}

async fn dev() -> anyhow::Result<()> {
    // First: from here on Ctrl-C / SIGTERM is a graceful stop.
    let cancel = belfry_runtime::shutdown_token();
    let env: Vec<(String, String)> = std::env::vars().collect();
    let settings = belfry_runtime::Settings::from_pairs(env.clone());
    let format = settings.parsed(
        "BELFRY_LOG_FORMAT",
        belfry_runtime::LogFormat::Text,
        "text or json",
    )?;
    let instance = belfry_runtime::default_instance();
    let telemetry = belfry_runtime::init_telemetry_with(
        "belfry-dev",
        &instance,
        format,
        belfry_worker::RunLogCapture::layer(),
    )?;
    let registry = belfry_worker::Registry::builder().builtins().build()?;
    telemetry
        .flush_after(async {
            let dev = belfry_embedded::start(env, registry, cancel).await?;
            println!("belfry dev: {}", dev.mode.describe());
            match dev.api_addr {
                Some(addr) => {
                    println!("  API       http://{addr}/v1   (web view: http://{addr}/ui)");
                    println!("  try       cargo run --release -p belfry -- --api http://{addr} runs ls   (in another terminal)");
                }
                None => println!("  API       off (BELFRY_API_ADDR=off)"),
            }
            println!("  stop      Ctrl-C (in-flight jobs finish or are handed back; nothing is lost)");
            Ok(dev.wait().await?)
        })
        .await
}
