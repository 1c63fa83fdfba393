-- Statuses are said once, in everystep/models.py (see the PostgreSQL
-- migration). SQLite cannot alter a CHECK constraint, so every new status
-- rebuilt a table. From this version the status columns carry no CHECK:
-- triggers refuse a word that is no status (store/functions/sqlite/
-- statuses.sql, rendered from the models' enums and re-created by the
-- migrator when they change), and a trigger is replaced without touching
-- the table. This is the last rebuild a status needs.
--
-- The rebuild, as 0006's, with foreign keys on (PRAGMA foreign_keys cannot
-- change inside the migration's transaction): copies of the run table and
-- of every table that references it (steps, attempts, messages, events),
-- the copies referencing the run table's copy; the old tables dropped
-- children first, so dropping the old run table cascades into nothing;
-- then the copies take the old names (ALTER TABLE ... RENAME rewrites the
-- children's REFERENCES to follow). The operator requests table, which no
-- table references, is rebuilt the same way. Every row keeps its values
-- and its id, each AUTOINCREMENT counter its value (so no id is handed out
-- twice), and every index is created again as the tables had it.

CREATE TABLE everystep_workflow_v18 (
    id               TEXT PRIMARY KEY,
    name             TEXT NOT NULL,
    args             TEXT NOT NULL,
    idempotency_key  TEXT,
    status           TEXT NOT NULL,
    claimed_by       TEXT,
    claimed_at       TEXT,
    result           TEXT,
    error            TEXT,
    created_at       TEXT NOT NULL,
    completed_at     TEXT,
    claim_epoch      INTEGER NOT NULL DEFAULT 0,
    not_before       TEXT,
    queue            TEXT NOT NULL DEFAULT 'default',
    priority         INTEGER NOT NULL DEFAULT 0,
    concurrency_key  TEXT,
    first_claimed_at TEXT,
    parent_id        TEXT,
    deadline         TEXT,
    wait_key         TEXT,
    app_version      TEXT,
    forked_from      TEXT,
    continued_from   TEXT,
    continued_as     TEXT,
    history          INTEGER
);

INSERT INTO everystep_workflow_v18
    (id, name, args, idempotency_key, status, claimed_by, claimed_at, result, error, created_at, completed_at,
     claim_epoch, not_before, queue, priority, concurrency_key, first_claimed_at, parent_id, deadline, wait_key,
     app_version, forked_from, continued_from, continued_as, history)
SELECT id, name, args, idempotency_key, status, claimed_by, claimed_at, result, error, created_at, completed_at,
       claim_epoch, not_before, queue, priority, concurrency_key, first_claimed_at, parent_id, deadline, wait_key,
       app_version, forked_from, continued_from, continued_as, history
FROM everystep_workflow;

CREATE TABLE everystep_step_v18 (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id    TEXT NOT NULL REFERENCES everystep_workflow_v18 (id) ON DELETE CASCADE,
    step_id        TEXT NOT NULL CHECK (length(step_id) <= 300),
    name           TEXT NOT NULL,
    args           TEXT,
    kwargs         TEXT,
    status         TEXT NOT NULL,
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

INSERT INTO everystep_step_v18
    (id, workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at, attempt,
     wake_at, cpu_seconds, peak_rss_bytes)
SELECT id, workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at, attempt,
       wake_at, cpu_seconds, peak_rss_bytes
FROM everystep_step;

CREATE TABLE everystep_attempt_v18 (
    workflow_id TEXT NOT NULL REFERENCES everystep_workflow_v18 (id) ON DELETE CASCADE,
    step_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    error       TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    failed_at   TEXT NOT NULL,
    retry_at    TEXT NOT NULL,
    PRIMARY KEY (workflow_id, step_id, attempt)
);

INSERT INTO everystep_attempt_v18 (workflow_id, step_id, attempt, error, started_at, failed_at, retry_at)
SELECT workflow_id, step_id, attempt, error, started_at, failed_at, retry_at
FROM everystep_attempt;

CREATE TABLE everystep_message_v18 (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    workflow_id     TEXT NOT NULL REFERENCES everystep_workflow_v18 (id) ON DELETE CASCADE,
    topic           TEXT NOT NULL,
    payload         TEXT NOT NULL,
    idempotency_key TEXT,
    created_at      TEXT NOT NULL,
    consumed_step   TEXT,
    consumed_at     TEXT,
    UNIQUE (workflow_id, idempotency_key)
);

INSERT INTO everystep_message_v18
    (id, workflow_id, topic, payload, idempotency_key, created_at, consumed_step, consumed_at)
SELECT id, workflow_id, topic, payload, idempotency_key, created_at, consumed_step, consumed_at
FROM everystep_message;

CREATE TABLE everystep_event_v18 (
    workflow_id TEXT NOT NULL REFERENCES everystep_workflow_v18 (id) ON DELETE CASCADE,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (workflow_id, key)
);

INSERT INTO everystep_event_v18 (workflow_id, key, value, updated_at)
SELECT workflow_id, key, value, updated_at
FROM everystep_event;

CREATE TABLE everystep_request_v18 (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    runner       TEXT NOT NULL,
    command      TEXT NOT NULL,
    args         TEXT NOT NULL,
    status       TEXT NOT NULL DEFAULT 'pending',
    reply        TEXT,
    requested_by TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    taken_at     TEXT,
    answered_at  TEXT
);

INSERT INTO everystep_request_v18
    (id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at)
SELECT id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at
FROM everystep_request;

-- Each copy's AUTOINCREMENT counter continues from its table's, not from
-- the largest id copied: an id whose row was deleted is never reused.
DELETE FROM sqlite_sequence
WHERE name IN ('everystep_step_v18', 'everystep_message_v18', 'everystep_request_v18');

INSERT INTO sqlite_sequence (name, seq)
SELECT name || '_v18', seq FROM sqlite_sequence
WHERE name IN ('everystep_step', 'everystep_message', 'everystep_request');

DROP TABLE everystep_step;

DROP TABLE everystep_attempt;

DROP TABLE everystep_message;

DROP TABLE everystep_event;

DROP TABLE everystep_workflow;

DROP TABLE everystep_request;

ALTER TABLE everystep_workflow_v18 RENAME TO everystep_workflow;

ALTER TABLE everystep_step_v18 RENAME TO everystep_step;

ALTER TABLE everystep_attempt_v18 RENAME TO everystep_attempt;

ALTER TABLE everystep_message_v18 RENAME TO everystep_message;

ALTER TABLE everystep_event_v18 RENAME TO everystep_event;

ALTER TABLE everystep_request_v18 RENAME TO everystep_request;

CREATE UNIQUE INDEX everystep_workflow_idempotency
    ON everystep_workflow (name, idempotency_key) WHERE idempotency_key IS NOT NULL;

CREATE INDEX everystep_workflow_running
    ON everystep_workflow (claimed_by) WHERE status = 'running';

CREATE INDEX everystep_workflow_status ON everystep_workflow (status, created_at);

CREATE INDEX everystep_workflow_waiting
    ON everystep_workflow (queue, not_before) WHERE status = 'scheduled' AND not_before IS NOT NULL;

CREATE INDEX everystep_workflow_queue_running
    ON everystep_workflow (queue, concurrency_key) WHERE status = 'running';

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (queue, priority DESC, name, coalesce(not_before, created_at)) WHERE status = 'scheduled';

CREATE INDEX everystep_workflow_parent ON everystep_workflow (parent_id) WHERE parent_id IS NOT NULL;

CREATE INDEX everystep_workflow_deadline ON everystep_workflow (deadline) WHERE deadline IS NOT NULL;

CREATE INDEX everystep_workflow_forked_from
    ON everystep_workflow (forked_from) WHERE forked_from IS NOT NULL;

CREATE INDEX everystep_workflow_wait_key
    ON everystep_workflow (wait_key) WHERE wait_key IS NOT NULL;

CREATE INDEX everystep_message_pending ON everystep_message (workflow_id, topic, id)
    WHERE consumed_step IS NULL;

CREATE INDEX everystep_request_pending ON everystep_request (runner, id) WHERE status = 'pending';

CREATE INDEX everystep_request_created ON everystep_request (created_at);
