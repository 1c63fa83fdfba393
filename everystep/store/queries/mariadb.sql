-- Every SQL statement everystep runs on MariaDB (10.6 or later), by name.
-- Parameters use PyMySQL's %(name)s style; a list parameter (workflow
-- names, run ids, statuses) is sent as a parenthesised tuple for IN. Times
-- are UTC DATETIME(6): the database clock is UTC_TIMESTAMP(6). JSON columns
-- are text, stored verbatim.
--
-- MariaDB has INSERT ... RETURNING but no UPDATE ... RETURNING, and no
-- data-modifying CTE. A name may therefore hold a short script: statements
-- each ending with ";" at the end of a line, run in order, in one
-- transaction (the caller's, or one of their own) when the script takes row
-- locks (FOR UPDATE); a script without them is one write and reads that
-- follow it, each atomic on its own (see mariadb.py):
--   * a SELECT that returns no row, or an INSERT/UPDATE/DELETE that touches
--     none, ends the script with no rows: it is a guard;
--   * a SELECT that returns rows binds %(picked)s, the tuple of its first
--     column, for the statements after it (SELECT ... FOR UPDATE, then
--     UPDATE ... WHERE id IN %(picked)s stands for UPDATE ... RETURNING);
--   * the result is the rows of the last SELECT run, or, in a script with
--     none, one row {affected: n} when its last statement touched rows;
--   * a result column named `keep` filters rows: those where it is false
--     are left out, and the column itself is dropped (an upsert's
--     RETURNING says which row it wrote, not only which it saw).
-- A script whose first statement is START TRANSACTION is different: it
-- carries its own transaction, ending with COMMIT, and is sent whole, in
-- one round trip (connections allow multi-statements); none of the rules
-- above applies to it, its guards are in its SQL, and its result is the
-- rows of its last SELECT.
-- Connections send CLIENT_FOUND_ROWS, so "touched" means "matched" (an
-- UPDATE that leaves a row as it was still counts), as in PostgreSQL.
-- Every executor write is conditional on (claimed_by, claim_epoch) in the
-- same statement that writes.

-- name: connection_setup
-- Run on every new connection: UTC for NOW() and friends; READ COMMITTED,
-- as on PostgreSQL (each statement reads what is committed, and InnoDB
-- takes no gap locks, so claimers and step writers never deadlock on them);
-- a strict SQL mode of our own, whatever the server's default (a value too
-- long for its column is an error, never cut).
SET SESSION time_zone = '+00:00';
SET SESSION sql_mode = 'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';
SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED

-- name: statement_timeout
-- Bound every statement (max_statement_time, in seconds) and every lock
-- wait (whole seconds, at least one).
SET SESSION max_statement_time = %(seconds)s;
SET SESSION innodb_lock_wait_timeout = %(lock_seconds)s

-- name: begin_write
START TRANSACTION

-- name: commit
COMMIT

-- name: rollback
ROLLBACK

-- name: schedule
-- INSERT IGNORE skips a duplicate idempotency key (no row returned), like
-- ON CONFLICT DO NOTHING; the unique index treats NULL keys as distinct.
-- (IGNORE would also cut a value too long for its column: the only such
-- column, the workflow name, is checked before, see mariadb.py.)
INSERT IGNORE INTO everystep_workflow (id, name, args, idempotency_key, status, created_at, not_before,
                                       queue, priority, concurrency_key, app_version, parent_id, deadline)
VALUES (%(id)s, %(name)s, %(args)s, %(idempotency_key)s, 'scheduled', UTC_TIMESTAMP(6), %(not_before)s,
        %(queue)s, %(priority)s, %(concurrency_key)s, %(app_version)s, %(parent_id)s, %(deadline)s)
RETURNING {run_columns}

-- name: insert_fork
-- A run forked from run_id (everystep fork): the same workflow, in the
-- same queue, scheduled now (with its workflow's deadline, if any); its
-- copied steps follow (fork_steps), in the same transaction.
INSERT INTO everystep_workflow (id, name, args, status, created_at, queue, priority, concurrency_key,
                                app_version, forked_from, deadline)
VALUES (%(id)s, %(name)s, %(args)s, 'scheduled', UTC_TIMESTAMP(6), %(queue)s, %(priority)s,
        %(concurrency_key)s, %(app_version)s, %(run_id)s, %(deadline)s)
RETURNING {run_columns}

-- name: fork_steps
-- Copy the steps run_id recorded before step_id's record (`cut`, its
-- completion time) into the fork, results as they are: the fork replays
-- them, never re-runs them. A patch marker written with the cut step's own
-- record was decided before that step began: it is copied too.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at, cpu_seconds, peak_rss_bytes)
SELECT %(id)s, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
       attempt, wake_at, cpu_seconds, peak_rss_bytes
FROM everystep_step
WHERE workflow_id = %(run_id)s AND step_id <> %(step_id)s AND completed_at IS NOT NULL
  AND (completed_at < %(cut)s OR (name = %(patch_name)s AND completed_at <= %(cut)s))

-- name: steps_for_update
SELECT {step_columns} FROM everystep_step WHERE workflow_id = %(run_id)s ORDER BY id FOR UPDATE

-- name: forks_of
-- The runs forked from a run, oldest first (its page says them).
SELECT {run_columns} FROM everystep_workflow WHERE forked_from = %(id)s ORDER BY created_at, id

-- name: get_run_by_key
SELECT {run_columns} FROM everystep_workflow
WHERE idempotency_digest = UNHEX(SHA2(CONCAT(%(name)s, CHAR(0), %(idempotency_key)s), 256))
  AND name = %(name)s AND idempotency_key = %(idempotency_key)s

-- name: get_run
SELECT {run_columns} FROM everystep_workflow WHERE id = %(id)s

