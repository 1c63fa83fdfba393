-- How many step records a run held when its last execution ended, noted
-- once a history is long (see the PostgreSQL migration).
ALTER TABLE everystep_workflow ADD COLUMN history INTEGER;
