-- The claim looks for each served workflow's runs by name.
--
-- Version 9's claim walked a queue's scheduled runs of one priority in due
-- order and tested each one's name against the served names. Runs of a
-- workflow the supervisor does not serve (another application's, or one
-- whose code was removed) that were due earlier were read and discarded by
-- every claim: 100,000 of them made a claim 38 ms of server time and cut a
-- supervisor's rate by 91 % (benchmark case 7).
--
-- The claimable index now holds the name after the priority, so one
-- queue's scheduled runs of one priority and one name are a single range
-- in due order. A claim takes, for each served name, its oldest due runs
-- (at most the batch, by one index probe and a LIMIT), and of those the
-- oldest overall: runs nobody serves are never read. Rows are then locked
-- with SKIP LOCKED by primary key; when another claimer holds some of the
-- candidates, the claim looks again past them, so a batch still fills
-- while due runs remain. Only the runs taken are locked, never the other
-- names' candidates.
--
-- Whether a claimed run has steps is now read by a scalar subquery with
-- LIMIT 1, not EXISTS. PostgreSQL plans an EXISTS both as a probe per run
-- and as a hash of the subquery's whole result, and picks one when it
-- plans the statement; the claim's plans are made once per session, and a
-- session that planned while the step table was small kept the hash: each
-- claim then read every step row in the table (3,130 buffers and 3.5 ms of
-- a claim's server time after 3,000 runs, growing with every run). A
-- scalar subquery is always the probe.
--
-- The candidates are locked by primary key, and their status is tested
-- inside coalesce() so that the test does not match the claimable index's
-- predicate: a plan made while the table was empty (the plans are made
-- once per session) would otherwise walk that whole index and filter it
-- by id, every claim reading every scheduled run.
--
-- What a claim pays moves from the runs it skips to the names it serves:
-- one index probe per served name and priority. A supervisor serving more
-- than four names first visits the names that hold runs of the queue and
-- priority (one probe per distinct name, served or not) and probes only
-- those it serves, so a large application pays for the names that have
-- work, not for every workflow it registers.
--
-- Everything else is version 9's: fair shares across queues, the second
-- round, highest priority first, due order within it, the limits, key
-- windows and rate bookkeeping of limited queues, the pinned plans, the
-- asynchronous commit and the returned columns.

DROP INDEX everystep_workflow_claimable;

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (queue, priority DESC, name, (coalesce(not_before, created_at)))
    WHERE status = 'scheduled';

CREATE OR REPLACE FUNCTION everystep_claim_limited(p_claimer text, p_names text[], p_limit integer, p_queues text[])
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
    v_served text[];
    v_candidates uuid[];
    v_skipped uuid[] := '{}';
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
                IF cardinality(p_names) <= 4 THEN
                    v_served := p_names;
                ELSE
                    -- Many served names: visit only the names holding runs of this
                    -- queue and priority (one probe each), and keep the served ones.
                    WITH RECURSIVE present(n) AS (
                        (SELECT w.name FROM everystep_workflow AS w
                         WHERE w.status = 'scheduled' AND w.queue = v_conf.name AND w.priority = v_priority
                         ORDER BY w.name LIMIT 1)
                        UNION ALL
                        SELECT (SELECT w.name FROM everystep_workflow AS w
                                WHERE w.status = 'scheduled' AND w.queue = v_conf.name AND w.priority = v_priority
                                  AND w.name > present.n
                                ORDER BY w.name LIMIT 1)
                        FROM present WHERE present.n IS NOT NULL
                    )
                    SELECT array_agg(present.n) INTO v_served FROM present WHERE present.n = ANY (p_names);
                END IF;
                IF v_conf.key_concurrency IS NULL THEN
                    v_skipped := '{}';
                    LOOP
                        SELECT array_agg(p.id ORDER BY p.due) INTO v_candidates FROM (
                            SELECT c.id, c.due
                            FROM (SELECT DISTINCT u.n FROM unnest(v_served) AS u(n)) AS served
                            CROSS JOIN LATERAL (
                                SELECT w.id, coalesce(w.not_before, w.created_at) AS due FROM everystep_workflow AS w
                                WHERE w.status = 'scheduled' AND w.queue = v_conf.name AND w.priority = v_priority
                                  AND w.name = served.n AND coalesce(w.not_before, w.created_at) <= v_now
                                  AND w.id <> ALL (v_skipped)
                                ORDER BY coalesce(w.not_before, w.created_at)
                                LIMIT v_allowed - v_got
                            ) AS c
                            ORDER BY c.due
                            LIMIT v_allowed - v_got
                        ) AS p;
                        EXIT WHEN v_candidates IS NULL;
                        RETURN QUERY
                        WITH picked AS (
                            SELECT w.id FROM everystep_workflow AS w
                            WHERE w.id = ANY (v_candidates) AND coalesce(w.status = 'scheduled', false)
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
                                  coalesce((SELECT true FROM everystep_step AS s WHERE s.workflow_id = w.id LIMIT 1), false);
                        GET DIAGNOSTICS v_count = ROW_COUNT;
                        v_got := v_got + v_count;
                        EXIT WHEN v_got >= v_allowed OR v_count = cardinality(v_candidates);
                        v_skipped := v_skipped || v_candidates;
                    END LOOP;
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
                    ), window_ids AS (
                        SELECT c.id, c.due
                        FROM (SELECT DISTINCT u.n FROM unnest(v_served) AS u(n)) AS served
                        CROSS JOIN LATERAL (
                            SELECT w.id, coalesce(w.not_before, w.created_at) AS due FROM everystep_workflow AS w
                            WHERE w.status = 'scheduled' AND w.queue = v_conf.name AND w.priority = v_priority
                              AND w.name = served.n AND coalesce(w.not_before, w.created_at) <= v_now
                              AND (w.concurrency_key IS NULL OR w.concurrency_key NOT IN (
                                   SELECT busy.key FROM busy WHERE busy.n >= v_conf.key_concurrency))
                            ORDER BY coalesce(w.not_before, w.created_at)
                            LIMIT (v_allowed - v_got) * 8 + 32
                        ) AS c
                        ORDER BY c.due
                        LIMIT (v_allowed - v_got) * 8 + 32
                    ), candidates AS (
                        SELECT w.id, w.concurrency_key AS key, window_ids.due
                        FROM everystep_workflow AS w JOIN window_ids ON w.id = window_ids.id
                        WHERE coalesce(w.status = 'scheduled', false)
                        FOR UPDATE OF w SKIP LOCKED
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
                              coalesce((SELECT true FROM everystep_step AS s WHERE s.workflow_id = w.id LIMIT 1), false);
                    GET DIAGNOSTICS v_count = ROW_COUNT;
                    v_got := v_got + v_count;
                END IF;
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
    v_served text[];
    v_candidates uuid[];
    v_skipped uuid[];
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
                    IF cardinality(p_names) <= 4 THEN
                        v_served := p_names;
                    ELSE
                        -- Many served names: visit only the names holding runs of this
                        -- queue and priority (one probe each), and keep the served ones.
                        WITH RECURSIVE present(n) AS (
                            (SELECT w.name FROM everystep_workflow AS w
                             WHERE w.status = 'scheduled' AND w.queue = v_name AND w.priority = v_priority
                             ORDER BY w.name LIMIT 1)
                            UNION ALL
                            SELECT (SELECT w.name FROM everystep_workflow AS w
                                    WHERE w.status = 'scheduled' AND w.queue = v_name AND w.priority = v_priority
                                      AND w.name > present.n
                                    ORDER BY w.name LIMIT 1)
                            FROM present WHERE present.n IS NOT NULL
                        )
                        SELECT array_agg(present.n) INTO v_served FROM present WHERE present.n = ANY (p_names);
                    END IF;
                    v_skipped := '{}';
                    LOOP
                        SELECT array_agg(p.id ORDER BY p.due) INTO v_candidates FROM (
                            SELECT c.id, c.due
                            FROM (SELECT DISTINCT u.n FROM unnest(v_served) AS u(n)) AS served
                            CROSS JOIN LATERAL (
                                SELECT w.id, coalesce(w.not_before, w.created_at) AS due FROM everystep_workflow AS w
                                WHERE w.status = 'scheduled' AND w.queue = v_name AND w.priority = v_priority
                                  AND w.name = served.n AND coalesce(w.not_before, w.created_at) <= v_now
                                  AND w.id <> ALL (v_skipped)
                                ORDER BY coalesce(w.not_before, w.created_at)
                                LIMIT v_share - v_got
                            ) AS c
                            ORDER BY c.due
                            LIMIT v_share - v_got
                        ) AS p;
                        EXIT WHEN v_candidates IS NULL;
                        RETURN QUERY
                        WITH picked AS (
                            SELECT w.id FROM everystep_workflow AS w
                            WHERE w.id = ANY (v_candidates) AND coalesce(w.status = 'scheduled', false)
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
                                  coalesce((SELECT true FROM everystep_step AS s WHERE s.workflow_id = w.id LIMIT 1), false);
                        GET DIAGNOSTICS v_count = ROW_COUNT;
                        v_got := v_got + v_count;
                        -- Short only if another claimer held some candidates:
                        -- look again past them.
                        EXIT WHEN v_got >= v_share OR v_count = cardinality(v_candidates);
                        v_skipped := v_skipped || v_candidates;
                    END LOOP;
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
