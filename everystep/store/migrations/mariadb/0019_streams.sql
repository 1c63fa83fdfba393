-- Streams: values out of a running run, as they happen (see the PostgreSQL
-- migration). Written to succeed again (IF NOT EXISTS): MariaDB commits DDL
-- at once.
CREATE TABLE IF NOT EXISTS everystep_stream (
    workflow_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    `key`       VARCHAR(255) NOT NULL,
    seq         BIGINT NOT NULL,
    value       LONGTEXT,
    step_id     VARCHAR(300) NOT NULL,
    attempt     BIGINT,
    closed      TINYINT NOT NULL DEFAULT 0,
    withdrawn   TINYINT NOT NULL DEFAULT 0,
    written_at  DATETIME(6) NOT NULL,
    PRIMARY KEY (workflow_id, `key`, seq),
    KEY everystep_stream_step (workflow_id, step_id),
    CONSTRAINT everystep_stream_workflow FOREIGN KEY (workflow_id)
        REFERENCES everystep_workflow (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
