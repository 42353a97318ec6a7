-- Fires a misfire policy skipped before any of them was claimed (every
-- replica down, the ledger unreachable, a stalled timer): the policy decides
-- on a span of instants without claiming each one, so the span is recorded,
-- one row per schedule and decision. Together with `skipped_fires` (skips
-- of claimed or overlapping fires) and `job_runs`, every instant of a
-- schedule is accounted for: run, or skipped with a reason.
CREATE TABLE IF NOT EXISTS skipped_ranges (
    job_name     TEXT        NOT NULL,
    after_at     TIMESTAMPTZ NOT NULL,  -- exclusive
    until_at     TIMESTAMPTZ NOT NULL,  -- inclusive
    skipped      BIGINT      NOT NULL CHECK (skipped > 0),
    reason       TEXT        NOT NULL,
    recorded_by  TEXT        NOT NULL,
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job_name, after_at, until_at)
);
CREATE INDEX IF NOT EXISTS skipped_ranges_recorded_idx ON skipped_ranges (recorded_at);
