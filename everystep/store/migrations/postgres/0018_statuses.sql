-- Statuses are said once, in everystep/models.py. The CHECK constraints of
-- the three status columns wrote each set out, so every new status needed
-- a migration that dropped and re-added one (and on SQLite rebuilt the
-- table). From this version each constraint calls a function of
-- store/functions/postgres/statuses.sql, which the migrator renders from
-- the models' enums and re-applies when its text changes: a new status is
-- a new function body, with no ALTER TABLE, no lock on the tables, no scan.
-- The functions are created here as they stood at this version, for the
-- constraints to be created against; the file replaces them in the same
-- transaction.
--
-- NOT VALID: the rows were checked against these very sets by the
-- constraints this replaces, so no scan of the tables (which may hold
-- millions of steps) under this migration's lock; every write is checked
-- from now on. `ALTER TABLE ... VALIDATE CONSTRAINT ...` proves the old
-- rows again at any time, taking a lock that lets writes through.
CREATE OR REPLACE FUNCTION everystep_is_run_status(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('scheduled', 'running', 'completed', 'failed', 'stopped', 'blocked', 'cancelled') $$;

CREATE OR REPLACE FUNCTION everystep_is_step_status(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('started', 'done', 'failed', 'retrying', 'sleeping', 'waiting') $$;

CREATE OR REPLACE FUNCTION everystep_is_request_status(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('pending', 'taken', 'answered', 'expired') $$;

ALTER TABLE everystep_workflow
    DROP CONSTRAINT everystep_workflow_status_check,
    ADD CONSTRAINT everystep_workflow_status_check CHECK (everystep_is_run_status(status)) NOT VALID;

ALTER TABLE everystep_step
    DROP CONSTRAINT everystep_step_status_check,
    ADD CONSTRAINT everystep_step_status_check CHECK (everystep_is_step_status(status)) NOT VALID;

ALTER TABLE everystep_request
    DROP CONSTRAINT everystep_request_status_check,
    ADD CONSTRAINT everystep_request_status_check CHECK (everystep_is_request_status(status)) NOT VALID;
