-- What each status column may hold: every member of its enum in
-- everystep/models.py, rendered into these bodies when the file is read
-- (the placeholders named after each vocabulary). The CHECK constraints of
-- the three columns call them (migration 0018), so a status added to the
-- models changes this file's text and the migrator re-applies it: the
-- database accepts the new status with no migration, no lock and no scan
-- of the tables, and still refuses any word that is no status.
--
-- LANGUAGE sql, IMMUTABLE, one expression, not STRICT: PostgreSQL inlines
-- the body into the constraint's expression, so each row is checked as a
-- literal IN list would check it. The inlining itself is done again each
-- time a statement that writes the column starts (the constraint's
-- expression is prepared per execution): about 5 µs more per single-row
-- INSERT than a literal list (20,000 of them: 330-340 ms against
-- 210-280 ms), the price of adding a status without an ALTER TABLE.
-- (Replacing the body does not check the rows already stored: a status the
-- models drop must first leave the data.)
CREATE OR REPLACE FUNCTION everystep_is_run_status(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN {run_statuses} $$;

CREATE OR REPLACE FUNCTION everystep_is_step_status(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN {step_statuses} $$;

CREATE OR REPLACE FUNCTION everystep_is_request_status(status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN {request_statuses} $$;
