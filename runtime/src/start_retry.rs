//! Start-up that survives a service restarting underneath it.
//!
//! A binary starting while Postgres or RabbitMQ restarts (or is briefly
//! unreachable) should not exit: the same outage while running is survived
//! by the reconnect loops. [`retry_start`] runs a start-up step again with a
//! back-off (0.5 s doubling to 5 s) while its error is transient, up to
//! `BELFRY_START_TIMEOUT`; past that (or on SIGTERM) the last error is
//! returned and the binary exits 1 with it. Configuration errors are not
//! transient and fail at once.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Runs `step` until it succeeds, its error is not `transient`, `timeout`
/// has passed since the first try, or `cancel` fires.
///
/// # Errors
///
/// The last error of `step`.
pub async fn retry_start<T, E, F, Fut>(
    what: &str,
    timeout: Duration,
    cancel: &CancellationToken,
    transient: impl Fn(&E) -> bool,
    mut step: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(500);
    loop {
        let error = match step().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        let left = timeout.saturating_sub(started.elapsed());
        if !transient(&error) || left.is_zero() || cancel.is_cancelled() {
            return Err(error);
        }
        let wait = pause.min(left);
        tracing::warn!(error = %error, retry_in = ?wait, "{what} failed; retrying (BELFRY_START_TIMEOUT bounds this)");
        // Shutdown ends the wait: the last error is returned.
        tokio::select! {
            _ = cancel.cancelled() => return Err(error),
            _ = tokio::time::sleep(wait) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}
