-- Control over running work: the statuses `cancelled` and `buffered`, the
-- cancel request columns, bounded and self-pausing schedules; see the
-- Postgres migration of the same name. SQLite cannot change a
-- CHECK constraint in place, so job_runs is rebuilt (the documented
-- procedure: new table, copy, drop, rename, indexes), in this migration's
-- transaction.
CREATE TABLE job_runs_new (
    id               BLOB    PRIMARY KEY,
    job_name         TEXT    NOT NULL,
    run_key          TEXT    NOT NULL,
    job_type         TEXT    NOT NULL,
    status           TEXT    NOT NULL
        CHECK (status IN ('claimed', 'dispatched', 'running', 'retrying', 'succeeded', 'failed', 'dead', 'cancelled', 'buffered')),
    payload          TEXT    NOT NULL DEFAULT 'null',
    scheduled_at     TEXT    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    claimed_by       TEXT,
    claimed_at       TEXT,
    dispatched_at    TEXT,
    started_at       TEXT,
    finished_at      TEXT,
    worker           TEXT,
    last_error       TEXT,
    attempt_log      TEXT    NOT NULL DEFAULT '[]',
    trace_id         TEXT,
    traceparent      TEXT,
    updated_at       TEXT    NOT NULL,
    next_dispatch_at TEXT,
    options          TEXT    NOT NULL DEFAULT '{}',
    lease_until      TEXT,
    cancel_requested_at TEXT,
    cancel_reason    TEXT,
    cancel_immediate INTEGER NOT NULL DEFAULT 0 CHECK (cancel_immediate IN (0, 1)),
    CONSTRAINT job_runs_job_name_run_key_key UNIQUE (job_name, run_key)
);

INSERT INTO job_runs_new (id, job_name, run_key, job_type, status, payload, scheduled_at,
    attempts, claimed_by, claimed_at, dispatched_at, started_at, finished_at, worker,
    last_error, attempt_log, trace_id, traceparent, updated_at, next_dispatch_at, options,
    lease_until)
SELECT id, job_name, run_key, job_type, status, payload, scheduled_at,
    attempts, claimed_by, claimed_at, dispatched_at, started_at, finished_at, worker,
    last_error, attempt_log, trace_id, traceparent, updated_at, next_dispatch_at, options,
    lease_until
FROM job_runs;

DROP TABLE job_runs;
ALTER TABLE job_runs_new RENAME TO job_runs;

CREATE INDEX job_runs_unfinished_idx ON job_runs (status, updated_at)
    WHERE status IN ('claimed', 'dispatched', 'running', 'retrying');
CREATE INDEX job_runs_job_name_scheduled_idx ON job_runs (job_name, scheduled_at DESC);
CREATE INDEX job_runs_next_dispatch_idx ON job_runs (next_dispatch_at)
    WHERE next_dispatch_at IS NOT NULL;
CREATE INDEX job_runs_scheduled_id_idx ON job_runs (scheduled_at DESC, id DESC);
CREATE INDEX job_runs_finished_idx ON job_runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX job_runs_failed_idx ON job_runs (scheduled_at DESC, id DESC)
    WHERE status IN ('failed', 'dead');
CREATE INDEX job_runs_buffered_idx ON job_runs (job_name, scheduled_at)
    WHERE status = 'buffered';

ALTER TABLE schedules ADD COLUMN remaining_runs INTEGER CHECK (remaining_runs >= 0);
ALTER TABLE schedules ADD COLUMN pause_note TEXT;
ALTER TABLE schedules ADD COLUMN resumed_at TEXT;
