-- Cluster-wide concurrency limits (issue 22; see ledger/src/concurrency.rs):
-- a slot is a running run under a live lease with the limit's key.
ALTER TABLE job_runs ADD COLUMN limit_key TEXT;
CREATE INDEX job_runs_limit_idx ON job_runs (limit_key, lease_until)
    WHERE status = 'running' AND limit_key IS NOT NULL;
