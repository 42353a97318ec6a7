-- Cluster-wide concurrency limits (issue 22; see ledger/src/concurrency.rs).
--
-- A slot of a limit is a run that is `running` under a live attempt lease
-- with the limit's key in `limit_key`: no table of slots to keep in step
-- with the runs, and a dead worker's slots end with its leases. The index
-- holds only running limited runs (a handful per key), so counting a key's
-- slots reads a few entries per partition however large the ledger is.
--
-- Upgrading: adding a nullable column is a catalog change; the partial
-- index is built on every partition (it reads each once; it stays tiny).
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS limit_key TEXT;
CREATE INDEX IF NOT EXISTS job_runs_limit_idx ON job_runs (limit_key, lease_until)
    WHERE status = 'running' AND limit_key IS NOT NULL;
