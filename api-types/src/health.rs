//! `/healthz` and `/readyz`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

wire_enum! {
    /// The liveness answer's only status.
    pub enum LivenessStatus {
        /// The process serves requests.
        Ok = "ok",
    }
}

/// `GET /healthz`: the process serves requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Liveness {
    /// Always `ok`.
    pub status: LivenessStatus,
}

wire_enum! {
    /// Whether a replica can claim and publish.
    pub enum ReadinessStatus {
        /// Every service is up.
        Ready = "ready",
        /// Redis is down; claims stay exact through the ledger.
        Degraded = "degraded",
        /// The ledger or the broker is down.
        NotReady = "not_ready",
    }
}

wire_enum! {
    /// How the replica runs.
    pub enum Mode {
        /// Postgres, Redis and RabbitMQ.
        Distributed = "distributed",
        /// One SQLite file holding ledger and queue (`belfry dev`).
        Embedded = "embedded",
    }
}

wire_enum! {
    /// A required service's state.
    pub enum ServiceState {
        /// Answered.
        Up = "up",
        /// Did not answer in time.
        Down = "down",
    }
}

wire_enum! {
    /// Redis's state; optional, so it may be switched off.
    pub enum RedisState {
        /// Answered.
        Up = "up",
        /// Did not answer in time.
        Down = "down",
        /// No Redis configured.
        Disabled = "disabled",
    }
}

impl ServiceState {
    /// `Up` when `up`.
    pub fn of(up: bool) -> Self {
        if up {
            Self::Up
        } else {
            Self::Down
        }
    }
}

impl RedisState {
    /// The state of a probe: `None` when Redis is not configured.
    pub fn of(probe: Option<bool>) -> Self {
        match probe {
            None => Self::Disabled,
            Some(true) => Self::Up,
            Some(false) => Self::Down,
        }
    }
}

/// `GET /readyz`: the services this replica needs. A distributed replica
/// reports `postgres` and `rabbitmq`, an embedded one `database` and
/// `queue`; the others are left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    /// Ready, degraded (Redis down) or not ready.
    pub status: ReadinessStatus,
    /// The replica's instance name.
    pub instance: String,
    /// Distributed or embedded.
    pub mode: Mode,
    /// Distributed mode: the ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<ServiceState>,
    /// Distributed mode: the broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rabbitmq: Option<ServiceState>,
    /// Embedded mode: the SQLite file (ledger and queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<ServiceState>,
    /// Embedded mode: the job queue in that file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<ServiceState>,
    /// The lock service (optional).
    pub redis: RedisState,
    /// Distributed mode: the node of each service this replica is
    /// connected to (`postgres`: `host:port/database`; `rabbitmq`: the
    /// cluster node's URL, which changes at a failover; `redis`: its URL),
    /// passwords masked.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub nodes: std::collections::BTreeMap<String, String>,
}
