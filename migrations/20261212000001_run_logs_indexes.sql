-- The latest progress of a run (`Ledger::latest_progress`, read by every
-- page and stream of its log) straight from the progress lines, instead of
-- walking the run's whole log backwards past its plain lines.
CREATE INDEX IF NOT EXISTS run_logs_progress_idx
    ON run_logs (run_id, attempt DESC, seq DESC) WHERE kind = 'progress';
--
-- Plain CREATE INDEX (see migration 5 for why not CONCURRENTLY): on a large
-- existing run_logs, create it by hand first with CREATE INDEX CONCURRENTLY
-- and this name; IF NOT EXISTS then makes this a no-op.

-- The retention pass's index of line instants as BRIN instead of a btree:
-- lines arrive in time order, so a summary per block range finds the old
-- ones (`Ledger::prune_run_logs`) while costing next to nothing per stored
-- line, where a btree on `at` was a second index every line paid for.
DROP INDEX IF EXISTS run_logs_at_idx;
CREATE INDEX IF NOT EXISTS run_logs_at_brin ON run_logs USING brin (at);
