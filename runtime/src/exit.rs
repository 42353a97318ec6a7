//! How a belfry binary ends when it cannot start or stops serving with an
//! error: one line on standard error naming what is wrong, exit status 1.
//!
//! Operators and supervisors (systemd, Kubernetes) read that line first, so
//! every binary prints it the same way: `{binary}: {error}`, where the
//! error's own text already names the service (URL masked), variable, file
//! or schedule and includes its cause.

/// Exits the process with status 1 after logging `result`'s error and
/// printing it as one line `{binary}: {error}`; returns when `result` is
/// `Ok`.
pub fn exit_on_error<E: std::fmt::Display>(binary: &str, result: Result<(), E>) {
    if let Err(e) = result {
        tracing::error!("{e}");
        eprintln!("{binary}: {e}");
        std::process::exit(1);
    }
}
