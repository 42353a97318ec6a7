//! The one shutdown token of a process.
//!
//! SIGINT or SIGTERM cancels it once; every loop selects on it to stop
//! taking new work and then finishes or hands back what it holds.

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGINT or SIGTERM.
///
/// Must be called inside a tokio runtime, as early as possible: the signal
/// handlers are installed before it returns, so a SIGTERM arriving any time
/// later (even while the binary is still starting) is a graceful stop, not
/// the default kill. When a handler cannot be installed the error is logged
/// and the other signal still works.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    // Installed here, synchronously; only the waiting is spawned.
    let signals = Signals::install();
    tokio::spawn(async move {
        signals.wait().await;
        tracing::info!("shutdown signal received; stopping new work");
        cancel.cancel();
    });
    token
}

#[cfg(unix)]
struct Signals {
    term: std::io::Result<tokio::signal::unix::Signal>,
    int: std::io::Result<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
impl Signals {
    fn install() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        Self {
            term: signal(SignalKind::terminate()),
            int: signal(SignalKind::interrupt()),
        }
    }

    async fn wait(self) {
        match (self.term, self.int) {
            (Ok(mut term), Ok(mut int)) => {
                // Either signal ends the wait; neither stream is used
                // afterwards, so dropping the other is safe.
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
}

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn install() -> Self {
        Signals
    }

    async fn wait(self) {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Waits for every task of `tasks` to end, for at most `deadline`.
///
/// The drain step of a graceful stop: the caller has stopped taking new
/// work, and what is in flight gets `deadline` to finish. Returns whether
/// the set is empty; on `false` the unfinished tasks are still in `tasks`
/// (their results so far are dropped), for the caller to interrupt, hand
/// back or abort.
pub async fn drain_within<T: 'static>(
    tasks: &mut tokio::task::JoinSet<T>,
    deadline: std::time::Duration,
) -> bool {
    tokio::time::timeout(deadline, async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_ok()
}
