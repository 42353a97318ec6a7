-- Control over running work (issue 19): cancelling a run, overlap
-- policies that buffer fires, bounded and self-pausing schedules.
--
-- Cancelling a run (POST /v1/runs/{id}/cancel): a new terminal status, and
-- the request a running run's worker acts on.
--
-- A waiting run (claimed, dispatched, retrying) becomes `cancelled` at once.
-- A running one keeps `running` with cancel_requested_at set until its
-- worker stops the handler and records `cancelled` (or the handler's own
-- outcome, if it finished first); the request reaches the worker through
-- NOTIFY belfry_cancel, and the worker's lease heartbeat reads it too, so
-- a lost notification only delays the cancel by one heartbeat.
--
-- NOT VALID: every stored row passed the old, narrower check, so it passes
-- this one; skipping the validation scan keeps the exclusive lock of this
-- migration short on a large job_runs (new rows are checked all the same).
ALTER TABLE job_runs DROP CONSTRAINT IF EXISTS job_runs_status_check;
ALTER TABLE job_runs ADD CONSTRAINT job_runs_status_check
    CHECK (status IN ('claimed', 'dispatched', 'running', 'retrying', 'succeeded', 'failed', 'dead', 'cancelled', 'buffered'))
    NOT VALID;

ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS cancel_requested_at TIMESTAMPTZ;
-- Who cancelled the run and why: becomes last_error when the run ends.
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS cancel_reason TEXT;
-- Abandon the attempt without the grace period (overlap terminate_other).
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS cancel_immediate BOOLEAN NOT NULL DEFAULT false;

-- Overlap policies buffer_one, buffer_all and cancel_other hold a fire as
-- `buffered` (its row claimed, its run key nominal) while the schedule's
-- previous run is unfinished; a replica's reconciler releases the oldest
-- buffered run of a schedule (buffered -> claimed, published by the
-- outbox) once nothing of the schedule is unfinished.
CREATE INDEX IF NOT EXISTS job_runs_buffered_idx
    ON job_runs (job_name, scheduled_at)
    WHERE status = 'buffered';

-- Bounded schedules: fires left (NULL: unbounded), decremented in the
-- transaction of each winning claim of a fire of the timetable.
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS remaining_runs BIGINT CHECK (remaining_runs >= 0);
-- Why the schedule is paused (an operator's --note, or the automatic pause
-- after consecutive failures); cleared on resume.
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS pause_note TEXT;
-- When it was last resumed: consecutive failures are counted from here.
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS resumed_at TIMESTAMPTZ;

-- The counter follows the definition: set from the spec's remaining_runs
-- when a schedule is stored, and again whenever that value changes (a
-- replace with the same value keeps counting). One trigger covers every
-- way a definition is written (file sync, API, by hand).
CREATE OR REPLACE FUNCTION belfry_schedules_counter() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'INSERT'
       OR (NEW.spec -> 'remaining_runs') IS DISTINCT FROM (OLD.spec -> 'remaining_runs') THEN
        NEW.remaining_runs := (NEW.spec ->> 'remaining_runs')::bigint;
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS schedules_counter ON schedules;
CREATE TRIGGER schedules_counter BEFORE INSERT OR UPDATE ON schedules
    FOR EACH ROW EXECUTE FUNCTION belfry_schedules_counter();

-- pause_after_failures = N: a schedule is paused, with a note, when N of
-- its runs that a worker attempted ended failed or dead after its latest
-- success (and after it was last resumed). A trigger, so every way an
-- attempted run fails (a handler's error, retries exhausted, a payload
-- that does not decode) counts, in the same transaction as the failure: no
-- replica has to watch for it, and two failures ending together pause it
-- once. Runs nobody attempted (skipped by a misfire policy, no worker
-- group for the type) say nothing about the job and do not count.
CREATE OR REPLACE FUNCTION belfry_pause_after_failures() RETURNS trigger AS $$
DECLARE
    limit_n integer;
    since   timestamptz;
    fails   bigint;
BEGIN
    -- A value edited by hand into something else than a number is
    -- ignored, never an error that would fail the worker's outcome write.
    SELECT CASE WHEN jsonb_typeof(spec -> 'pause_after_failures') = 'number'
                THEN LEAST((spec ->> 'pause_after_failures')::numeric, 1000000)::integer END
    INTO limit_n
    FROM schedules WHERE name = NEW.job_name AND NOT paused;
    IF limit_n IS NULL THEN
        RETURN NULL;
    END IF;
    -- Failures ending together in several transactions are counted one
    -- after the other: each waits for the schedule's row here (after its
    -- run's row, the order the claim takes too), then counts what the
    -- others committed; the one that reaches N pauses it, the later ones
    -- find it paused.
    SELECT resumed_at INTO since FROM schedules
    WHERE name = NEW.job_name AND NOT paused FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO fails FROM job_runs r
    WHERE r.job_name = NEW.job_name AND r.status IN ('failed', 'dead') AND r.attempts > 0
      AND r.finished_at > COALESCE(since, '-infinity')
      AND r.scheduled_at > COALESCE((SELECT max(q.scheduled_at) FROM job_runs q
                                     WHERE q.job_name = NEW.job_name AND q.status = 'succeeded'
                                       AND q.finished_at > COALESCE(since, '-infinity')),
                                    '-infinity');
    IF fails >= limit_n THEN
        UPDATE schedules SET paused = true,
            pause_note = format('paused after %s consecutive failures; the last: %s: %s',
                                limit_n, NEW.run_key, left(COALESCE(NEW.last_error, ''), 300))
        WHERE name = NEW.job_name AND NOT paused;
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS job_runs_pause_after_failures ON job_runs;
CREATE TRIGGER job_runs_pause_after_failures AFTER INSERT OR UPDATE OF status ON job_runs
    FOR EACH ROW WHEN (NEW.status IN ('failed', 'dead') AND NEW.attempts > 0)
    EXECUTE FUNCTION belfry_pause_after_failures();
