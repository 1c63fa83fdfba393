-- Operator requests relayed to a runner through the database, and what a
-- supervisor publishes about its children (see the PostgreSQL migration).
CREATE TABLE IF NOT EXISTS everystep_request (
    id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    runner       VARCHAR(255) NOT NULL,
    command      VARCHAR(64) NOT NULL,
    args         LONGTEXT NOT NULL,
    status       VARCHAR(16) NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'taken', 'answered', 'expired')),
    reply        LONGTEXT,
    requested_by VARCHAR(255) NOT NULL,
    created_at   DATETIME(6) NOT NULL,
    taken_at     DATETIME(6),
    answered_at  DATETIME(6),
    KEY everystep_request_pending (runner, status, id),
    KEY everystep_request_created (created_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

ALTER TABLE everystep_runner ADD COLUMN IF NOT EXISTS detail LONGTEXT;
