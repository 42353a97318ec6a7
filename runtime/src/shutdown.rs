//! The one shutdown token of a process.
//!
//! SIGINT or SIGTERM cancels it once; every loop selects on it to stop
//! taking new work and then finishes or hands back what it holds.

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGINT or SIGTERM.
///
/// Must be called inside a tokio runtime. When a signal handler cannot be
/// installed (no such signal on the platform) the error is logged and the
/// other signal still works.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received; stopping new work");
        cancel.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            // Either signal ends the wait; neither stream is used afterwards,
            // so dropping the other is safe.
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        (Ok(mut only), Err(e)) | (Err(e), Ok(mut only)) => {
            tracing::error!(error = %e, "could not install one signal handler");
            only.recv().await;
        }
        (Err(e1), Err(e2)) => {
            tracing::error!(%e1, %e2, "could not install signal handlers; falling back to ctrl-c");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}
