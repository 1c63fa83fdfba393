-- The claim: everystep_claim(claimer, names, limit, queues) and the path it
-- hands limited queues to, everystep_claim_limited. What it must do is the
-- contract in store/queue_claim.py (order, priority, fairness, limits,
-- pause, served names, locked rows, batch); this file is how PostgreSQL does
-- it, and the one place to change it (the migrator re-applies it when its
-- text changes: store/functions/__init__.py).
--
-- Fairness. The served queues (everystep_served_queues) are taken in a
-- random order, so over many claims each one goes first as often as any
-- other; each gets a fair share of the batch (a queue with fewer due runs
-- leaves the rest of its share to the queues after it), then the queues
-- that filled their share may take what is left.
--
-- Within a queue: highest priority first, then earliest due. Priorities are
-- walked one by one, one index probe each, bounded by "w.priority <
-- coalesce(v_priority, one above the largest integer)": a bound in every
-- plan, generic ones included, so sleeping runs of a higher priority cost a
-- claim nothing. The time is read once into a variable: a volatile
-- clock_timestamp() in a WHERE clause could not bound the index scan.
--
-- Served names. The claimable index holds (queue, priority, name, due), so
-- one queue's scheduled runs of one priority and one name are a single
-- range in due order. For each served name the claim reads its oldest due
-- runs (at most what is still wanted, by one probe and a LIMIT), and of
-- those takes the oldest overall: runs nobody serves (another application's,
-- or a workflow whose code is gone) are never read. A runner serving more
-- than four names first visits the names holding runs of the queue and
-- priority (one probe per distinct name) and probes only those it serves.
--
-- Locked rows. Candidates are locked by primary key, SKIP LOCKED; when
-- another claimer holds some of them, the claim looks again past them, so a
-- batch still fills while due runs remain. Their status is tested inside
-- coalesce() so that the test does not match the claimable index's
-- predicate: a plan made while the table was empty would otherwise walk
-- that whole index and filter it by id.
--
-- Limits (everystep_claim_limited). A queue with limits is claimed from
-- under its everystep_queue row's lock, taken SKIP LOCKED: while another
-- claimer holds it this one moves on, so a queue busy or at its limit never
-- stalls the rest. Under the lock, read committed gives each statement a
-- fresh snapshot: the running count and the rate window include every claim
-- committed before. A queue visibly at its concurrency is skipped before
-- locking (a slot freed meanwhile is taken by the next claim). The clock is
-- read after the lock, so one queue's claim times only move forward. Keys
-- already at their limit are skipped by the scan; of the rest, each key
-- takes only what its limit leaves, from a window of candidates wider than
-- the batch, so one key heading the queue cannot leave the batch short.
-- Whether a queue is limited or paused is read by each claim, so a limit or
-- a pause set while runs wait holds from the next claim on.
--
-- The fast path (everystep_claim itself). When no served queue has a limit
-- or a pause (a single named queue: one primary key probe says so), the
-- claim runs without the queue rows, their locks or the rate bookkeeping,
-- on generic plans (plan_cache_mode) that are the plans a fresh one would
-- be: the claim index walked in due order for the LIMIT, the few rows
-- picked joined by primary key (hash and merge joins off, so a plan costed
-- for a tenth of the queue cannot hash the whole table). A plan made anew
-- on every call cost more than running it.
--
-- Plans. Both functions run on generic plans, made once per session, with
-- hash and merge joins off. A limited queue's claim once kept the default
-- (plan_cache_mode auto): PostgreSQL then judged the generic plans of its
-- statements dearer than custom ones and planned them anew on every call,
-- which cost a claim serving a limited or paused queue twice what the fast
-- path costs (case 11: 1.5 ms against 0.7 ms per claim).
--
-- A generic plan is made once and kept for the session, so it must be
-- right for any backlog, whatever the statistics said when it was made.
-- A runner that starts on a new database (no statistics, a few runs) would
-- otherwise plan each probe through the status index, which serves
-- "status = 'scheduled'" too, and sort what it reads: that reads every
-- scheduled run on every claim (100,000 index entries per claim of a
-- 20,000-run backlog, in the test that pins this), until an ANALYZE happens
-- to re-plan it. enable_sort = off leaves the claim index, whose order is
-- the one each probe asks for, as the only plan without a sort; jit = off
-- because the cost a disabled sort adds would otherwise reach the JIT
-- thresholds and compile every call.
--
-- The SET clauses also rule out bitmap and sequential scans: with
-- statistics from a moment when few runs were scheduled, the planner may
-- otherwise read every scheduled run and sort them, a collapse for a
-- backlog of a hundred thousand, exactly when claims must be fast. Whether
-- a claimed run has steps is read by a scalar subquery with LIMIT 1, always
-- a probe (an EXISTS may be planned as a hash of the whole step table, and
-- a session keeps the plan it made).
--
-- Commit. synchronous_commit is off for the claim's transaction only: a
-- claim lost in a crash returns the run to the queue, and the claimer's
-- first step write is then refused, because every write checks the claim;
-- the flush of that first step record makes the claim durable anyway. The
-- last column says whether the run has recorded steps; when it has none the
-- runner does not read them.
--
-- Changing the result type: CREATE OR REPLACE cannot, so the numbered
-- migration of that release drops the function first (DROP FUNCTION IF
-- EXISTS); the migrator re-applies every file after a numbered migration.

CREATE OR REPLACE FUNCTION everystep_claim_limited(p_claimer text, p_names text[], p_limit integer, p_queues text[],
                                                   p_versions text[])
RETURNS TABLE (id uuid, name text, args json, status text, idempotency_key text, claimed_by text,
               claimed_at timestamptz, result json, error json, created_at timestamptz,
               completed_at timestamptz, claim_epoch bigint, not_before timestamptz,
               queue text, priority integer, concurrency_key text, has_steps boolean)
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
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
                                  AND (p_versions IS NULL OR w.app_version IS NULL OR w.app_version = ANY (p_versions))
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
                            claim_epoch = w.claim_epoch + 1,
                            first_claimed_at = coalesce(w.first_claimed_at, v_now)
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
                              AND (p_versions IS NULL OR w.app_version IS NULL OR w.app_version = ANY (p_versions))
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
                        claim_epoch = w.claim_epoch + 1,
                        first_claimed_at = coalesce(w.first_claimed_at, v_now)
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

CREATE OR REPLACE FUNCTION everystep_claim(p_claimer text, p_names text[], p_limit integer, p_queues text[],
                                           p_versions text[])
RETURNS TABLE (id uuid, name text, args json, status text, idempotency_key text, claimed_by text,
               claimed_at timestamptz, result json, error json, created_at timestamptz,
               completed_at timestamptz, claim_epoch bigint, not_before timestamptz,
               queue text, priority integer, concurrency_key text, has_steps boolean)
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
SET jit = off
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
                                  AND (p_versions IS NULL OR w.app_version IS NULL OR w.app_version = ANY (p_versions))
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
                            claim_epoch = w.claim_epoch + 1,
                            first_claimed_at = coalesce(w.first_claimed_at, v_now)
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

    RETURN QUERY SELECT * FROM everystep_claim_limited(p_claimer, p_names, p_limit, v_names, p_versions);
END;
$$;
