//! Names of every AMQP object and Redis key belfry uses.
//!
//! Every name is prefixed by the namespace (`BELFRY_NAMESPACE`, default
//! `belfry`), so two deployments, or two tests, can share one broker and one
//! Redis without seeing each other's jobs.
//!
//! | object | name | kind |
//! | --- | --- | --- |
//! | job exchange | `{ns}.jobs` | durable topic exchange, routing key = job type |
//! | group queue | `{ns}.jobs.{group}` | durable quorum queue, bound once per job type the group serves (its `normal` runs) |
//! | group queue per priority | `{ns}.jobs.{group}.high`, `{ns}.jobs.{group}.low` | the same, bound with `high:{type}` / `low:{type}` |
//! | dead-letter exchange | `{ns}.dead-letter` | durable fanout exchange |
//! | dead-letter queue | `{ns}.dead-letter` | durable quorum queue |
//! | claim lock | `{ns}:lock:{job_name}:{run_key}` | Redis string, `SET NX PX` |

use crate::name::{validate_name, NameError};

/// AMQP header carrying the W3C `traceparent`.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// AMQP header carrying the W3C `tracestate`.
pub const HEADER_TRACESTATE: &str = "tracestate";
/// AMQP header carrying [`crate::MESSAGE_VERSION`].
pub const HEADER_VERSION: &str = "x-belfry-version";
/// AMQP header set on dead-lettered messages: why the message is dead.
pub const HEADER_DEAD_REASON: &str = "x-belfry-dead-reason";
/// AMQP header set on dead-lettered messages: the routing key it came with.
pub const HEADER_ORIGINAL_ROUTING_KEY: &str = "x-belfry-original-routing-key";
/// AMQP header set on dead-lettered messages: the worker that gave up on it.
pub const HEADER_DEAD_BY: &str = "x-belfry-dead-by";
/// The content type of job messages.
pub const CONTENT_TYPE_JSON: &str = "application/json";
/// The default namespace.
pub const DEFAULT_NAMESPACE: &str = "belfry";

/// The names of one deployment's AMQP objects and Redis keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    namespace: String,
}

impl Topology {
    /// Names for namespace `namespace`.
    ///
    /// # Errors
    ///
    /// [`NameError`] when the namespace breaks the naming rule.
    pub fn new(namespace: &str) -> Result<Self, NameError> {
        validate_name("namespace", namespace)?;
        Ok(Self {
            namespace: namespace.to_owned(),
        })
    }

    /// The namespace itself.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The topic exchange jobs are published to.
    pub fn jobs_exchange(&self) -> String {
        format!("{}.jobs", self.namespace)
    }

    /// The durable queue of worker group `group` (its `normal` level).
    pub fn group_queue(&self, group: &str) -> String {
        format!("{}.jobs.{group}", self.namespace)
    }

    /// The queue of worker group `group` at `priority`: the group queue for
    /// `normal`, `{ns}.jobs.{group}.high` / `.low` for the others.
    pub fn group_queue_at(&self, group: &str, priority: crate::Priority) -> String {
        match priority {
            crate::Priority::Normal => self.group_queue(group),
            other => format!("{}.jobs.{group}.{}", self.namespace, other.as_str()),
        }
    }

    /// The dead-letter exchange.
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dead-letter", self.namespace)
    }

    /// The dead-letter queue.
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dead-letter", self.namespace)
    }

    /// The Redis key that filters replicas racing for one fire.
    pub fn lock_key(&self, job_name: &str, run_key: &str) -> String {
        format!("{}:lock:{job_name}:{run_key}", self.namespace)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_prefixed() {
        let t = Topology::new("belfry").unwrap();
        assert_eq!(t.jobs_exchange(), "belfry.jobs");
        assert_eq!(t.group_queue("reports"), "belfry.jobs.reports");
        assert_eq!(t.dead_letter_queue(), "belfry.dead-letter");
        assert_eq!(
            t.lock_key("n", "n@2026-07-26T03:00:00Z"),
            "belfry:lock:n:n@2026-07-26T03:00:00Z"
        );
        assert!(Topology::new("a b").is_err());
    }
}
