-- The claim (store/queue_claim.py states its contract), as procedures: the
-- whole claim is one round trip, CALL everystep_claim(...), where the
-- steps run in Python took one per probe, per queue and per priority. They
-- port queue_claim.QueueClaim line by line (served queues in a random
-- order, fair shares then what is left, priorities, served names, key
-- limits, the locked-retry), each step named as its Python method.
--
-- everystep_claim runs its own transaction (a procedure's statements would
-- each commit on their own in autocommit mode) at the session's READ
-- COMMITTED: a limited queue is claimed from under its row's lock (FOR
-- UPDATE SKIP LOCKED, held to the commit), so the counts read after it
-- include every claim committed before; runs are locked FOR UPDATE SKIP
-- LOCKED, so claimers never wait on each other. Every other read of a
-- table is a plain SELECT (... INTO a variable) or the SELECT of an INSERT
-- ... SELECT, which read without locks at READ COMMITTED: in MariaDB a
-- subquery in SET, IF or an UPDATE takes shared locks, and would wait on
-- a run an operator or another claimer holds. Lists arrive as JSON
-- arrays. The session's temporary tables (es_claim_*) hold the steps'
-- lists: created once per session (a session variable says so), cleared
-- at each call; MEMORY tables, save the candidates' (InnoDB: a window of a
-- key-limited queue is up to eight times the batch per served name).
--
-- Each body lies between "-- $$" marks: migrations.split_statements keeps
-- it one statement. SQL SECURITY INVOKER: a procedure runs with the
-- privileges of the runner calling it, never those of whoever migrated.

