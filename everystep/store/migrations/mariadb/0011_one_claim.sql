-- The claim looks for each served workflow's runs by name, as PostgreSQL's
-- has since version 10 (store/queue_claim.py). The claimable index holds
-- the name after the priority, so one queue's scheduled runs of one
-- priority and one name are a single range in due order: runs nobody
-- serves are never read. One ALTER replaces the index of version 7, so a
-- re-run leaves the same index.
ALTER TABLE everystep_workflow
    DROP INDEX IF EXISTS everystep_workflow_claimable,
    ADD INDEX everystep_workflow_claimable (status, queue, priority, name, due_at);

-- Where each stored function's file was last applied (store/functions/).
-- This backend stores no function, so the table stays empty; it exists so
-- every backend's migrator is the same.
CREATE TABLE IF NOT EXISTS everystep_function (
    name       VARCHAR(255) NOT NULL PRIMARY KEY,
    sha256     CHAR(64) NOT NULL,
    applied_at DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