-- name: list_runs
SELECT {run_columns} FROM everystep_workflow
WHERE (%(status)s IS NULL OR status = %(status)s) AND (%(name)s IS NULL OR name = %(name)s)
  AND (%(version)s IS NULL OR app_version = %(version)s)
  AND (%(waiting_at)s IS NULL OR not_before > %(waiting_at)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: count_runs_upto
SELECT count(*) AS total FROM (
    SELECT 1 FROM everystep_workflow
    WHERE (%(status)s IS NULL OR status = %(status)s) AND (%(name)s IS NULL OR name = %(name)s)
      AND (%(version)s IS NULL OR app_version = %(version)s)
      AND (%(waiting_at)s IS NULL OR not_before > %(waiting_at)s)
    LIMIT %(cap)s
) AS capped

-- name: get_steps
SELECT {step_columns} FROM everystep_step WHERE workflow_id = %(id)s ORDER BY id

-- name: replay_steps
-- What a replay needs of each step, and nothing more (not its arguments,
-- its costs or when it ended): read once per claim of a run with history.
SELECT step_id, name, status, result, error, attempt, started_at, wake_at
FROM everystep_step WHERE workflow_id = %(id)s ORDER BY id

-- name: ping
SELECT 1 AS one

-- name: claim
-- The whole claim, queue limits included, in one round trip: the
-- procedure (store/functions/mariadb/claim.sql) runs it in a transaction
-- of its own and returns the runs claimed. Lists are JSON arrays.
CALL everystep_claim(%(claimer)s, %(limit)s, %(names)s, %(queues)s, %(serve_all)s, %(versions)s)

-- name: claim_own
-- Catch-up: re-claim (bumping the epoch, which fences any stale execution)
-- runs left running under this name that nothing here executes.
SELECT id FROM everystep_workflow
WHERE status = 'running' AND claimed_by = %(claimer)s AND name IN %(names)s
  AND id NOT IN %(exclude)s
ORDER BY created_at
LIMIT %(limit)s
FOR UPDATE;
UPDATE everystep_workflow SET claim_epoch = claim_epoch + 1
WHERE id IN %(picked)s AND status = 'running' AND claimed_by = %(claimer)s;
SELECT {run_columns_w},
    EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = w.id) AS has_steps
FROM everystep_workflow AS w WHERE w.id IN %(picked)s

-- name: _step_upsert
-- A step record meeting its row: a row still waiting for its outcome
-- (started, retrying, sleeping) is replaced; any other is left as it is
-- (each assignment is conditional on the old status, assigned last).
ON DUPLICATE KEY UPDATE
    name = IF(status IN {step_open_statuses}, VALUES(name), name),
    args = IF(status IN {step_open_statuses}, VALUES(args), args),
    kwargs = IF(status IN {step_open_statuses}, VALUES(kwargs), kwargs),
    result = IF(status IN {step_open_statuses}, VALUES(result), result),
    error = IF(status IN {step_open_statuses}, VALUES(error), error),
    started_at = IF(status IN {step_open_statuses}, VALUES(started_at), started_at),
    completed_at = IF(status IN {step_open_statuses}, VALUES(completed_at), completed_at),
    attempt = IF(status IN {step_open_statuses}, VALUES(attempt), attempt),
    wake_at = IF(status IN {step_open_statuses}, VALUES(wake_at), wake_at),
    cpu_seconds = IF(status IN {step_open_statuses}, VALUES(cpu_seconds), cpu_seconds),
    peak_rss_bytes = IF(status IN {step_open_statuses}, VALUES(peak_rss_bytes), peak_rss_bytes),
    status = IF(status IN {step_open_statuses}, VALUES(status), status)

-- name: record_step
-- Record a finished step while this claim is the run's current one. A row
-- still waiting for its outcome (started, retrying, sleeping) is replaced;
-- any other is left as it is (each assignment is conditional on the old
-- status, which is assigned last). RETURNING gives the row as it is now:
-- the write is ours if it carries the completion time we wrote (keep).
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at, cpu_seconds, peak_rss_bytes)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s, %(kwargs)s, %(status)s, %(result)s, %(error)s,
       %(started_at)s, %(now)s, %(attempt)s, %(wake_at)s, %(cpu_seconds)s, %(peak_rss_bytes)s
FROM DUAL
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
)
{_step_upsert}
RETURNING completed_at, completed_at = %(now)s AND status = %(status)s AS keep

-- name: record_marker
-- A patch marker (everystep.patches), in the transaction of the write it
-- goes with, before that write. Fenced like every step record; a marker
-- already recorded is left as it is.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, started_at, completed_at, attempt)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s, '{{}}', 'done', %(result)s, %(now)s, %(now)s, 1
FROM DUAL
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
)
ON DUPLICATE KEY UPDATE step_id = everystep_step.step_id

-- name: start_step
-- The atomic claim on an unsafe step's effect: exactly one insert wins. The
-- run's row lock (FOR UPDATE, under this claim) serialises the claimants;
-- the next statement then sees what an earlier one committed. A `retrying`
-- row is taken over the same way.
SELECT id FROM everystep_workflow
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s
FOR UPDATE;
SELECT 1 AS free FROM DUAL
WHERE NOT EXISTS (SELECT 1 FROM everystep_step
                  WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND status <> 'retrying');
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, started_at)
VALUES (%(run_id)s, %(step_id)s, %(name)s, %(args)s, %(kwargs)s, 'started', %(started_at)s)
ON DUPLICATE KEY UPDATE
    name = VALUES(name), args = VALUES(args), kwargs = VALUES(kwargs), status = 'started',
    error = NULL, started_at = VALUES(started_at), completed_at = NULL, wake_at = NULL;
SELECT started_at FROM everystep_step WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s

-- name: finish_step
UPDATE everystep_step
SET status = %(status)s, result = %(result)s, error = %(error)s, completed_at = %(now)s,
    cpu_seconds = %(cpu_seconds)s, peak_rss_bytes = %(peak_rss_bytes)s
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND status = 'started'
  AND EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
  );
SELECT completed_at FROM everystep_step WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s

-- name: record_step_locked
-- A transactional step's record, in the transaction of its own writes
-- (everystep/store/base/step_transactions.py): record_step, its values
-- selected from the run's row under this claim and that row locked in
-- share mode, to the commit (at READ COMMITTED an INSERT ... SELECT reads
-- its source without a lock unless told to), so a claim cannot bump the
-- epoch between this fence check and the commit: it waits for it.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at, cpu_seconds, peak_rss_bytes)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s, %(kwargs)s, %(status)s, %(result)s, %(error)s,
       %(started_at)s, %(now)s, %(attempt)s, %(wake_at)s, %(cpu_seconds)s, %(peak_rss_bytes)s
