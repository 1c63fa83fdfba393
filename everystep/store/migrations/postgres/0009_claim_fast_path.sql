-- The claim, with a fast path for queues without limits.
--
-- The claim is on every run's critical path: a supervisor claims for each
-- child that just freed up, so what a claim costs the server shows in every
-- run's throughput. Version 7's claim cost about twice the claim's UPDATE,
-- mostly in two places:
--
-- * Its claim statement was planned anew on every call. Its LIMIT is a
--   variable, so the cached generic plan is costed for a tenth of the
--   queue, always dearer than a plan made for the actual LIMIT, and the
--   plan cache kept choosing a fresh plan, which cost more than running it.
-- * It read every served queue's settings into an array of queue rows and
--   walked it, locks and rate bookkeeping included, even with no limits.
--
-- So one statement lists the served queues in a random order, as a text
-- array, and says whether any of them has a limit or a pause (a single
-- named queue skips the discovery: one primary key probe). When none has,
-- this function claims on its own: per queue while the batch is not full,
-- one priority probe and one claim statement, on generic plans
-- (plan_cache_mode) that are the plans a fresh one would be: the claim
-- index walked in due order for the LIMIT, the few rows picked joined by
-- primary key (hash and merge joins off, so a plan costed for a tenth of
-- the queue cannot hash the whole table). What the fast path keeps from
-- version 7: fair shares across queues and the second round, highest
-- priority first, due order, SKIP LOCKED, the pinned scans, the
-- asynchronous commit, the returned columns.
--
-- Otherwise the claim is version 7's function, unchanged but for its name
-- (everystep_claim_limited) and one bound, called with the queues already
-- listed; it keeps its own planner settings, so its plans are version 7's.
-- Whether a queue is limited is read by each claim, so a limit or a pause
-- set while runs wait holds from the next claim on, as before.
--
-- The bound: the priority walk's probe read "v_priority IS NULL OR
-- w.priority < v_priority", which a generic plan (the plan cache's choice
-- for it after five calls) cannot use as an index bound: each probe past
-- the first stepped over every scheduled run of the priorities above,
-- sleeping ones included. It is now "w.priority < coalesce(v_priority,
-- one above the largest integer)", a bound in every plan, so sleeping runs
-- of a higher priority again cost a claim nothing, on both paths.
CREATE FUNCTION everystep_claim_limited(p_claimer text, p_names text[], p_limit integer, p_queues text[])
RETURNS TABLE (id uuid, name text, args json, status text, idempotency_key text, claimed_by text,
               claimed_at timestamptz, result json, error json, created_at timestamptz,
               completed_at timestamptz, claim_epoch bigint, not_before timestamptz,
               queue text, priority integer, concurrency_key text, has_steps boolean)
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_hashjoin = on
SET enable_mergejoin = on
SET plan_cache_mode = auto
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
                  AND w.priority < coalesce(v_priority::bigint, 2147483648)
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

CREATE OR REPLACE FUNCTION everystep_claim(p_claimer text, p_names text[], p_limit integer, p_queues text[])
RETURNS TABLE (id uuid, name text, args json, status text, idempotency_key text, claimed_by text,
               claimed_at timestamptz, result json, error json, created_at timestamptz,
               completed_at timestamptz, claim_epoch bigint, not_before timestamptz,
               queue text, priority integer, concurrency_key text, has_steps boolean)
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_names text[];
    v_full_names text[];
    v_name text;
    v_limited boolean;
    v_left integer := p_limit;
    v_others integer;
    v_share integer;
    v_got integer;
    v_count integer;
    v_priority integer;
    v_now timestamptz;
    v_round integer;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    IF cardinality(p_queues) = 1 THEN
        v_names := p_queues;
        v_limited := EXISTS (
            SELECT 1 FROM everystep_queue AS c
            WHERE c.name = p_queues[1]
              AND (c.paused OR c.concurrency IS NOT NULL OR c.key_concurrency IS NOT NULL
                   OR c.rate_limit IS NOT NULL));
    ELSE
        SELECT array_agg(served.q ORDER BY random()),
               coalesce(bool_or(c.paused OR c.concurrency IS NOT NULL OR c.key_concurrency IS NOT NULL
                                OR c.rate_limit IS NOT NULL), false)
        INTO v_names, v_limited
        FROM everystep_served_queues(p_queues) AS served(q)
        LEFT JOIN everystep_queue AS c ON c.name = served.q;
    END IF;
    IF v_names IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;

    IF NOT v_limited THEN
        -- The fast path: no served queue has a limit or a pause.
        FOR v_round IN 1..2 LOOP
            v_others := cardinality(v_names);
            v_full_names := '{}';
            FOREACH v_name IN ARRAY v_names LOOP
                EXIT WHEN v_left <= 0;
                v_share := CASE WHEN v_round = 1 THEN ceil(v_left::numeric / v_others)::integer ELSE v_left END;
                v_others := v_others - 1;
                v_now := clock_timestamp();
                v_got := 0;
                v_priority := NULL;
                LOOP
                    SELECT w.priority INTO v_priority FROM everystep_workflow AS w
                    WHERE w.status = 'scheduled' AND w.queue = v_name
                      AND w.priority < coalesce(v_priority::bigint, 2147483648)
                    ORDER BY w.priority DESC
                    LIMIT 1;
                    EXIT WHEN NOT FOUND;
                    RETURN QUERY
                    WITH picked AS (
                        SELECT w.id FROM everystep_workflow AS w
                        WHERE w.status = 'scheduled' AND w.queue = v_name AND w.priority = v_priority
                          AND coalesce(w.not_before, w.created_at) <= v_now
                          AND w.name = ANY(p_names)
                        ORDER BY coalesce(w.not_before, w.created_at)
                        LIMIT v_share - v_got
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
                    GET DIAGNOSTICS v_count = ROW_COUNT;
                    v_got := v_got + v_count;
                    EXIT WHEN v_got >= v_share;
                END LOOP;
                v_left := v_left - v_got;
                IF v_got = v_share THEN
                    v_full_names := v_full_names || v_name;
                END IF;
            END LOOP;
            EXIT WHEN v_left <= 0 OR cardinality(v_full_names) = 0 OR cardinality(v_names) = 1;
            v_names := v_full_names;
        END LOOP;
        RETURN;
    END IF;

    RETURN QUERY SELECT * FROM everystep_claim_limited(p_claimer, p_names, p_limit, v_names);
END;
$$;
