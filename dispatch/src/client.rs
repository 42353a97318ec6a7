//! Ad-hoc jobs: enqueue a job of any registered type from application code.
//!
//! An ad-hoc job goes through the same ledger as a scheduled fire: it is
//! inserted into `job_runs` with `UNIQUE(job_name, run_key)`, so an enqueue
//! repeated with the same idempotency key runs once, and every ad-hoc run
//! is visible in `job_runs`. A job due now is published at once; a job for
//! later waits in the outbox and a scheduler replica's reconciler publishes
//! it when it comes due (within the reconcile interval, 1 s by default).
//!
//! ```no_run
//! # async fn demo(client: belfry_dispatch::Client) -> Result<(), belfry_dispatch::DispatchError> {
//! use belfry_dispatch::AdHocJob;
//! let job = AdHocJob::new("billing", serde_json::json!({"customer": "c-42"}))
//!     .idempotency_key("invoice-2026-07")
//!     .after(std::time::Duration::from_secs(600));
//! let enqueued = client.enqueue(job).await?;
//! println!("run {}", enqueued.run_key());
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use belfry_broker::Broker;
use belfry_ledger::{Ledger, NewRun, RunStatus};
use belfry_protocol::{validate_name, JobOptions, Topology};

use crate::{DispatchError, DispatchOutcome, Dispatcher};

/// Longest accepted idempotency key.
pub const MAX_KEY_LEN: usize = belfry_protocol::run_key::MAX_IDENTITY_BYTES;

/// A job to enqueue.
#[derive(Debug, Clone)]
pub struct AdHocJob {
    job_type: String,
    payload: serde_json::Value,
    name: Option<String>,
    key: Option<String>,
    run_at: Option<DateTime<Utc>>,
    options: JobOptions,
}

impl AdHocJob {
    /// A job of `job_type` with `payload`, due now, named after its type.
    pub fn new(job_type: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            job_type: job_type.into(),
            payload,
            name: None,
            key: None,
            run_at: None,
            options: JobOptions::default(),
        }
    }

    /// The job name (its runs' `job_name`); default: the job type.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// An idempotency key: the run key becomes `{name}@{key}`, and enqueueing
    /// the same name and key again returns the existing run instead of a new
    /// one.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Run at `at` (now, if `at` has passed).
    pub fn at(mut self, at: DateTime<Utc>) -> Self {
        self.run_at = Some(at);
        self
    }

    /// Run after `delay`.
    pub fn after(mut self, delay: Duration) -> Self {
        let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
        self.run_at = Some(
            Utc::now()
                .checked_add_signed(delay)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        );
        self
    }

    /// Retry and timeout overrides for this run.
    pub fn options(mut self, options: JobOptions) -> Self {
        self.options = options;
        self
    }
}

/// The result of an enqueue.
#[derive(Debug, Clone, PartialEq)]
pub enum Enqueued {
    /// A new run was created.
    Created {
        /// Its id in `job_runs`.
        id: Uuid,
        /// Its run key.
        run_key: String,
        /// When it runs.
        scheduled_at: DateTime<Utc>,
        /// Whether it was already published (due now) or waits in the outbox.
        published: bool,
    },
    /// A run with the same name and idempotency key already exists.
    Existing {
        /// Its id.
        id: Uuid,
        /// Its run key.
        run_key: String,
        /// Its current status.
        status: RunStatus,
    },
}

impl Enqueued {
    /// The run's id.
    pub fn id(&self) -> Uuid {
        match self {
            Self::Created { id, .. } | Self::Existing { id, .. } => *id,
        }
    }

    /// The run's key.
    pub fn run_key(&self) -> &str {
        match self {
            Self::Created { run_key, .. } | Self::Existing { run_key, .. } => run_key,
        }
    }
}

/// Enqueues ad-hoc jobs.
#[derive(Debug, Clone)]
pub struct Client {
    ledger: Ledger,
    dispatcher: Arc<Dispatcher>,
    instance: String,
    confirm_grace: Duration,
}

impl Client {
    /// Connects to the ledger and the broker of namespace `namespace`;
    /// `instance` names this client in `job_runs.claimed_by`.
    ///
    /// # Errors
    ///
    /// [`DispatchError`] naming the service (URL masked) that cannot be
    /// reached, or an invalid namespace.
    pub async fn connect(
        database_url: &str,
        amqp_url: &str,
        namespace: &str,
        instance: &str,
    ) -> Result<Self, DispatchError> {
        Self::connect_routed(database_url, None, amqp_url, namespace, instance).await
    }

