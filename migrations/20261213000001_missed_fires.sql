-- Fires a replica could not claim (the ledger unreachable, its clock
-- skewed), recorded before that replica claims anything newer and kept
-- until their schedule's misfire policy decided them (see
-- `ledger/src/missed_fire.rs`). Without it a replica that claimed a newer
-- fire and then died left the older ones in its memory only, and recovery,
-- which starts from a schedule's latest run, never saw them.
CREATE TABLE IF NOT EXISTS missed_fires (
    job_name     TEXT        NOT NULL,
    scheduled_at TIMESTAMPTZ NOT NULL,
    recorded_by  TEXT        NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_name, scheduled_at)
);