CREATE OR REPLACE PROCEDURE everystep_claim_pick(
    IN p_queue VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, IN p_priority INT, IN p_want INT,
    IN p_per_key INT, IN p_serve_all TINYINT, IN p_claimer VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT p_got INT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN -- $$
    -- QueueClaim._picking, due, names_at and _pick: up to p_want of the
    -- oldest due runs of the served names at one priority of a queue, runs
    -- of keys at p_per_key stepped over; runs another claimer locked are
    -- skipped and looked past.
    DECLARE v_left INT;
    DECLARE v_window INT;
    DECLARE v_picked INT;
    DECLARE v_locked INT;
    DECLARE v_name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_next VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;  -- a SELECT ... INTO that found nothing
    SET p_got = 0;
    DELETE FROM es_claim_skipped;
    -- names_at: every served name when they are few, else the names holding
    -- runs here (one probe each) that are served.
    DELETE FROM es_claim_here;
    IF (SELECT count(*) FROM es_claim_names) <= 4 THEN
        INSERT INTO es_claim_here (name) SELECT name FROM es_claim_names;
    ELSE
        SET v_next = '';
        probe: LOOP
            SET v_name = v_next, v_next = NULL;
            SELECT name INTO v_next FROM everystep_workflow FORCE INDEX (everystep_workflow_claimable)
            WHERE status = 'scheduled' AND queue = p_queue AND priority = p_priority AND name > v_name
            ORDER BY name LIMIT 1;
            IF v_next IS NULL THEN
                LEAVE probe;
            END IF;
            INSERT INTO es_claim_here (name) SELECT name FROM es_claim_names WHERE name = v_next;
        END LOOP;
    END IF;
    picking: WHILE p_got < p_want DO
        SET v_left = p_want - p_got;
        DELETE FROM es_claim_busy;
        IF p_per_key IS NOT NULL THEN
            INSERT INTO es_claim_busy (ckey, n)
            SELECT concurrency_key, count(*) FROM everystep_workflow FORCE INDEX (everystep_workflow_queue_running)
            WHERE status = 'running' AND queue = p_queue AND concurrency_key IS NOT NULL
            GROUP BY concurrency_key;
        END IF;
        SET v_window = IF(p_per_key IS NULL, v_left, v_left * 8 + 32);
        -- due: each served name's oldest due runs, one index range each.
        DELETE FROM es_claim_due;
        SET v_name = (SELECT min(name) FROM es_claim_here);
        WHILE v_name IS NOT NULL DO
            INSERT INTO es_claim_due (id, ckey, due)
            SELECT id, concurrency_key, due_at FROM everystep_workflow FORCE INDEX (everystep_workflow_claimable)
            WHERE status = 'scheduled' AND queue = p_queue AND priority = p_priority AND name = v_name
              AND due_at <= UTC_TIMESTAMP(6)
              AND (p_serve_all = 1 OR app_version IS NULL OR app_version IN (SELECT version FROM es_claim_versions))
              AND (concurrency_key IS NULL
                   OR concurrency_key NOT IN (SELECT ckey FROM es_claim_busy WHERE n >= p_per_key))
              AND id NOT IN (SELECT id FROM es_claim_skipped)
            ORDER BY due_at
            LIMIT v_window;
            SET v_name = (SELECT min(name) FROM es_claim_here WHERE name > v_name);
        END WHILE;
        -- _pick: the first v_left of the window in due order whose key,
        -- counting its running runs and those picked before, stays within
        -- p_per_key.
        DELETE FROM es_claim_picked;
        INSERT INTO es_claim_picked (id)
        SELECT ranked.id FROM (
            SELECT window_.id, window_.ckey, window_.due,
                   ROW_NUMBER() OVER (PARTITION BY window_.ckey ORDER BY window_.due, window_.id) AS nth
            FROM (SELECT id, ckey, due FROM es_claim_due ORDER BY due, id LIMIT v_window) AS window_
        ) AS ranked
        LEFT JOIN es_claim_busy AS busy ON busy.ckey = ranked.ckey
        WHERE p_per_key IS NULL OR ranked.ckey IS NULL OR coalesce(busy.n, 0) + ranked.nth <= p_per_key
        ORDER BY ranked.due, ranked.id
        LIMIT v_left;
        SET v_picked = ROW_COUNT();
        IF v_picked <= 0 THEN
            LEAVE picking;
        END IF;
        -- claim_ids: those still scheduled and not locked by anyone else.
        DELETE FROM es_claim_locked;
        INSERT INTO es_claim_locked (id)
        SELECT w.id FROM es_claim_picked AS p STRAIGHT_JOIN everystep_workflow AS w ON w.id = p.id
        WHERE w.status = 'scheduled'
        FOR UPDATE SKIP LOCKED;
        SET v_locked = ROW_COUNT();
        IF v_locked > 0 THEN
            -- Each by its key: an UPDATE joined to the list may scan the table
            -- instead, and wait on the rows others hold.
            SET v_id = (SELECT min(id) FROM es_claim_locked);
            WHILE v_id IS NOT NULL DO
                UPDATE everystep_workflow
                SET status = 'running', claimed_by = p_claimer, claimed_at = UTC_TIMESTAMP(6),
                    claim_epoch = claim_epoch + 1, first_claimed_at = coalesce(first_claimed_at, UTC_TIMESTAMP(6))
                WHERE id = v_id;
                SET v_id = (SELECT min(id) FROM es_claim_locked WHERE id > v_id);
            END WHILE;
            INSERT INTO es_claim_batch (id) SELECT id FROM es_claim_locked;
            SET p_got = p_got + v_locked;
        END IF;
        IF v_locked = v_picked THEN
            LEAVE picking;  -- nothing held by another claimer: this window is done
        END IF;
        INSERT INTO es_claim_skipped (id)
        SELECT p.id FROM es_claim_picked AS p LEFT JOIN es_claim_locked AS l ON l.id = p.id WHERE l.id IS NULL;
    END WHILE;
END -- $$
;

CREATE OR REPLACE PROCEDURE everystep_claim_queue(
    IN p_queue VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, IN p_most INT, IN p_serve_all TINYINT,
    IN p_claimer VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, OUT p_got INT)
MODIFIES SQL DATA SQL SECURITY INVOKER
body: BEGIN -- $$
    -- QueueClaim.from_queue: up to p_most runs of one queue, highest
    -- priority first; a limited queue under its lock and within its limits
    -- (lock, allowed), its claims logged for the rate window.
    DECLARE v_concurrency INT;
    DECLARE v_per_key INT;
    DECLARE v_rate INT;
    DECLARE v_period DOUBLE;
    DECLARE v_paused TINYINT DEFAULT 0;
    DECLARE v_found TINYINT DEFAULT 0;
    DECLARE v_most INT DEFAULT p_most;
    DECLARE v_below BIGINT DEFAULT 1099511627776;
    DECLARE v_priority BIGINT;
    DECLARE v_taken INT;
    DECLARE v_running INT;
    DECLARE v_used INT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;  -- a SELECT ... INTO that found nothing
    SET p_got = 0;
    DELETE FROM es_claim_batch;
    SELECT concurrency, key_concurrency, rate_limit, rate_period
    INTO v_concurrency, v_per_key, v_rate, v_period
    FROM es_claim_served WHERE queue = p_queue;
    IF v_concurrency IS NOT NULL OR v_per_key IS NOT NULL OR v_rate IS NOT NULL THEN
        -- lock: a queue visibly at its concurrency is skipped before locking.
        SELECT count(*) INTO v_running FROM everystep_workflow FORCE INDEX (everystep_workflow_queue_running)
        WHERE status = 'running' AND queue = p_queue;
        IF v_concurrency IS NOT NULL AND v_concurrency <= v_running THEN
            LEAVE body;
        END IF;
        BEGIN
            DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
            SELECT 1, concurrency, key_concurrency, rate_limit, rate_period, paused
            INTO v_found, v_concurrency, v_per_key, v_rate, v_period, v_paused
            FROM everystep_queue WHERE name = p_queue
            FOR UPDATE SKIP LOCKED;
        END;
        IF NOT v_found OR v_paused OR v_concurrency = 0 THEN
            LEAVE body;  -- another claimer holds it, or paused meanwhile
        END IF;
        -- allowed
        IF v_concurrency IS NOT NULL THEN
            SELECT count(*) INTO v_running FROM everystep_workflow FORCE INDEX (everystep_workflow_queue_running)
            WHERE status = 'running' AND queue = p_queue;
            SET v_most = LEAST(v_most, v_concurrency - v_running);
        END IF;
        IF v_rate IS NOT NULL AND v_period IS NOT NULL THEN
            DELETE FROM everystep_queue_claim
            WHERE queue = p_queue
              AND claimed_at < UTC_TIMESTAMP(6) - INTERVAL ROUND(v_period * 1000000) MICROSECOND;
            SELECT count(*) INTO v_used FROM everystep_queue_claim WHERE queue = p_queue;
            SET v_most = LEAST(v_most, v_rate - v_used);
        END IF;
    END IF;
    priorities: WHILE p_got < v_most DO
        SET v_priority = NULL;
        SELECT priority INTO v_priority FROM everystep_workflow FORCE INDEX (everystep_workflow_claimable)
        WHERE status = 'scheduled' AND queue = p_queue AND priority < v_below
        ORDER BY priority DESC LIMIT 1;
        IF v_priority IS NULL THEN
            LEAVE priorities;
        END IF;
        SET v_below = v_priority;
        CALL everystep_claim_pick(p_queue, v_priority, v_most - p_got, v_per_key, p_serve_all, p_claimer, v_taken);
        SET p_got = p_got + v_taken;
    END WHILE;
    IF p_got > 0 AND v_rate IS NOT NULL THEN
        -- One row per run just claimed, stamped with the claim time it carries.
        INSERT INTO everystep_queue_claim (queue, claimed_at)
        SELECT p_queue, w.claimed_at FROM es_claim_batch AS b STRAIGHT_JOIN everystep_workflow AS w ON w.id = b.id;
    END IF;
END -- $$
;

CREATE OR REPLACE PROCEDURE everystep_claim(
    IN p_claimer VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, IN p_limit INT, IN p_names LONGTEXT,
    IN p_queues LONGTEXT, IN p_serve_all TINYINT, IN p_versions LONGTEXT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN -- $$
    -- QueueClaim.run, in one transaction; the result is the claimed runs
    -- (as the claim statements of mariadb.sql return them).
    DECLARE v_left INT DEFAULT p_limit;
    DECLARE v_count INT;
    DECLARE v_index INT;
    DECLARE v_share INT;
    DECLARE v_got INT;
    DECLARE v_first TINYINT DEFAULT 1;
    DECLARE v_order DOUBLE;
    DECLARE v_queue VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_found VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;  -- a SELECT ... INTO that found nothing
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    IF @everystep_claim_tables IS NULL THEN  -- once per session
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_names (
            name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_versions (
            version VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_found (
            queue VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_served (
            queue VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
            concurrency INT, key_concurrency INT, rate_limit INT, rate_period DOUBLE,
            rnd DOUBLE NOT NULL, in_round TINYINT NOT NULL, full_share TINYINT NOT NULL) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_here (
            name VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_busy (
            ckey VARCHAR(300) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY, n INT NOT NULL)
            ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_due (
            id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
            ckey VARCHAR(300) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, due DATETIME(6) NOT NULL)
            ENGINE = InnoDB;  -- a key-limited window may outgrow a MEMORY table
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_picked (
            id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_locked (
            id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_skipped (
            id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_batch (
            id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        CREATE TEMPORARY TABLE IF NOT EXISTS es_claim_claimed (
            id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY) ENGINE = MEMORY;
        SET @everystep_claim_tables = 1;
    END IF;
    DELETE FROM es_claim_names;
    DELETE FROM es_claim_versions;
    DELETE FROM es_claim_found;
    DELETE FROM es_claim_served;
    DELETE FROM es_claim_claimed;
    INSERT IGNORE INTO es_claim_names (name)
    SELECT name FROM JSON_TABLE(p_names, '$[*]' COLUMNS (name VARCHAR(255) PATH '$')) AS j WHERE name <> '';
    INSERT IGNORE INTO es_claim_versions (version)
    SELECT version FROM JSON_TABLE(coalesce(p_versions, '[]'), '$[*]' COLUMNS (version VARCHAR(255) PATH '$')) AS j;

    START TRANSACTION;
    -- served: the queues given, or every queue holding scheduled runs (one
    -- probe of the claim index each), with their settings; paused ones and
    -- those limited to 0 left out; a random order.
    IF p_queues IS NULL THEN
        SET v_queue = '';
        probe: LOOP
            SET v_found = NULL;
            SELECT queue INTO v_found FROM everystep_workflow FORCE INDEX (everystep_workflow_claimable)
            WHERE status = 'scheduled' AND queue > v_queue ORDER BY queue LIMIT 1;
            IF v_found IS NULL THEN
                LEAVE probe;
            END IF;
            SET v_queue = v_found;
            INSERT INTO es_claim_found (queue) VALUES (v_queue);
        END LOOP;
    ELSE
        INSERT IGNORE INTO es_claim_found (queue)
        SELECT queue FROM JSON_TABLE(p_queues, '$[*]' COLUMNS (queue VARCHAR(100) PATH '$')) AS j WHERE queue <> '';
    END IF;
    INSERT INTO es_claim_served
        (queue, concurrency, key_concurrency, rate_limit, rate_period, rnd, in_round, full_share)
    SELECT f.queue, q.concurrency, q.key_concurrency, q.rate_limit, q.rate_period, RAND(), 1, 0
    FROM es_claim_found AS f LEFT JOIN everystep_queue AS q ON q.name = f.queue
    WHERE NOT coalesce(q.paused, FALSE) AND coalesce(q.concurrency, 1) <> 0;
    -- run: a fair share for each queue, then what is left for those that
    -- filled their share.
    rounds: LOOP
        SET v_count = (SELECT count(*) FROM es_claim_served WHERE in_round = 1);
        SET v_index = 0;
        UPDATE es_claim_served SET full_share = 0;
        SET v_order = (SELECT min(rnd) FROM es_claim_served WHERE in_round = 1);
        queues: WHILE v_order IS NOT NULL DO
            IF v_left <= 0 THEN
                LEAVE queues;
            END IF;
            SET v_queue = (SELECT queue FROM es_claim_served WHERE in_round = 1 AND rnd = v_order LIMIT 1);
            SET v_share = IF(v_first, CEIL(v_left / (v_count - v_index)), v_left);
            CALL everystep_claim_queue(v_queue, v_share, p_serve_all, p_claimer, v_got);
            INSERT INTO es_claim_claimed (id) SELECT id FROM es_claim_batch;
            SET v_left = v_left - v_got;
            IF v_got = v_share THEN
                UPDATE es_claim_served SET full_share = 1 WHERE queue = v_queue;
            END IF;
            SET v_index = v_index + 1;
            SET v_order = (SELECT min(rnd) FROM es_claim_served WHERE in_round = 1 AND rnd > v_order);
        END WHILE;
        IF v_left <= 0 OR v_count = 1 OR NOT v_first
                OR NOT EXISTS (SELECT 1 FROM es_claim_served WHERE full_share = 1) THEN
            LEAVE rounds;
        END IF;
        UPDATE es_claim_served SET in_round = full_share;
        SET v_first = 0;
    END LOOP;
    SELECT w.id, w.name, w.args, w.status, w.idempotency_key, w.claimed_by, w.claimed_at, w.result, w.error,
           w.created_at, w.completed_at, w.claim_epoch, w.not_before, w.queue, w.priority, w.concurrency_key,
           w.first_claimed_at, w.app_version, w.forked_from,
           EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = w.id) AS has_steps
    FROM es_claim_claimed AS c STRAIGHT_JOIN everystep_workflow AS w ON w.id = c.id;
    COMMIT;
END -- $$
;
