//! The command line.

use clap::{Args, Parser, Subcommand};

/// belfry: cluster-safe cron. Talks to a belfry-scheduler's REST API.
#[derive(Debug, Parser)]
#[command(name = "belfry", version, about)]
pub struct Cli {
    /// Base URL of the API.
    #[arg(
        long,
        env = "BELFRY_API_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub api: String,
    /// Bearer token (admin for changes, read-only for lookups).
    #[arg(long, env = "BELFRY_API_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Print the API's JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Schedules: list, show, add, edit, remove, pause, resume, trigger,
    /// backfill, preview.
    #[command(subcommand)]
    Schedules(Box<ScheduleCommand>),
    /// Runs: list with filters, show one, cancel.
    #[command(subcommand)]
    Runs(RunCommand),
    /// Ad-hoc jobs.
    #[command(subcommand)]
    Jobs(JobCommand),
    /// Alerts: channels and recent deliveries; a test alert.
    #[command(subcommand)]
    Alerts(AlertCommand),
    /// Runs a whole belfry in this process (scheduler, worker with the
    /// built-in job types, REST API and web view) on an embedded SQLite
    /// database (`.belfry/dev.db`, or `DATABASE_URL=sqlite:...`); with a
    /// Postgres `DATABASE_URL`, `AMQP_URL` and `REDIS_URL` it runs on those
    /// services instead. Schedules come from `BELFRY_SCHEDULES`
    /// (`examples/schedules.toml`). Stops on Ctrl-C.
    Dev,
}

/// Schedule commands.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// List schedules.
    Ls {
        /// Page size.
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Start after this cursor (printed after a partial page).
        #[arg(long)]
        cursor: Option<String>,
        /// Follow every page.
        #[arg(long)]
        all: bool,
    },
    /// Show one schedule.
    Get {
        /// Schedule name.
        name: String,
    },
    /// Add schedules from a file (TOML `[[schedule]]` tables or a JSON
    /// object), or one from flags.
    Add {
        /// A schedule file (.toml) or one schedule as JSON (.json).
        #[arg(long, short = 'f', conflicts_with_all = ["name", "job_type"])]
        file: Option<std::path::PathBuf>,
        /// Schedule name (with flags).
        #[arg(required_unless_present = "file")]
        name: Option<String>,
        /// Job type (with flags).
        #[arg(long, required_unless_present = "file")]
        job_type: Option<String>,
        /// The schedule's other fields (flattened: each is its own flag).
        #[command(flatten)]
        fields: ScheduleFields,
        /// Create it paused.
        #[arg(long)]
        paused: bool,
    },
    /// Change fields of a schedule (the rest stay).
    Edit {
        /// Schedule name.
        name: String,
        /// New job type.
        #[arg(long)]
        job_type: Option<String>,
        /// The schedule's other fields (flattened: each is its own flag).
        #[command(flatten)]
        fields: ScheduleFields,
    },
    /// Delete a schedule (its runs stay).
    Rm {
        /// Schedule name.
        name: String,
    },
    /// Stop firing until resumed.
    Pause {
        /// Schedule name.
        name: String,
        /// Why: shown with the schedule until it is resumed.
        #[arg(long)]
        note: Option<String>,
    },
    /// Fire again; fires missed while paused follow the misfire policy.
    Resume {
        /// Schedule name.
        name: String,
        /// Why (written to the audit log).
        #[arg(long)]
        note: Option<String>,
    },
    /// Run now, with its own run key.
    Trigger {
        /// Schedule name.
        name: String,
        /// Run even if the overlap policy forbids it right now.
        #[arg(long)]
        force: bool,
    },
    /// Fire every instant in [from, to) that has not run.
    Backfill {
        /// Schedule name.
        name: String,
        /// Start (RFC 3339, inclusive).
        #[arg(long)]
        from: String,
        /// End (RFC 3339, exclusive).
        #[arg(long)]
        to: String,
    },
    /// The next fire instants.
    Preview {
        /// Schedule name.
        name: String,
        /// How many.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: u32,
    },
}

