-- Live runners and their heartbeats (heartbeat_epoch: unix seconds, for expiry math).
CREATE TABLE everystep_runner (
    name            TEXT PRIMARY KEY,
    instance        TEXT NOT NULL,
    kind            TEXT NOT NULL,
    host            TEXT NOT NULL,
    pid             INTEGER NOT NULL,
    lease_seconds   REAL NOT NULL CHECK (lease_seconds > 0),
    started_at      TEXT NOT NULL,
    heartbeat_at    TEXT NOT NULL,
    heartbeat_epoch REAL NOT NULL
);
