-- The ledger at volume: `job_runs` becomes a table partitioned by time, so
-- retention drops whole days instead of deleting rows one by one.
--
-- The partition key is `key_instant`, the instant the run key names:
--
--   * `{job_name}@{YYYY-MM-DDTHH:MM:SSZ}` (every scheduled fire): that instant;
--   * `{job_name}@{UUIDv7}` (ad-hoc runs enqueued without a key): the UUID's
--     millisecond clock, cut to the second;
--   * any other key (an idempotency key, a hand-made key): 1970-01-01, the
--     "keyed" partition.
--
-- It is a pure function of (job_name, run_key) (`belfry_key_instant`, the
-- only place it is computed: inserts call it), so the partitioned table's
-- `UNIQUE (job_name, run_key, key_instant)` is exactly the old
-- `UNIQUE (job_name, run_key)`: the same key always lands in the same
-- partition, where the unique index sees any earlier row with it. That is
-- why the partition key is not `scheduled_at` (an ad-hoc run's
-- `scheduled_at` is the caller's choice, and two enqueues of one key could
-- name two instants) and why no side table of keys is needed.
--
-- Partitions: `job_runs_keyed` (MINVALUE up to the first day partition; on an
-- upgraded database it also holds the history from before this migration),
-- one per UTC day `job_runs_pYYYYMMDD`, created ahead by the schedulers
-- (`Ledger::prepare_run_partitions`), and `job_runs_default` for whatever
-- falls outside them (a run whose key names a far-future instant), whose
-- rows move into a day partition when that day is created. Retention drops
-- day partitions whose every run finished before the cutoff and prunes the
-- keyed and default partitions row by row as before.
--
-- Upgrading an existing database: the whole table is converted in this
-- migration's transaction (the table is rewritten once with a new column
-- and two unique indexes are built: about 16 s per million rows on the
-- benchmark machine; see README "The partitioned ledger"). Stop every scheduler and worker of the
-- previous version first: their inserts name `ON CONFLICT (job_name,
-- run_key)`, which the partitioned table no longer has.

-- Seconds since 1970 of an RFC 3339 instant in the exact form of run keys
-- (`2026-07-26T03:00:00Z`), or of a lower-case hyphenated UUIDv7; NULL for
-- anything else. Plain arithmetic, no casts that depend on the session
-- (DateStyle, TimeZone): the function is truly immutable.
CREATE OR REPLACE FUNCTION belfry_identity_instant(identity text) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN identity ~ '^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]Z$'
             -- 2026-02-30 is not a day: the day must exist in its month.
             AND substr(identity, 9, 2)::int <= extract(day FROM
                 make_date(substr(identity, 1, 4)::int, substr(identity, 6, 2)::int, 1)
                 + interval '1 month' - interval '1 day')
        THEN to_timestamp(
                 (make_date(substr(identity, 1, 4)::int, substr(identity, 6, 2)::int,
                            substr(identity, 9, 2)::int) - date '1970-01-01')::bigint * 86400
                 + substr(identity, 12, 2)::bigint * 3600
                 + substr(identity, 15, 2)::bigint * 60
                 + substr(identity, 18, 2)::bigint)
        WHEN identity ~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
        THEN to_timestamp(
                 (('x' || substr(identity, 1, 8) || substr(identity, 10, 4))::bit(48)::bigint) / 1000)
    END
$$;

-- The partition key of a run: see above.
CREATE OR REPLACE FUNCTION belfry_key_instant(job_name text, run_key text) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(
        CASE WHEN left(run_key, length(job_name) + 1) = job_name || '@'
             THEN belfry_identity_instant(substr(run_key, length(job_name) + 2)) END,
        timestamptz '1970-01-01 00:00:00+00')
$$;

-- The newest live fire of schedules whose runs retention dropped with their
-- day partition: misfire recovery after downtime counts from a schedule's
-- newest fire, which row-by-row retention always kept in `job_runs`.
CREATE TABLE IF NOT EXISTS schedule_last_fires (
    job_name     TEXT        PRIMARY KEY,
    scheduled_at TIMESTAMPTZ NOT NULL
);

DO $$
DECLARE
    upper_day timestamptz;
    idx record;
    acl record;
