-- Code changes under runs in flight: the code version a run was started
-- under, and the run it was forked from (see the PostgreSQL migration).
ALTER TABLE everystep_workflow ADD COLUMN app_version TEXT;

ALTER TABLE everystep_workflow ADD COLUMN forked_from TEXT;

CREATE INDEX everystep_workflow_forked_from
    ON everystep_workflow (forked_from) WHERE forked_from IS NOT NULL;
