-- Operator requests relayed to a runner through the database, and what a
-- supervisor publishes about its children (see the PostgreSQL migration).
CREATE TABLE everystep_request (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    runner       TEXT NOT NULL,
    command      TEXT NOT NULL,
    args         TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'taken', 'answered', 'expired')),
    reply        TEXT,
    requested_by TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    taken_at     TEXT,
    answered_at  TEXT
);

CREATE INDEX everystep_request_pending ON everystep_request (runner, id) WHERE status = 'pending';

CREATE INDEX everystep_request_created ON everystep_request (created_at);

ALTER TABLE everystep_runner ADD COLUMN detail TEXT;
