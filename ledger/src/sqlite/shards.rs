//! Shard leases on the embedded ledger: there are none. One process owns
//! the file and fires every schedule, so a replica on it never shards (see
//! `crate::shards`); asking is a mistake named as such.

use std::time::Duration;

use async_trait::async_trait;

use super::SqliteLedger;
use crate::shards::{ShardLease, ShardPass};
use crate::store::ShardStore;
use crate::LedgerError;

const SHARDING: &str = "sharding the fires between replicas";

#[async_trait]
impl ShardStore for SqliteLedger {
    async fn shard_pass(&self, _: &str, _: u32, _: Duration) -> Result<ShardPass, LedgerError> {
        Err(LedgerError::Unsupported(SHARDING))
    }

    async fn leave_shards(&self, _: &str) -> Result<u64, LedgerError> {
        Err(LedgerError::Unsupported(SHARDING))
    }

    async fn shard_leases(&self) -> Result<Vec<ShardLease>, LedgerError> {
        Err(LedgerError::Unsupported(SHARDING))
    }
}
