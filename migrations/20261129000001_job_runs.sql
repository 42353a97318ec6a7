-- The ledger: one row per (job_name, run_key). The unique constraint is the
-- guarantee that a fire is owned by exactly one scheduler replica; the Redis
-- lock in front of it only saves work.
CREATE TABLE IF NOT EXISTS job_runs (
    id            UUID        PRIMARY KEY,  -- equals the message_id of the run's JobMessage
    job_name      TEXT        NOT NULL,
    run_key       TEXT        NOT NULL,     -- {job_name}@{fire instant, RFC 3339 UTC, whole seconds}
    job_type      TEXT        NOT NULL,
    status        TEXT        NOT NULL
        CHECK (status IN ('claimed', 'dispatched', 'running', 'retrying', 'succeeded', 'failed', 'dead')),
    payload       JSONB       NOT NULL DEFAULT 'null'::jsonb,
    scheduled_at  TIMESTAMPTZ NOT NULL,
    attempts      INTEGER     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    claimed_by    TEXT,                     -- scheduler instance that won the fire
    claimed_at    TIMESTAMPTZ,
    dispatched_at TIMESTAMPTZ,              -- broker confirmed the publish
    started_at    TIMESTAMPTZ,              -- first attempt began
    finished_at   TIMESTAMPTZ,              -- terminal status reached
    worker        TEXT,                     -- worker instance of the latest attempt
    last_error    TEXT,
    attempt_log   JSONB       NOT NULL DEFAULT '[]'::jsonb,  -- one object per finished attempt
    trace_id      TEXT,                     -- W3C trace id of the run
    traceparent   TEXT,                     -- W3C traceparent the run was published with
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT job_runs_job_name_run_key_key UNIQUE (job_name, run_key)
);

-- Unfinished runs, for the reconciler and for operators looking for stuck work.
CREATE INDEX IF NOT EXISTS job_runs_unfinished_idx
    ON job_runs (status, updated_at)
    WHERE status IN ('claimed', 'dispatched', 'running', 'retrying');

-- A schedule's history, newest first.
CREATE INDEX IF NOT EXISTS job_runs_job_name_scheduled_idx
    ON job_runs (job_name, scheduled_at DESC);

-- Schedule definitions. The TOML file is synced into this table at start.
CREATE TABLE IF NOT EXISTS schedules (
    name        TEXT        PRIMARY KEY,
    cron        TEXT,
    every_ms    BIGINT      CHECK (every_ms > 0),
    timezone    TEXT        NOT NULL DEFAULT 'UTC',
    job_type    TEXT        NOT NULL,
    payload     JSONB       NOT NULL DEFAULT 'null'::jsonb,
    paused      BOOLEAN     NOT NULL DEFAULT false,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((cron IS NULL) <> (every_ms IS NULL))
);
