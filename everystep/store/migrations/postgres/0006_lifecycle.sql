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

-- The claim, now in due-time order and only over runs that are due. The
-- time is read once into a variable: a volatile clock_timestamp() in the
-- WHERE clause could not bound the index scan, which would then read every
-- sleeping run whenever fewer than p_limit runs are due. Plan pinning and
-- the asynchronous commit are as in version 3 (see there).
DROP FUNCTION everystep_claim(text, text[], integer);

CREATE FUNCTION everystep_claim(p_claimer text, p_names text[], p_limit integer)
RETURNS TABLE (id uuid, name text, args json, status text, idempotency_key text, claimed_by text,
               claimed_at timestamptz, result json, error json, created_at timestamptz,
               completed_at timestamptz, claim_epoch bigint, not_before timestamptz, has_steps boolean)
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH picked AS (
        SELECT w.id FROM everystep_workflow AS w
        WHERE w.status = 'scheduled'
          AND coalesce(w.not_before, w.created_at) <= v_now
          AND w.name = ANY(p_names)
        ORDER BY coalesce(w.not_before, w.created_at)
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE everystep_workflow AS w
    SET status = 'running', claimed_by = p_claimer, claimed_at = v_now,
        claim_epoch = w.claim_epoch + 1
    FROM picked
    WHERE w.id = picked.id
    RETURNING w.id, w.name, w.args, w.status, w.idempotency_key, w.claimed_by, w.claimed_at,
              w.result, w.error, w.created_at, w.completed_at, w.claim_epoch, w.not_before,
              EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = w.id);
END;
$$;

-- Seconds until the earliest scheduled run of these workflows is due
-- (negative: overdue; NULL: none). Runners call it after a claim that came
-- back short, and set a timer: that is how a delayed or sleeping run starts
-- on time without anyone polling faster. Pinned like the claim: one step
-- along the same index.
CREATE FUNCTION everystep_next_due(p_names text[])
RETURNS double precision
LANGUAGE sql
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
    SELECT extract(epoch FROM coalesce(w.not_before, w.created_at) - clock_timestamp())::float8
    FROM everystep_workflow AS w
    WHERE w.status = 'scheduled' AND w.name = ANY(p_names)
    ORDER BY coalesce(w.not_before, w.created_at)
    LIMIT 1
$$;