FROM everystep_workflow
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s
LOCK IN SHARE MODE
ON DUPLICATE KEY UPDATE
    name = IF(everystep_step.status IN {step_open_statuses}, VALUES(name), everystep_step.name),
    args = IF(everystep_step.status IN {step_open_statuses}, VALUES(args), everystep_step.args),
    kwargs = IF(everystep_step.status IN {step_open_statuses}, VALUES(kwargs), everystep_step.kwargs),
    result = IF(everystep_step.status IN {step_open_statuses}, VALUES(result), everystep_step.result),
    error = IF(everystep_step.status IN {step_open_statuses}, VALUES(error), everystep_step.error),
    started_at = IF(everystep_step.status IN {step_open_statuses}, VALUES(started_at), everystep_step.started_at),
    completed_at = IF(everystep_step.status IN {step_open_statuses}, VALUES(completed_at), everystep_step.completed_at),
    attempt = IF(everystep_step.status IN {step_open_statuses}, VALUES(attempt), everystep_step.attempt),
    wake_at = IF(everystep_step.status IN {step_open_statuses}, VALUES(wake_at), everystep_step.wake_at),
    cpu_seconds = IF(everystep_step.status IN {step_open_statuses}, VALUES(cpu_seconds), everystep_step.cpu_seconds),
    peak_rss_bytes = IF(everystep_step.status IN {step_open_statuses}, VALUES(peak_rss_bytes), everystep_step.peak_rss_bytes),
    status = IF(everystep_step.status IN {step_open_statuses}, VALUES(status), everystep_step.status)
RETURNING completed_at, completed_at = %(now)s AND status = %(status)s AS keep

-- name: step_conflict
SELECT (SELECT count(*) FROM everystep_workflow
        WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
          AND claim_epoch = %(claim_epoch)s) AS owned,
       {step_columns_s}
FROM (SELECT 1) AS one
LEFT JOIN everystep_step AS s ON s.workflow_id = %(run_id)s AND s.step_id = %(step_id)s

-- name: finish_run
-- The parent to wake (wake_waiter), if the run is a child: its runner
-- wakes it once this write is done.
UPDATE everystep_workflow
SET status = %(status)s, result = %(result)s, error = %(error)s, completed_at = UTC_TIMESTAMP(6)
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s;
SELECT id, parent_id AS wake_parent FROM everystep_workflow WHERE id = %(run_id)s

-- name: finish_run_with_step
-- The run's last step and its terminal status, both or neither, in one
-- round trip (sent whole: see the header) and one durable commit. The run
-- row is locked first, under the claim, so both writes see the same claim;
-- the status changes only if the step row is ours now (it carries our
-- completion time: a step that already has an outcome writes nothing). No
-- row back means nothing was written.
START TRANSACTION;
SELECT id FROM everystep_workflow
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s
FOR UPDATE;
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at, cpu_seconds, peak_rss_bytes)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s, %(kwargs)s, %(step_status)s, %(step_result)s,
       %(step_error)s, %(started_at)s, %(now)s, %(attempt)s, %(wake_at)s, %(cpu_seconds)s, %(peak_rss_bytes)s
FROM DUAL
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
)
{_step_upsert};
UPDATE everystep_workflow
SET status = %(status)s, result = %(result)s, error = %(error)s, completed_at = UTC_TIMESTAMP(6)
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s
  AND EXISTS (SELECT 1 FROM everystep_step
              WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s
                AND completed_at = %(now)s AND status = %(step_status)s);
SELECT s.completed_at, w.parent_id AS wake_parent
FROM everystep_workflow AS w
JOIN everystep_step AS s ON s.workflow_id = w.id AND s.step_id = %(step_id)s
WHERE w.id = %(run_id)s AND w.status = %(status)s AND w.claimed_by = %(claimer)s
  AND w.claim_epoch = %(claim_epoch)s AND s.completed_at = %(now)s AND s.status = %(step_status)s;
COMMIT

-- name: requeue
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s

-- name: requeue_all
SELECT id FROM everystep_workflow WHERE status = 'running' AND claimed_by = %(claimer)s FOR UPDATE;
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE id IN %(picked)s AND status = 'running' AND claimed_by = %(claimer)s

-- name: queue_stats
-- Pending: scheduled and due; waiting: scheduled for later. The oldest
-- pending age counts from the due time.
SELECT
    (SELECT count(*) FROM everystep_workflow
       WHERE status = 'scheduled' AND due_at <= UTC_TIMESTAMP(6)) AS pending,
    (SELECT count(*) FROM everystep_workflow
       WHERE status = 'scheduled' AND due_at > UTC_TIMESTAMP(6)) AS waiting,
    (SELECT count(*) FROM everystep_workflow WHERE status = 'running') AS running,
    (SELECT count(*) FROM everystep_workflow WHERE status = 'blocked') AS blocked,
    (SELECT TIMESTAMPDIFF(MICROSECOND, min(due_at), UTC_TIMESTAMP(6)) / 1000000.0
       FROM everystep_workflow
       WHERE status = 'scheduled' AND due_at <= UTC_TIMESTAMP(6)) AS oldest_age

-- name: count_scheduled
SELECT count(*) AS scheduled FROM everystep_workflow WHERE status = 'scheduled' AND name IN %(names)s

-- name: lock_run
SELECT {run_columns} FROM everystep_workflow WHERE id = %(id)s FOR UPDATE

-- name: lock_step
SELECT {step_columns} FROM everystep_step
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s FOR UPDATE

-- name: resolve_step_outcome
UPDATE everystep_step
SET status = %(status)s, result = %(result)s, error = %(error)s, completed_at = UTC_TIMESTAMP(6)
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND status = 'started'

-- name: delete_step
DELETE FROM everystep_step
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND status = 'started'

-- name: reschedule
-- Admin transitions back to the queue; the epoch bump fences the previous
-- executor.
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL,
    error = NULL, result = NULL, completed_at = NULL, claim_epoch = claim_epoch + 1
WHERE id = %(run_id)s AND status = %(from_status)s

