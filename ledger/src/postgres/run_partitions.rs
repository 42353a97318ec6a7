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

/// How long a maintenance statement may wait for a table lock. While it
/// waits, every later statement that needs a conflicting lock on the table
/// queues behind it, so this bounds the stall a busy moment can cause the
/// claim path (once a day, per day created or dropped).
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '1s'";

/// Whether partition `{name}` holds a run that keeps it from being dropped:
/// unfinished, finished after the cutoff (`$1`), or ended with follow-ups
/// not decided yet (a join waiting; see `crate::follow_up`). Four
/// `EXISTS`, each an index probe (the partial indexes on unfinished,
/// buffered, finished and undecided runs); one `OR` of the conditions
/// would scan the whole day, and the second check runs while `job_runs`
/// is locked.
fn blockers(name: &str) -> String {
    format!(
        "SELECT EXISTS (SELECT 1 FROM {name} \
                        WHERE status IN ('claimed', 'dispatched', 'running', 'retrying')) \
             OR EXISTS (SELECT 1 FROM {name} WHERE status = 'buffered') \
             OR EXISTS (SELECT 1 FROM {name} WHERE finished_at >= $1) \
             OR EXISTS (SELECT 1 FROM {name} WHERE follow_ups_done_at IS NULL \
                        AND options ? 'follow_ups' \
                        AND status IN ('succeeded', 'failed', 'dead', 'cancelled'))"
    )
}

/// Attempts at locking the default partition without waiting (see
/// `prepare_run_partitions`), and the pause between two.
const DEFAULT_LOCK_ATTEMPTS: u32 = 20;
const DEFAULT_LOCK_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// SQLSTATE of `lock_not_available` (NOWAIT, `lock_timeout`).
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE of `undefined_table`: a partition another replica dropped.
pub(super) const UNDEFINED_TABLE: &str = "42P01";

