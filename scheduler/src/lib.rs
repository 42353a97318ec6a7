//! belfry's scheduler: every replica computes the same fire instants, and
//! for each fire exactly one replica wins and publishes it.
//!
//! The flow of one fire, and the module that owns each step:
//!
//! 1. [`timer`]: a heap of next fire instants, one per schedule; the fire
//!    instant comes from the [`schedule`], never from when the timer woke.
//! 2. [`claim`]: Redis `SET NX PX` as a cheap filter ([`lock`]), then
//!    `INSERT ... ON CONFLICT DO NOTHING` in the ledger as the guarantee;
//!    [`redis_topology`] tells one server, a Sentinel group and a Cluster apart.
//! 3. dispatch (`belfry_dispatch`): publish with confirm and `mandatory`,
//!    then mark the run `dispatched` (or `dead` when no worker group serves
//!    its type); the outbox reconciler republishes what was not confirmed.
//!
//! [`replica`] wires these into the loop a `belfry-scheduler` process runs;
//! [`config`] reads its settings from the environment. This crate is the
//! engine only: the process, its REST API and web view are `belfry-server`.

pub mod cancel;
pub mod claim;
pub mod clock_guard;
pub mod config;
pub mod counters;
pub mod describe;
pub mod error;
pub mod keeper_runtime;
pub mod lock;
pub mod misfire;
pub mod ops;
pub mod pace;
pub mod preview;
pub mod redis_topology;
pub mod replica;
pub mod retention;
pub mod run_partitions;
pub mod schedule;
pub mod schedule_file;
pub mod schedule_sync;
pub mod shard_lease;
pub mod timer;
pub mod timer_progress;
pub mod zoned_cron;

pub use claim::{ClaimOutcome, Claimer, FireSource};
pub use clock_guard::ClockGuard;
pub use config::SchedulerConfig;
pub use counters::FireCounters;
pub use error::SchedulerError;
pub use lock::ClaimLock;
pub use misfire::MisfirePolicy;
pub use ops::{Ops, OpsError};
pub use replica::{FireOutcome, RecoveryWait, Replica, ReplicaTiming, SkipReason};
pub use schedule::{OverlapPolicy, Schedule, ScheduleError};
pub use schedule_sync::{ScheduleChange, ScheduleSync};
pub use shard_lease::{OwnedShards, PassOutcome, ShardKeeper, ShardSettings};
pub use timer::{Due, Fire, Skipped, Timer};
