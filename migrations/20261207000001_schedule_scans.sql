-- The scans replicas make of `schedules` on a timer, made cheap for a
-- table of a million rows (issue 21).
--
-- The deadline watch asks every few seconds which schedules have a
-- `deadline`; few do, but without this index every ask read every row's
-- `spec` (5 s per ask at a million schedules, on every replica). The
-- partial index holds only the schedules with one, and the query's WHERE
-- is its predicate, so the ask reads those alone.
--
-- Upgrading: the index is built once, reading the table (a few seconds at
-- a million rows, during which schedule writes wait).
CREATE INDEX IF NOT EXISTS schedules_with_deadline ON schedules (name)
    WHERE spec ->> 'deadline' IS NOT NULL;
