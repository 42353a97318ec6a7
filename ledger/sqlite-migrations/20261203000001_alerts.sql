-- Alerts (issue 20): the same tables and triggers as the Postgres
-- migration (read it for why), in the embedded database's types: ids are
-- 16-byte BLOBs, instants fixed-width UTC text.

CREATE TABLE alert_events (
    id          BLOB    PRIMARY KEY,
    kind        TEXT    NOT NULL,
    subject     TEXT    NOT NULL,
    job_name    TEXT,
    job_type    TEXT,
    run_id      BLOB,
    run_key     TEXT,
    count       INTEGER NOT NULL DEFAULT 1,
    detail      TEXT    NOT NULL DEFAULT '',
    channel     TEXT,
    covers_from  TEXT,
    covers_until TEXT,
    dedupe_key  TEXT    UNIQUE,
    occurred_at TEXT    NOT NULL,
    routed_at   TEXT
);
CREATE INDEX alert_events_unrouted_idx ON alert_events (occurred_at) WHERE routed_at IS NULL;
CREATE INDEX alert_events_occurred_idx ON alert_events (occurred_at);
CREATE INDEX alert_events_covers_idx ON alert_events (job_name, covers_until) WHERE covers_from IS NOT NULL;

CREATE TABLE alert_deliveries (
    id          BLOB    PRIMARY KEY,
    event_id    BLOB    NOT NULL REFERENCES alert_events (id) ON DELETE CASCADE,
    channel     TEXT    NOT NULL,
    status      TEXT    NOT NULL CHECK (status IN ('pending', 'sent', 'failed', 'folded')),
    due_at      TEXT    NOT NULL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    folded      INTEGER NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until TEXT,
    last_error  TEXT,
    created_at  TEXT    NOT NULL,
    sent_at     TEXT,
    UNIQUE (event_id, channel)
);
CREATE INDEX alert_deliveries_due_idx ON alert_deliveries (due_at) WHERE status = 'pending';
CREATE INDEX alert_deliveries_created_idx ON alert_deliveries (created_at);

CREATE TABLE alert_throttles (
    channel      TEXT NOT NULL,
    subject      TEXT NOT NULL,
    window_start TEXT NOT NULL,
    carrier      BLOB,
    folded       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (channel, subject)
);

CREATE INDEX alert_throttles_carrier_idx ON alert_throttles (carrier) WHERE carrier IS NOT NULL;

CREATE TABLE alert_failing (
    run_id   BLOB PRIMARY KEY,
    job_name TEXT NOT NULL
);
CREATE INDEX alert_failing_job_idx ON alert_failing (job_name);

-- A run's end (see the Postgres migration); only a status that changed.
-- The one writer makes each trigger's steps one decision.
CREATE TRIGGER job_runs_alert_recovered_update AFTER UPDATE OF status ON job_runs
    WHEN NEW.status = 'succeeded' AND OLD.status IS NOT NEW.status
BEGIN
    INSERT OR IGNORE INTO alert_events (id, kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key, occurred_at)
    SELECT randomblob(16), 'schedule.recovered', NEW.job_name, NEW.job_name, NEW.job_type, NEW.id, NEW.run_key,
           'succeeded again after ' || (SELECT count(*) FROM alert_failing WHERE job_name = NEW.job_name)
               || ' failed run(s)',
           'schedule.recovered:' || hex(NEW.id), strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z'
    WHERE EXISTS (SELECT 1 FROM alert_failing WHERE job_name = NEW.job_name);
    DELETE FROM alert_failing WHERE job_name = NEW.job_name;
END;

CREATE TRIGGER job_runs_alert_end_update AFTER UPDATE OF status ON job_runs
    WHEN NEW.status IN ('failed', 'dead', 'cancelled') AND OLD.status IS NOT NEW.status
BEGIN
    INSERT OR IGNORE INTO alert_failing (run_id, job_name)
    SELECT NEW.id, NEW.job_name
    WHERE NEW.status IN ('failed', 'dead') AND NEW.attempts > 0
      AND EXISTS (SELECT 1 FROM schedules WHERE name = NEW.job_name);
    INSERT OR IGNORE INTO alert_events (id, kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key, occurred_at)
    SELECT randomblob(16), 'run.' || NEW.status, NEW.job_name, NEW.job_name, NEW.job_type, NEW.id, NEW.run_key,
           substr(COALESCE(NEW.last_error, ''), 1, 2000), 'run.' || NEW.status || ':' || hex(NEW.id),
           strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z'
    WHERE NOT (NEW.status = 'dead' AND NEW.attempts = 0
               AND COALESCE(NEW.last_error, '') LIKE 'skipped by misfire policy%');