pub(super) fn is_code(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some(code))
}

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
            let mut attempt = 0;
            loop {
                attempt += 1;
                match self.create_day(&name, from, to).await {
                    Ok(true) => {
                        created.push(name.clone());
                        break;
                    }
                    Ok(false) => break,
                    // The default partition was in use: nothing was held
                    // meanwhile, so nobody waited on us; try again shortly.
                    Err(LedgerError::Query(e))
                        if is_code(&e, LOCK_NOT_AVAILABLE) && attempt < DEFAULT_LOCK_ATTEMPTS =>
                    {
                        tokio::time::sleep(DEFAULT_LOCK_PAUSE).await;
                    }
                    Err(e) => return Err(e),
                }
            }
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
            match self.drop_day(&p.name, cutoff).await {
                Ok(true) => out.dropped.push(p.name),
                Ok(false) => out.kept.push(p.name),
                // Another replica's pass dropped it first.
                Err(LedgerError::Query(e)) if is_code(&e, UNDEFINED_TABLE) => {}
                // Its lock was not granted in time (a long transaction on
                // job_runs): the next pass tries again; the other days and
                // the row-by-row pruning go on.
                Err(LedgerError::Query(e)) if is_code(&e, LOCK_NOT_AVAILABLE) => {
                    tracing::info!(partition = %p.name, "run partition busy; dropping it next pass");
                    out.kept.push(p.name);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn run_partitions(&self) -> Result<Vec<RunPartition>, LedgerError> {
        list(&self.route).await
    }
}

impl PgStore {
    /// Creates day partition `name` for `[from, to)` unless a partition
    /// covers it; whether it was created.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`]; `lock_not_available` when the default
    /// partition was in use (the caller retries).
    async fn create_day(
        &self,
        name: &str,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
    ) -> Result<bool, LedgerError> {
        // Two replicas preparing the same day: the second finds it.
        let mut tx = self.maintenance().await?;
        let existing = list_in(&self.route, &mut tx).await?;
        let covered = existing
            .iter()
            .any(|p| !p.default && p.from.is_none_or(|f| f < to) && p.to.is_none_or(|t| t > from));
        if covered {
            tx.commit().await?;
            return Ok(false);
        }
        // Writers wait (readers do not) until the day is attached: an
        // insert routed to the default partition before the attach would
        // fail its partition check after it ("violates partition
        // constraint"), because routing is decided before the insert waits
        // for the default's lock. SHARE on the parent alone (ONLY: not on
        // every partition) waits for writes in flight and holds off new
        // ones, which route afresh once it is released. The default is then
        // taken without waiting: a transaction that read it and is about to
        // write (a claim deciding an overlap) holds it while it waits for
        // us, so waiting here would be a deadlock; we give way instead and
        // the caller tries again. Held for the few milliseconds below (the
        // new table is empty, the default small).
        let statements = [
            "LOCK TABLE ONLY job_runs IN SHARE MODE".to_owned(),
            "LOCK TABLE job_runs_default IN ACCESS EXCLUSIVE MODE NOWAIT".to_owned(),
            format!("CREATE TABLE {name} (LIKE job_runs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"),
        ];
        for s in &statements {
            sqlx::query(s).execute(self.route.on(&mut tx)).await?;
        }
        // Runs of this day that landed in the default move out; the attach
        // checks the default holds none.
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
        let (lo, hi) = (from.to_rfc3339(), to.to_rfc3339());
        for s in [
            format!(
                "ALTER TABLE {name} ADD CONSTRAINT {name}_range \
                 CHECK (key_instant IS NOT NULL AND key_instant >= '{lo}' AND key_instant < '{hi}')"
            ),
            format!(
                "ALTER TABLE job_runs ATTACH PARTITION {name} FOR VALUES FROM ('{lo}') TO ('{hi}')"
            ),
            format!("ALTER TABLE {name} DROP CONSTRAINT {name}_range"),
        ] {
            sqlx::query(&s).execute(self.route.on(&mut tx)).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Drops day partition `name` if nothing in it is unfinished or
    /// finished after `cutoff`, first recording its schedules' newest fires;
    /// whether it was dropped.
    ///
    /// # Errors
    ///
    /// [`LedgerError::Query`]: `undefined_table` when another replica
    /// dropped it first, `lock_not_available` when `job_runs` stayed busy.
    async fn drop_day(&self, name: &str, cutoff: DateTime<Utc>) -> Result<bool, LedgerError> {
        // The slow part, with no lock on the parent: is anything in the
        // way, and which schedules' newest fire is in it.
        let blocked: bool = sqlx::query_scalar(&blockers(name))
            .bind(cutoff)
            .fetch_one(&self.route)
            .await?;
        if blocked {
            return Ok(false);
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
        // commit), re-check under the lock (a run written into this old day
        // since the check above keeps it: index probes only), drop.
        let mut tx = self.maintenance().await?;
        sqlx::query(&format!("ALTER TABLE job_runs DETACH PARTITION {name}"))
            .execute(self.route.on(&mut tx))
            .await?;
        let blocked: bool = sqlx::query_scalar(&blockers(name))
            .bind(cutoff)
            .fetch_one(self.route.on(&mut tx))
            .await?;
        if blocked {
            // Rolled back: the partition stays attached.
            tx.rollback().await?;
            return Ok(false);
        }
        sqlx::query(&format!("DROP TABLE {name}"))
            .execute(self.route.on(&mut tx))
            .await?;
        tx.commit().await?;
        Ok(true)
    }

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

/// Reads the partitions of `job_runs` from the catalog ([`list_in`]).
pub(super) async fn list(route: &super::pooler::PgRoute) -> Result<Vec<RunPartition>, LedgerError> {
    let mut tx = route.begin().await?;
    let out = list_in(route, &mut tx).await?;
    tx.commit().await?;
    Ok(out)
}

/// Reads the partitions of `job_runs` from the catalog inside `tx`, oldest
/// first (the default last). The bounds come as text in the session's
/// format, so the transaction fixes it (ISO, UTC) before reading them back.
async fn list_in(
    route: &super::pooler::PgRoute,
    tx: &mut sqlx::PgConnection,
) -> Result<Vec<RunPartition>, LedgerError> {
    for s in [
        "SET LOCAL DateStyle = 'ISO, YMD'",
        "SET LOCAL TimeZone = 'UTC'",
    ] {
        sqlx::query(s).execute(route.on(&mut *tx)).await?;
    }
    let executor = route.on(&mut *tx);

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
