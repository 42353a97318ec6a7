//! Follow-up jobs on the embedded ledger (`crate::follow_up`): one write
//! transaction per page (the one writer decides a page at a time, so no
//! parent is decided twice).

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use chrono::Utc;

use super::runs::{claim_in, CLAIM_CHUNK};
use super::{ts, SqliteLedger};
use crate::follow_up::{
    other_keys, plan, EndedParent, FollowUpPass, RelatedRun, ENDED_PARENT_COLUMNS,
    RESULT_COLUMN_SQLITE,
};
use crate::store::FollowUpStore;
use crate::LedgerError;

#[async_trait]
impl FollowUpStore for SqliteLedger {
    async fn settle_follow_ups(&self, limit: i64, by: &str) -> Result<FollowUpPass, LedgerError> {
        let now = Utc::now();
        let at = ts(now);
        let mut tx = self.write_tx().await?;
        // The predicate is the partial index's.
        let parents: Vec<EndedParent> = sqlx::query_as(&format!(
            "SELECT {ENDED_PARENT_COLUMNS}, {RESULT_COLUMN_SQLITE} FROM job_runs \
             WHERE follow_ups_done_at IS NULL AND json_extract(options, '$.follow_ups') IS NOT NULL \
               AND status IN ('succeeded', 'failed', 'dead', 'cancelled') \
               AND (follow_ups_next_at IS NULL OR follow_ups_next_at <= ?1) \
             ORDER BY follow_ups_next_at LIMIT ?2"
        ))
        .bind(&at)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if parents.is_empty() {
            tx.rollback().await?;
            return Ok(FollowUpPass::default());
        }
        let mut others = HashMap::new();
        for (name, key) in other_keys(&parents) {
            let found: Option<RelatedRun> = sqlx::query_as(&format!(
                "SELECT id, job_name, run_key, status, last_error, {RESULT_COLUMN_SQLITE} \
                 FROM job_runs WHERE job_name = ?1 AND run_key = ?2"
            ))
            .bind(&name)
            .bind(&key)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(o) = found {
                others.insert((name, key), o);
            }
        }
        let decided = plan(&parents, &others, now, by);
        // Children first, then the parents' marks: all in this commit.
        let mut won = HashSet::new();
        for chunk in decided.all_children().chunks(CLAIM_CHUNK) {
            won.extend(claim_in(&mut tx, chunk, &at, false).await?);
        }
        let enqueued = decided.enqueued(&won);
        let mut skipped = 0;
        for (id, reason) in decided.skipped(&won) {
            sqlx::query(
                "UPDATE job_runs SET status = 'cancelled', last_error = ?2, finished_at = ?3, \
                     next_dispatch_at = NULL, updated_at = ?3 WHERE id = ?1 AND status = 'claimed'",
            )
            .bind(id)
            .bind(reason)
            .bind(&at)
            .execute(&mut *tx)
            .await?;
            skipped += 1;
        }
        for id in &decided.done {
            sqlx::query("UPDATE job_runs SET follow_ups_done_at = ?2 WHERE id = ?1")
                .bind(id)
                .bind(&at)
                .execute(&mut *tx)
                .await?;
        }
        for (id, next) in &decided.later {
            sqlx::query("UPDATE job_runs SET follow_ups_next_at = ?2 WHERE id = ?1")
                .bind(id)
                .bind(ts(*next))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(FollowUpPass {
            parents: parents.len(),
            enqueued,
            skipped,
            waiting: decided.later.len(),
        })
    }
}
