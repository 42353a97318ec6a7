-- Cluster-wide rate limits (issue 22; see ledger/src/rate_limit.rs): the
-- sliding log of each rate key's recent starts, and the next turn of the
-- runs waiting for one. Instants are fixed-width RFC 3339 text, as in
-- every other table of the embedded ledger.
CREATE TABLE rate_limit_starts (
    limit_key  TEXT NOT NULL,
    started_at TEXT NOT NULL
);
CREATE INDEX rate_limit_starts_key_idx ON rate_limit_starts (limit_key, started_at);

CREATE TABLE rate_limit_turns (
    limit_key TEXT PRIMARY KEY,
    next_turn TEXT NOT NULL
);
