-- The run lifecycle: delayed and sleeping runs, retries with backoff,
-- cancellation, periodic (cron) schedules (see the PostgreSQL migration).
--
-- MariaDB indexes no expression, but it indexes a generated column: `due_at`
-- is coalesce(not_before, created_at), computed on read, and the claim walks
-- (status, due_at) in due-time order and stops at the first run that is not
-- yet due, so sleeping runs cost a claim nothing.
ALTER TABLE everystep_workflow
    ADD COLUMN IF NOT EXISTS not_before DATETIME(6),
    ADD COLUMN IF NOT EXISTS due_at DATETIME(6) AS (coalesce(not_before, created_at)) VIRTUAL;

ALTER TABLE everystep_workflow
    DROP CONSTRAINT IF EXISTS everystep_workflow_status_check,
    ADD CONSTRAINT everystep_workflow_status_check CHECK (status IN
        ('scheduled', 'running', 'completed', 'failed', 'stopped', 'blocked', 'cancelled'));

CREATE INDEX IF NOT EXISTS everystep_workflow_claimable ON everystep_workflow (status, due_at);

ALTER TABLE everystep_step
    ADD COLUMN IF NOT EXISTS attempt INT NOT NULL DEFAULT 1,
    ADD COLUMN IF NOT EXISTS wake_at DATETIME(6);

ALTER TABLE everystep_step
    DROP CONSTRAINT IF EXISTS everystep_step_status_check,
    ADD CONSTRAINT everystep_step_status_check CHECK (status IN
        ('started', 'done', 'failed', 'retrying', 'sleeping'));

CREATE TABLE IF NOT EXISTS everystep_attempt (
    workflow_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    step_id     VARCHAR(300) NOT NULL,
    attempt     INT NOT NULL,
    error       LONGTEXT NOT NULL,
    started_at  DATETIME(6) NOT NULL,
    failed_at   DATETIME(6) NOT NULL,
    retry_at    DATETIME(6) NOT NULL,
    PRIMARY KEY (workflow_id, step_id, attempt),
    CONSTRAINT everystep_attempt_workflow FOREIGN KEY (workflow_id)
        REFERENCES everystep_workflow (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS everystep_cron (
    name      VARCHAR(255) NOT NULL PRIMARY KEY,
    last_tick DATETIME(6) NOT NULL,
    last_run  CHAR(36) CHARACTER SET ascii COLLATE ascii_bin
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