    /// [`Client::connect`] where `database_url` may lead through a
    /// transaction pooler (PgBouncer `pool_mode = transaction`): with
    /// `direct_url`, the Postgres URL that bypasses it (the binaries'
    /// `BELFRY_DATABASE_DIRECT_URL`), statements over the pooler run
    /// unnamed, each in its own transaction, and the migrations use the
    /// direct URL (see `belfry_ledger::Ledger::connect_routed`).
    ///
    /// # Errors
    ///
    /// As [`Client::connect`].
    pub async fn connect_routed(
        database_url: &str,
        direct_url: Option<&str>,
        amqp_url: &str,
        namespace: &str,
        instance: &str,
    ) -> Result<Self, DispatchError> {
        let ledger = Ledger::connect_routed(database_url, direct_url, 4).await?;
        ledger.migrate().await?;
        let broker = Broker::connect(
            amqp_url,
            Topology::new(namespace)?,
            &format!("belfry-client {instance}"),
        )
        .await?;
        broker.declare_core().await?;
        Ok(Self::new(ledger, broker, instance))
    }

    /// A client from connected parts.
    pub fn new(ledger: Ledger, broker: Broker, instance: &str) -> Self {
        Self {
            dispatcher: Arc::new(Dispatcher::new(broker, ledger.clone())),
            ledger,
            instance: instance.to_owned(),
            confirm_grace: Duration::from_secs(30),
        }
    }

    /// Enqueues `job`.
    ///
    /// # Errors
    ///
    /// [`DispatchError::Name`] for an invalid job type or name,
    /// [`DispatchError::BadKey`] for an unusable idempotency key, and
    /// [`DispatchError::Ledger`] when the ledger cannot be reached (nothing
    /// was enqueued). Once the run is stored the call succeeds: a publish
    /// that fails afterwards is finished by the outbox reconciler.
    pub async fn enqueue(&self, job: AdHocJob) -> Result<Enqueued, DispatchError> {
        validate_name("job type", &job.job_type)?;
        let name = job.name.clone().unwrap_or_else(|| job.job_type.clone());
        validate_name("job name", &name)?;
        job.options.check_follow_ups(&name)?;
        let id = Uuid::now_v7();
        let key = match &job.key {
            Some(key) => {
                check_key(key)?;
                key.clone()
            }
            None => id.to_string(),
        };
        let run_key = format!("{name}@{key}");
        let now = Utc::now();
        let scheduled_at = job.run_at.unwrap_or(now);
        let due_now = scheduled_at <= now;
        // Inside the caller's span (a request, say), the run joins its trace.
        let trace = crate::run_trace::current_or_new();
        let grace =
            chrono::Duration::from_std(self.confirm_grace).unwrap_or(chrono::Duration::seconds(30));
        let run = NewRun {
            id,
            job_name: name.clone(),
            run_key: run_key.clone(),
            job_type: job.job_type.clone(),
            payload: job.payload,
            scheduled_at,
            claimed_by: format!("client:{}", self.instance),
            trace_id: trace.trace_id().map(str::to_owned),
            traceparent: Some(trace.traceparent),
            options: job.options,
            // Due now: the reconciler covers us if the publish below fails.
            // Later: the reconciler publishes it when it comes due.
            next_dispatch_at: if due_now { now + grace } else { scheduled_at },
        };
        if !self.ledger.claim(&run).await? {
            let existing = self
                .ledger
                .run_by_key(&name, &run_key)
                .await?
                .ok_or_else(|| {
                    belfry_ledger::LedgerError::Corrupt(format!("run {run_key} vanished"))
                })?;
            return Ok(Enqueued::Existing {
                id: existing.id,
                run_key,
                status: existing.status()?,
            });
        }
        // The run is stored: from here on the job is enqueued whatever the
        // broker says. A publish that failed, or could not be recorded, is
        // the outbox's to finish; an error now would invite a caller
        // without an idempotency key to enqueue it twice.
        let published = due_now
            && self.dispatcher.dispatch(&run.to_message()).await == DispatchOutcome::Dispatched;
        Ok(Enqueued::Created {
            id,
            run_key,
            scheduled_at,
            published,
        })
    }
}

fn check_key(key: &str) -> Result<(), DispatchError> {
    let bad = |reason: &str| DispatchError::BadKey {
        key: key.to_owned(),
        reason: reason.to_owned(),
    };
    // The same rule a received message's run key is held to, so a key
    // accepted here is never refused by a worker.
    belfry_protocol::check_identity(key).map_err(bad)?;
    if chrono::DateTime::parse_from_rfc3339(key).is_ok() {
        // `{name}@{instant}` is the run key of a scheduled fire: an ad-hoc
        // run must not take a fire's key (or be mistaken for one).
        return Err(bad(
            "it is an RFC 3339 instant, the form of scheduled fires' run keys; use another key",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        assert!(check_key("invoice-2026-07").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key("a b").is_err());
        assert!(check_key(&"k".repeat(201)).is_err());
        assert!(check_key("2026-07-26T03:00:00Z").is_err());
    }
}
