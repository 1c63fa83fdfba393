-- Code changes under runs in flight: the code version a run was started
-- under, and the run it was forked from (see the PostgreSQL migration).
ALTER TABLE everystep_workflow
    ADD COLUMN IF NOT EXISTS app_version VARCHAR(255),
    ADD COLUMN IF NOT EXISTS forked_from CHAR(36) CHARACTER SET ascii COLLATE ascii_bin;

CREATE INDEX IF NOT EXISTS everystep_workflow_forked_from ON everystep_workflow (forked_from);
