-- The claim looks for each served workflow's runs by name, as PostgreSQL's
-- has since version 10 (store/queue_claim.py). The claimable index holds
-- the name after the priority, so one queue's scheduled runs of one
-- priority and one name are a single range in due order: runs nobody
-- serves are never read.
DROP INDEX everystep_workflow_claimable;

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (queue, priority DESC, name, coalesce(not_before, created_at)) WHERE status = 'scheduled';

-- Where each stored function's file was last applied (store/functions/).
-- This backend stores no function, so the table stays empty; it exists so
-- every backend's migrator is the same.
CREATE TABLE everystep_function (
    name       TEXT PRIMARY KEY,
    sha256     TEXT NOT NULL,
    applied_at TEXT NOT NULL
);
