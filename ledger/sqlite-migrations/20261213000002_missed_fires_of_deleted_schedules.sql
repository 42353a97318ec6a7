-- A deleted schedule's missed-fire records go with it; see the Postgres
-- migration of the same name.
CREATE TRIGGER IF NOT EXISTS schedules_forget_missed_fires AFTER DELETE ON schedules
BEGIN
    DELETE FROM missed_fires WHERE job_name = OLD.name;
END;
