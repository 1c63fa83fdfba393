-- Runs and their recorded steps. Timestamps are ISO-8601 UTC text, JSON is text.
CREATE TABLE everystep_workflow (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    args            TEXT NOT NULL,
    idempotency_key TEXT,
    status          TEXT NOT NULL CHECK (status IN
                        ('scheduled', 'running', 'completed', 'failed', 'stopped', 'blocked')),
    claimed_by      TEXT,
    claimed_at      TEXT,
    result          TEXT,
    error           TEXT,
    created_at      TEXT NOT NULL,
    completed_at    TEXT
);

CREATE UNIQUE INDEX everystep_workflow_idempotency
    ON everystep_workflow (name, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (created_at) WHERE status = 'scheduled';

CREATE INDEX everystep_workflow_running
    ON everystep_workflow (claimed_by) WHERE status = 'running';

CREATE INDEX everystep_workflow_status ON everystep_workflow (status, created_at);

CREATE TABLE everystep_step (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id  TEXT NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    step_id      TEXT NOT NULL CHECK (length(step_id) <= 300),
    name         TEXT NOT NULL,
    args         TEXT,
    kwargs       TEXT,
    status       TEXT NOT NULL CHECK (status IN ('started', 'done', 'failed')),
    result       TEXT,
    error        TEXT,
    started_at   TEXT NOT NULL,
    completed_at TEXT,
    UNIQUE (workflow_id, step_id)
);
