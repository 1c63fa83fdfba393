-- Queues and flow control (see everystep/queues.py).
--
-- Every run belongs to a named queue ('default' unless its workflow or its
-- schedule() says otherwise), has a priority (larger first) and may carry a
-- concurrency key. A database that recorded this version as the reserved
-- placeholder gets this file applied by the migrator (migrations/__init__.py).
ALTER TABLE everystep_workflow ADD COLUMN queue text NOT NULL DEFAULT 'default';

ALTER TABLE everystep_workflow ADD COLUMN priority integer NOT NULL DEFAULT 0;

ALTER TABLE everystep_workflow ADD COLUMN concurrency_key text;

-- A queue's limits and pause flag. A queue without a row has no limits and
-- is not paused. NULL: no such limit. Claims from a limited queue lock its
-- row: that is what makes two claimers unable to pass a limit together.
CREATE TABLE everystep_queue (
    name            text PRIMARY KEY,
    concurrency     integer CHECK (concurrency >= 0),
    key_concurrency integer CHECK (key_concurrency >= 1),
    rate_limit      integer CHECK (rate_limit >= 1),
    rate_period     double precision CHECK (rate_period > 0),
    paused          boolean NOT NULL DEFAULT false,
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- When each recent claim of a rate-limited queue happened: the sliding
-- window its rate is checked against (claims delete what is older).
CREATE TABLE everystep_queue_claim (
    queue      text NOT NULL,
    claimed_at timestamptz NOT NULL
);

CREATE INDEX everystep_queue_claim_window ON everystep_queue_claim (queue, claimed_at);

-- Claims walk one queue at a time, one priority at a time, in due order;
-- its first column also lists the queues holding scheduled runs.
DROP INDEX everystep_workflow_claimable;

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (queue, priority DESC, (coalesce(not_before, created_at))) WHERE status = 'scheduled';

-- When each queue's next waiting run (delayed, sleeping, retrying) is due:
-- a run with no not-before time is due at once. Only waiting runs are in
-- it, and a claim, which reads due runs by priority, never uses it.
CREATE INDEX everystep_workflow_waiting
    ON everystep_workflow (queue, not_before) WHERE status = 'scheduled' AND not_before IS NOT NULL;

-- A limited queue's running runs, per concurrency key.
CREATE INDEX everystep_workflow_queue_running
    ON everystep_workflow (queue, concurrency_key) WHERE status = 'running';

-- From this version on the claim serves queues, enforces their limits
-- under the queue row's lock, and everystep_next_due probes each served
-- queue (store/functions/postgres/: claim.sql, next_due.sql,
-- served_queues.sql).