-- name: lock_runner
-- The current holder of a runner name, locked while a new instance decides
-- whether it may take the name.
SELECT name, kind, host, pid, lease_seconds, started_at, heartbeat_at,
       TIMESTAMPDIFF(MICROSECOND, heartbeat_at, UTC_TIMESTAMP(6)) / 1000000.0 AS silent,
       (SELECT count(*) FROM everystep_workflow w
        WHERE w.status = 'running' AND w.claimed_by = %(name)s) AS running,
       instance
FROM everystep_runner WHERE name = %(name)s
FOR UPDATE

-- name: insert_runner
INSERT IGNORE INTO everystep_runner
    (name, instance, kind, host, pid, lease_seconds, started_at, heartbeat_at)
VALUES (%(name)s, %(instance)s, %(kind)s, %(host)s, %(pid)s, %(lease)s, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
RETURNING name

-- name: replace_runner
UPDATE everystep_runner
SET instance = %(instance)s, kind = %(kind)s, host = %(host)s, pid = %(pid)s,
    lease_seconds = %(lease)s, started_at = UTC_TIMESTAMP(6), heartbeat_at = UTC_TIMESTAMP(6)
WHERE name = %(name)s

-- name: fence_runner_runs
-- A takeover: the previous holder's executions can write nothing more.
SELECT id FROM everystep_workflow WHERE status = 'running' AND claimed_by = %(name)s FOR UPDATE;
UPDATE everystep_workflow SET claim_epoch = claim_epoch + 1 WHERE id IN %(picked)s

-- name: heartbeat
UPDATE everystep_runner SET heartbeat_at = UTC_TIMESTAMP(6)
WHERE name = %(name)s AND instance = %(instance)s

-- name: unregister_runner
DELETE FROM everystep_runner WHERE name = %(name)s AND instance = %(instance)s

-- name: expired_runners
-- Runners silent past their lease, locked: concurrent recoverers serialise
-- here, and forget_runner checks the lease again under the lock.
SELECT name FROM everystep_runner
WHERE heartbeat_at < UTC_TIMESTAMP(6) - INTERVAL (lease_seconds * 1000000) MICROSECOND
  AND name <> %(me)s
FOR UPDATE

-- name: forget_runner
DELETE FROM everystep_runner
WHERE name = %(name)s AND heartbeat_at < UTC_TIMESTAMP(6) - INTERVAL (lease_seconds * 1000000) MICROSECOND

-- name: requeue_dead_runners_runs
SELECT id FROM everystep_workflow WHERE status = 'running' AND claimed_by = %(claimer)s FOR UPDATE;
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, claim_epoch = claim_epoch + 1
WHERE id IN %(picked)s

-- name: list_runners
SELECT r.name, r.kind, r.host, r.pid, r.lease_seconds, r.started_at, r.heartbeat_at,
       TIMESTAMPDIFF(MICROSECOND, r.heartbeat_at, UTC_TIMESTAMP(6)) / 1000000.0 AS silent,
       (SELECT count(*) FROM everystep_workflow w WHERE w.status = 'running' AND w.claimed_by = r.name)
           AS running,
       r.instance
FROM everystep_runner AS r
ORDER BY r.name

-- name: claim_states
SELECT id, status, claimed_by, claim_epoch FROM everystep_workflow WHERE id IN %(ids)s

-- name: migration_lock
-- A named lock per database, held by the session until released: the
-- lock that serialises migrators (DDL commits at once on MariaDB, so no
-- transaction can). Waits up to %(wait)s seconds; 1 when taken.
SELECT GET_LOCK(CONCAT('everystep_migrate.', DATABASE()), %(wait)s) AS locked

-- name: migration_unlock
SELECT RELEASE_LOCK(CONCAT('everystep_migrate.', DATABASE())) AS released

-- name: create_migration_table
CREATE TABLE IF NOT EXISTS everystep_migration (
    version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin

-- name: applied_migrations
SELECT version, name FROM everystep_migration

-- name: rename_migration
-- A placeholder version recorded earlier, now applied for real.
UPDATE everystep_migration SET name = %(name)s, applied_at = %(now)s WHERE version = %(version)s

-- name: insert_migration
INSERT INTO everystep_migration (version, name, applied_at) VALUES (%(version)s, %(name)s, %(now)s)

-- name: migration_table_exists
SELECT count(*) AS present FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'everystep_migration'

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM everystep_migration

-- name: function_table_exists
-- Where each stored function's file was last applied (store/functions/;
-- this backend has none).
SELECT count(*) AS present FROM information_schema.tables
WHERE table_schema = DATABASE() AND table_name = 'everystep_function'

-- name: applied_functions
SELECT name, sha256 FROM everystep_function

-- name: record_function
INSERT INTO everystep_function (name, sha256, applied_at) VALUES (%(name)s, %(sha256)s, %(now)s)
ON DUPLICATE KEY UPDATE sha256 = VALUES(sha256), applied_at = VALUES(applied_at)

-- -- The operations console and operator requests (migration 0005) -----------

-- name: submit_request
INSERT INTO everystep_request (runner, command, args, requested_by, created_at)
VALUES (%(runner)s, %(command)s, %(args)s, %(requested_by)s, UTC_TIMESTAMP(6))
RETURNING id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at,
          0.0 AS age

-- name: take_requests
-- This runner's pending requests, oldest first, with their age by the
-- database's clock. SKIP LOCKED: two instances racing on one name never
-- take the same request twice.
SELECT id FROM everystep_request
WHERE runner = %(runner)s AND status = 'pending'
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;
UPDATE everystep_request SET status = 'taken', taken_at = UTC_TIMESTAMP(6) WHERE id IN %(picked)s;
SELECT id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at,
       TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) / 1000000.0 AS age
FROM everystep_request WHERE id IN %(picked)s

-- name: answer_request
UPDATE everystep_request SET status = 'answered', reply = %(reply)s, answered_at = UTC_TIMESTAMP(6)
WHERE id = %(id)s AND status = 'taken'

-- name: expire_request
UPDATE everystep_request SET status = 'expired', answered_at = UTC_TIMESTAMP(6)
WHERE id = %(id)s AND status = 'pending'

