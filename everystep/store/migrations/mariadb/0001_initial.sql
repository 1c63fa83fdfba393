-- Runs and their recorded steps (see the PostgreSQL migration). MariaDB
-- commits DDL at once, so a migration cannot share a transaction with the
-- version row that records it: every statement here is written to succeed
-- again (IF NOT EXISTS), and a migration cut off half-way is completed by
-- the next `migrate`. Ids are UUID text (ASCII, binary collation, so they
-- sort as PostgreSQL sorts uuids); names compare byte for byte; JSON is
-- stored verbatim as text (key order survives replay); timestamps are UTC
-- DATETIME(6). Idempotency keys may be long: uniqueness is on a digest of
-- (name, key), NULL without a key, and a unique index treats NULLs as
-- distinct, which is what the partial index of the other backends says.
CREATE TABLE IF NOT EXISTS everystep_workflow (
    id              CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    name            VARCHAR(255) NOT NULL,
    args            LONGTEXT NOT NULL,
    idempotency_key TEXT,
    status          VARCHAR(16) NOT NULL,
    claimed_by      VARCHAR(255),
    claimed_at      DATETIME(6),
    result          LONGTEXT,
    error           LONGTEXT,
    created_at      DATETIME(6) NOT NULL,
    completed_at    DATETIME(6),
    idempotency_digest BINARY(32)
        AS (UNHEX(SHA2(CONCAT(name, CHAR(0), idempotency_key), 256))) STORED,
    CONSTRAINT everystep_workflow_status_check CHECK (status IN
        ('scheduled', 'running', 'completed', 'failed', 'stopped', 'blocked')),
    UNIQUE KEY everystep_workflow_idempotency (idempotency_digest),
    KEY everystep_workflow_running (status, claimed_by),
    KEY everystep_workflow_status (status, created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS everystep_step (
    id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    workflow_id  CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    step_id      VARCHAR(300) NOT NULL,
    name         VARCHAR(255) NOT NULL,
    args         LONGTEXT,
    kwargs       LONGTEXT,
    status       VARCHAR(16) NOT NULL,
    result       LONGTEXT,
    error        LONGTEXT,
    started_at   DATETIME(6) NOT NULL,
    completed_at DATETIME(6),
    CONSTRAINT everystep_step_status_check CHECK (status IN ('started', 'done', 'failed')),
    UNIQUE KEY everystep_step_unique (workflow_id, step_id),
    CONSTRAINT everystep_step_workflow FOREIGN KEY (workflow_id)
        REFERENCES everystep_workflow (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
