-- Fires a schedule deliberately did not run: its previous run was still going
-- (overlap = "forbid"). Misfire skips are counted and logged, not stored: a
-- long outage of a one-second schedule would otherwise write a row per second.
CREATE TABLE IF NOT EXISTS skipped_fires (
    job_name     TEXT        NOT NULL,
    run_key      TEXT        NOT NULL,
    scheduled_at TIMESTAMPTZ NOT NULL,
    reason       TEXT        NOT NULL,
    recorded_by  TEXT        NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_name, run_key)
);
CREATE INDEX IF NOT EXISTS skipped_fires_job_name_scheduled_idx ON skipped_fires (job_name, scheduled_at DESC);
