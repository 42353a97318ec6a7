-- A deleted schedule's missed-fire records go with it, so a schedule
-- created again under the same name does not inherit (and fire) the
-- instants of the one that was deleted.
CREATE OR REPLACE FUNCTION belfry_forget_missed_fires() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM missed_fires WHERE job_name = OLD.name;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS schedules_forget_missed_fires ON schedules;
CREATE TRIGGER schedules_forget_missed_fires AFTER DELETE ON schedules
    FOR EACH ROW EXECUTE FUNCTION belfry_forget_missed_fires();
