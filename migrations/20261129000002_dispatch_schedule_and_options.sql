-- When a run that is not yet with a worker should be (re)published:
--   claimed  : the claimer's confirm deadline (a replica that died between the
--              insert and the confirm is covered by the reconciler after it),
--              or the requested instant of a delayed ad-hoc job;
--   retrying : the end of a long back-off that was handed to the ledger
--              instead of holding a worker's prefetch slot.
-- NULL means "nothing to publish": the run is with the broker or a worker.
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS next_dispatch_at TIMESTAMPTZ;

-- Per-run overrides of the job type's retry policy and timeout, from the
-- schedule or the ad-hoc request; carried in the message as `options`.
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS options JSONB NOT NULL DEFAULT '{}'::jsonb;
-- The attempt holding a `running` run, until when: a second delivery of the
-- same run (after a channel loss) waits instead of running it concurrently,
-- and takes over once the lease has expired.
ALTER TABLE job_runs ADD COLUMN IF NOT EXISTS lease_until TIMESTAMPTZ;

ALTER TABLE schedules ADD COLUMN IF NOT EXISTS options JSONB NOT NULL DEFAULT '{}'::jsonb;

CREATE INDEX IF NOT EXISTS job_runs_next_dispatch_idx
    ON job_runs (next_dispatch_at)
    WHERE next_dispatch_at IS NOT NULL;
