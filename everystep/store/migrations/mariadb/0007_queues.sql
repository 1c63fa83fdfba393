-- Queues and flow control (see everystep/queues.py and the PostgreSQL
-- migration). Written to be re-run, like every MariaDB migration; a
-- database that recorded this version as the reserved placeholder gets it
-- applied by the migrator (migrations/__init__.py).
--
-- Every run belongs to a named queue ('default' unless its workflow or its
-- schedule() says otherwise), has a priority (larger first) and may carry a
-- concurrency key.
ALTER TABLE everystep_workflow
    ADD COLUMN IF NOT EXISTS queue VARCHAR(100) NOT NULL DEFAULT 'default',
    ADD COLUMN IF NOT EXISTS priority INT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS concurrency_key VARCHAR(300);

-- A queue's limits and pause flag. A queue without a row has no limits and
-- is not paused. NULL: no such limit. Claims from a limited queue lock its
-- row: that is what makes two claimers unable to pass a limit together.
CREATE TABLE IF NOT EXISTS everystep_queue (
    name            VARCHAR(100) NOT NULL PRIMARY KEY,
    concurrency     INT CHECK (concurrency >= 0),
    key_concurrency INT CHECK (key_concurrency >= 1),
    rate_limit      INT CHECK (rate_limit >= 1),
    rate_period     DOUBLE CHECK (rate_period > 0),
    paused          BOOLEAN NOT NULL DEFAULT FALSE,
    updated_at      DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- When each recent claim of a rate-limited queue happened: the sliding
-- window its rate is checked against (claims delete what is older).
CREATE TABLE IF NOT EXISTS everystep_queue_claim (
    id         BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    queue      VARCHAR(100) NOT NULL,
    claimed_at DATETIME(6) NOT NULL,
    KEY everystep_queue_claim_window (queue, claimed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- MariaDB has no partial index: each index leads with the status. Claims
-- walk one queue at a time, one priority at a time, in due order (and list
-- the queues holding scheduled runs by its first two columns); one ALTER
-- replaces the index of version 6, so a re-run leaves the same index.
ALTER TABLE everystep_workflow
    DROP INDEX IF EXISTS everystep_workflow_claimable,
    ADD INDEX everystep_workflow_claimable (status, queue, priority, due_at);

-- When each queue's next waiting run (delayed, sleeping, retrying) is due.
CREATE INDEX IF NOT EXISTS everystep_workflow_waiting ON everystep_workflow (status, queue, not_before);

-- A limited queue's running runs, per concurrency key.
CREATE INDEX IF NOT EXISTS everystep_workflow_queue_running
    ON everystep_workflow (status, queue, concurrency_key);
