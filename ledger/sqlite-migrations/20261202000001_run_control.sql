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

-- The counter follows the definition (see the Postgres migration).
CREATE TRIGGER schedules_counter_insert AFTER INSERT ON schedules
BEGIN
    UPDATE schedules SET remaining_runs = json_extract(NEW.spec, '$.remaining_runs')
    WHERE name = NEW.name;
END;

CREATE TRIGGER schedules_counter_update AFTER UPDATE OF spec ON schedules
    WHEN json_extract(NEW.spec, '$.remaining_runs') IS NOT json_extract(OLD.spec, '$.remaining_runs')
BEGIN
    UPDATE schedules SET remaining_runs = json_extract(NEW.spec, '$.remaining_runs')
    WHERE name = NEW.name;
END;

-- pause_after_failures (see the Postgres migration).
CREATE TRIGGER job_runs_pause_after_failures_update AFTER UPDATE OF status ON job_runs
    WHEN NEW.status IN ('failed', 'dead') AND NEW.attempts > 0
BEGIN
    UPDATE schedules SET paused = 1, updated_at = NEW.updated_at,
        pause_note = 'paused after ' || json_extract(spec, '$.pause_after_failures')
            || ' consecutive failures; the last: ' || NEW.run_key || ': '
            || substr(COALESCE(NEW.last_error, ''), 1, 300)
    WHERE name = NEW.job_name AND paused = 0
      AND json_extract(spec, '$.pause_after_failures') IS NOT NULL
      AND (SELECT count(*) FROM job_runs r
           WHERE r.job_name = NEW.job_name AND r.status IN ('failed', 'dead') AND r.attempts > 0
             AND r.finished_at > COALESCE(schedules.resumed_at, '')
             AND r.scheduled_at > COALESCE((SELECT max(q.scheduled_at) FROM job_runs q
                                            WHERE q.job_name = NEW.job_name AND q.status = 'succeeded'
                                              AND q.finished_at > COALESCE(schedules.resumed_at, '')), ''))
          >= json_extract(spec, '$.pause_after_failures');
END;

CREATE TRIGGER job_runs_pause_after_failures_insert AFTER INSERT ON job_runs
    WHEN NEW.status IN ('failed', 'dead') AND NEW.attempts > 0
BEGIN
    UPDATE schedules SET paused = 1, updated_at = NEW.updated_at,
        pause_note = 'paused after ' || json_extract(spec, '$.pause_after_failures')
            || ' consecutive failures; the last: ' || NEW.run_key || ': '
            || substr(COALESCE(NEW.last_error, ''), 1, 300)
    WHERE name = NEW.job_name AND paused = 0
      AND json_extract(spec, '$.pause_after_failures') IS NOT NULL
      AND (SELECT count(*) FROM job_runs r
           WHERE r.job_name = NEW.job_name AND r.status IN ('failed', 'dead') AND r.attempts > 0
             AND r.finished_at > COALESCE(schedules.resumed_at, '')
             AND r.scheduled_at > COALESCE((SELECT max(q.scheduled_at) FROM job_runs q
                                            WHERE q.job_name = NEW.job_name AND q.status = 'succeeded'
                                              AND q.finished_at > COALESCE(schedules.resumed_at, '')), ''))
          >= json_extract(spec, '$.pause_after_failures');
END;
