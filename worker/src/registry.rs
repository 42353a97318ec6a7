//! The registry of job types a worker serves.
//!
//! Built once at start with [`Registry::builder`]; the worker binds its
//! group queue to exactly these types, so it never receives a type it
//! cannot handle, and looks handlers up by the message's `job_type`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use thiserror::Error;

use belfry_protocol::{validate_name, JobOptions, NameError};

use crate::job::{Job, JobContext, JobError};

/// A running attempt, type-erased.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), JobError>> + Send>>;

/// A job type's handler, type-erased so handlers of different payload
/// types live in one map.
pub trait Handler: Send + Sync {
    /// Decodes `payload` and starts the attempt.
    ///
    /// # Errors
    ///
    /// The decode error when `payload` does not match the job's payload
    /// type; the run cannot succeed with this payload.
    fn start(
        &self,
        ctx: JobContext,
        payload: serde_json::Value,
    ) -> Result<HandlerFuture, serde_json::Error>;
}

struct Typed<J: Job>(Arc<J>);

impl<J: Job> Handler for Typed<J> {
    fn start(
        &self,
        ctx: JobContext,
        payload: serde_json::Value,
    ) -> Result<HandlerFuture, serde_json::Error> {
        let payload: J::Payload = serde_json::from_value(payload)?;
        let job = self.0.clone();
        Ok(Box::pin(async move { job.run(ctx, payload).await }))
    }
}

/// Why a registry could not be built.
#[derive(Debug, Error)]
pub enum RegistryError {
    /// Two jobs claim the same type name.
    #[error("job type {0:?} is registered twice; each type needs exactly one handler")]
    Duplicate(String),
    /// A type name breaks the naming rule.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A configured job type has no handler in this binary.
    #[error(
        "job type {job_type:?} is configured but has no handler; this worker can run: {registered}"
    )]
    NotRegistered {
        /// The configured type.
        job_type: String,
        /// The types that have handlers.
        registered: String,
    },
    /// Nothing was registered.
    #[error("the registry is empty; register at least one job type")]
    Empty,
    /// `capture_tracing` named a type not registered before it.
    #[error("capture_tracing names job type {0:?}, which is not registered before it; call .job(..) for the type first")]
    CaptureUnregistered(String),
}

/// A registered job type: its handler and its own retry/timeout settings.
#[derive(Clone)]
pub struct Registered {
    /// The handler.
    pub handler: Arc<dyn Handler>,
    /// The type's overrides of the worker's defaults.
    pub options: JobOptions,
    /// Whether `tracing` events inside the handler's span are stored in
    /// the run's log, and at which level or more severe (see
    /// [`crate::log_capture`]); `None`, the default, stores none.
    pub capture_tracing: Option<tracing::Level>,
}

/// Job types and their handlers.
#[derive(Clone)]
pub struct Registry {
    handlers: BTreeMap<String, Registered>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("types", &self.types())
            .finish()
    }
}

/// Collects job types; see [`Registry::builder`].
#[derive(Default)]
pub struct RegistryBuilder {
    entries: Vec<(String, Registered)>,
    /// Types named by `capture_tracing` before (or without) being
    /// registered: refused by `build`.
    unknown_captures: Vec<String>,
}

impl RegistryBuilder {
    /// Registers job type `J` with the worker's default retry policy and
    /// timeout.
    pub fn job<J: Job>(self, job: J) -> Self {
        self.job_with(job, JobOptions::default())
    }

    /// Registers job type `J` with its own retry policy and/or timeout
    /// (fields left `None` keep the worker's defaults; a schedule or an
    /// ad-hoc request can override them again per run).
    pub fn job_with<J: Job>(mut self, job: J, options: JobOptions) -> Self {
        let handler: Arc<dyn Handler> = Arc::new(Typed(Arc::new(job)));
        self.entries.push((
            J::TYPE.to_owned(),
            Registered {
                handler,
                options,
                capture_tracing: None,
            },
        ));
        self
    }

