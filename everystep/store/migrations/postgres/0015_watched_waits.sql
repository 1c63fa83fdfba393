-- Waits on another run (a body's get_event with a timeout, wait_key
-- `event:<run>:<key>`): a set_event finds the runs waiting for its event
-- by wait_key (wake_watchers). Only waiting runs have one, so the index
-- holds those alone.
CREATE INDEX IF NOT EXISTS everystep_workflow_wait_key
    ON everystep_workflow (wait_key) WHERE wait_key IS NOT NULL;
