//! belfry's end-to-end tests as one test binary: each module was its own
//! binary once; one binary links once, which is most of what building the
//! tests costs. Two stay apart: `fault_suite` (it restarts the machine's
//! services, so it runs alone) and `traces` (it installs a global tracing
//! subscriber, which would record every other test's spans).
//!
//! Run one module with `cargo test -p belfry-tests --test e2e api::`, one
//! test with its full path, e.g. `exactly_once::three_replicas_two_workers_every_fire_runs_exactly_once`.

mod ack_window;
mod alerts;
mod api;
mod api_operator_story;
mod backlog;
mod batched_dispatch;
mod bounded;
mod builtin_jobs;
mod cancel;
mod exactly_once;
mod flow_control;
mod follow_ups;
mod lease;
mod metrics;
mod overlap;
mod poison_values;
mod pooler;
mod postgres_failover;
mod process_api;
mod process_telemetry;
mod publish_confirm;
mod rabbitmq_cluster;
mod redis_ha;
mod retention;
mod run_logs;
mod run_partitions;
mod schedule_engine;
mod sharding;
mod test_isolation;
mod tls;
mod ui;
mod ui_browser;
mod worker_library;
mod worker_outcomes;
