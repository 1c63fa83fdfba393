-- Debounced scheduling (see the PostgreSQL migration). Written to succeed
-- again (IF NOT EXISTS): MariaDB commits DDL at once. The key is bounded
-- (255 characters, as a workflow name) so the primary key fits an index.
ALTER TABLE everystep_workflow ADD COLUMN IF NOT EXISTS debounce_calls INT NULL;

CREATE TABLE IF NOT EXISTS everystep_debounce (
    name         VARCHAR(255) NOT NULL,
    debounce_key VARCHAR(255) NOT NULL,
    run_id       CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    first_at     DATETIME(6) NOT NULL,
    calls        BIGINT NOT NULL DEFAULT 1,
    PRIMARY KEY (name, debounce_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
