-- Run logs and progress (issue 23; ledger/src/run_log.rs): what a handler
-- wrote through `JobContext::log` and `JobContext::progress`, one row per
-- line, per run and attempt in the order written (`seq`, from 0 per
-- attempt). `kind`: `log`, `progress` (with `done`/`total`), `truncated`
-- (the attempt's bound was reached; later lines were dropped) or `error`
-- (the attempt's failure, written by the worker). `fields` is the line's
-- structured fields as JSON text (text, not jsonb: a field may hold a NUL,
-- which jsonb refuses). No foreign key: `job_runs` is partitioned and its
-- rows leave by whole partitions; retention removes a run's lines once the
-- run is gone (`Ledger::prune_run_logs`, by `at`).
CREATE TABLE IF NOT EXISTS run_logs (
    run_id   UUID        NOT NULL,
    attempt  INTEGER     NOT NULL,
    seq      INTEGER     NOT NULL,
    at       TIMESTAMPTZ NOT NULL,
    kind     TEXT        NOT NULL,
    level    TEXT        NOT NULL,
    message  TEXT        NOT NULL,
    fields   TEXT,
    done     BIGINT,
    total    BIGINT,
    PRIMARY KEY (run_id, attempt, seq)
);
CREATE INDEX IF NOT EXISTS run_logs_at_idx ON run_logs (at);
