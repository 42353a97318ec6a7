-- The full definition of a schedule, as the `[[schedule]]` table of the file
-- (and the API's JSON) writes it: replicas build their timers from it.
ALTER TABLE schedules ADD COLUMN IF NOT EXISTS spec JSONB;

-- Every change to a schedule, by belfry or by hand, bumps updated_at and
-- tells every replica (LISTEN belfry_schedules) which schedule changed.
CREATE OR REPLACE FUNCTION belfry_schedules_touch() RETURNS trigger AS $$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION belfry_schedules_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('belfry_schedules', COALESCE(NEW.name, OLD.name));
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS schedules_touch ON schedules;
CREATE TRIGGER schedules_touch BEFORE UPDATE ON schedules
    FOR EACH ROW EXECUTE FUNCTION belfry_schedules_touch();

DROP TRIGGER IF EXISTS schedules_notify ON schedules;
CREATE TRIGGER schedules_notify AFTER INSERT OR UPDATE OR DELETE ON schedules
    FOR EACH ROW EXECUTE FUNCTION belfry_schedules_notify();