-- name: get_request
SELECT id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at,
       TIMESTAMPDIFF(MICROSECOND, created_at, UTC_TIMESTAMP(6)) / 1000000.0 AS age
FROM everystep_request WHERE id = %(id)s

-- name: prune_requests
DELETE FROM everystep_request WHERE created_at < %(cutoff)s

-- name: publish_runner_detail
UPDATE everystep_runner SET detail = %(detail)s
WHERE name = %(name)s AND instance = %(instance)s

-- name: runner_details
SELECT name, instance, detail FROM everystep_runner WHERE detail IS NOT NULL

-- name: page_runs_older
SELECT {run_columns} FROM everystep_workflow
WHERE id >= %(lo)s AND id <= %(hi)s AND id < %(cursor_id)s
  AND (%(name)s IS NULL OR name = %(name)s)
  AND (%(queue)s IS NULL OR queue = %(queue)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: page_runs_newer
SELECT {run_columns} FROM everystep_workflow
WHERE id >= %(lo)s AND id <= %(hi)s AND id > %(cursor_id)s
  AND (%(name)s IS NULL OR name = %(name)s)
  AND (%(queue)s IS NULL OR queue = %(queue)s)
ORDER BY id ASC
LIMIT %(limit)s

-- name: page_runs_status_older
SELECT {run_columns} FROM everystep_workflow
WHERE status = %(status)s
  AND (%(waiting_at)s IS NULL OR not_before > %(waiting_at)s)
  AND created_at <= %(cursor_at)s AND (created_at, id) < (%(cursor_at)s, %(cursor_id)s)
  AND id >= %(lo)s AND id <= %(hi)s
  AND (%(name)s IS NULL OR name = %(name)s)
  AND (%(queue)s IS NULL OR queue = %(queue)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: page_runs_status_newer
SELECT {run_columns} FROM everystep_workflow
WHERE status = %(status)s
  AND (%(waiting_at)s IS NULL OR not_before > %(waiting_at)s)
  AND created_at >= %(cursor_at)s AND (created_at, id) > (%(cursor_at)s, %(cursor_id)s)
  AND id >= %(lo)s AND id <= %(hi)s
  AND (%(name)s IS NULL OR name = %(name)s)
  AND (%(queue)s IS NULL OR queue = %(queue)s)
ORDER BY created_at ASC, id ASC
LIMIT %(limit)s

-- name: count_status_upto
SELECT count(*) AS total FROM (
    SELECT 1 FROM everystep_workflow WHERE status = %(status)s LIMIT %(cap)s
) AS capped

-- name: count_statuses
SELECT status, count(*) AS total FROM everystep_workflow GROUP BY status

-- name: estimate_statuses
-- InnoDB's statistics carry no value frequencies the console could use:
-- counts are exact, as on SQLite.
SELECT -1.0 AS estimated_rows, NULL AS status_values, NULL AS status_shares

-- name: steps_of_runs
SELECT {step_columns} FROM everystep_step WHERE workflow_id IN %(ids)s ORDER BY workflow_id, id

-- name: waiting_steps_of_runs
SELECT {step_columns} FROM everystep_step
WHERE workflow_id IN %(ids)s AND status IN {step_waiting_statuses}
ORDER BY workflow_id, id

-- name: prune_count
SELECT count(*) AS runs, (SELECT count(*) FROM everystep_step AS s
                  JOIN everystep_workflow AS w ON w.id = s.workflow_id
                  WHERE w.status IN %(statuses)s AND w.status NOT IN {active_statuses}
                    AND w.completed_at < %(cutoff)s) AS steps
FROM everystep_workflow
WHERE status IN %(statuses)s AND status NOT IN {active_statuses}
  AND completed_at < %(cutoff)s

-- name: prune_pick
-- One batch of finished runs to delete. The NOT IN is the guarantee that
-- no unfinished run is ever pruned, whatever statuses the caller passes;
-- SKIP LOCKED never waits for an operator command holding one.
SELECT id FROM everystep_workflow
WHERE status IN %(statuses)s AND status NOT IN {active_statuses}
  AND completed_at < %(cutoff)s
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: prune_steps
DELETE FROM everystep_step WHERE workflow_id IN %(ids)s

-- name: prune_runs
DELETE FROM everystep_workflow
WHERE id IN %(ids)s AND status NOT IN {active_statuses}

-- -- The run lifecycle (migration 0006) --------------------------------------

-- name: release
-- Back to the queue until not_before (a retry's backoff, a durable sleep),
-- fenced like every executor write.
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = %(not_before)s, wait_key = NULL
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s

-- name: defer
-- Back to the queue until not_before after one of the engine's own
-- statements failed, holding that error meanwhile (everystep/engine_errors.py).
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = %(not_before)s, wait_key = NULL,
    error = %(error)s
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s

-- name: insert_attempt
INSERT IGNORE INTO everystep_attempt (workflow_id, step_id, attempt, error, started_at, failed_at, retry_at)
VALUES (%(run_id)s, %(step_id)s, %(attempt)s, %(error)s, %(started_at)s, %(failed_at)s, %(wake_at)s)

-- name: get_attempts
SELECT workflow_id, step_id, attempt, error, started_at, failed_at, retry_at
FROM everystep_attempt WHERE workflow_id = %(id)s ORDER BY step_id, attempt

-- name: next_due
-- When the next scheduled run of one queue that is not due yet becomes due
-- (no row: none); the caller asks for each queue it serves.
SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), not_before) / 1000000.0 AS wait
FROM everystep_workflow FORCE INDEX (everystep_workflow_waiting)
WHERE status = 'scheduled' AND queue = %(queue)s AND not_before > UTC_TIMESTAMP(6)
ORDER BY not_before
LIMIT 1

-- name: cancel_run
UPDATE everystep_workflow
SET status = 'cancelled', error = %(error)s, completed_at = UTC_TIMESTAMP(6)
WHERE id = %(run_id)s AND status = %(from_status)s

-- name: record_cancelled_step
-- The step a cancel cut off, recorded by the holder of the cancelled claim.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s, %(kwargs)s, %(status)s, %(result)s, %(error)s,
       %(started_at)s, %(now)s, %(attempt)s, %(wake_at)s
FROM DUAL
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'cancelled' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
)
ON DUPLICATE KEY UPDATE
    name = IF(status IN {step_open_statuses}, VALUES(name), name),
    args = IF(status IN {step_open_statuses}, coalesce(VALUES(args), args), args),
    kwargs = IF(status IN {step_open_statuses}, coalesce(VALUES(kwargs), kwargs), kwargs),
    result = IF(status IN {step_open_statuses}, VALUES(result), result),
    error = IF(status IN {step_open_statuses}, VALUES(error), error),
    started_at = IF(status IN {step_open_statuses}, VALUES(started_at), started_at),
    completed_at = IF(status IN {step_open_statuses}, VALUES(completed_at), completed_at),
    attempt = IF(status IN {step_open_statuses}, VALUES(attempt), attempt),
    wake_at = IF(status IN {step_open_statuses}, VALUES(wake_at), wake_at),
    status = IF(status IN {step_open_statuses}, VALUES(status), status)
