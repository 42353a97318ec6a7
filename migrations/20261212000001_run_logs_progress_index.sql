-- The latest progress of a run (`Ledger::latest_progress`, read by every
-- page and stream of its log) straight from the progress lines, instead of
-- walking the run's whole log backwards past its plain lines.
CREATE INDEX IF NOT EXISTS run_logs_progress_idx
    ON run_logs (run_id, attempt DESC, seq DESC) WHERE kind = 'progress';
--
-- Plain CREATE INDEX (see migration 5 for why not CONCURRENTLY): on a large
-- existing run_logs, create it by hand first with CREATE INDEX CONCURRENTLY
-- and this name; IF NOT EXISTS then makes this a no-op.
