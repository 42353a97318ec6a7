//! Time partitions of `job_runs` on Postgres (`crate::run_partitions`):
//! creation ahead of time and retention by dropping whole days.
//!
//! Both are DDL on a table every replica and worker writes, so each step
//! is built to hold the parent's strong locks as briefly as possible:
//!
//! * a day is created as a plain table and then attached, holding off
//!   writers (`SHARE` on `job_runs`; readers go on) only for the attach
//!   itself (`CREATE TABLE .. PARTITION OF` would take `ACCESS EXCLUSIVE`
//!   while it builds the table); days are created days ahead and at
//!   migration, so the day a fire needs exists before anyone writes to it;
//! * a drop first does the slow part (the blocker check and recording the
//!   newest fires) without any lock on the parent, then detaches and drops
//!   in one short transaction, re-checking the blockers under the lock;
//! * every such transaction sets a `lock_timeout`: a DDL statement waiting
//!   for a lock makes every later statement on the table queue behind it,
//!   so a pass gives up quickly (and the next pass retries) rather than
//!   stall the claim path behind a long transaction.

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};

use super::PgStore;
use crate::fire_history::live_fire;
use crate::run_partitions::{day_partition_name, PartitionDrop, RunPartition};
use crate::store::RunPartitionStore;
use crate::LedgerError;

/// Serialises partition maintenance between replicas (two-key advisory
/// lock, beside the shard passes' `(21, 0)`).
const MAINTENANCE_LOCK: &str = "SELECT pg_advisory_xact_lock(21, 1)";

/// How long a maintenance statement may wait for a table lock.
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '2s'";

/// A run that keeps its day partition from being dropped: unfinished, or
/// finished after the cutoff (`$1`). Index probes only (the partial
/// indexes on unfinished and on finished runs).
const BLOCKERS: &str = "status IN ('claimed', 'dispatched', 'running', 'retrying', 'buffered') \
                        OR finished_at >= $1";

#[async_trait]
impl RunPartitionStore for PgStore {
    async fn prepare_run_partitions(&self, days: &[NaiveDate]) -> Result<Vec<String>, LedgerError> {
        let mut created = Vec::new();
        for &day in days {
            let Some(from) = day.and_hms_opt(0, 0, 0).map(|t| t.and_utc()) else {
                continue;
            };
            let Some(to) = day
                .succ_opt()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
                .map(|t| t.and_utc())
            else {
                continue;
            };
            let name = day_partition_name(day);
            // Two replicas preparing the same day: the second finds it.
            let mut tx = self.maintenance().await?;
            let existing = list(self.route.on(&mut tx)).await?;
            let covered = existing.iter().any(|p| {
                !p.default && p.from.is_none_or(|f| f < to) && p.to.is_none_or(|t| t > from)
            });
            if covered {
                tx.commit().await?;
                continue;
            }
            // Writers wait (readers do not) until the day is attached: an
            // insert routed to the default partition before the attach
            // would fail its partition check after it ("violates partition
            // constraint"), because routing is decided before the insert
            // waits for the default's lock. SHARE on the parent waits for
            // writes in flight and holds off new ones, which route afresh
            // once it is released. Parent before default, the order every
            // writer takes them in, so no cycle. Held for the few
            // milliseconds below (the new table is empty, the default
            // small).
            let statements = [
                "LOCK TABLE job_runs IN SHARE MODE".to_owned(),
                // Runs of this day that landed in the default move out, and
                // the attach checks the default holds none.
                "LOCK TABLE job_runs_default IN ACCESS EXCLUSIVE MODE".to_owned(),
                format!(
                    "CREATE TABLE {name} (LIKE job_runs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
                ),
            ];
            for s in &statements {
                sqlx::query(s).execute(self.route.on(&mut tx)).await?;
            }
            sqlx::query(&format!(
                "WITH moved AS (DELETE FROM job_runs_default \
                                WHERE key_instant >= $1 AND key_instant < $2 RETURNING *) \
                 INSERT INTO {name} SELECT * FROM moved"
            ))
            .bind(from)
            .bind(to)
            .execute(self.route.on(&mut tx))
            .await?;
            // The range as a CHECK lets ATTACH skip scanning the new table;
            // dropped again once the partition bound says the same.
            sqlx::query(&format!(
                "ALTER TABLE {name} ADD CONSTRAINT {name}_range \
                 CHECK (key_instant IS NOT NULL AND key_instant >= '{}' AND key_instant < '{}')",
                from.to_rfc3339(),
                to.to_rfc3339()
            ))
            .execute(self.route.on(&mut tx))
            .await?;
            sqlx::query(&format!(
                "ALTER TABLE job_runs ATTACH PARTITION {name} FOR VALUES FROM ('{}') TO ('{}')",
                from.to_rfc3339(),
                to.to_rfc3339()
            ))
            .execute(self.route.on(&mut tx))
            .await?;
            sqlx::query(&format!("ALTER TABLE {name} DROP CONSTRAINT {name}_range"))
                .execute(self.route.on(&mut tx))
                .await?;
            tx.commit().await?;
            created.push(name);
        }
        Ok(created)
    }

