-- Alerts (issue 20): events worth telling someone about, written in the
-- transaction of the state change that causes them, and their deliveries
-- to the channels of BELFRY_ALERTS.
--
-- Why triggers: a run that ends failed, a fire skipped by a policy, a run
-- marked stuck, a schedule paused by belfry: each is one row change, made
-- by whichever process (worker, replica, API) made it. A trigger records
-- the event in that same transaction, so no event is lost when the process
-- dies right after the change, and none is recorded twice: a change is
-- committed once. The dedupe_key makes events recorded by replica passes
-- (late runs, a replica's clock guard) once across replicas too.
CREATE TABLE IF NOT EXISTS alert_events (
    id          UUID        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- run.failed, run.dead, run.cancelled, run.stuck, run.late,
    -- fire.skipped, schedule.paused, schedule.recovered,
    -- replica.clock_guard, alert.test
    kind        TEXT        NOT NULL,
    -- What throttling counts per: the schedule (job) name, or
    -- 'replica:<instance>'.
    subject     TEXT        NOT NULL,
    job_name    TEXT,
    job_type    TEXT,
    run_id      UUID,
    run_key     TEXT,
    -- Missed or skipped instants this event stands for (fire.skipped).
    count       BIGINT      NOT NULL DEFAULT 1,
    -- One human-readable line: the error, the reason, the note.
    detail      TEXT        NOT NULL DEFAULT '',
    -- With alert.test: the one channel it goes to.
    channel     TEXT,
    -- fire.skipped of a span: the instants it covers, (from, until].
    covers_from  TIMESTAMPTZ,
    covers_until TIMESTAMPTZ,
    dedupe_key  TEXT        UNIQUE,
    occurred_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When a replica gave it its deliveries (NULL: not yet).
    routed_at   TIMESTAMPTZ
);
CREATE INDEX IF NOT EXISTS alert_events_unrouted_idx ON alert_events (occurred_at)
    WHERE routed_at IS NULL;
CREATE INDEX IF NOT EXISTS alert_events_occurred_idx ON alert_events (occurred_at);
CREATE INDEX IF NOT EXISTS alert_events_covers_idx ON alert_events (job_name, covers_until)
    WHERE covers_from IS NOT NULL;

-- One row per (event, channel): the unique pair is what makes two replicas
-- routing the same event give it one delivery per channel.
CREATE TABLE IF NOT EXISTS alert_deliveries (
    id          UUID        PRIMARY KEY,
    event_id    UUID        NOT NULL REFERENCES alert_events (id) ON DELETE CASCADE,
    channel     TEXT        NOT NULL,
    -- pending: to send at due_at; sent; failed: gave up (last_error says
    -- why); folded: throttled into another delivery's summary.
    status      TEXT        NOT NULL CHECK (status IN ('pending', 'sent', 'failed', 'folded')),
    due_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts    INTEGER     NOT NULL DEFAULT 0,
    -- Events of the same channel and subject folded into this one while
    -- it waited for the end of the throttling window.
    folded      BIGINT      NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until TIMESTAMPTZ,
    last_error  TEXT,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at     TIMESTAMPTZ,
    UNIQUE (event_id, channel)
);
CREATE INDEX IF NOT EXISTS alert_deliveries_due_idx ON alert_deliveries (due_at)
    WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS alert_deliveries_created_idx ON alert_deliveries (created_at);

-- Throttling per (channel, subject): when the current window opened, and
-- the delivery (if any) that carries the events folded since, due at the
-- end of the window. Routing an event locks this row (after the event's);
-- taking deliveries to send locks delivery rows, then these: routing never
-- locks an existing delivery, so the two cannot deadlock.
CREATE TABLE IF NOT EXISTS alert_throttles (
    channel      TEXT        NOT NULL,
    subject      TEXT        NOT NULL,
    window_start TIMESTAMPTZ NOT NULL,
    carrier      UUID,
    -- Events folded into the carrier so far.
    folded       BIGINT      NOT NULL DEFAULT 0,
    PRIMARY KEY (channel, subject)
);
CREATE INDEX IF NOT EXISTS alert_throttles_carrier_idx ON alert_throttles (carrier)
    WHERE carrier IS NOT NULL;

-- The attempted failures of each schedule not yet followed by a success:
-- a success that clears some is a schedule.recovered event. A table of its
-- own rather than a flag on `schedules`: writing `schedules` would touch
-- updated_at and notify every replica that the schedule changed, and
-- would lock its row on the workers' path. Rows are only inserted (on a
-- failure) and deleted with SKIP LOCKED (on a success), so no worker ever
-- waits here: outcomes of many schedules ending in several batches at once
-- cannot deadlock on it. A success that finds the rows locked by another
-- success leaves the notice to that one.
CREATE TABLE IF NOT EXISTS alert_failing (
    run_id   UUID PRIMARY KEY,
    job_name TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS alert_failing_job_idx ON alert_failing (job_name);

-- A run's end: failed, dead or cancelled is an event; a success after a
-- failure of the same schedule is schedule.recovered. A success of a
-- schedule that is not failing costs one index probe of an (almost
-- always) empty table.
CREATE OR REPLACE FUNCTION belfry_alert_run_end() RETURNS trigger AS $$
DECLARE
    cleared bigint;
BEGIN
    IF NEW.status = 'succeeded' THEN
        IF EXISTS (SELECT 1 FROM alert_failing WHERE job_name = NEW.job_name) THEN
            WITH gone AS (
                DELETE FROM alert_failing WHERE run_id IN (
                    SELECT run_id FROM alert_failing WHERE job_name = NEW.job_name
                    FOR UPDATE SKIP LOCKED)
                RETURNING 1)
            SELECT count(*) INTO cleared FROM gone;
            IF cleared > 0 THEN
                INSERT INTO alert_events (kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key)
                VALUES ('schedule.recovered', NEW.job_name, NEW.job_name, NEW.job_type, NEW.id, NEW.run_key,
                        format('succeeded again after %s failed run(s)', cleared),
                        'schedule.recovered:' || NEW.id)
                ON CONFLICT (dedupe_key) DO NOTHING;
            END IF;
        END IF;
        RETURN NULL;
    END IF;
    IF NEW.status IN ('failed', 'dead') AND NEW.attempts > 0
       AND EXISTS (SELECT 1 FROM schedules WHERE name = NEW.job_name) THEN
        INSERT INTO alert_failing (run_id, job_name) VALUES (NEW.id, NEW.job_name)
        ON CONFLICT DO NOTHING;
    END IF;
    -- A claim the misfire policy skipped (dead, never attempted): its
    -- skipped_fires row, written in the same transaction, is the event.
    IF NEW.status = 'dead' AND NEW.attempts = 0
       AND NEW.last_error LIKE 'skipped by misfire policy%' THEN
        RETURN NULL;
    END IF;
    INSERT INTO alert_events (kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key)
    VALUES ('run.' || NEW.status, NEW.job_name, NEW.job_name, NEW.job_type, NEW.id, NEW.run_key,
            left(COALESCE(NEW.last_error, ''), 2000), 'run.' || NEW.status || ':' || NEW.id)
    ON CONFLICT (dedupe_key) DO NOTHING;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

-- Only a status that changed: statements that write `status` back
-- unchanged (marking a run dispatched that a fast worker already
-- finished) are not ends.
DROP TRIGGER IF EXISTS job_runs_alert_run_end ON job_runs;
CREATE TRIGGER job_runs_alert_run_end AFTER UPDATE OF status ON job_runs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       AND NEW.status IN ('failed', 'dead', 'cancelled', 'succeeded'))
    EXECUTE FUNCTION belfry_alert_run_end();
DROP TRIGGER IF EXISTS job_runs_alert_run_insert ON job_runs;
CREATE TRIGGER job_runs_alert_run_insert AFTER INSERT ON job_runs
    FOR EACH ROW WHEN (NEW.status IN ('failed', 'dead', 'cancelled'))
    EXECUTE FUNCTION belfry_alert_run_end();

-- A run the stuck-run scan marked (last_error 'stuck: ...', set once).
CREATE OR REPLACE FUNCTION belfry_alert_run_stuck() RETURNS trigger AS $$
BEGIN
    INSERT INTO alert_events (kind, subject, job_name, job_type, run_id, run_key, detail, dedupe_key)
    VALUES ('run.stuck', NEW.job_name, NEW.job_name, NEW.job_type, NEW.id, NEW.run_key,
            left(NEW.last_error, 2000), 'run.stuck:' || NEW.id)
    ON CONFLICT (dedupe_key) DO NOTHING;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS job_runs_alert_run_stuck ON job_runs;
CREATE TRIGGER job_runs_alert_run_stuck AFTER UPDATE OF last_error ON job_runs
    FOR EACH ROW WHEN (NEW.last_error LIKE 'stuck:%'
                       AND OLD.last_error IS DISTINCT FROM NEW.last_error)
    EXECUTE FUNCTION belfry_alert_run_stuck();

-- A fire skipped by an overlap policy or because the schedule ran out.
CREATE OR REPLACE FUNCTION belfry_alert_fire_skipped() RETURNS trigger AS $$
BEGIN
    INSERT INTO alert_events (kind, subject, job_name, job_type, run_key, detail, dedupe_key)
    VALUES ('fire.skipped', NEW.job_name, NEW.job_name,
            (SELECT job_type FROM schedules WHERE name = NEW.job_name), NEW.run_key,
            left(NEW.reason, 2000), 'fire.skipped:' || NEW.job_name || ':' || NEW.run_key)
    ON CONFLICT (dedupe_key) DO NOTHING;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS skipped_fires_alert ON skipped_fires;
CREATE TRIGGER skipped_fires_alert AFTER INSERT ON skipped_fires
    FOR EACH ROW EXECUTE FUNCTION belfry_alert_fire_skipped();

-- Fires missed while every replica was down (or the ledger unreachable)
-- and skipped by the misfire policy: one event for the span, with the
-- number of instants in it. Each replica records the span it saw, so the
-- same outage can arrive as several overlapping spans: only the first
-- becomes an event (its instants were told; the others overlap them).
-- The schedule's lock (key 20, its own: the claim path's is key 7)
-- serialises the check with a concurrent insert of an overlapping span;
-- record_skipped_ranges inserts in name order, so two replicas take
-- these locks in one order.
CREATE OR REPLACE FUNCTION belfry_alert_range_skipped() RETURNS trigger AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(NEW.job_name, 20));
    IF EXISTS (SELECT 1 FROM alert_events
               WHERE job_name = NEW.job_name AND covers_from IS NOT NULL
                 AND covers_from < NEW.until_at AND covers_until > NEW.after_at) THEN
        RETURN NULL;
    END IF;
    INSERT INTO alert_events (kind, subject, job_name, job_type, count, detail, dedupe_key,
                              covers_from, covers_until)
    VALUES ('fire.skipped', NEW.job_name, NEW.job_name,
            (SELECT job_type FROM schedules WHERE name = NEW.job_name), NEW.skipped,
            format('%s fires missed from %s to %s: %s', NEW.skipped,
                   to_char(NEW.after_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                   to_char(NEW.until_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                   left(NEW.reason, 1000)),
            'fire.skipped:' || NEW.job_name || ':' || NEW.after_at || ':' || NEW.until_at,
            NEW.after_at, NEW.until_at)
    ON CONFLICT (dedupe_key) DO NOTHING;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS skipped_ranges_alert ON skipped_ranges;
CREATE TRIGGER skipped_ranges_alert AFTER INSERT ON skipped_ranges
    FOR EACH ROW EXECUTE FUNCTION belfry_alert_range_skipped();

-- A schedule belfry paused by itself: pause_after_failures, or
-- remaining_runs run out (their notes start 'paused after ' and
-- 'ran out'); an operator's pause is not an alert.
CREATE OR REPLACE FUNCTION belfry_alert_schedule_paused() RETURNS trigger AS $$
BEGIN
    INSERT INTO alert_events (kind, subject, job_name, job_type, detail)
    VALUES ('schedule.paused', NEW.name, NEW.name, NEW.job_type, left(NEW.pause_note, 2000));
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS schedules_alert_paused ON schedules;
CREATE TRIGGER schedules_alert_paused AFTER UPDATE OF paused ON schedules
    FOR EACH ROW WHEN (NEW.paused AND NOT OLD.paused
                       AND (NEW.pause_note LIKE 'paused after %' OR NEW.pause_note LIKE 'ran out%'))
    EXECUTE FUNCTION belfry_alert_schedule_paused();
