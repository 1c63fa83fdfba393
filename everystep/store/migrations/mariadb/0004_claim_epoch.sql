-- Fencing: every claim of a run bumps its claim epoch, and every write an
-- executor makes for the run is conditional on (claimed_by, claim_epoch),
-- so a stale execution of a run its own runner re-claimed is refused.
ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS claim_epoch BIGINT NOT NULL DEFAULT 0;
