-- Follow-up jobs (issue 22; see ledger/src/follow_up.rs).
--
-- A run whose options carry follow-up lists (`options ? 'follow_ups'`) has
-- them enqueued by the scheduler replicas' follow-up pass once it has
-- ended. `follow_ups_done_at` records that the pass decided every one of
-- them (in the transaction that inserted the children), `follow_ups_next_at`
-- when a run with a follow-up still waiting for another parent is looked
-- at again. The partial index holds only ended runs with undecided
-- follow-ups: the pass reads a few entries however large the ledger is,
-- and no statement of the hot path (claims, attempt starts and ends)
-- writes a column it covers except the status it already wrote.
--
-- Upgrading: two nullable columns (a catalog change, no rewrite); the
-- partial index is built on every partition (each is read once while
-- writes to it wait, as for the earlier partial indexes) and holds nothing
-- for existing runs (none carries follow-ups).
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS follow_ups_done_at TIMESTAMPTZ;
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS follow_ups_next_at TIMESTAMPTZ;
CREATE INDEX IF NOT EXISTS job_runs_follow_ups_idx ON job_runs (follow_ups_next_at)
    WHERE follow_ups_done_at IS NULL AND options ? 'follow_ups'
      AND status IN ('succeeded', 'failed', 'dead', 'cancelled');
