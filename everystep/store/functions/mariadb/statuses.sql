-- What each status column may hold: every member of its enum in
-- everystep/models.py, rendered into these expressions when the file is
-- read (the placeholders named after each vocabulary). Each status
-- column's CHECK tests its invisible virtual column `status_known`
-- (migration 0018); a status added to the models changes this file's
-- text, and the migrator re-applies it: MariaDB changes a virtual
-- column's expression in place (no copy of the table, no scan of its
-- rows), and the CHECK refuses any word that is no status from then on.

ALTER TABLE everystep_workflow
    MODIFY COLUMN status_known TINYINT AS (status IN {run_statuses}) VIRTUAL INVISIBLE;

ALTER TABLE everystep_step
    MODIFY COLUMN status_known TINYINT AS (status IN {step_statuses}) VIRTUAL INVISIBLE;

ALTER TABLE everystep_request
    MODIFY COLUMN status_known TINYINT AS (status IN {request_statuses}) VIRTUAL INVISIBLE;
