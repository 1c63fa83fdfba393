-- What each status column may hold: every member of its enum in
-- everystep/models.py, rendered into the triggers when the file is read
-- (the placeholders named after each vocabulary). SQLite cannot alter a
-- CHECK constraint without rebuilding its table, so the status columns
-- have none (migration 0018) and these triggers refuse a word that is no
-- status, as a CHECK would (an IntegrityError; the write is undone). A
-- status added to the models changes this file's text, and the migrator
-- drops and creates the triggers again in its transaction: the table is
-- not touched. An UPDATE that leaves the status column out does not fire
-- them.

DROP TRIGGER IF EXISTS everystep_workflow_status_insert;

CREATE TRIGGER everystep_workflow_status_insert BEFORE INSERT ON everystep_workflow
WHEN NEW.status NOT IN {run_statuses}
BEGIN -- $$
    SELECT RAISE(ABORT, 'CHECK constraint failed: everystep_workflow.status is no run status');
END -- $$
;

DROP TRIGGER IF EXISTS everystep_workflow_status_update;

CREATE TRIGGER everystep_workflow_status_update BEFORE UPDATE OF status ON everystep_workflow
WHEN NEW.status NOT IN {run_statuses}
BEGIN -- $$
    SELECT RAISE(ABORT, 'CHECK constraint failed: everystep_workflow.status is no run status');
END -- $$
;

DROP TRIGGER IF EXISTS everystep_step_status_insert;

CREATE TRIGGER everystep_step_status_insert BEFORE INSERT ON everystep_step
WHEN NEW.status NOT IN {step_statuses}
BEGIN -- $$
    SELECT RAISE(ABORT, 'CHECK constraint failed: everystep_step.status is no step status');
END -- $$
;

DROP TRIGGER IF EXISTS everystep_step_status_update;

CREATE TRIGGER everystep_step_status_update BEFORE UPDATE OF status ON everystep_step
WHEN NEW.status NOT IN {step_statuses}
BEGIN -- $$
    SELECT RAISE(ABORT, 'CHECK constraint failed: everystep_step.status is no step status');
END -- $$
;

DROP TRIGGER IF EXISTS everystep_request_status_insert;

CREATE TRIGGER everystep_request_status_insert BEFORE INSERT ON everystep_request
WHEN NEW.status NOT IN {request_statuses}
BEGIN -- $$
    SELECT RAISE(ABORT, 'CHECK constraint failed: everystep_request.status is no request status');
END -- $$
;

DROP TRIGGER IF EXISTS everystep_request_status_update;

CREATE TRIGGER everystep_request_status_update BEFORE UPDATE OF status ON everystep_request
WHEN NEW.status NOT IN {request_statuses}
BEGIN -- $$
    SELECT RAISE(ABORT, 'CHECK constraint failed: everystep_request.status is no request status');
END -- $$
;
