//! Wire types shared by every belfry component and by producers written in
//! other languages.
//!
//! This crate deliberately has no runtime dependencies (no tokio, sqlx or
//! lapin): it only says what goes over the wire and how things are named, so
//! that a producer, a scheduler and a worker can never disagree about a
//! message layout, a run key or a queue name.

pub mod follow_up;
pub mod job_options;
pub mod key_instant;
pub mod message;
pub mod name;
pub mod priority;
pub mod rate_limit;
pub mod run_key;
pub mod schedule_spec;
pub mod shard;
pub mod storable;
pub mod topology;
pub mod trace_context;

pub use follow_up::{FollowOn, FollowUp, FollowUpSpec, FollowUps, InvalidFollowUp, ParentRun};
pub use job_options::{JobOptions, RetryOverride};
pub use key_instant::key_instant;
pub use message::{JobMessage, MessageError, MESSAGE_VERSION};
pub use name::{validate_name, NameError};
pub use priority::Priority;
pub use rate_limit::{InvalidRateLimit, RateLimit};
pub use run_key::{check_identity, run_key, validate_run_key, InvalidRunKey, RunKeyError};
pub use schedule_spec::{RetrySpec, ScheduleSpec};
pub use shard::{shard_key, shard_of};
pub use storable::{check_storable_json, check_storable_text, Unstorable};
pub use topology::Topology;
pub use trace_context::TraceContext;