RETURNING completed_at, completed_at = %(now)s AND status = %(status)s AS keep

-- name: cron_ticks
SELECT c.name, c.last_tick, c.last_run, w.status AS last_status
FROM everystep_cron AS c
LEFT JOIN everystep_workflow AS w ON w.id = c.last_run
WHERE c.name IN %(names)s

-- name: record_cron_tick
-- The last tick only moves forward (last_run is assigned before last_tick,
-- so it compares against the old tick).
INSERT INTO everystep_cron (name, last_tick, last_run) VALUES (%(name)s, %(tick)s, %(run_id)s)
ON DUPLICATE KEY UPDATE
    last_run = IF(last_tick < VALUES(last_tick), VALUES(last_run), last_run),
    last_tick = GREATEST(last_tick, VALUES(last_tick))

-- -- Queues and flow control (migration 0007) ---------------------------------
-- The claim's steps run in the claim procedure (functions/mariadb/claim.sql);
-- these two list the served queues for next_due.

-- name: claim_next_queue
-- The first queue after %(after)s holding scheduled runs: one probe of the
-- claim index, however many runs wait in each queue. The claim asks again
-- after each one found ("" comes before every queue name).
SELECT queue FROM everystep_workflow FORCE INDEX (everystep_workflow_claimable)
WHERE status = 'scheduled' AND queue > %(after)s
ORDER BY queue
LIMIT 1

-- name: claim_queue_settings
SELECT name, concurrency, key_concurrency, rate_limit, rate_period, paused FROM everystep_queue
WHERE name IN %(queues)s

-- name: lock_queue
-- An operator's change to a queue, under its row lock (claims from a
-- limited queue hold it too, so a change lands between two claims).
SELECT name, concurrency, key_concurrency, rate_limit, rate_period, paused
FROM everystep_queue WHERE name = %(name)s FOR UPDATE

