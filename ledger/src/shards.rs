//! Shard leases: how scheduler replicas share the fires (issue 21).
//!
//! Schedules are split into a fixed number of shards (see
//! [`belfry_protocol::shard_of`]); each live replica holds leases on an
//! even share of them (`shard_leases`: owner, expiry by the database's
//! clock, a fencing epoch raised on every change of owner) and fires only
//! the schedules of the shards it holds. A replica announces itself with a
//! heartbeat (`scheduler_replicas`); the live ones split the shards
//! `ceil(shards / live)` each.
//!
//! One pass ([`Ledger::shard_pass`]) renews this replica's heartbeat and
//! leases, takes free or expired shards up to its share, and then shards
//! beyond their share from replicas holding more (a join: the old owner
//! learns at its next renewal, and until then both fire the shard, which
//! the claim path makes harmless). Passes are serialised by a
//! transaction-scoped advisory lock, so two joining replicas never take
//! the same excess twice. Leaving ([`Ledger::leave_shards`]) frees this
//! replica's shards at once for the others' next pass; a replica that dies
//! loses them when their lease expires.
//!
//! Only Postgres ledgers shard: the embedded ledger has one process, which
//! fires everything.

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::{Ledger, LedgerError};

/// What one pass left this replica holding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPass {
    /// Shards this replica holds after the pass, ascending.
    pub owned: Vec<u32>,
    /// Of those, the ones it took in this pass (new to it).
    pub taken: Vec<u32>,
    /// Live replicas, this one included.
    pub live: u32,
    /// The ledger's shard count.
    pub shards: u32,
}

/// One shard's lease, as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ShardLease {
    /// The shard.
    pub shard: i32,
    /// The replica holding it (`None`: free).
    pub owner: Option<String>,
    /// Raised on every change of owner.
    pub epoch: i64,
    /// When the lease ends unless renewed (1970-01-01 for a lease never
    /// held or freed).
    pub expires_at: DateTime<Utc>,
    /// Whether it is held now (`expires_at` ahead of the database's clock).
    pub live: bool,
}

impl Ledger {
    /// One lease pass of replica `instance` over `shards` shards with leases
    /// of `ttl`: heartbeat, renewal of what it holds, then taking free,
    /// expired and excess shards up to its share (see the module docs).
    ///
    /// The first pass of any replica records the shard count; a later one
    /// may change it only while no other replica is live (every lease is
    /// then dropped and taken again under the new count).
    ///
    /// # Errors
    ///
    /// [`LedgerError::ShardCount`] when live replicas use another shard
    /// count; [`LedgerError::Unsupported`] on the embedded ledger;
    /// [`LedgerError::Query`] when the database cannot be reached.
    pub async fn shard_pass(
        &self,
        instance: &str,
        shards: u32,
        ttl: Duration,
    ) -> Result<ShardPass, LedgerError> {
        self.store.shard_pass(instance, shards, ttl).await
    }

    /// Frees every shard `instance` holds and removes its heartbeat, so the
    /// other replicas take them at their next pass (a graceful leave).
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached (the
    /// leases then expire on their own); [`LedgerError::Unsupported`] on
    /// the embedded ledger.
    pub async fn leave_shards(&self, instance: &str) -> Result<u64, LedgerError> {
        self.store.leave_shards(instance).await
    }

    /// Every shard's lease, by shard.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`] when the database cannot be reached;
    /// [`LedgerError::Unsupported`] on the embedded ledger.
    pub async fn shard_leases(&self) -> Result<Vec<ShardLease>, LedgerError> {
        self.store.shard_leases().await
    }
}
