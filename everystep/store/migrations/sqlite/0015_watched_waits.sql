-- Waits on another run: a set_event finds the runs waiting for its event
-- by wait_key (see the PostgreSQL migration).
CREATE INDEX everystep_workflow_wait_key
    ON everystep_workflow (wait_key) WHERE wait_key IS NOT NULL;
