//! `belfry`, the command line over belfry's REST API: list and change
//! schedules, pause one during an incident, run one now, replay a missed
//! night, look up what happened to a run, enqueue an ad-hoc job.
//!
//! [`args`] defines the command line, [`api_client`] talks HTTP and maps
//! answers to [`CliError`]s with stable exit codes, [`commands`] runs each
//! command, [`table`] prints human output (`--json` prints the API's JSON).

pub mod api_client;
pub mod args;
pub mod commands;
pub mod table;

pub use api_client::{ApiClient, CliError};
pub use args::Cli;

/// Exit codes scripts can rely on.
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// Anything else: an unexpected answer, an internal server error.
    pub const OTHER: u8 = 1;
    /// Usage error: bad arguments, unreadable input file (also clap's).
    pub const USAGE: u8 = 2;
    /// 404: no such schedule or run.
    pub const NOT_FOUND: u8 = 3;
    /// 409: conflicts with the current state (name taken, overlap).
    pub const CONFLICT: u8 = 4;
    /// 400/413/422: the API refused the input.
    pub const INVALID: u8 = 5;
    /// 401/403: missing, wrong or read-only token.
    pub const AUTH: u8 = 6;
    /// 503 or no connection: retry later.
    pub const UNAVAILABLE: u8 = 7;
}