    async fn drop_expired_run_partitions(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<PartitionDrop, LedgerError> {
        let mut out = PartitionDrop::default();
        let expired: Vec<RunPartition> = list(&self.route)
            .await?
            .into_iter()
            .filter(|p| p.is_day() && p.to.is_some_and(|t| t <= cutoff))
            .collect();
        for p in expired {
            let name = &p.name;
            // The slow part, with no lock on the parent: is anything in the
            // way, and which schedules' newest fire is in it.
            let blocked: bool = sqlx::query_scalar(&format!(
                "SELECT EXISTS (SELECT 1 FROM {name} WHERE {BLOCKERS})"
            ))
            .bind(cutoff)
            .fetch_one(&self.route)
            .await?;
            if blocked {
                out.kept.push(name.clone());
                continue;
            }
            sqlx::query(&format!(
                "INSERT INTO schedule_last_fires (job_name, scheduled_at) \
                 SELECT r.job_name, max(r.scheduled_at) FROM {name} r WHERE {} GROUP BY r.job_name \
                 ON CONFLICT (job_name) DO UPDATE \
                     SET scheduled_at = GREATEST(schedule_last_fires.scheduled_at, EXCLUDED.scheduled_at)",
                live_fire("r")
            ))
            .execute(&self.route)
            .await?;
            // The short part: detach (ACCESS EXCLUSIVE on job_runs until
            // commit), re-check under the lock (a run written into this old
            // day since the check above keeps it), drop.
            let mut tx = self.maintenance().await?;
            sqlx::query(&format!("ALTER TABLE job_runs DETACH PARTITION {name}"))
                .execute(self.route.on(&mut tx))
                .await?;
            let blocked: bool = sqlx::query_scalar(&format!(
                "SELECT EXISTS (SELECT 1 FROM {name} WHERE {BLOCKERS})"
            ))
            .bind(cutoff)
            .fetch_one(self.route.on(&mut tx))
            .await?;
            if blocked {
                // Rolled back: the partition stays attached.
                tx.rollback().await?;
                out.kept.push(name.clone());
                continue;
            }
            sqlx::query(&format!("DROP TABLE {name}"))
                .execute(self.route.on(&mut tx))
                .await?;
            tx.commit().await?;
            out.dropped.push(name.clone());
        }
        Ok(out)
    }

    async fn run_partitions(&self) -> Result<Vec<RunPartition>, LedgerError> {
        list(&self.route).await
    }
}

impl PgStore {
    /// A maintenance transaction: short lock waits, and serialised with
    /// every other replica's maintenance.
    async fn maintenance(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, LedgerError> {
        let mut tx = self.route.begin().await?;
        sqlx::query(LOCK_TIMEOUT)
            .execute(self.route.on(&mut tx))
            .await?;
        sqlx::query(MAINTENANCE_LOCK)
            .execute(self.route.on(&mut tx))
            .await?;
        Ok(tx)
    }
}

/// Reads the partitions of `job_runs` from the catalog, oldest first (the
/// default last). The bounds are read back in the session's own text form
/// of a timestamp, so the cast back is exact whatever its DateStyle.
async fn list<'e, E>(executor: E) -> Result<Vec<RunPartition>, LedgerError>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
{
    /// Name, lower bound, upper bound, default.
    type Row = (String, Option<DateTime<Utc>>, Option<DateTime<Utc>>, bool);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT c.relname::text, \
             substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \\(''([^'']*)''\\)')::timestamptz, \
             substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']*)''\\)')::timestamptz, \
             pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' \
         FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'job_runs'::regclass",
    )
    .fetch_all(executor)
    .await?;
    let mut out: Vec<RunPartition> = rows
        .into_iter()
        .map(|(name, from, to, default)| RunPartition {
            name,
            from,
            to,
            default,
        })
        .collect();
    // Keyed (no lower bound) first, then by day, the default last.
    out.sort_by_key(|p| (p.default, p.from.is_some(), p.from));
    Ok(out)
}