END;

CREATE TRIGGER job_runs_alert_end_insert AFTER INSERT ON job_runs
    WHEN NEW.status IN ('failed', 'dead', 'cancelled')
BEGIN
    INSERT OR IGNORE INTO alert_failing (run_id, job_name)
    SELECT NEW.id, NEW.job_name
    WHERE NEW.status IN ('failed', 'dead') AND NEW.attempts > 0
      AND EXISTS (SELECT 1 FROM schedules WHERE name = NEW.job_name);
    INSERT OR IGNORE INTO alert_events (id, kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key, occurred_at)
    SELECT randomblob(16), 'run.' || NEW.status, NEW.job_name, NEW.job_name, NEW.job_type, NEW.id, NEW.run_key,
           substr(COALESCE(NEW.last_error, ''), 1, 2000), 'run.' || NEW.status || ':' || hex(NEW.id),
           strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z'
    WHERE NOT (NEW.status = 'dead' AND NEW.attempts = 0
               AND COALESCE(NEW.last_error, '') LIKE 'skipped by misfire policy%');
END;

CREATE TRIGGER job_runs_alert_run_stuck AFTER UPDATE OF last_error ON job_runs
    WHEN NEW.last_error LIKE 'stuck:%' AND OLD.last_error IS NOT NEW.last_error
BEGIN
    INSERT OR IGNORE INTO alert_events (id, kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key, occurred_at)
    VALUES (randomblob(16), 'run.stuck', NEW.job_name, NEW.job_name, NEW.job_type, NEW.id, NEW.run_key,
            substr(NEW.last_error, 1, 2000), 'run.stuck:' || hex(NEW.id),
            strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z');
END;

CREATE TRIGGER skipped_fires_alert AFTER INSERT ON skipped_fires
BEGIN
    INSERT OR IGNORE INTO alert_events (id, kind, subject, job_name, job_type, run_key, detail, dedupe_key, occurred_at)
    VALUES (randomblob(16), 'fire.skipped', NEW.job_name, NEW.job_name,
            (SELECT job_type FROM schedules WHERE name = NEW.job_name), NEW.run_key,
            substr(NEW.reason, 1, 2000), 'fire.skipped:' || NEW.job_name || ':' || NEW.run_key,
            strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z');
END;

-- One event per overlapping set of spans (see the Postgres migration);
-- the one writer makes the check and the insert one step.
CREATE TRIGGER skipped_ranges_alert AFTER INSERT ON skipped_ranges
BEGIN
    INSERT OR IGNORE INTO alert_events (id, kind, subject, job_name, job_type, count, detail, dedupe_key,
                                        occurred_at, covers_from, covers_until)
    SELECT randomblob(16), 'fire.skipped', NEW.job_name, NEW.job_name,
           (SELECT job_type FROM schedules WHERE name = NEW.job_name), NEW.skipped,
           NEW.skipped || ' fires missed from ' || substr(NEW.after_at, 1, 19) || 'Z to '
               || substr(NEW.until_at, 1, 19) || 'Z: ' || substr(NEW.reason, 1, 1000),
           'fire.skipped:' || NEW.job_name || ':' || NEW.after_at || ':' || NEW.until_at,
           strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z', NEW.after_at, NEW.until_at
    WHERE NOT EXISTS (SELECT 1 FROM alert_events
                      WHERE job_name = NEW.job_name AND covers_from IS NOT NULL
                        AND covers_from < NEW.until_at AND covers_until > NEW.after_at);
END;

CREATE TRIGGER schedules_alert_paused AFTER UPDATE OF paused ON schedules
    WHEN NEW.paused = 1 AND OLD.paused = 0
         AND (NEW.pause_note LIKE 'paused after %' OR NEW.pause_note LIKE 'ran out%')
BEGIN
    INSERT INTO alert_events (id, kind, subject, job_name, job_type, detail, occurred_at)
    VALUES (randomblob(16), 'schedule.paused', NEW.name, NEW.name, NEW.job_type,
            substr(NEW.pause_note, 1, 2000), strftime('%Y-%m-%dT%H:%M:%f', 'now') || '000Z');
END;
