-- Fires a replica could not claim, kept until their schedule's misfire
-- policy decided them; see the Postgres migration of the same name.
CREATE TABLE missed_fires (
    job_name     TEXT NOT NULL,
    scheduled_at TEXT NOT NULL,
    recorded_by  TEXT NOT NULL,
    recorded_at  TEXT NOT NULL,
    PRIMARY KEY (job_name, scheduled_at)
);
