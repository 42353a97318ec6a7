//! A run's priority (issue 22): `high`, `normal` (the default) or `low`.
//!
//! Each level of a worker group has a queue of its own
//! ([`crate::Topology::group_queue_at`]); a worker consumes all three and,
//! whenever a handler is free, takes a ready delivery of the highest level
//! first. So a backlog of `normal` runs does not hold up a `high` one, and
//! `low` runs go only when nothing above them is waiting.
//!
//! Why queues per level and not RabbitMQ's priority queues: group queues
//! are quorum queues (replicated; issue 18), and quorum queues take no
//! `x-max-priority` before RabbitMQ 4.0 (this machine runs 3.10); a queue's
//! arguments cannot be changed once declared, so existing deployments
//! could not have it without deleting their queues. The `normal` level's
//! queue and routing key are the ones belfry always had: nothing existing
//! changes, and a message published by hand with the job type as its
//! routing key is a `normal` run.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A run's priority.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Priority {
    /// Taken before everything else.
    High,
    /// The default.
    #[default]
    Normal,
    /// Taken only when nothing above it is ready.
    Low,
}

impl Priority {
    /// Every level, highest first (the order a worker looks in).
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The level's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The routing key of a run of `job_type` at this level: the job type
    /// itself for `normal` (as always), `high:<type>` / `low:<type>`
    /// otherwise (`:` is not allowed in job type names, so no job type's
    /// key can be another level's).
    pub fn routing_key(self, job_type: &str) -> String {
        match self {
            Priority::Normal => job_type.to_owned(),
            other => format!("{}:{job_type}", other.as_str()),
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        match raw.trim() {
            "high" => Ok(Priority::High),
            "normal" => Ok(Priority::Normal),
            "low" => Ok(Priority::Low),
            other => Err(format!(
                "unknown priority {other:?}; use \"high\", \"normal\" or \"low\""
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_order_and_route_apart() {
        assert!(Priority::High < Priority::Normal && Priority::Normal < Priority::Low);
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>().unwrap(), p);
        }
        assert!("urgent"
            .parse::<Priority>()
            .unwrap_err()
            .contains("\"high\""));
        assert_eq!(Priority::Normal.routing_key("report"), "report");
        assert_eq!(
            Priority::High.routing_key("acme.report"),
            "high:acme.report"
        );
        assert_eq!(Priority::Low.routing_key("report"), "low:report");
        assert_eq!(Priority::default(), Priority::Normal);
    }
}
