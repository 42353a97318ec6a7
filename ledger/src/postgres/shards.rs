//! Shard leases on Postgres (`crate::shards`): one transaction per pass,
//! serialised across replicas by a transaction-scoped advisory lock, every
//! expiry judged by the database's clock.
//!
//! Every statement of a pass is bounded on the server by the lease's own
//! lifetime (`statement_timeout`, local to the transaction), and a leave
//! by [`LEAVE_BOUND`]. The caller gives up on a pass after as long, but
//! giving up only drops the client's side: without the server's bound the
//! abandoned backend would go on waiting for the pass lock (Postgres does
//! not notice a closed socket while a statement waits), queue ahead of
//! the next passes and, once it had the lock, hold it for the rest of its
//! statements. Under a saturated database that turned one slow pass into
//! a line of them.

use std::time::Duration;

use async_trait::async_trait;

use super::run_partitions::is_code;
use super::PgStore;
use crate::shards::{ShardLease, ShardPass};
use crate::store::ShardStore;
use crate::LedgerError;

/// The lock serialising lease passes: the two-key form of the advisory
/// locks, a key space apart from the one-key locks of the claim path.
const PASS_LOCK: &str = "SELECT pg_advisory_xact_lock(21, 0)";

/// The server-side bound on each statement of a leave (the scheduler
/// gives a leave as long).
pub const LEAVE_BOUND: Duration = Duration::from_secs(5);

/// SQLSTATE of a statement cancelled by `statement_timeout`.
const QUERY_CANCELED: &str = "57014";

/// Heartbeats expired this long are forgotten.
const FORGET_AFTER: &str = "interval '1 day'";

#[async_trait]
impl ShardStore for PgStore {
    async fn shard_pass(
        &self,
        instance: &str,
        shards: u32,
        ttl: Duration,
    ) -> Result<ShardPass, LedgerError> {
        self.pass(instance, shards, ttl)
            .await
            .map_err(|e| over_bound(e, "a shard lease pass", ttl))
    }

    async fn leave_shards(&self, instance: &str) -> Result<u64, LedgerError> {
        self.leave(instance)
            .await
            .map_err(|e| over_bound(e, "freeing this replica's shards", LEAVE_BOUND))
    }

    async fn shard_leases(&self) -> Result<Vec<ShardLease>, LedgerError> {
        Ok(sqlx::query_as(
            // A free lease expires at -infinity, which chrono cannot hold.
            "SELECT shard, owner, epoch, GREATEST(expires_at, 'epoch'::timestamptz) AS expires_at, \
                    expires_at > now() AS live \
             FROM shard_leases ORDER BY shard",
        )
        .fetch_all(&self.route)
        .await?)
    }
}

/// Bounds every statement of `tx` on the server to `bound` (at least a
/// millisecond: zero would mean no bound at all).
async fn bound_statements(
    store: &PgStore,
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    bound: Duration,
) -> Result<(), LedgerError> {
    let ms = bound.as_millis().clamp(1, i32::MAX as u128);
    // `true`: local to this transaction, so the pooled connection (and a
    // transaction-mode pooler's server connection) goes back unbounded.
    sqlx::query("SELECT set_config('statement_timeout', $1, true)")
        .bind(format!("{ms}ms"))
        .execute(store.route.on(tx))
        .await?;
    Ok(())
}

