-- Statuses are said once, in everystep/models.py (see the PostgreSQL
-- migration). MariaDB's CHECK cannot call a stored function, and changing
-- a CHECK copies the whole table (ALGORITHM=COPY). So each status column
-- gets an invisible virtual column saying whether its value is a status
-- (`status_known`), and the column's CHECK tests that: the expression of a
-- virtual column that no index uses changes in place, without a copy, so
-- store/functions/mariadb/statuses.sql renders it from the models' enums
-- and the migrator re-applies it when they change. Adding these CHECKs
-- copies each of the three tables once, here; no status after this one
-- needs a copy. Written to succeed again (IF EXISTS, IF NOT EXISTS):
-- MariaDB commits DDL at once.
ALTER TABLE everystep_workflow
    ADD COLUMN IF NOT EXISTS status_known TINYINT AS
        (status IN ('scheduled', 'running', 'completed', 'failed', 'stopped', 'blocked', 'cancelled'))
        VIRTUAL INVISIBLE,
    DROP CONSTRAINT IF EXISTS everystep_workflow_status_check,
    ADD CONSTRAINT everystep_workflow_status_check CHECK (status_known);

ALTER TABLE everystep_step
    ADD COLUMN IF NOT EXISTS status_known TINYINT AS
        (status IN ('started', 'done', 'failed', 'retrying', 'sleeping', 'waiting')) VIRTUAL INVISIBLE,
    DROP CONSTRAINT IF EXISTS everystep_step_status_check,
    ADD CONSTRAINT everystep_step_status_check CHECK (status_known);

-- The request table's CHECK was declared with its column, so the column
-- is declared again without it (in the same copy).
ALTER TABLE everystep_request
    MODIFY COLUMN status VARCHAR(16) NOT NULL DEFAULT 'pending',
    ADD COLUMN IF NOT EXISTS status_known TINYINT AS
        (status IN ('pending', 'taken', 'answered', 'expired')) VIRTUAL INVISIBLE,
    DROP CONSTRAINT IF EXISTS everystep_request_status_check,
    ADD CONSTRAINT everystep_request_status_check CHECK (status_known);
