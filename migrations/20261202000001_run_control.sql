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
