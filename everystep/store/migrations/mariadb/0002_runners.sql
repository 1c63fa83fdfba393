-- Live runners and their heartbeats (see the PostgreSQL migration).
CREATE TABLE IF NOT EXISTS everystep_runner (
    name          VARCHAR(255) NOT NULL PRIMARY KEY,
    instance      VARCHAR(255) NOT NULL,
    kind          VARCHAR(64) NOT NULL,
    host          VARCHAR(255) NOT NULL,
    pid           INT NOT NULL,
    lease_seconds DOUBLE NOT NULL CHECK (lease_seconds > 0),
    started_at    DATETIME(6) NOT NULL,
    heartbeat_at  DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
