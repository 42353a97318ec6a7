//! belfry's dispatch path, shared by the scheduler and by applications that
//! enqueue ad-hoc jobs.
//!
//! - [`dispatcher`]: publish a claimed run with confirm and `mandatory`, then
//!   record what the broker said (`dispatched`, or `dead` when no worker
//!   group serves the type; an unconfirmed run stays in the outbox).
//! - [`reconciler`]: the outbox loop every scheduler replica runs: runs whose
//!   `next_dispatch_at` passed (a claimer died before the confirm, a delayed
//!   ad-hoc job came due, a long retry back-off ended) are taken with
//!   `SKIP LOCKED` and published again with the same message id.
//! - [`run_trace`]: which trace a new run joins (the caller's, or a new
//!   one), and how a span continues a message's trace.
//! - [`client`]: enqueue a job of any type now, at an instant or after a
//!   delay, with an optional idempotency key, through the same ledger.

pub mod client;
pub mod dispatcher;
pub mod error;
pub mod reconciler;
pub mod run_trace;

pub use client::{AdHocJob, Client, Enqueued};
pub use dispatcher::{DispatchOutcome, Dispatcher};
pub use error::DispatchError;
pub use reconciler::{ReconcileReport, Reconciler};
