-- Follow-up jobs (issue 22; see ledger/src/follow_up.rs): when the
-- follow-up pass decided an ended run's follow-ups, and when it looks again
-- at one still waiting for another parent. The partial index holds only
-- ended runs with undecided follow-ups.
ALTER TABLE job_runs ADD COLUMN follow_ups_done_at TEXT;
ALTER TABLE job_runs ADD COLUMN follow_ups_next_at TEXT;
CREATE INDEX job_runs_follow_ups_idx ON job_runs (follow_ups_next_at)
    WHERE follow_ups_done_at IS NULL AND json_extract(options, '$.follow_ups') IS NOT NULL
      AND status IN ('succeeded', 'failed', 'dead', 'cancelled');
