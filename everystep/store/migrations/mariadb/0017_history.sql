-- How many step records a run held when its last execution ended, noted
-- once a history is long (see the PostgreSQL migration). Added last, with
-- no default: instant on InnoDB (IF NOT EXISTS: DDL here does not roll
-- back, so a migration cut short is applied again safely).
ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS history INT NULL;
