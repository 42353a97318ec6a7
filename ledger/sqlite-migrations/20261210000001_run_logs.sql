-- Run logs and progress (issue 23; see migrations/ and ledger/src/run_log.rs):
-- the same table as on Postgres; instants as RFC 3339 text like every
-- other instant here.
CREATE TABLE IF NOT EXISTS run_logs (
    run_id   BLOB    NOT NULL,
    attempt  INTEGER NOT NULL,
    seq      INTEGER NOT NULL,
    at       TEXT    NOT NULL,
    kind     TEXT    NOT NULL,
    level    TEXT    NOT NULL,
    message  TEXT    NOT NULL,
    fields   TEXT,
    done     INTEGER,
    total    INTEGER,
    PRIMARY KEY (run_id, attempt, seq)
);
CREATE INDEX IF NOT EXISTS run_logs_at_idx ON run_logs (at);
