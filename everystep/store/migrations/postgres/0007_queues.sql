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

-- The queues served: those given, or (NULL) every queue holding scheduled
-- runs, found by one index probe per queue. A plain SQL function, so the
-- planner inlines it into the statements that use it.
CREATE FUNCTION everystep_served_queues(p_queues text[])
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

-- The claim. The served queues that are not paused (nor limited to 0) are
-- taken in a random order, so that over many claims each one goes first as
-- often as any other; each gets a fair share of the batch (a queue with
-- fewer due runs leaves the rest of its share to the queues after it), then
-- the queues that filled their share may take what is left.
--
-- Within a queue: highest priority first, then earliest due. Priorities are
-- walked one by one (one index probe each), and within one the scan is
-- bounded by the due time, so sleeping runs cost a claim nothing.
--
-- A queue with limits is claimed from under its row's lock, taken SKIP
-- LOCKED: while another claimer holds it this one moves on to the other
-- queues, so a queue busy or at its limit never stalls the rest. Under the
-- lock, read committed gives each statement a fresh snapshot: the running
-- count includes every claim committed before. A queue whose limit is
-- visibly reached is skipped before locking (a slot freed meanwhile is
-- taken by the next claim). The clock is read after the lock, so one
-- queue's claim times only move forward. Plan pinning and the asynchronous
-- commit are as in version 3 (see there).
DROP FUNCTION everystep_claim(text, text[], integer);