BEGIN
    IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('job_runs')) <> 'r' THEN
        RETURN; -- already partitioned
    END IF;

    -- Row triggers move to the parent (they are cloned onto every
    -- partition); left on the old table they would fire twice there.
    DROP TRIGGER IF EXISTS job_runs_pause_after_failures ON job_runs;
    DROP TRIGGER IF EXISTS job_runs_alert_run_end ON job_runs;
    DROP TRIGGER IF EXISTS job_runs_alert_run_insert ON job_runs;
    DROP TRIGGER IF EXISTS job_runs_alert_run_stuck ON job_runs;

    ALTER TABLE job_runs RENAME TO job_runs_keyed;
    -- The parent's keys replace these (a partition cannot keep a primary
    -- key of its own).
    ALTER TABLE job_runs_keyed DROP CONSTRAINT IF EXISTS job_runs_pkey;
    ALTER TABLE job_runs_keyed DROP CONSTRAINT IF EXISTS job_runs_job_name_run_key_key;
    -- Free the index names for the parent's; ATTACH below adopts each old
    -- index whose definition matches the parent's instead of building it.
    FOR idx IN SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = 'job_runs_keyed'::regclass LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', idx.relname, left('keyed_' || idx.relname, 63));
    END LOOP;

    -- The key instant of every old row. Added as a stored generated column
    -- and then made a plain one: one rewrite of the table that rebuilds its
    -- indexes whole, instead of an UPDATE of every row, which inserts into
    -- each index row by row (on 9 million runs the UPDATE had not finished
    -- after 14 minutes; BENCHMARKS.md, "Retention at volume").
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'job_runs_keyed'::regclass
                   AND attname = 'key_instant' AND NOT attisdropped) THEN
        ALTER TABLE job_runs_keyed ADD COLUMN key_instant TIMESTAMPTZ
            GENERATED ALWAYS AS (belfry_key_instant(job_name, run_key)) STORED;
        ALTER TABLE job_runs_keyed ALTER COLUMN key_instant DROP EXPRESSION;
    ELSE
        UPDATE job_runs_keyed SET key_instant = belfry_key_instant(job_name, run_key)
            WHERE key_instant IS DISTINCT FROM belfry_key_instant(job_name, run_key);
    END IF;
    ALTER TABLE job_runs_keyed ALTER COLUMN key_instant SET NOT NULL;
    -- Added NOT VALID by the run-control migration; a partition must
    -- satisfy its parent's checks for certain.
    ALTER TABLE job_runs_keyed VALIDATE CONSTRAINT job_runs_status_check;
    -- The argument above holds only if every row's key_instant is the
    -- function of its key: enforced by the table, not left to the writers.
    -- Copied to the parent by LIKE below (and from it to every partition).
    ALTER TABLE job_runs_keyed ADD CONSTRAINT job_runs_key_instant_check
        CHECK (key_instant = belfry_key_instant(job_name, run_key));

    -- The old rows stay where they are: the keyed partition reaches up to
    -- the day after the newest of them (not further than tomorrow: a key
    -- naming a far-future instant goes to the default partition).
    SELECT date_trunc('day', max(key_instant), 'UTC') + interval '1 day' INTO upper_day
        FROM job_runs_keyed WHERE key_instant < now() + interval '1 day';
    upper_day := GREATEST(COALESCE(upper_day, timestamptz '1970-01-02 00:00:00+00'),
                          timestamptz '1970-01-02 00:00:00+00');

    -- Same columns in the same order, defaults, NOT NULLs and CHECKs.
    CREATE TABLE job_runs (LIKE job_runs_keyed INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
        PARTITION BY RANGE (key_instant);
    ALTER TABLE job_runs ADD CONSTRAINT job_runs_pkey PRIMARY KEY (id, key_instant);
    ALTER TABLE job_runs ADD CONSTRAINT job_runs_run_key_key UNIQUE (job_name, run_key, key_instant);
    -- The old table's grants (a role reading or writing runs keeps doing so).
    FOR acl IN SELECT a.privilege_type, a.grantee
               FROM pg_class c, aclexplode(c.relacl) a
               WHERE c.oid = 'job_runs_keyed'::regclass AND a.grantee <> c.relowner LOOP
        EXECUTE format('GRANT %s ON job_runs TO %s', acl.privilege_type,
                       CASE WHEN acl.grantee = 0 THEN 'PUBLIC'
                            ELSE quote_ident(pg_get_userbyid(acl.grantee)) END);
    END LOOP;
    CREATE INDEX job_runs_unfinished_idx ON job_runs (status, updated_at)
        WHERE status IN ('claimed', 'dispatched', 'running', 'retrying');
    CREATE INDEX job_runs_job_name_scheduled_idx ON job_runs (job_name, scheduled_at DESC);
    CREATE INDEX job_runs_next_dispatch_idx ON job_runs (next_dispatch_at)
        WHERE next_dispatch_at IS NOT NULL;
    CREATE INDEX job_runs_scheduled_id_idx ON job_runs (scheduled_at DESC, id DESC);
    CREATE INDEX job_runs_finished_idx ON job_runs (finished_at) WHERE finished_at IS NOT NULL;
    CREATE INDEX job_runs_failed_idx ON job_runs (scheduled_at DESC, id DESC)
        WHERE status IN ('failed', 'dead');
    CREATE INDEX job_runs_buffered_idx ON job_runs (job_name, scheduled_at)
        WHERE status = 'buffered';

    CREATE TABLE job_runs_default PARTITION OF job_runs DEFAULT;
    INSERT INTO job_runs_default SELECT * FROM job_runs_keyed WHERE key_instant >= upper_day;
    DELETE FROM job_runs_keyed WHERE key_instant >= upper_day;
    EXECUTE format('ALTER TABLE job_runs ATTACH PARTITION job_runs_keyed FOR VALUES FROM (MINVALUE) TO (%L)',
                   upper_day);

    CREATE TRIGGER job_runs_pause_after_failures AFTER INSERT OR UPDATE OF status ON job_runs
        FOR EACH ROW WHEN (NEW.status IN ('failed', 'dead') AND NEW.attempts > 0)
        EXECUTE FUNCTION belfry_pause_after_failures();
    CREATE TRIGGER job_runs_alert_run_end AFTER UPDATE OF status ON job_runs
        FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                           AND NEW.status IN ('failed', 'dead', 'cancelled', 'succeeded'))
        EXECUTE FUNCTION belfry_alert_run_end();
    CREATE TRIGGER job_runs_alert_run_insert AFTER INSERT ON job_runs
        FOR EACH ROW WHEN (NEW.status IN ('failed', 'dead', 'cancelled'))
        EXECUTE FUNCTION belfry_alert_run_end();
    CREATE TRIGGER job_runs_alert_run_stuck AFTER UPDATE OF last_error ON job_runs
        FOR EACH ROW WHEN (NEW.last_error LIKE 'stuck:%'
                           AND OLD.last_error IS DISTINCT FROM NEW.last_error)
        EXECUTE FUNCTION belfry_alert_run_stuck();
END $$;
