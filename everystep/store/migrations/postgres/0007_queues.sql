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

-- Claims walk one queue at a time, one priority at a time, in due order.
DROP INDEX everystep_workflow_claimable;

CREATE INDEX everystep_workflow_claimable
    ON everystep_workflow (queue, priority DESC, (coalesce(not_before, created_at))) WHERE status = 'scheduled';

-- Which queues hold scheduled runs, and when each one's next run is due.
CREATE INDEX everystep_workflow_queue_due
    ON everystep_workflow (queue, (coalesce(not_before, created_at))) WHERE status = 'scheduled';

-- A limited queue's running runs, per concurrency key.
CREATE INDEX everystep_workflow_queue_running
    ON everystep_workflow (queue, concurrency_key) WHERE status = 'running';

-- The queues to claim from: those given (NULL: every queue holding
-- scheduled runs, found by one index probe per queue), minus the paused
-- ones, in a random order so that over many claims every queue is served
-- first as often as any other.
CREATE FUNCTION everystep_claim_queues(p_queues text[])
RETURNS text[]
LANGUAGE plpgsql
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_found text[];
BEGIN
    IF p_queues IS NULL THEN
        WITH RECURSIVE found AS (
            (SELECT w.queue FROM everystep_workflow AS w WHERE w.status = 'scheduled'
             ORDER BY w.queue LIMIT 1)
            UNION ALL
            SELECT (SELECT w.queue FROM everystep_workflow AS w
                    WHERE w.status = 'scheduled' AND w.queue > found.queue ORDER BY w.queue LIMIT 1)
            FROM found WHERE found.queue IS NOT NULL
        )
        SELECT array_agg(found.queue) INTO v_found FROM found WHERE found.queue IS NOT NULL;
    ELSE
        v_found := p_queues;
    END IF;
    RETURN ARRAY(
        SELECT q FROM unnest(v_found) AS q
        WHERE NOT EXISTS (SELECT 1 FROM everystep_queue AS c WHERE c.name = q AND c.paused)
        ORDER BY random()
    );
END;
$$;

-- Claim up to p_max due runs of one queue, highest priority first, then
-- earliest due. A queue with limits is claimed from under its row's lock,
-- taken SKIP LOCKED: while another claimer holds it this one moves on to
-- other queues, so a queue at its limit or busy never stalls the rest.
-- Under the lock, read committed gives each statement a fresh snapshot: the
-- running count includes every claim committed before. The clock is read
-- after the lock, so claim times of a queue only move forward. Priorities
-- are walked one by one (one index probe each), and within one the scan is
-- bounded by the due time, so sleeping runs cost a claim nothing.
CREATE FUNCTION everystep_claim_queue(p_claimer text, p_names text[], p_queue text, p_max integer)
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
    v_conf everystep_queue%ROWTYPE;
    v_now timestamptz;
    v_allowed integer := p_max;
    v_priority integer;
    v_got integer := 0;
    v_count integer;
