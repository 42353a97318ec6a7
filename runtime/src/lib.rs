//! Process plumbing shared by the belfry binaries and their libraries:
//! typed settings from environment variables, service URLs with credentials
//! masked, logging and trace export, the metrics endpoint, the shutdown
//! token and the clock.
//!
//! Nothing here knows about jobs or schedules; it exists so that the
//! scheduler and the worker read configuration, log and stop the same way.

pub mod client_tls;
pub mod clock;
pub mod endpoint;
pub mod exit;
pub mod exported_events;
pub mod failpoint;
pub mod host_list;
pub mod metrics;
#[cfg(feature = "metrics-server")]
pub mod metrics_server;
pub mod service_nodes;
pub mod setting;
pub mod shutdown;
pub mod start_retry;
pub mod telemetry;
pub mod trace_propagation;

pub use client_tls::ClientTls;
pub use clock::{process_clock, Clock, SharedClock, SkewedClock, SystemClock};
pub use endpoint::{masked, url_list};
pub use exit::exit_on_error;
pub use setting::{SettingError, Settings};
pub use shutdown::shutdown_token;
pub use telemetry::{init_telemetry, init_telemetry_with, LogFormat, Telemetry, TelemetryError};

/// The default instance name: `{hostname}-{pid}`.
///
/// Unique per process on a host and readable in `job_runs.claimed_by` /
/// `job_runs.worker`.
pub fn default_instance() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let host = if host.is_empty() {
        "localhost".into()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}