-- name: put_queue
INSERT INTO everystep_queue (name, concurrency, key_concurrency, rate_limit, rate_period, paused, updated_at)
VALUES (%(name)s, %(concurrency)s, %(key_concurrency)s, %(rate_limit)s, %(rate_period)s, %(paused)s,
        UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
    concurrency = VALUES(concurrency), key_concurrency = VALUES(key_concurrency),
    rate_limit = VALUES(rate_limit), rate_period = VALUES(rate_period), paused = VALUES(paused),
    updated_at = VALUES(updated_at)

-- name: queue_settings
SELECT name, concurrency, key_concurrency, rate_limit, rate_period, paused FROM everystep_queue ORDER BY name

-- name: queue_has_runs
-- Whether any run, finished or not, names the queue (an operator command
-- checking a name; a name no run has scans the table).
SELECT 1 AS found FROM everystep_workflow WHERE queue = %(name)s LIMIT 1

-- name: queue_counts
-- Per queue: due and waiting scheduled runs, running and blocked ones, and
-- the age of the oldest due run (by the database's clock).
SELECT queue,
       sum(status = 'scheduled' AND due_at <= UTC_TIMESTAMP(6)) AS pending,
       sum(status = 'scheduled' AND due_at > UTC_TIMESTAMP(6)) AS waiting,
       sum(status = 'running') AS running,
       sum(status = 'blocked') AS blocked,
       TIMESTAMPDIFF(MICROSECOND,
                     min(CASE WHEN status = 'scheduled' AND due_at <= UTC_TIMESTAMP(6) THEN due_at END),
                     UTC_TIMESTAMP(6)) / 1000000.0 AS oldest_age
FROM everystep_workflow
WHERE status IN {active_statuses}
GROUP BY queue
ORDER BY queue

-- name: wake_wait
-- An idle runner's wake-up connection waits here, up to %(seconds)s; the
-- everystep_wake procedure (functions/mariadb/wake.sql) finds it by this
-- text and interrupts it. Sent without waiting for its answer (mariadb.py).
SELECT SLEEP(%(seconds)s) AS everystep_wake

-- name: wake_end
-- A wake-up connection closing: end its sleep (the server would hold the
-- sleeping session to its end otherwise).
KILL QUERY %(session)s

-- name: wake_runners
-- After a schedule() commits: interrupt the runners' wake_wait.
CALL everystep_wake()

-- name: read_only_session
-- A session that cannot write (connect(read_only=True): everystep replay).
SET SESSION TRANSACTION READ ONLY

-- -- Waiting on the world: messages, events, child runs, deadlines (migration 0013) --

-- name: lock_run_wait
SELECT id, name, status, wait_key, continued_as FROM everystep_workflow WHERE id = %(run_id)s FOR UPDATE

-- name: lock_claimed
SELECT id, deadline, app_version FROM everystep_workflow
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s
FOR UPDATE

-- name: message_by_key
SELECT id FROM everystep_message WHERE workflow_id = %(run_id)s AND idempotency_key = %(key)s

-- name: insert_message
INSERT INTO everystep_message (workflow_id, topic, payload, idempotency_key, created_at)
VALUES (%(run_id)s, %(topic)s, %(payload)s, %(key)s, UTC_TIMESTAMP(6))
RETURNING id

-- name: wake_waiter
-- As on PostgreSQL: the row is written whatever it holds (IF, not a WHERE
-- on the status: a semi-consistent read would skip a row being released),
-- wait_key assigned last (MariaDB assigns left to right).
UPDATE everystep_workflow
SET not_before = IF(status = 'scheduled' AND wait_key IN (%(wait_key)s, '*'), UTC_TIMESTAMP(6), not_before),
    wait_key = IF(status = 'scheduled' AND wait_key IN (%(wait_key)s, '*'), NULL, wait_key)
WHERE id = %(run_id)s

-- name: wake_watchers
-- A set_event's wake of the runs waiting for that event alone (see the
-- PostgreSQL statement: a semi-consistent read skips a row being
-- released, whose releaser then reads the event under lock_watched).
UPDATE everystep_workflow SET not_before = UTC_TIMESTAMP(6), wait_key = NULL
WHERE status = 'scheduled' AND wait_key = %(wait_key)s

-- name: lock_watched
SELECT id FROM everystep_workflow WHERE id = %(run_id)s LOCK IN SHARE MODE

-- name: next_message
SELECT id, payload FROM everystep_message
WHERE workflow_id = %(run_id)s AND topic = %(topic)s AND consumed_step IS NULL
ORDER BY id
LIMIT 1

-- name: consume_message
UPDATE everystep_message SET consumed_step = %(step_id)s, consumed_at = UTC_TIMESTAMP(6)
WHERE id = %(message_id)s AND consumed_step IS NULL

-- name: release_wait
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = %(not_before)s,
    wait_key = %(wait_key)s
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s

-- name: put_event
INSERT INTO everystep_event (workflow_id, `key`, value, updated_at)
VALUES (%(run_id)s, %(key)s, %(value)s, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE value = VALUES(value), updated_at = VALUES(updated_at)

-- name: get_event
SELECT `key`, value, updated_at FROM everystep_event WHERE workflow_id = %(run_id)s AND `key` = %(key)s

-- name: list_events
SELECT `key`, value, updated_at FROM everystep_event WHERE workflow_id = %(run_id)s ORDER BY `key`

-- name: list_messages
SELECT id, topic, payload, idempotency_key, created_at, consumed_step, consumed_at
FROM everystep_message WHERE workflow_id = %(run_id)s ORDER BY id

-- name: run_links
SELECT id, parent_id, deadline, wait_key FROM everystep_workflow WHERE id = %(run_id)s

-- name: child_outcome
SELECT id, status, result, error, parent_id, continued_as FROM everystep_workflow WHERE id = %(run_id)s

-- name: run_ended
-- A wait for a run's end is over (everystep.wait_kinds): a row when the
-- run has ended, or is gone.
SELECT 1 AS ended FROM DUAL WHERE NOT EXISTS (
    SELECT 1 FROM everystep_workflow WHERE id = %(run_id)s AND status IN {active_statuses})

-- name: list_children
SELECT {run_columns} FROM everystep_workflow WHERE parent_id = %(run_id)s
ORDER BY created_at, id
LIMIT %(limit)s

-- name: active_children
SELECT id FROM everystep_workflow WHERE parent_id = %(run_id)s AND status IN {active_statuses}

-- name: expired_deadlines
SELECT id FROM everystep_workflow
WHERE deadline IS NOT NULL AND deadline <= UTC_TIMESTAMP(6) AND status IN {active_statuses}
ORDER BY deadline
LIMIT %(limit)s

-- name: stale_child_waits
-- Parents still waiting for a child that has ended: a runner that died
-- between the child's end and the parent's wake (two writes here).
SELECT p.id, p.wait_key FROM everystep_workflow AS p
JOIN everystep_workflow AS c ON p.wait_key = CONCAT({wait_prefix_child}, c.id)
WHERE p.status = 'scheduled' AND substr(p.wait_key, 1, {wait_prefix_child_length}) = {wait_prefix_child} AND c.status NOT IN {active_statuses}
LIMIT 100

-- name: waiting_counts
SELECT {wait_kind_of} AS kind,
       count(*) AS runs
FROM everystep_workflow
WHERE status = 'scheduled' AND not_before > UTC_TIMESTAMP(6)
GROUP BY 1

-- -- Continuing as new (migration 0016) --

-- name: lock_continuing
-- continue_as_new: the run's row under its claim, locked, with what its
-- successor takes over (everystep/store/base/continuations.py).
SELECT id, name, idempotency_key, queue, priority, concurrency_key, parent_id, deadline
FROM everystep_workflow
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s AND claim_epoch = %(claim_epoch)s
FOR UPDATE

-- name: end_continued
-- The run ends `continued`, pointing at its successor, and gives its
-- idempotency key up to it (the unique index on (name, key) allows one).
UPDATE everystep_workflow
SET status = 'continued', completed_at = UTC_TIMESTAMP(6), continued_as = %(new_id)s, idempotency_key = NULL,
    result = NULL, error = NULL
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s AND claim_epoch = %(claim_epoch)s

-- name: insert_continuation
-- Its successor (see the PostgreSQL statement).
INSERT INTO everystep_workflow (id, name, args, idempotency_key, status, created_at, queue, priority,
                                concurrency_key, app_version, parent_id, deadline, continued_from)
VALUES (%(new_id)s, %(name)s, %(args)s, %(idempotency_key)s, 'scheduled', UTC_TIMESTAMP(6), %(queue)s,
        %(priority)s, %(concurrency_key)s, %(app_version)s, %(parent_id)s, %(deadline)s, %(run_id)s)

-- name: move_unconsumed_messages
-- The messages nobody received yet go to the successor, which receives them
-- as this run would have.
UPDATE everystep_message SET workflow_id = %(new_id)s WHERE workflow_id = %(run_id)s AND consumed_step IS NULL

-- name: copy_events
-- What the run published stays readable on its successor.
INSERT INTO everystep_event (workflow_id, `key`, value, updated_at)
SELECT %(new_id)s, `key`, value, updated_at FROM everystep_event WHERE workflow_id = %(run_id)s

-- name: adopt_children
-- Its unfinished children are its successor's: a cancel of the chain's
-- newest run reaches them.
UPDATE everystep_workflow SET parent_id = %(new_id)s
WHERE parent_id = %(run_id)s AND status IN {active_statuses}

-- name: step_ids
-- Long histories (store/base/histories.py). Every step id of a run in the
-- order first recorded, as get_steps reads them: what a page of steps is
-- cut from, without reading the arguments and results of the others.
SELECT step_id FROM everystep_step WHERE workflow_id = %(id)s ORDER BY id

-- name: steps_by_id
SELECT {step_columns} FROM everystep_step WHERE workflow_id = %(id)s AND step_id IN %(step_ids)s

-- name: step_outline
-- Every step of a run in the order first recorded: its id, function and
-- status (and the result of the steps named results_of: a patch marker's
-- answer), what the step graph is drawn from however long the history.
SELECT step_id, name, status, CASE WHEN name = %(results_of)s THEN result END AS result
FROM everystep_step WHERE workflow_id = %(id)s ORDER BY id

-- name: note_history
-- A run's history as its execution under this claim left it.
UPDATE everystep_workflow SET history = %(records)s WHERE id = %(run_id)s AND claim_epoch = %(claim_epoch)s

-- name: largest_history
SELECT max(history) AS records FROM everystep_workflow WHERE status IN {active_statuses}

-- name: run_cost
-- What a run's measured steps cost, summed where the rows are (no step
-- row leaves the database): `everystep show`'s cost line.
SELECT count(cpu_seconds) AS measured, sum(cpu_seconds) AS cpu_seconds,
       max(CASE WHEN cpu_seconds IS NOT NULL THEN coalesce(peak_rss_bytes, 0) END) AS peak_rss_bytes
FROM everystep_step WHERE workflow_id = %(id)s

-- -- Streams (migration 0019, everystep.streams; see postgres.sql) -----------

-- name: stream_tail
SELECT (SELECT seq FROM everystep_stream WHERE workflow_id = w.id AND `key` = %(key)s
        ORDER BY seq DESC LIMIT 1) AS seq,
       (SELECT CASE WHEN closed AND NOT withdrawn THEN 1 ELSE 0 END FROM everystep_stream
        WHERE workflow_id = w.id AND `key` = %(key)s ORDER BY seq DESC LIMIT 1) AS closed
FROM everystep_workflow AS w
WHERE w.id = %(run_id)s AND w.status = 'running' AND w.claimed_by = %(claimer)s
  AND w.claim_epoch = %(claim_epoch)s

-- name: stream_tail_live
-- `stream_tail` for a write from a step's code (see postgres.sql).
SELECT (SELECT seq FROM everystep_stream WHERE workflow_id = w.id AND `key` = %(key)s
        ORDER BY seq DESC LIMIT 1) AS seq,
       (SELECT CASE WHEN closed AND NOT withdrawn THEN 1 ELSE 0 END FROM everystep_stream
        WHERE workflow_id = w.id AND `key` = %(key)s ORDER BY seq DESC LIMIT 1) AS closed
FROM everystep_workflow AS w
WHERE w.id = %(run_id)s AND w.status = 'running' AND w.claimed_by = %(claimer)s
  AND w.claim_epoch = %(claim_epoch)s

-- name: stream_withdraw
UPDATE everystep_stream SET withdrawn = 1, value = NULL
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND attempt IS NOT NULL
  AND attempt <> %(attempt)s AND NOT withdrawn

-- name: stream_append
INSERT IGNORE INTO everystep_stream (workflow_id, `key`, seq, value, step_id, attempt, closed, written_at)
VALUES (%(run_id)s, %(key)s, %(seq)s, %(value)s, %(step_id)s, %(attempt)s, %(closed)s, UTC_TIMESTAMP(6))

-- name: stream_read
SELECT seq, value, step_id, attempt, closed, written_at FROM everystep_stream
WHERE workflow_id = %(run_id)s AND `key` = %(key)s AND seq > %(after)s AND NOT withdrawn
ORDER BY seq LIMIT %(limit)s

-- name: stream_keys
SELECT `key`, max(seq) AS seq, max(CASE WHEN closed THEN 1 ELSE 0 END) AS closed
FROM everystep_stream WHERE workflow_id = %(run_id)s AND NOT withdrawn
GROUP BY `key` ORDER BY `key`

-- -- Debounced scheduling (migration 0020; store/base/debounce.py) --

-- name: debounce_take
-- See queries/postgres.sql. ON DUPLICATE KEY UPDATE takes the existing
-- row's exclusive lock at once (INSERT IGNORE's shared lock, upgraded
-- later, would deadlock two schedulers of one key); the SELECT reads the
-- row this transaction holds.
INSERT INTO everystep_debounce (name, debounce_key, run_id, first_at)
VALUES (%(name)s, %(debounce_key)s, %(id)s, %(now)s)
ON DUPLICATE KEY UPDATE calls = calls + 1;
SELECT run_id, first_at FROM everystep_debounce WHERE name = %(name)s AND debounce_key = %(debounce_key)s

