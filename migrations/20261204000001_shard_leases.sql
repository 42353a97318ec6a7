-- Issue 21: replicas share the fires by shard instead of all racing for each.
--
-- A schedule's shard is belfry_shard_key(name) % shards: 32-bit FNV-1a over
-- the name's UTF-8 bytes, the same function as belfry_protocol::shard_key
-- (a test compares them). The shard count is the ledger's (shard_map), so
-- every replica agrees on it; a replica configured with another count is
-- refused while others run.

CREATE OR REPLACE FUNCTION belfry_shard_key(name text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    bytes bytea := convert_to(name, 'UTF8');
    h bigint := 2166136261;
BEGIN
    -- h < 2^32 and the prime < 2^25: the product fits in a bigint.
    FOR i IN 0 .. length(bytes) - 1 LOOP
        h := ((h # get_byte(bytes, i)) * 16777619) & 4294967295;
    END LOOP;
    RETURN h;
END
$$;

-- Computed by the database on every write, so rows written by hand or by
-- an older build carry it too; a replica loads the schedules of the shards
-- it takes with `shard_key % shards = ANY(...)`.
ALTER TABLE schedules
    ADD COLUMN IF NOT EXISTS shard_key bigint GENERATED ALWAYS AS (belfry_shard_key(name)) STORED;

-- One row: how many shards the schedules are split into.
CREATE TABLE IF NOT EXISTS shard_map (
    id smallint PRIMARY KEY CHECK (id = 1),
    shards integer NOT NULL CHECK (shards BETWEEN 1 AND 65536),
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- One row per shard: who fires its schedules, until when (the database's
-- clock), and a fencing epoch raised on every change of owner.
CREATE TABLE IF NOT EXISTS shard_leases (
    shard integer PRIMARY KEY CHECK (shard >= 0),
    owner text,
    epoch bigint NOT NULL DEFAULT 0,
    expires_at timestamptz NOT NULL DEFAULT '-infinity',
    taken_at timestamptz
);
CREATE INDEX IF NOT EXISTS shard_leases_owner ON shard_leases (owner);

-- The replicas taking part, each with its heartbeat's expiry: the live ones
-- share the shards evenly.
CREATE TABLE IF NOT EXISTS scheduler_replicas (
    instance text PRIMARY KEY,
    joined_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
