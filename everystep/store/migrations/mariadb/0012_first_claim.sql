-- When a run was first claimed (see the PostgreSQL migration): set by the
-- claim the first time only; NULL for runs never claimed or claimed before.
ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS first_claimed_at DATETIME(6);
