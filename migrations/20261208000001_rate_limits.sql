-- Cluster-wide rate limits (issue 22; see ledger/src/rate_limit.rs).
--
-- `rate_limit_starts` is the sliding log of each rate key's recent starts:
-- a start is allowed while fewer than the limit's `starts` rows of its key
-- are younger than its window; the check deletes the rows that left the
-- window, so a key holds at most `starts` rows (10,000 at most).
--
-- `rate_limit_turns` spaces the runs that found the window full: each gets
-- the key's next turn, `window / starts` after the previous one.
--
-- Upgrading: two new tables; nothing existing changes.
CREATE TABLE IF NOT EXISTS rate_limit_starts (
    limit_key  TEXT        NOT NULL,
    started_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS rate_limit_starts_key_idx
    ON rate_limit_starts (limit_key, started_at);

CREATE TABLE IF NOT EXISTS rate_limit_turns (
    limit_key TEXT        PRIMARY KEY,
    next_turn TIMESTAMPTZ NOT NULL
);