    /// Stores the `tracing` events that job type `J`'s handler emits (in
    /// its attempt's span, at `max_level` or more severe) in each run's
    /// log, beside its `ctx.log` lines. Off by default: a library that logs
    /// a lot would fill the store. Needs [`crate::RunLogCapture`] in the
    /// process's subscriber (see [`crate::log_capture`]). Register `J`
    /// first.
    pub fn capture_tracing<J: Job>(mut self, max_level: tracing::Level) -> Self {
        match self.entries.iter_mut().rev().find(|(t, _)| t == J::TYPE) {
            Some((_, registered)) => registered.capture_tracing = Some(max_level),
            None => self.unknown_captures.push(J::TYPE.to_owned()),
        }
        self
    }

    /// Registers the built-in `noop`, `sleep` and `http` job types.
    pub fn builtins(self) -> Self {
        self.job(crate::builtin::Noop)
            .job(crate::builtin::Sleep)
            .job(crate::builtin::Http::default())
    }

    /// Builds the registry.
    ///
    /// # Errors
    ///
    /// [`RegistryError`] for a duplicate or invalid type name, an empty
    /// registry, or `capture_tracing` of a type not registered.
    pub fn build(self) -> Result<Registry, RegistryError> {
        if let Some(job_type) = self.unknown_captures.into_iter().next() {
            return Err(RegistryError::CaptureUnregistered(job_type));
        }
        let mut handlers = BTreeMap::new();
        for (name, registered) in self.entries {
            validate_name("job type", &name)?;
            if handlers.insert(name.clone(), registered).is_some() {
                return Err(RegistryError::Duplicate(name));
            }
        }
        if handlers.is_empty() {
            return Err(RegistryError::Empty);
        }
        Ok(Registry { handlers })
    }
}

impl Registry {
    /// Starts an empty builder.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// The registered type names, sorted.
    pub fn types(&self) -> Vec<&str> {
        self.handlers.keys().map(String::as_str).collect()
    }

    /// The handler and settings of `job_type`.
    pub fn get(&self, job_type: &str) -> Option<&Registered> {
        self.handlers.get(job_type)
    }

    /// Keeps only `types` (a worker group serving part of what this binary
    /// can run).
    ///
    /// # Errors
    ///
    /// [`RegistryError::NotRegistered`] naming a type that has no handler,
    /// and [`RegistryError::Empty`] when `types` is empty.
    pub fn restrict<S: AsRef<str>>(mut self, types: &[S]) -> Result<Self, RegistryError> {
        let wanted: Vec<&str> = types.iter().map(AsRef::as_ref).collect();
        if let Some(missing) = wanted.iter().find(|t| !self.handlers.contains_key(**t)) {
            return Err(RegistryError::NotRegistered {
                job_type: (*missing).to_owned(),
                registered: self.types().join(", "),
            });
        }
        self.handlers
            .retain(|name, _| wanted.contains(&name.as_str()));
        if self.handlers.is_empty() {
            return Err(RegistryError::Empty);
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named;
    impl Job for Named {
        const TYPE: &'static str = "noop";
        type Payload = serde_json::Value;
        async fn run(&self, _: JobContext, _: serde_json::Value) -> Result<(), JobError> {
            Ok(())
        }
    }

    struct BadName;
    impl Job for BadName {
        const TYPE: &'static str = "bad name";
        type Payload = ();
        async fn run(&self, _: JobContext, _: ()) -> Result<(), JobError> {
            Ok(())
        }
    }

    #[test]
    fn builds_and_refuses() {
        let r = Registry::builder().builtins().build().unwrap();
        assert_eq!(r.types(), ["http", "noop", "sleep"]);
        assert!(matches!(
            Registry::builder().builtins().job(Named).build(),
            Err(RegistryError::Duplicate(t)) if t == "noop"
        ));
        assert!(matches!(
            Registry::builder().job(BadName).build(),
            Err(RegistryError::Name(_))
        ));
        assert!(matches!(
            Registry::builder().build(),
            Err(RegistryError::Empty)
        ));
    }
}
