-- The latest progress of a run straight from its progress lines (see
-- migrations/20261212000001_run_logs_indexes.sql; SQLite keeps its plain index of `at`).
CREATE INDEX IF NOT EXISTS run_logs_progress_idx
    ON run_logs (run_id, attempt DESC, seq DESC) WHERE kind = 'progress';
