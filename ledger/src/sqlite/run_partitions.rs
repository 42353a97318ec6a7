//! Time partitions on the embedded ledger: there are none. SQLite has no
//! table partitioning and an embedded ledger holds one process's history,
//! so `job_runs` stays one table pruned row by row (see
//! `crate::run_partitions`); these calls do nothing.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};

use super::SqliteLedger;
use crate::run_partitions::{PartitionDrop, RunPartition};
use crate::store::RunPartitionStore;
use crate::LedgerError;

#[async_trait]
impl RunPartitionStore for SqliteLedger {
    async fn prepare_run_partitions(&self, _: &[NaiveDate]) -> Result<Vec<String>, LedgerError> {
        Ok(Vec::new())
    }

    async fn drop_expired_run_partitions(
        &self,
        _: DateTime<Utc>,
    ) -> Result<PartitionDrop, LedgerError> {
        Ok(PartitionDrop::default())
    }

    async fn run_partitions(&self) -> Result<Vec<RunPartition>, LedgerError> {
        Ok(Vec::new())
    }
}
