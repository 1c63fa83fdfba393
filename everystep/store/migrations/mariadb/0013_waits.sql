-- Runs that wait on the world: messages, events, child runs, deadlines
-- (see the PostgreSQL migration). Written to succeed again (IF NOT EXISTS):
-- MariaDB commits DDL at once.
ALTER TABLE everystep_workflow
    ADD COLUMN IF NOT EXISTS parent_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin,
    ADD COLUMN IF NOT EXISTS deadline DATETIME(6),
    ADD COLUMN IF NOT EXISTS wait_key VARCHAR(400);

CREATE INDEX IF NOT EXISTS everystep_workflow_parent ON everystep_workflow (parent_id);

CREATE INDEX IF NOT EXISTS everystep_workflow_deadline ON everystep_workflow (deadline);

ALTER TABLE everystep_step
    DROP CONSTRAINT IF EXISTS everystep_step_status_check,
    ADD CONSTRAINT everystep_step_status_check CHECK (status IN
        ('started', 'done', 'failed', 'retrying', 'sleeping', 'waiting'));

CREATE TABLE IF NOT EXISTS everystep_message (
    id              BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    workflow_id     CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic           VARCHAR(255) NOT NULL,
    payload         LONGTEXT NOT NULL,
    idempotency_key VARCHAR(255),
    created_at      DATETIME(6) NOT NULL,
    consumed_step   VARCHAR(300),
    consumed_at     DATETIME(6),
    UNIQUE KEY everystep_message_idempotency (workflow_id, idempotency_key),
    KEY everystep_message_pending (workflow_id, topic, consumed_step, id),
    CONSTRAINT everystep_message_workflow FOREIGN KEY (workflow_id)
        REFERENCES everystep_workflow (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS everystep_event (
    workflow_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key`       VARCHAR(255) NOT NULL,
    value       LONGTEXT NOT NULL,
    updated_at  DATETIME(6) NOT NULL,
    PRIMARY KEY (workflow_id, `key`),
    CONSTRAINT everystep_event_workflow FOREIGN KEY (workflow_id)
        REFERENCES everystep_workflow (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