CREATE FUNCTION everystep_claim(p_claimer text, p_names text[], p_limit integer, p_queues text[])
RETURNS TABLE (id uuid, name text, args json, status text, idempotency_key text, claimed_by text,
               claimed_at timestamptz, result json, error json, created_at timestamptz,
               completed_at timestamptz, claim_epoch bigint, not_before timestamptz,
               queue text, priority integer, concurrency_key text, has_steps boolean)
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_queues everystep_queue[];
    v_full everystep_queue[];
    v_conf everystep_queue;
    v_left integer := p_limit;
    v_others integer;
    v_share integer;
    v_allowed integer;
    v_got integer;
    v_count integer;
    v_priority integer;
    v_now timestamptz;
    v_round integer;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT coalesce(array_agg(ROW(served.q, c.concurrency, c.key_concurrency, c.rate_limit, c.rate_period,
                                  false, NULL)::everystep_queue ORDER BY random()), '{}')
    INTO v_queues
    FROM everystep_served_queues(p_queues) AS served(q)
    LEFT JOIN everystep_queue AS c ON c.name = served.q
    WHERE c.paused IS NOT TRUE AND c.concurrency IS DISTINCT FROM 0;
    FOR v_round IN 1..2 LOOP
        v_others := cardinality(v_queues);
        v_full := '{}';
        FOREACH v_conf IN ARRAY v_queues LOOP
            EXIT WHEN v_left <= 0;
            v_share := CASE WHEN v_round = 1 THEN ceil(v_left::numeric / v_others)::integer ELSE v_left END;
            v_others := v_others - 1;
            v_allowed := v_share;
            IF v_conf.concurrency IS NOT NULL OR v_conf.key_concurrency IS NOT NULL
               OR v_conf.rate_limit IS NOT NULL THEN
                IF v_conf.concurrency IS NOT NULL AND v_conf.concurrency <= (
                        SELECT count(*) FROM everystep_workflow AS w
                        WHERE w.status = 'running' AND w.queue = v_conf.name) THEN
                    CONTINUE;
                END IF;
                SELECT * INTO v_conf FROM everystep_queue AS c WHERE c.name = v_conf.name FOR UPDATE SKIP LOCKED;
                IF NOT FOUND OR v_conf.paused THEN
                    CONTINUE;
                END IF;
                v_now := clock_timestamp();
                IF v_conf.concurrency IS NOT NULL THEN
                    v_allowed := least(v_allowed, v_conf.concurrency - (
                        SELECT count(*) FROM everystep_workflow AS w
                        WHERE w.status = 'running' AND w.queue = v_conf.name));
                END IF;
                IF v_conf.rate_limit IS NOT NULL THEN
                    DELETE FROM everystep_queue_claim AS r
                    WHERE r.queue = v_conf.name
                      AND r.claimed_at < v_now - v_conf.rate_period * interval '1 second';
                    v_allowed := least(v_allowed, v_conf.rate_limit - (
                        SELECT count(*) FROM everystep_queue_claim AS r WHERE r.queue = v_conf.name));
                END IF;
                CONTINUE WHEN v_allowed <= 0;
            ELSE
                v_now := clock_timestamp();
            END IF;
            v_got := 0;
            v_priority := NULL;
            LOOP
                SELECT w.priority INTO v_priority FROM everystep_workflow AS w
                WHERE w.status = 'scheduled' AND w.queue = v_conf.name
                  AND (v_priority IS NULL OR w.priority < v_priority)
                ORDER BY w.priority DESC
                LIMIT 1;
                EXIT WHEN NOT FOUND;
                IF v_conf.key_concurrency IS NULL THEN
                    RETURN QUERY
                    WITH picked AS (
                        SELECT w.id FROM everystep_workflow AS w
                        WHERE w.status = 'scheduled' AND w.queue = v_conf.name AND w.priority = v_priority
                          AND coalesce(w.not_before, w.created_at) <= v_now
                          AND w.name = ANY(p_names)
                        ORDER BY coalesce(w.not_before, w.created_at)
                        LIMIT v_allowed - v_got
                        FOR UPDATE SKIP LOCKED
                    )
                    UPDATE everystep_workflow AS w
                    SET status = 'running', claimed_by = p_claimer, claimed_at = v_now,
                        claim_epoch = w.claim_epoch + 1
                    FROM picked
                    WHERE w.id = picked.id
                    RETURNING w.id, w.name, w.args, w.status, w.idempotency_key, w.claimed_by, w.claimed_at,
                              w.result, w.error, w.created_at, w.completed_at, w.claim_epoch, w.not_before,
                              w.queue, w.priority, w.concurrency_key,
                              EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = w.id);
                ELSE
                    -- Keys already at their limit are skipped by the scan; of
                    -- the rest, each key takes only what its limit leaves. A
                    -- window of candidates wider than the batch keeps one key
                    -- heading the queue from leaving the batch short.
                    RETURN QUERY
                    WITH busy AS (
                        SELECT w.concurrency_key AS key, count(*) AS n FROM everystep_workflow AS w
                        WHERE w.status = 'running' AND w.queue = v_conf.name AND w.concurrency_key IS NOT NULL
                        GROUP BY w.concurrency_key
                    ), candidates AS (
                        SELECT w.id, w.concurrency_key AS key, coalesce(w.not_before, w.created_at) AS due
                        FROM everystep_workflow AS w
                        WHERE w.status = 'scheduled' AND w.queue = v_conf.name AND w.priority = v_priority
                          AND coalesce(w.not_before, w.created_at) <= v_now
                          AND w.name = ANY(p_names)
                          AND (w.concurrency_key IS NULL OR w.concurrency_key NOT IN (
                               SELECT busy.key FROM busy WHERE busy.n >= v_conf.key_concurrency))
                        ORDER BY coalesce(w.not_before, w.created_at)
                        LIMIT (v_allowed - v_got) * 8 + 32
                        FOR UPDATE SKIP LOCKED
                    ), ranked AS (
                        SELECT c.id, c.key, c.due,
                               row_number() OVER (PARTITION BY c.key ORDER BY c.due, c.id) AS rank
                        FROM candidates AS c
                    ), picked AS (
                        SELECT r.id FROM ranked AS r LEFT JOIN busy AS b ON b.key = r.key
                        WHERE r.key IS NULL OR coalesce(b.n, 0) + r.rank <= v_conf.key_concurrency
                        ORDER BY r.due, r.id
                        LIMIT v_allowed - v_got
                    )
                    UPDATE everystep_workflow AS w
                    SET status = 'running', claimed_by = p_claimer, claimed_at = v_now,
                        claim_epoch = w.claim_epoch + 1
                    FROM picked
                    WHERE w.id = picked.id
                    RETURNING w.id, w.name, w.args, w.status, w.idempotency_key, w.claimed_by, w.claimed_at,
                              w.result, w.error, w.created_at, w.completed_at, w.claim_epoch, w.not_before,
                              w.queue, w.priority, w.concurrency_key,
                              EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = w.id);
                END IF;
                GET DIAGNOSTICS v_count = ROW_COUNT;
                v_got := v_got + v_count;
                EXIT WHEN v_got >= v_allowed;
            END LOOP;
            IF v_conf.rate_limit IS NOT NULL AND v_got > 0 THEN
                INSERT INTO everystep_queue_claim (queue, claimed_at)
                SELECT v_conf.name, v_now FROM generate_series(1, v_got);
            END IF;
            v_left := v_left - v_got;
            IF v_got = v_share THEN
                v_full := v_full || v_conf;
            END IF;
        END LOOP;
        EXIT WHEN v_left <= 0 OR cardinality(v_full) = 0 OR cardinality(v_queues) = 1;
        v_queues := v_full;
    END LOOP;
END;
$$;

-- Seconds until the next scheduled run of the served queues (NULL: every
-- queue) that is not due yet becomes due; NULL when there is none. One index
-- probe per queue: runners set their timer by it after a short claim.
DROP FUNCTION everystep_next_due(text[]);

CREATE FUNCTION everystep_next_due(p_queues text[])
RETURNS double precision
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
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
