-- "What failed?" is the web view's and the API's most common filtered
-- question. Without this, /v1/runs?status=failed walks the (scheduled_at, id)
-- index until it has a page of failures, which in a big, healthy table means
-- most of it. Only failed and dead runs enter this index (once each, when
-- they end), so the claim path does not pay for it.
CREATE INDEX IF NOT EXISTS job_runs_failed_idx
    ON job_runs (scheduled_at DESC, id DESC)
    WHERE status IN ('failed', 'dead');
--
-- Plain CREATE INDEX (see migration 5 for why not CONCURRENTLY): on a large
-- existing job_runs, create it by hand first with CREATE INDEX CONCURRENTLY
-- and this name; IF NOT EXISTS then makes this a no-op.