/// Definition fields settable from flags.
#[derive(Debug, Args, Default)]
pub struct ScheduleFields {
    /// Cron expression (6 fields with seconds, or 5).
    #[arg(long)]
    pub cron: Option<String>,
    /// Interval, e.g. 30s.
    #[arg(long)]
    pub every: Option<String>,
    /// One-shot instant (RFC 3339).
    #[arg(long)]
    pub at: Option<String>,
    /// One-shot delay from now, e.g. 10m.
    #[arg(long)]
    pub after: Option<String>,
    /// IANA time zone of the cron expression.
    #[arg(long)]
    pub timezone: Option<String>,
    /// Payload, as JSON.
    #[arg(long)]
    pub payload: Option<String>,
    /// Per-attempt timeout, e.g. 10m.
    #[arg(long)]
    pub timeout: Option<String>,
    /// skip, fire_once or catch_up.
    #[arg(long)]
    pub misfire: Option<String>,
    /// allow_all (default), skip, buffer_one, buffer_all, cancel_other or
    /// terminate_other (allow and forbid: aliases of allow_all and skip).
    #[arg(long)]
    pub overlap: Option<String>,
    /// Spread fires over up to this long, e.g. 30s.
    #[arg(long)]
    pub jitter: Option<String>,
    /// No fire before this instant (RFC 3339).
    #[arg(long)]
    pub start_at: Option<String>,
    /// No fire after this instant (RFC 3339).
    #[arg(long)]
    pub end_at: Option<String>,
    /// Fire at most this many more times, then pause.
    #[arg(long)]
    pub remaining_runs: Option<u64>,
    /// Pause after this many consecutive failed or dead runs.
    #[arg(long)]
    pub pause_after_failures: Option<u32>,
}

/// Run commands.
#[derive(Debug, Subcommand)]
pub enum RunCommand {
    /// List runs, newest fire first.
    Ls {
        /// Only this schedule (job name).
        #[arg(long)]
        schedule: Option<String>,
        /// Only this job type.
        #[arg(long)]
        job_type: Option<String>,
        /// Only these statuses (comma-separated).
        #[arg(long)]
        status: Option<String>,
        /// Scheduled at or after (RFC 3339).
        #[arg(long)]
        from: Option<String>,
        /// Scheduled before (RFC 3339).
        #[arg(long)]
        to: Option<String>,
        /// Page size.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// Start after this cursor (printed after a partial page).
        #[arg(long)]
        cursor: Option<String>,
        /// Follow every page.
        #[arg(long)]
        all: bool,
    },
    /// Show one run: timings, attempts and their errors, replica, worker,
    /// trace id.
    Show {
        /// Run id.
        id: String,
    },
    /// Print a run's log: its handler's lines and progress per attempt,
    /// and each failed attempt's error after its last lines.
    Logs {
        /// Run id.
        id: String,
        /// Keep printing new lines until the run has ended and its log is
        /// complete.
        #[arg(long, short)]
        follow: bool,
        /// Start after this line: ATTEMPT.SEQ, e.g. 2.17 (a line's `attempt`
        /// and `seq` as --json prints them; the API's `next`).
        #[arg(long)]
        after: Option<String>,
    },
    /// Cancel a run: a waiting run never executes; a running one is
    /// stopped on its worker (its handler's cancellation token fires, and
    /// after BELFRY_CANCEL_GRACE the attempt is abandoned). A finished run
    /// cannot be cancelled.
    Cancel {
        /// Run id.
        id: String,
        /// Why, for the run's last error and the audit log.
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Job commands.
#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Enqueue an ad-hoc job.
    Enqueue {
        /// Job type.
        job_type: String,
        /// Payload, as JSON.
        #[arg(long)]
        payload: Option<String>,
        /// Job name (default: the job type).
        #[arg(long)]
        name: Option<String>,
        /// Idempotency key: the same name and key enqueue once.
        #[arg(long)]
        key: Option<String>,
        /// Run at this instant (RFC 3339).
        #[arg(long, conflicts_with = "delay")]
        at: Option<String>,
        /// Run after this delay, e.g. 10m.
        #[arg(long)]
        delay: Option<String>,
    },
}

/// Alert commands.
#[derive(Debug, Subcommand)]
pub enum AlertCommand {
    /// The configured channels and the latest deliveries, newest first.
    Ls {
        /// Only deliveries in this status: pending, sent, failed or folded.
        #[arg(long)]
        status: Option<String>,
        /// How many deliveries.
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Send a test alert to one channel (it shows in `alerts ls` once sent).
    Test {
        /// The channel's name in BELFRY_ALERTS.
        channel: String,
        /// Text to put in it.
        #[arg(long)]
        note: Option<String>,
    },
}
