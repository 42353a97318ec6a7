-- belfry's embedded ledger (SQLite): the same tables, columns, states and
-- unique constraint as the Postgres ledger (see ../../migrations), plus the
-- job queue that stands in for RabbitMQ in embedded mode.
--
-- Types: ids are 16-byte BLOBs (uuid), JSON is TEXT, and every instant is
-- TEXT in one fixed-width UTC format (YYYY-MM-DDTHH:MM:SS.ffffffZ), so that
-- comparing and ordering the text is comparing and ordering the instants.
-- belfry writes every instant itself; nothing here calls SQLite's clock.

CREATE TABLE job_runs (
    id               BLOB    PRIMARY KEY,
    job_name         TEXT    NOT NULL,
    run_key          TEXT    NOT NULL,
    job_type         TEXT    NOT NULL,
    status           TEXT    NOT NULL
        CHECK (status IN ('claimed', 'dispatched', 'running', 'retrying', 'succeeded', 'failed', 'dead')),
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
    CONSTRAINT job_runs_job_name_run_key_key UNIQUE (job_name, run_key)
);

CREATE INDEX job_runs_unfinished_idx ON job_runs (status, updated_at)
    WHERE status IN ('claimed', 'dispatched', 'running', 'retrying');
CREATE INDEX job_runs_job_name_scheduled_idx ON job_runs (job_name, scheduled_at DESC);
CREATE INDEX job_runs_next_dispatch_idx ON job_runs (next_dispatch_at)
    WHERE next_dispatch_at IS NOT NULL;
CREATE INDEX job_runs_scheduled_id_idx ON job_runs (scheduled_at DESC, id DESC);
CREATE INDEX job_runs_finished_idx ON job_runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX job_runs_failed_idx ON job_runs (scheduled_at DESC, id DESC)
    WHERE status IN ('failed', 'dead');

CREATE TABLE schedules (
    name       TEXT    PRIMARY KEY,
    cron       TEXT,
    every_ms   INTEGER CHECK (every_ms > 0),
    timezone   TEXT    NOT NULL DEFAULT 'UTC',
    job_type   TEXT    NOT NULL,
    payload    TEXT    NOT NULL DEFAULT 'null',
    paused     INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    created_at TEXT    NOT NULL,
    updated_at TEXT    NOT NULL,
    options    TEXT    NOT NULL DEFAULT '{}',
    spec       TEXT,
    CONSTRAINT schedules_kind_check CHECK (cron IS NULL OR every_ms IS NULL)
);

CREATE TABLE skipped_fires (
    job_name     TEXT NOT NULL,
    run_key      TEXT NOT NULL,
    scheduled_at TEXT NOT NULL,
    reason       TEXT NOT NULL,
    recorded_by  TEXT NOT NULL,
    recorded_at  TEXT NOT NULL,
    PRIMARY KEY (job_name, run_key)
);
CREATE INDEX skipped_fires_job_name_scheduled_idx ON skipped_fires (job_name, scheduled_at DESC);
CREATE INDEX skipped_fires_recorded_idx ON skipped_fires (recorded_at);

-- The job queue: what RabbitMQ holds in distributed mode. A published
-- message is one row per queue bound to its job type (the jobs exchange's
-- routing); `taken_by` is the consumer session holding it unacknowledged.
-- Acking deletes the row; a session that dies leaves its rows taken, and
-- the next process to open the database gives them back (one process owns
-- the file at a time), as a broker requeues a dead consumer's deliveries.
CREATE TABLE job_queue (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    queue       TEXT    NOT NULL,
    routing_key TEXT    NOT NULL,
    body        BLOB    NOT NULL,
    message_id  TEXT,
    traceparent TEXT,
    enqueued_at TEXT    NOT NULL,
    deliveries  INTEGER NOT NULL DEFAULT 0,
    taken_by    TEXT
);
CREATE INDEX job_queue_ready_idx ON job_queue (queue, seq) WHERE taken_by IS NULL;

-- Which job types each worker group's queue receives (queue bindings).
CREATE TABLE queue_bindings (
    job_type TEXT NOT NULL,
    queue    TEXT NOT NULL,
    PRIMARY KEY (job_type, queue)
);

-- Messages that can never be processed, with why (the dead-letter queue).
CREATE TABLE dead_letters (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    routing_key TEXT NOT NULL,
    body        BLOB NOT NULL,
    reason      TEXT NOT NULL,
    dead_by     TEXT NOT NULL,
    message_id  TEXT,
    traceparent TEXT,
    recorded_at TEXT NOT NULL
);
