-- Seconds until the next scheduled run of the served queues (NULL: every
-- queue) that is not due yet becomes due; NULL when there is none. Paused
-- queues are left out. One probe of the waiting index per queue: runners
-- call it after a claim that came back short and set a timer, which is how
-- a delayed or sleeping run starts on time without anyone polling faster.
-- Its plan settings are the claim's, for the same reasons (claim.sql).

CREATE OR REPLACE FUNCTION everystep_next_due(p_queues text[])
RETURNS double precision
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    RETURN (
        SELECT extract(epoch FROM min(next.due) - v_now)::float8
        FROM everystep_served_queues(p_queues) AS served(q)
        CROSS JOIN LATERAL (
            SELECT w.not_before AS due FROM everystep_workflow AS w
            WHERE w.status = 'scheduled' AND w.not_before IS NOT NULL AND w.queue = served.q
              AND w.not_before > v_now
            ORDER BY w.not_before
            LIMIT 1
        ) AS next
        WHERE NOT EXISTS (SELECT 1 FROM everystep_queue AS c WHERE c.name = served.q AND c.paused)
    );
END;
$$;
