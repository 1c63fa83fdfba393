-- The queues a claim serves: those given, or (NULL) every queue holding
-- scheduled runs, found by one probe of the claimable index per queue. A
-- plain SQL function, so the planner inlines it into the statements that
-- use it (the claim and everystep_next_due).

CREATE OR REPLACE FUNCTION everystep_served_queues(p_queues text[])
RETURNS SETOF text
LANGUAGE sql
STABLE
AS $$
    WITH RECURSIVE found AS (
        (SELECT w.queue FROM everystep_workflow AS w
         WHERE p_queues IS NULL AND w.status = 'scheduled' ORDER BY w.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT w.queue FROM everystep_workflow AS w
                WHERE w.status = 'scheduled' AND w.queue > found.queue ORDER BY w.queue LIMIT 1)
        FROM found WHERE found.queue IS NOT NULL
    )
    SELECT found.queue FROM found WHERE found.queue IS NOT NULL
    UNION ALL
    SELECT given FROM unnest(p_queues) AS given
$$;
