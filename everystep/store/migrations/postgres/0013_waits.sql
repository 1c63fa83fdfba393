-- Runs that wait on the world: messages into a run, events out of it,
-- child runs, run deadlines (README "Waiting on the world").
--
-- A waiting run is a scheduled run with a not-before time, as a durable
-- sleep is: `wait_key` says what ends its wait early ('message:<topic>',
-- 'child:<run id>', '*' when several scopes wait on different things).
-- A send or a child's end moves `not_before` to now under the run's row
-- lock, in the transaction that ends the wait; a run that waits with no
-- timeout has a not-before time far ahead (models.WAIT_FOREVER).
ALTER TABLE everystep_workflow ADD COLUMN parent_id uuid;

ALTER TABLE everystep_workflow ADD COLUMN deadline timestamptz;

ALTER TABLE everystep_workflow ADD COLUMN wait_key text;

-- `runs --parent`, the console's children list and the cancel cascade.
CREATE INDEX everystep_workflow_parent ON everystep_workflow (parent_id) WHERE parent_id IS NOT NULL;

-- The deadline sweep reads the runs that have one, earliest first.
CREATE INDEX everystep_workflow_deadline ON everystep_workflow (deadline) WHERE deadline IS NOT NULL;

-- A step may wait for a message or a child: 'waiting' (its topic or child
-- in args, its timeout in wake_at).
ALTER TABLE everystep_step DROP CONSTRAINT everystep_step_status_check;

ALTER TABLE everystep_step ADD CONSTRAINT everystep_step_status_check CHECK (status IN
    ('started', 'done', 'failed', 'retrying', 'sleeping', 'waiting'));

-- Messages sent to a run, consumed in send order (id) per topic, each by
-- one recv step (consumed_step), in the transaction that records it.
CREATE TABLE everystep_message (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow_id     uuid NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    topic           text NOT NULL,
    payload         json NOT NULL,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    consumed_step   text,
    consumed_at     timestamptz,
    CONSTRAINT everystep_message_idempotency UNIQUE (workflow_id, idempotency_key)
);

CREATE INDEX everystep_message_pending ON everystep_message (workflow_id, topic, id)
    WHERE consumed_step IS NULL;

CREATE INDEX everystep_message_run ON everystep_message (workflow_id, id);

-- Events a run publishes (set_event): the last value per key.
CREATE TABLE everystep_event (
    workflow_id uuid NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    key         text NOT NULL,
    value       json NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (workflow_id, key)
);
