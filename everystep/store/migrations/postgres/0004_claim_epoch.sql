-- Fencing: every claim of a run bumps its claim epoch, and every write an
-- executor makes for the run is conditional on (claimed_by, claim_epoch).
-- A runner name alone cannot tell two executions apart (the same supervisor
-- may re-claim a run an operator requeued while a child still executes it);
-- the epoch can, so a stale executor's first write is refused.
ALTER TABLE everystep_workflow ADD COLUMN claim_epoch bigint NOT NULL DEFAULT 0;

-- The claim function returned the new epoch with the run from this version
-- on (store/functions/postgres/claim.sql).
