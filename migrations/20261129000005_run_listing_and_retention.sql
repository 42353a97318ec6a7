-- Indexes for the API's run listing (newest first, keyset pagination on
-- (scheduled_at, id)) and for retention (finished runs by age).
--
-- Plain CREATE INDEX, inside the migration's transaction: CONCURRENTLY would
-- deadlock with replicas waiting on sqlx's migration lock (their waiting
-- statement holds a snapshot the concurrent build waits for). On an existing
-- large job_runs, build them by hand first with CREATE INDEX CONCURRENTLY and
-- the same names; IF NOT EXISTS then makes this migration a no-op.
CREATE INDEX IF NOT EXISTS job_runs_scheduled_id_idx
    ON job_runs (scheduled_at DESC, id DESC);

CREATE INDEX IF NOT EXISTS job_runs_finished_idx
    ON job_runs (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE INDEX IF NOT EXISTS skipped_fires_recorded_idx
    ON skipped_fires (recorded_at);

-- One-shot schedules (`at`) have neither a cron expression nor an interval:
-- the first migration's CHECK refused to store them. The definition itself
-- is in `spec`; the columns only summarise it.
ALTER TABLE schedules DROP CONSTRAINT IF EXISTS schedules_check;
ALTER TABLE schedules DROP CONSTRAINT IF EXISTS schedules_kind_check;
ALTER TABLE schedules ADD CONSTRAINT schedules_kind_check CHECK (cron IS NULL OR every_ms IS NULL);
