-- The run lifecycle: delayed and sleeping runs, retries with backoff,
-- cancellation, periodic (cron) schedules.
--
-- A scheduled run is not claimable before `not_before` (NULL: at once). A
-- delayed start, a durable sleep and a retry's backoff are all the same
-- thing: status 'scheduled' with a not-before time, holding a row and no
-- process. Claims walk the partial index of scheduled runs in due-time
-- order, coalesce(not_before, created_at), and stop at the first run that
-- is not yet due, so a hundred thousand sleeping runs cost a claim nothing.
ALTER TABLE everystep_workflow ADD COLUMN not_before timestamptz;

-- 'cancelled': final, set by an operator. A cancelled run keeps the
-- claimed_by and claim_epoch it had, so the supervisor holding it can still
-- record the step it cut off (a write fenced by that claim and by the
-- status), while every other write of that execution, conditional on
-- status 'running', is refused.
ALTER TABLE everystep_workflow DROP CONSTRAINT everystep_workflow_status_check;

ALTER TABLE everystep_workflow ADD CONSTRAINT everystep_workflow_status_check CHECK (status IN
    ('scheduled', 'running', 'completed', 'failed', 'stopped', 'blocked', 'cancelled'));

DROP INDEX everystep_workflow_claimable;

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow ((coalesce(not_before, created_at))) WHERE status = 'scheduled';

-- A step row may now wait: 'retrying' (attempt `attempt` failed, the next
-- may start at `wake_at`) or 'sleeping' (a durable sleep until `wake_at`).
-- Its final outcome replaces it, keeping `attempt`.
ALTER TABLE everystep_step ADD COLUMN attempt integer NOT NULL DEFAULT 1;

ALTER TABLE everystep_step ADD COLUMN wake_at timestamptz;

ALTER TABLE everystep_step DROP CONSTRAINT everystep_step_status_check;

ALTER TABLE everystep_step ADD CONSTRAINT everystep_step_status_check CHECK (status IN
    ('started', 'done', 'failed', 'retrying', 'sleeping'));

-- Every failed attempt that was retried, for `get_steps`, `everystep show`
-- and the console. Deleted with its run (retention).
CREATE TABLE everystep_attempt (
    workflow_id uuid NOT NULL REFERENCES everystep_workflow (id) ON DELETE CASCADE,
    step_id     text NOT NULL,
    attempt     integer NOT NULL,
    error       json NOT NULL,
    started_at  timestamptz NOT NULL,
    failed_at   timestamptz NOT NULL,
    retry_at    timestamptz NOT NULL,
    PRIMARY KEY (workflow_id, step_id, attempt)
);

-- The last tick enqueued for each periodic workflow, so a runner starting
-- after downtime knows whether the most recent tick was missed. The runs
-- themselves are deduplicated by their idempotency key per (workflow, tick).
CREATE TABLE everystep_cron (
    name      text PRIMARY KEY,
    last_tick timestamptz NOT NULL,
    last_run  uuid
);

-- The claim and everystep_next_due read due runs in due-time order from
-- this version on (store/functions/postgres/).