impl PgStore {
    /// [`ShardStore::shard_pass`], its errors as the database gave them.
    async fn pass(
        &self,
        instance: &str,
        shards: u32,
        ttl: Duration,
    ) -> Result<ShardPass, LedgerError> {
        let shards_i32 = i32::try_from(shards.clamp(1, 65_536)).unwrap_or(256);
        let mut tx = self.route.begin().await?;
        bound_statements(self, &mut tx, ttl).await?;
        let ttl = ttl.as_secs_f64();
        // Serialises passes: each sees the counts the previous one left, so
        // two replicas joining at once never both take the same excess.
        sqlx::query(PASS_LOCK)
            .execute(self.route.on(&mut tx))
            .await?;
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM scheduler_replicas WHERE expires_at > now() AND instance <> $1",
        )
        .bind(instance)
        .fetch_one(self.route.on(&mut tx))
        .await?;
        let stored: Option<i32> = sqlx::query_scalar("SELECT shards FROM shard_map WHERE id = 1")
            .fetch_optional(self.route.on(&mut tx))
            .await?;
        match stored {
            Some(n) if n == shards_i32 => {}
            Some(n) if others > 0 => {
                // Refused before this replica announces itself: it takes
                // no part until its setting agrees.
                tx.rollback().await?;
                return Err(LedgerError::ShardCount {
                    configured: shards_i32.unsigned_abs(),
                    stored: n.unsigned_abs(),
                });
            }
            _ => {
                // First replica ever, or nobody else is live: the count is
                // this replica's, and every lease starts afresh (a shard
                // number means other schedules under another count).
                sqlx::query(
                    "INSERT INTO shard_map (id, shards, changed_at) VALUES (1, $1, now()) \
                     ON CONFLICT (id) DO UPDATE SET shards = EXCLUDED.shards, changed_at = now()",
                )
                .bind(shards_i32)
                .execute(self.route.on(&mut tx))
                .await?;
                if stored.is_some() {
                    sqlx::query("DELETE FROM shard_leases")
                        .execute(self.route.on(&mut tx))
                        .await?;
                }
                sqlx::query(
                    "INSERT INTO shard_leases (shard) SELECT generate_series(0, $1 - 1) \
                     ON CONFLICT (shard) DO NOTHING",
                )
                .bind(shards_i32)
                .execute(self.route.on(&mut tx))
                .await?;
            }
        }
        sqlx::query(
            "INSERT INTO scheduler_replicas (instance, expires_at) \
             VALUES ($1, now() + make_interval(secs => $2)) \
             ON CONFLICT (instance) DO UPDATE SET expires_at = EXCLUDED.expires_at",
        )
        .bind(instance)
        .bind(ttl)
        .execute(self.route.on(&mut tx))
        .await?;
        sqlx::query(&format!(
            "DELETE FROM scheduler_replicas WHERE expires_at < now() - {FORGET_AFTER}"
        ))
        .execute(self.route.on(&mut tx))
        .await?;
        // Only a lease still held is renewed: one that expired may already
        // be another's (its epoch moved on), and is taken again below like
        // any free shard if not.
        let mut owned: Vec<i32> = sqlx::query_scalar(
            "UPDATE shard_leases SET expires_at = now() + make_interval(secs => $2) \
             WHERE owner = $1 AND expires_at > now() RETURNING shard",
        )
        .bind(instance)
        .bind(ttl)
        .fetch_all(self.route.on(&mut tx))
        .await?;
        let live = others + 1;
        let share = (i64::from(shards_i32) + live - 1) / live;
        let mut need = share - i64::try_from(owned.len()).unwrap_or(i64::MAX);
        let mut taken: Vec<i32> = Vec::new();
        if need > 0 {
            // Free or expired shards first, lowest numbers first.
            let free: Vec<i32> = sqlx::query_scalar(
                "UPDATE shard_leases SET owner = $1, epoch = epoch + 1, taken_at = now(), \
                     expires_at = now() + make_interval(secs => $2) \
                 WHERE shard IN (SELECT shard FROM shard_leases \
                                 WHERE owner IS NULL OR expires_at <= now() \
                                 ORDER BY shard LIMIT $3) \
                 RETURNING shard",
            )
            .bind(instance)
            .bind(ttl)
            .bind(need)
            .fetch_all(self.route.on(&mut tx))
            .await?;
            need -= i64::try_from(free.len()).unwrap_or(i64::MAX);
            taken.extend(free);
        }
        if need > 0 {
            // Then shards beyond their owner's share, from the most loaded
            // owners: each owner keeps its share (a join never leaves an
            // owner with fewer than the target).
            let stolen: Vec<i32> = sqlx::query_scalar(
                "WITH held AS ( \
                     SELECT shard, owner, \
                            row_number() OVER (PARTITION BY owner ORDER BY shard DESC) AS rank, \
                            count(*) OVER (PARTITION BY owner) AS n \
                     FROM shard_leases WHERE owner IS NOT NULL AND owner <> $1 AND expires_at > now()), \
                 excess AS ( \
                     SELECT shard FROM held WHERE rank <= n - $3 ORDER BY rank, shard LIMIT $4) \
                 UPDATE shard_leases SET owner = $1, epoch = epoch + 1, taken_at = now(), \
                     expires_at = now() + make_interval(secs => $2) \
                 WHERE shard IN (SELECT shard FROM excess) \
                 RETURNING shard",
            )
            .bind(instance)
            .bind(ttl)
            .bind(share)
            .bind(need)
            .fetch_all(self.route.on(&mut tx))
            .await?;
            taken.extend(stolen);
        }
        tx.commit().await?;
        owned.extend(taken.iter().copied());
        owned.sort_unstable();
        taken.sort_unstable();
        let unsigned = |v: Vec<i32>| v.into_iter().map(i32::unsigned_abs).collect();
        Ok(ShardPass {
            owned: unsigned(owned),
            taken: unsigned(taken),
            live: u32::try_from(live).unwrap_or(u32::MAX),
            shards: shards_i32.unsigned_abs(),
        })
    }

    /// [`ShardStore::leave_shards`], its errors as the database gave them.
    async fn leave(&self, instance: &str) -> Result<u64, LedgerError> {
        let mut tx = self.route.begin().await?;
        bound_statements(self, &mut tx, LEAVE_BOUND).await?;
        // Under the pass lock, so a pass running now counts this replica
        // either live with its shards or gone without them.
        sqlx::query(PASS_LOCK)
            .execute(self.route.on(&mut tx))
            .await?;
        let freed = sqlx::query(
            "UPDATE shard_leases SET owner = NULL, expires_at = '-infinity' WHERE owner = $1",
        )
        .bind(instance)
        .execute(self.route.on(&mut tx))
        .await?
        .rows_affected();
        sqlx::query("DELETE FROM scheduler_replicas WHERE instance = $1")
            .bind(instance)
            .execute(self.route.on(&mut tx))
            .await?;
        tx.commit().await?;
        Ok(freed)
    }
}

/// The server-side bound's cancel (`57014`, `statement_timeout`) as what it
/// is: the operation took longer than `after`, as when the client gives up
/// first (both bounds are the same, and either may fire first).
fn over_bound(e: LedgerError, what: &'static str, after: Duration) -> LedgerError {
    match e {
        LedgerError::Query(ref q) if is_code(q, QUERY_CANCELED) => {
            LedgerError::TimedOut { what, after }
        }
        e => e,
    }
}
