-- Runs and their recorded steps.
CREATE TABLE everystep_workflow (
    id              uuid PRIMARY KEY,
    name            text NOT NULL,
    args            json NOT NULL,
    idempotency_key text,
    status          text NOT NULL CHECK (status IN
                        ('scheduled', 'running', 'completed', 'failed', 'stopped', 'blocked')),
    claimed_by      text,
    claimed_at      timestamptz,
    result          json,
    error           json,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    completed_at    timestamptz
);

-- One run per (workflow, key): the arbiter of concurrent idempotent schedules.
CREATE UNIQUE INDEX everystep_workflow_idempotency
    ON everystep_workflow (name, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- Claims read only this small partial index, however many finished runs pile up.
CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (created_at) WHERE status = 'scheduled';

-- Catchup, requeue and lease recovery look up running runs by claimer.
CREATE INDEX everystep_workflow_running
    ON everystep_workflow (claimed_by) WHERE status = 'running';

-- Operators list runs by status, newest first.
CREATE INDEX everystep_workflow_status ON everystep_workflow (status, created_at);

CREATE TABLE everystep_step (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id  uuid NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    step_id      text NOT NULL CHECK (length(step_id) <= 300),
    name         text NOT NULL,
    args         json,
    kwargs       json,
    status       text NOT NULL CHECK (status IN ('started', 'done', 'failed')),
    result       json,
    error        json,
    started_at   timestamptz NOT NULL,
    completed_at timestamptz,
    CONSTRAINT everystep_step_unique UNIQUE (workflow_id, step_id)
);