BEGIN
    SELECT * INTO v_conf FROM everystep_queue AS c WHERE c.name = p_queue;
    IF FOUND AND (v_conf.concurrency IS NOT NULL OR v_conf.key_concurrency IS NOT NULL
                  OR v_conf.rate_limit IS NOT NULL) THEN
        SELECT * INTO v_conf FROM everystep_queue AS c WHERE c.name = p_queue FOR UPDATE SKIP LOCKED;
        IF NOT FOUND OR v_conf.paused THEN
            RETURN;
        END IF;
        v_now := clock_timestamp();
        IF v_conf.concurrency IS NOT NULL THEN
            v_allowed := least(v_allowed, v_conf.concurrency - (
                SELECT count(*) FROM everystep_workflow AS w WHERE w.status = 'running' AND w.queue = p_queue));
        END IF;
        IF v_conf.rate_limit IS NOT NULL THEN
            DELETE FROM everystep_queue_claim AS r
            WHERE r.queue = p_queue AND r.claimed_at < v_now - v_conf.rate_period * interval '1 second';
            v_allowed := least(v_allowed, v_conf.rate_limit - (
                SELECT count(*) FROM everystep_queue_claim AS r WHERE r.queue = p_queue));
        END IF;
        IF v_allowed <= 0 THEN
            RETURN;
        END IF;
    ELSIF FOUND AND v_conf.paused THEN
        RETURN;
    ELSE
        v_conf := NULL;
        v_now := clock_timestamp();
    END IF;
    LOOP
        SELECT w.priority INTO v_priority FROM everystep_workflow AS w
        WHERE w.status = 'scheduled' AND w.queue = p_queue AND (v_priority IS NULL OR w.priority < v_priority)
        ORDER BY w.priority DESC
        LIMIT 1;
        EXIT WHEN NOT FOUND;
        IF v_conf.key_concurrency IS NULL THEN
            RETURN QUERY
            WITH picked AS (
                SELECT w.id FROM everystep_workflow AS w
                WHERE w.status = 'scheduled' AND w.queue = p_queue AND w.priority = v_priority
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
            -- Keys already at their limit are skipped in the scan; of the
            -- rest, each key takes only what its limit leaves. A window of
            -- candidates wider than the batch keeps one busy key at the head
            -- of the queue from leaving the batch short.
            RETURN QUERY
            WITH busy AS (
                SELECT w.concurrency_key AS key, count(*) AS n FROM everystep_workflow AS w
                WHERE w.status = 'running' AND w.queue = p_queue AND w.concurrency_key IS NOT NULL
                GROUP BY w.concurrency_key
            ), candidates AS (
                SELECT w.id, w.concurrency_key AS key, coalesce(w.not_before, w.created_at) AS due
                FROM everystep_workflow AS w
                WHERE w.status = 'scheduled' AND w.queue = p_queue AND w.priority = v_priority
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
        SELECT p_queue, v_now FROM generate_series(1, v_got);
    END IF;
END;
$$;

-- The claim: every served queue gets a fair share of the batch first (a
-- queue with fewer due runs leaves its share to those after it), then the
-- queues that filled their share may take what is left. Plan pinning and
-- the asynchronous commit are as in version 3 (see there).
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
DECLARE
    v_queues text[] := everystep_claim_queues(p_queues);
    v_full text[];
    v_queue text;
    v_left integer := p_limit;
    v_others integer;
    v_share integer;
    v_count integer;
    v_round integer;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    FOR v_round IN 1..2 LOOP
        v_others := coalesce(cardinality(v_queues), 0);
        v_full := '{}';
        FOREACH v_queue IN ARRAY coalesce(v_queues, '{}') LOOP
            EXIT WHEN v_left <= 0;
            v_share := CASE WHEN v_round = 1 THEN ceil(v_left::numeric / v_others)::integer ELSE v_left END;
            RETURN QUERY SELECT * FROM everystep_claim_queue(p_claimer, p_names, v_queue, v_share);
            GET DIAGNOSTICS v_count = ROW_COUNT;
            v_left := v_left - v_count;
            v_others := v_others - 1;
            IF v_count = v_share THEN
                v_full := v_full || v_queue;
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
    v_queue text;
    v_next timestamptz;
    v_best timestamptz;
BEGIN
    FOREACH v_queue IN ARRAY coalesce(everystep_claim_queues(p_queues), '{}') LOOP
        SELECT coalesce(w.not_before, w.created_at) INTO v_next FROM everystep_workflow AS w
        WHERE w.status = 'scheduled' AND w.queue = v_queue AND coalesce(w.not_before, w.created_at) > v_now
        ORDER BY coalesce(w.not_before, w.created_at)
        LIMIT 1;
        IF FOUND AND (v_best IS NULL OR v_next < v_best) THEN
            v_best := v_next;
        END IF;
    END LOOP;
    RETURN extract(epoch FROM v_best - v_now)::float8;
END;
$$;
