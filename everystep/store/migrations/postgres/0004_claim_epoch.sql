-- Fencing: every claim of a run bumps its claim epoch, and every write an
-- executor makes for the run is conditional on (claimed_by, claim_epoch).
-- A runner name alone cannot tell two executions apart (the same supervisor
-- may re-claim a run an operator requeued while a child still executes it);
-- the epoch can, so a stale executor's first write is refused.
ALTER TABLE everystep_workflow ADD COLUMN claim_epoch bigint NOT NULL DEFAULT 0;

-- The claim function returns the new epoch with the run; its result type
-- changes, so it is replaced rather than altered.
DROP FUNCTION everystep_claim(text, text[], integer);

CREATE FUNCTION everystep_claim(p_claimer text, p_names text[], p_limit integer)
RETURNS TABLE (id uuid, name text, args json, status text, idempotency_key text, claimed_by text,
               claimed_at timestamptz, result json, error json, created_at timestamptz,
               completed_at timestamptz, claim_epoch bigint, has_steps boolean)
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH picked AS (
        SELECT w.id FROM everystep_workflow AS w
        WHERE w.status = 'scheduled' AND w.name = ANY(p_names)
        ORDER BY w.created_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE everystep_workflow AS w
    SET status = 'running', claimed_by = p_claimer, claimed_at = clock_timestamp(),
        claim_epoch = w.claim_epoch + 1
    FROM picked
    WHERE w.id = picked.id
    RETURNING w.id, w.name, w.args, w.status, w.idempotency_key, w.claimed_by, w.claimed_at,
              w.result, w.error, w.created_at, w.completed_at, w.claim_epoch,
              EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = w.id);
END;
$$;
