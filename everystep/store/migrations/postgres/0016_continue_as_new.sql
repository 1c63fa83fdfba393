-- Runs that continue as new (everystep.continue_as_new): the run a run
-- continues and the run that continued it, NULL for every other run.
ALTER TABLE everystep_workflow
    ADD COLUMN IF NOT EXISTS continued_from uuid,
    ADD COLUMN IF NOT EXISTS continued_as uuid;
