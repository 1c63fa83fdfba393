-- Runs that wait on the world: messages, events, child runs, deadlines
-- (see the PostgreSQL migration). SQLite cannot alter a CHECK constraint,
-- so the step table is rebuilt to admit 'waiting' (as 0006 did): a copy,
-- the old table dropped (nothing references it), the copy renamed.
ALTER TABLE everystep_workflow ADD COLUMN parent_id TEXT;

ALTER TABLE everystep_workflow ADD COLUMN deadline TEXT;

ALTER TABLE everystep_workflow ADD COLUMN wait_key TEXT;

CREATE INDEX everystep_workflow_parent ON everystep_workflow (parent_id) WHERE parent_id IS NOT NULL;

CREATE INDEX everystep_workflow_deadline ON everystep_workflow (deadline) WHERE deadline IS NOT NULL;

CREATE TABLE everystep_step_v13 (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id    TEXT NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    step_id        TEXT NOT NULL CHECK (length(step_id) <= 300),
    name           TEXT NOT NULL,
    args           TEXT,
    kwargs         TEXT,
    status         TEXT NOT NULL CHECK (status IN
                       ('started', 'done', 'failed', 'retrying', 'sleeping', 'waiting')),
    result         TEXT,
    error          TEXT,
    started_at     TEXT NOT NULL,
    completed_at   TEXT,
    attempt        INTEGER NOT NULL DEFAULT 1,
    wake_at        TEXT,
    cpu_seconds    REAL,
    peak_rss_bytes INTEGER,
    UNIQUE (workflow_id, step_id)
);

INSERT INTO everystep_step_v13
    (id, workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at, cpu_seconds, peak_rss_bytes)
SELECT id, workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
       attempt, wake_at, cpu_seconds, peak_rss_bytes
FROM everystep_step;

DROP TABLE everystep_step;

ALTER TABLE everystep_step_v13 RENAME TO everystep_step;

CREATE TABLE everystep_message (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id     TEXT NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    topic           TEXT NOT NULL,
    payload         TEXT NOT NULL,
    idempotency_key TEXT,
    created_at      TEXT NOT NULL,
    consumed_step   TEXT,
    consumed_at     TEXT,
    UNIQUE (workflow_id, idempotency_key)
);

CREATE INDEX everystep_message_pending ON everystep_message (workflow_id, topic, id)
    WHERE consumed_step IS NULL;

CREATE TABLE everystep_event (
    workflow_id TEXT NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (workflow_id, key)
);
