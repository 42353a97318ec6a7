//! `belfry`: parses the command line and runs it ([`belfry::commands`]);
//! the exit code says what happened (see [`belfry::exit`]).

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = belfry::Cli::parse();
    match belfry::commands::run(&cli).await {
        Ok(()) => std::process::ExitCode::from(belfry::exit::OK),
        Err(e) => {
            eprintln!("belfry: {e}");
            std::process::ExitCode::from(e.exit_code())
        }
    }
}
