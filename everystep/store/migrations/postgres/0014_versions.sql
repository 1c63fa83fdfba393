-- Code changes under runs in flight (everystep.patches, versions, fork):
-- the code version a run was started under (``--app-version``, or a hash
-- of its workflow's code), and the run it was forked from (``everystep
-- fork``), NULL for every run before this version and for unforked ones.
ALTER TABLE everystep_workflow
    ADD COLUMN IF NOT EXISTS app_version text,
    ADD COLUMN IF NOT EXISTS forked_from uuid;

-- Runs forked from a run, for its page (``show`` says both ways).
CREATE INDEX IF NOT EXISTS everystep_workflow_forked_from
    ON everystep_workflow (forked_from) WHERE forked_from IS NOT NULL;

-- The claim takes the versions a runner serves (--serve-versions): its new
-- signature is created from store/functions/postgres/claim.sql after the
-- migrations; the old one goes, so a call is never ambiguous.
DROP FUNCTION IF EXISTS everystep_claim(text, text[], integer, text[]);

DROP FUNCTION IF EXISTS everystep_claim_limited(text, text[], integer, text[]);
