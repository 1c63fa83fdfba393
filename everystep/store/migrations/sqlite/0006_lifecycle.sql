-- The run lifecycle: delayed and sleeping runs, retries with backoff,
-- cancellation, periodic (cron) schedules (see the PostgreSQL migration).
--
-- SQLite cannot alter a CHECK constraint, and both tables gain a status, so
-- both are rebuilt: copies under new names, the step copy referencing the
-- workflow copy; the old tables are dropped child first, so dropping the
-- old workflow table cascades into nothing (its only child is gone); then
-- the copies take the old names, and ALTER TABLE ... RENAME rewrites the
-- step table's REFERENCES to follow. This works with foreign keys on, as
-- they are on every connection (PRAGMA foreign_keys cannot change inside
-- the migration's transaction). Every index is created again.
CREATE TABLE everystep_workflow_v6 (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    args            TEXT NOT NULL,
    idempotency_key TEXT,
    status          TEXT NOT NULL CHECK (status IN
                        ('scheduled', 'running', 'completed', 'failed', 'stopped', 'blocked', 'cancelled')),
    claimed_by      TEXT,
    claimed_at      TEXT,
    result          TEXT,
    error           TEXT,
    created_at      TEXT NOT NULL,
    completed_at    TEXT,
    claim_epoch     INTEGER NOT NULL DEFAULT 0,
    not_before      TEXT
);

INSERT INTO everystep_workflow_v6
    (id, name, args, idempotency_key, status, claimed_by, claimed_at, result, error, created_at,
     completed_at, claim_epoch)
SELECT id, name, args, idempotency_key, status, claimed_by, claimed_at, result, error, created_at,
       completed_at, claim_epoch
FROM everystep_workflow;

CREATE TABLE everystep_step_v6 (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id  TEXT NOT NULL REFERENCES everystep_workflow_v6 (id) ON DELETE CASCADE,
    step_id      TEXT NOT NULL CHECK (length(step_id) <= 300),
    name         TEXT NOT NULL,
    args         TEXT,
    kwargs       TEXT,
    status       TEXT NOT NULL CHECK (status IN ('started', 'done', 'failed', 'retrying', 'sleeping')),
    result       TEXT,
    error        TEXT,
    started_at   TEXT NOT NULL,
    completed_at TEXT,
    attempt      INTEGER NOT NULL DEFAULT 1,
    wake_at      TEXT,
    UNIQUE (workflow_id, step_id)
);

INSERT INTO everystep_step_v6
    (id, workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at)
SELECT id, workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at
FROM everystep_step;

DROP TABLE everystep_step;

DROP TABLE everystep_workflow;

ALTER TABLE everystep_workflow_v6 RENAME TO everystep_workflow;

ALTER TABLE everystep_step_v6 RENAME TO everystep_step;

CREATE UNIQUE INDEX everystep_workflow_idempotency
    ON everystep_workflow (name, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (coalesce(not_before, created_at)) WHERE status = 'scheduled';

CREATE INDEX everystep_workflow_running
    ON everystep_workflow (claimed_by) WHERE status = 'running';

CREATE INDEX everystep_workflow_status ON everystep_workflow (status, created_at);

CREATE TABLE everystep_attempt (
    workflow_id TEXT NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    step_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    error       TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    failed_at   TEXT NOT NULL,
    retry_at    TEXT NOT NULL,
    PRIMARY KEY (workflow_id, step_id, attempt)
);

CREATE TABLE everystep_cron (
    name      TEXT PRIMARY KEY,
    last_tick TEXT NOT NULL,
    last_run  TEXT
);
