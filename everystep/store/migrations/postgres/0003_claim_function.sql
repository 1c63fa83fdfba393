-- The claim, as a function, so its plan cannot depend on statistics.
--
-- The claim must walk the partial index of scheduled runs in created_at
-- order and stop after `p_limit` rows. With statistics from a moment when
-- few runs were scheduled, the planner may instead bitmap-scan every
-- scheduled run and sort them: fine for ten rows, a collapse for a backlog
-- of a hundred thousand, which is exactly when claims must be fast. The
-- function's SET clauses rule that plan out.
--
-- The commit does not wait for the WAL flush (synchronous_commit off for
-- this transaction only): a claim lost in a crash returns the run to the
-- queue, and the claimer's first step write is then refused, because every
-- write checks the claim; the flush of that first step record makes the
-- claim durable anyway. The last column says whether the run has recorded
-- steps; when it has none the runner does not read them.
CREATE FUNCTION everystep_claim(p_claimer text, p_names text[], p_limit integer)
RETURNS TABLE (id uuid, name text, args json, status text, idempotency_key text, claimed_by text,
               claimed_at timestamptz, result json, error json, created_at timestamptz,
               completed_at timestamptz, has_steps boolean)
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
    SET status = 'running', claimed_by = p_claimer, claimed_at = clock_timestamp()
    FROM picked
    WHERE w.id = picked.id
    RETURNING w.id, w.name, w.args, w.status, w.idempotency_key, w.claimed_by, w.claimed_at,
              w.result, w.error, w.created_at, w.completed_at,
              EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = w.id);
END;
$$;
