//! Follow-up jobs on Postgres (`crate::follow_up`): one transaction per
//! page; the parents locked `FOR UPDATE SKIP LOCKED`, so replicas passing
//! at once split the page instead of deciding a parent twice.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::runs::claim_rows;
use super::PgStore;
use crate::follow_up::{
    other_keys, plan, EndedParent, FollowUpPass, RelatedRun, ENDED_PARENT_COLUMNS, RESULT_COLUMN_PG,
};
use crate::store::FollowUpStore;
use crate::LedgerError;

#[async_trait]
impl FollowUpStore for PgStore {
    async fn settle_follow_ups(&self, limit: i64, by: &str) -> Result<FollowUpPass, LedgerError> {
        let mut tx = self.route.begin().await?;
        // The predicate is the partial index's: only ended runs with
        // undecided follow-ups are read. A parent another replica holds is
        // skipped, not waited for: that replica decides it.
        let parents: Vec<EndedParent> = sqlx::query_as(&format!(
            "SELECT {ENDED_PARENT_COLUMNS}, {RESULT_COLUMN_PG} FROM job_runs \
             WHERE follow_ups_done_at IS NULL AND options ? 'follow_ups' \
               AND status IN ('succeeded', 'failed', 'dead', 'cancelled') \
               AND (follow_ups_next_at IS NULL OR follow_ups_next_at <= now()) \
             ORDER BY follow_ups_next_at NULLS FIRST LIMIT $1 FOR UPDATE SKIP LOCKED"
        ))
        .bind(limit)
        .fetch_all(self.route.on(&mut tx))
        .await?;
        if parents.is_empty() {
            tx.rollback().await?;
            return Ok(FollowUpPass::default());
        }
        let keys = other_keys(&parents);
        let (names, run_keys): (Vec<String>, Vec<String>) = keys.into_iter().unzip();
        let others: Vec<RelatedRun> = sqlx::query_as(&format!(
            "SELECT j.id, j.job_name, j.run_key, j.status, j.last_error, {RESULT_COLUMN_PG} \
             FROM job_runs j JOIN unnest($1::text[], $2::text[]) AS k(n, r) \
               ON j.job_name = k.n AND j.run_key = k.r AND j.key_instant = belfry_key_instant(k.n, k.r)"
        ))
        .bind(&names)
        .bind(&run_keys)
        .fetch_all(self.route.on(&mut tx))
        .await?;
        let others: HashMap<(String, String), RelatedRun> = others
            .into_iter()
            .map(|o| ((o.job_name.clone(), o.run_key.clone()), o))
            .collect();
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(self.route.on(&mut tx))
            .await?;
        let decided = plan(&parents, &others, now, by);
        // Children first, then the parents' marks: all in this commit.
        // One insert, in key order (see `FollowUpPlan::all_children`).
        let won = claim_rows(self.route.on(&mut tx), &decided.all_children(), false).await?;
        let won: std::collections::HashSet<Uuid> = won.into_iter().map(|(id, _)| id).collect();
        let enqueued = decided.enqueued(&won);
        let (skip_ids, reasons): (Vec<Uuid>, Vec<String>) =
            decided.skipped(&won).into_iter().unzip();
        sqlx::query(
            "UPDATE job_runs j SET status = 'cancelled', last_error = s.reason, finished_at = now(), \
                 next_dispatch_at = NULL, updated_at = now() \
             FROM unnest($1::uuid[], $2::text[]) AS s(id, reason) \
             WHERE j.id = s.id AND j.status = 'claimed'",
        )
        .bind(&skip_ids)
        .bind(&reasons)
        .execute(self.route.on(&mut tx))
        .await?;
        sqlx::query("UPDATE job_runs SET follow_ups_done_at = now() WHERE id = ANY($1)")
            .bind(&decided.done)
            .execute(self.route.on(&mut tx))
            .await?;
        let (later_ids, later_at): (Vec<Uuid>, Vec<DateTime<Utc>>) =
            decided.later.iter().copied().unzip();
        sqlx::query(
            "UPDATE job_runs j SET follow_ups_next_at = l.at \
             FROM unnest($1::uuid[], $2::timestamptz[]) AS l(id, at) WHERE j.id = l.id",
        )
        .bind(&later_ids)
        .bind(&later_at)
        .execute(self.route.on(&mut tx))
        .await?;
        tx.commit().await?;
        Ok(FollowUpPass {
            parents: parents.len(),
            enqueued,
            skipped: skip_ids.len(),
            waiting: decided.later.len(),
        })
    }
}