-- name: debounce_fold
SELECT id FROM everystep_workflow
WHERE id = %(run_id)s AND status = 'scheduled' AND first_claimed_at IS NULL AND debounce_calls IS NOT NULL
FOR UPDATE;
UPDATE everystep_workflow SET args = %(args)s, not_before = %(not_before)s, debounce_calls = debounce_calls + 1
WHERE id IN %(picked)s;
SELECT {run_columns}, debounce_calls FROM everystep_workflow WHERE id IN %(picked)s

-- name: debounce_move
UPDATE everystep_debounce SET run_id = %(id)s, first_at = %(now)s
WHERE name = %(name)s AND debounce_key = %(debounce_key)s

-- name: debounce_open
INSERT INTO everystep_workflow (id, name, args, status, created_at, not_before, queue, priority,
                                concurrency_key, app_version, deadline, wait_key, debounce_calls)
VALUES (%(id)s, %(name)s, %(args)s, 'scheduled', UTC_TIMESTAMP(6), %(not_before)s, %(queue)s, %(priority)s,
        %(concurrency_key)s, %(app_version)s, %(deadline)s, %(wait_key)s, 1)
RETURNING {run_columns}, debounce_calls

-- name: debounce_windows
SELECT id, wait_key, debounce_calls FROM everystep_workflow
WHERE id IN %(ids)s AND debounce_calls IS NOT NULL
