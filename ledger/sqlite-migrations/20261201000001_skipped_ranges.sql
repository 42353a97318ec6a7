-- Spans of fires a misfire policy skipped before any was claimed; see the
-- Postgres migration of the same name.
CREATE TABLE skipped_ranges (
    job_name     TEXT    NOT NULL,
    after_at     TEXT    NOT NULL,
    until_at     TEXT    NOT NULL,
    skipped      INTEGER NOT NULL CHECK (skipped > 0),
    reason       TEXT    NOT NULL,
    recorded_by  TEXT    NOT NULL,
    recorded_at  TEXT    NOT NULL,
    PRIMARY KEY (job_name, after_at, until_at)
);
CREATE INDEX skipped_ranges_recorded_idx ON skipped_ranges (recorded_at);
