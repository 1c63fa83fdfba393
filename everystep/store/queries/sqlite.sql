-- Every SQL statement everystep runs on SQLite, by name.
-- Parameters use sqlite3's :name style. Timestamps are ISO-8601 UTC text
-- written by Python, JSON columns are text. Writers serialise on SQLite's
-- single write lock; claims take it up front with BEGIN IMMEDIATE.

-- name: schedule
INSERT INTO everystep_workflow (id, name, args, idempotency_key, status, created_at, not_before,
                                queue, priority, concurrency_key, app_version, parent_id, deadline)
VALUES (:id, :name, :args, :idempotency_key, 'scheduled', :now, :not_before,
        :queue, :priority, :concurrency_key, :app_version, :parent_id, :deadline)
ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {run_columns}

-- name: insert_fork
-- A run forked from run_id (everystep fork): the same workflow, in the
-- same queue, scheduled now (with its workflow's deadline, if any); its
-- copied steps follow (fork_steps), in the same transaction.
INSERT INTO everystep_workflow (id, name, args, status, created_at, queue, priority, concurrency_key,
                                app_version, forked_from, deadline)
VALUES (:id, :name, :args, 'scheduled', :now, :queue, :priority, :concurrency_key, :app_version, :run_id, :deadline)
RETURNING {run_columns}

-- name: fork_steps
-- Copy the steps run_id recorded before step_id's record (`cut`, its
-- completion time) into the fork, results as they are: the fork replays
-- them, never re-runs them. A patch marker written with the cut step's own
-- record was decided before that step began: it is copied too.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at, cpu_seconds, peak_rss_bytes)
SELECT :id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
       attempt, wake_at, cpu_seconds, peak_rss_bytes
FROM everystep_step
WHERE workflow_id = :run_id AND step_id <> :step_id AND completed_at IS NOT NULL
  AND (completed_at < :cut OR (name = :patch_name AND completed_at <= :cut))

-- name: steps_for_update
SELECT {step_columns} FROM everystep_step WHERE workflow_id = :run_id ORDER BY id

-- name: forks_of
-- The runs forked from a run, oldest first (its page says them).
SELECT {run_columns} FROM everystep_workflow WHERE forked_from = :id ORDER BY created_at, id

-- name: get_run_by_key
SELECT {run_columns} FROM everystep_workflow
WHERE name = :name AND idempotency_key = :idempotency_key

-- name: get_run
SELECT {run_columns} FROM everystep_workflow WHERE id = :id

-- name: list_runs
SELECT {run_columns} FROM everystep_workflow
WHERE (:status IS NULL OR status = :status) AND (:name IS NULL OR name = :name)
  AND (:version IS NULL OR app_version = :version)
  AND (:waiting_at IS NULL OR not_before > :waiting_at)
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: count_runs_upto
SELECT count(*) AS total FROM (
    SELECT 1 FROM everystep_workflow
    WHERE (:status IS NULL OR status = :status) AND (:name IS NULL OR name = :name)
      AND (:version IS NULL OR app_version = :version)
      AND (:waiting_at IS NULL OR not_before > :waiting_at)
    LIMIT :cap
)

-- name: get_steps
SELECT {step_columns} FROM everystep_step WHERE workflow_id = :id ORDER BY id

-- name: replay_steps
-- What a replay needs of each step, and nothing more (not its arguments,
-- its costs or when it ended): read once per claim of a run with history.
SELECT step_id, name, status, result, error, attempt, started_at, wake_at
FROM everystep_step WHERE workflow_id = :id ORDER BY id

-- name: ping
SELECT 1 AS one

-- name: claim
-- One queue's oldest due runs at one priority, of the served names only:
-- for each name, its earliest due runs along the partial index of scheduled
-- runs by (queue, priority, name, due time), one range that stops at the
-- first run not yet due, and of those the earliest overall (runs nobody
-- serves are never read). INDEXED BY pins that plan, as PostgreSQL's claim
-- function does: left to itself, SQLite reads every scheduled run through
-- the status index and sorts them, sleeping ones included. Each claim bumps
-- the run's epoch: the fencing token its writes carry. The queue limits are
-- applied around it, under the same write lock (store/sqlite_claim.py).
UPDATE everystep_workflow
SET status = 'running', claimed_by = :claimer, claimed_at = :now, claim_epoch = claim_epoch + 1,
    first_claimed_at = coalesce(first_claimed_at, :now)
WHERE id IN (
    SELECT c.id FROM (SELECT DISTINCT value AS name FROM json_each(:names)) AS served
    JOIN everystep_workflow AS c ON c.id IN (
        SELECT w.id FROM everystep_workflow AS w INDEXED BY everystep_workflow_claimable
        WHERE w.status = 'scheduled' AND w.queue = :queue AND w.priority = :priority
          AND w.name = served.name AND coalesce(w.not_before, w.created_at) <= :now
          AND (:versions IS NULL OR w.app_version IS NULL
               OR w.app_version IN (SELECT value FROM json_each(:versions)))
        ORDER BY coalesce(w.not_before, w.created_at)
        LIMIT :limit)
    ORDER BY coalesce(c.not_before, c.created_at), c.id
    LIMIT :limit
)
RETURNING {run_columns},
    -- One probe per run: a run without steps (most claims) is not read again.
    EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = everystep_workflow.id) AS has_steps

-- name: claim_name_due
-- One served workflow's due runs at one priority of a queue, earliest due
-- first: one range of the claimable index. Keys at their limit (``busy``)
-- and runs already passed over (``skipped``) are left out.
SELECT id, concurrency_key AS key, coalesce(not_before, created_at) AS due
FROM everystep_workflow INDEXED BY everystep_workflow_claimable
WHERE status = 'scheduled' AND queue = :queue AND priority = :priority AND name = :name
  AND coalesce(not_before, created_at) <= :now
  AND (:versions IS NULL OR app_version IS NULL OR app_version IN (SELECT value FROM json_each(:versions)))
  AND (concurrency_key IS NULL OR concurrency_key NOT IN (SELECT value FROM json_each(:busy)))
  AND id NOT IN (SELECT value FROM json_each(:skipped))
ORDER BY coalesce(not_before, created_at)
LIMIT :limit

-- name: claim_next_name
-- The first workflow name after :after holding scheduled runs at one
-- priority of a queue: one probe of the claimable index.
SELECT name FROM everystep_workflow INDEXED BY everystep_workflow_claimable
WHERE status = 'scheduled' AND queue = :queue AND priority = :priority AND name > :after
ORDER BY name
LIMIT 1

-- name: claim_ids
UPDATE everystep_workflow
SET status = 'running', claimed_by = :claimer, claimed_at = :now, claim_epoch = claim_epoch + 1,
    first_claimed_at = coalesce(first_claimed_at, :now)
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'scheduled'
RETURNING {run_columns},
    EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = everystep_workflow.id) AS has_steps

-- name: claim_all_queues
-- Every queue holding scheduled runs: one index probe per queue.
WITH RECURSIVE found(queue) AS (
    SELECT (SELECT queue FROM everystep_workflow INDEXED BY everystep_workflow_claimable
            WHERE status = 'scheduled' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM everystep_workflow AS w INDEXED BY everystep_workflow_claimable
            WHERE w.status = 'scheduled' AND w.queue > found.queue ORDER BY w.queue LIMIT 1)
    FROM found WHERE found.queue IS NOT NULL
)
SELECT queue FROM found WHERE queue IS NOT NULL

-- name: claim_queue_settings
SELECT name, concurrency, key_concurrency, rate_limit, rate_period, paused FROM everystep_queue
WHERE name IN (SELECT value FROM json_each(:queues))

-- name: next_priority
SELECT priority FROM everystep_workflow INDEXED BY everystep_workflow_claimable
WHERE status = 'scheduled' AND queue = :queue AND priority < :below
ORDER BY priority DESC
LIMIT 1

-- name: queue_running
SELECT count(*) AS n FROM everystep_workflow INDEXED BY everystep_workflow_queue_running
WHERE status = 'running' AND queue = :queue

-- name: queue_busy_keys
SELECT concurrency_key AS key, count(*) AS n FROM everystep_workflow INDEXED BY everystep_workflow_queue_running
WHERE status = 'running' AND queue = :queue AND concurrency_key IS NOT NULL
GROUP BY concurrency_key

-- name: queue_rate_prune
DELETE FROM everystep_queue_claim WHERE queue = :queue AND claimed_at < :since

-- name: queue_rate_used
SELECT count(*) AS n FROM everystep_queue_claim WHERE queue = :queue

-- name: queue_rate_log
INSERT INTO everystep_queue_claim (queue, claimed_at) SELECT :queue, :now FROM json_each(:ids)

-- name: claim_own
-- Catch-up: re-claim (bumping the epoch, which fences any stale execution)
-- runs left running under this name that nothing here executes.
UPDATE everystep_workflow
SET claim_epoch = claim_epoch + 1
WHERE id IN (
    SELECT id FROM everystep_workflow
    WHERE status = 'running' AND claimed_by = :claimer
      AND name IN (SELECT value FROM json_each(:names))
      AND id NOT IN (SELECT value FROM json_each(:exclude))
    ORDER BY created_at
    LIMIT :limit
)
RETURNING {run_columns},
    EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = everystep_workflow.id) AS has_steps

-- name: _claim_fence
-- Fragment (see everystep/store/queries): the fence of every executor
-- write, "while this claim (claimer and epoch) is still the run's current one".
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
      AND claim_epoch = :claim_epoch
)

-- name: _step_row
-- Fragment: the step record's insert; a SELECT of its values follows.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at, cpu_seconds, peak_rss_bytes)

-- name: _step_values
-- Fragment: the step record's values, a SELECT for the fence to follow.
SELECT :run_id, :step_id, :name, :args, :kwargs, :status, :result, :error, :started_at, :now,
       :attempt, :wake_at, :cpu_seconds, :peak_rss_bytes

-- name: _step_upsert
-- Fragment: a row still waiting for its outcome is replaced.
ON CONFLICT (workflow_id, step_id) DO UPDATE
SET name = excluded.name, args = excluded.args, kwargs = excluded.kwargs,
    status = excluded.status, result = excluded.result, error = excluded.error,
    started_at = excluded.started_at, completed_at = excluded.completed_at,
    attempt = excluded.attempt, wake_at = excluded.wake_at,
    cpu_seconds = excluded.cpu_seconds, peak_rss_bytes = excluded.peak_rss_bytes
WHERE everystep_step.status IN {step_open_statuses}

-- name: record_step
{_step_row}
{_step_values}
{_claim_fence}
{_step_upsert}
RETURNING completed_at

-- name: record_step_marked
-- record_step and one patch marker (everystep.patches) in one statement,
-- so the marker takes no statement or transaction of its own; one fence
-- for both rows. The marker row conflicts only with itself, already
-- `done`: the upsert leaves it. No RETURNING: on this two-row insert
-- SQLite would put the rows and the returned rows in temporary tables,
-- ten times what the marker row itself costs; two changes say both rows
-- were written (SQLiteStore._record_step_marked).
{_step_row}
SELECT * FROM (
{_step_values}
UNION ALL
SELECT :run_id, :marker_id, :marker_name, :marker_args, '{{}}', 'done', :marker_result, NULL, :now, :now,
       1, NULL, NULL, NULL
)
{_claim_fence}
{_step_upsert}

-- name: record_marker
-- A patch marker (everystep.patches), in the transaction of the write it
-- goes with, before that write. Fenced like every step record; a marker
-- already recorded is left as it is.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, started_at, completed_at, attempt)
SELECT :run_id, :step_id, :name, :args, '{{}}', 'done', :result, :now, :now, 1
{_claim_fence}
ON CONFLICT (workflow_id, step_id) DO NOTHING

-- name: start_step
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, started_at)
SELECT :run_id, :step_id, :name, :args, :kwargs, 'started', :started_at
{_claim_fence}
ON CONFLICT (workflow_id, step_id) DO UPDATE
SET name = excluded.name, args = excluded.args, kwargs = excluded.kwargs, status = 'started',
    error = NULL, started_at = excluded.started_at, completed_at = NULL, wake_at = NULL
WHERE everystep_step.status = 'retrying'
RETURNING started_at

-- name: finish_step
UPDATE everystep_step
SET status = :status, result = :result, error = :error, completed_at = :now,
    cpu_seconds = :cpu_seconds, peak_rss_bytes = :peak_rss_bytes
WHERE workflow_id = :run_id AND step_id = :step_id AND status = 'started'
  AND EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
      AND claim_epoch = :claim_epoch
  )
RETURNING completed_at

-- name: step_conflict
SELECT (SELECT count(*) FROM everystep_workflow
        WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
          AND claim_epoch = :claim_epoch) AS owned,
       {step_columns_s}
FROM (SELECT 1) AS one
LEFT JOIN everystep_step AS s ON s.workflow_id = :run_id AND s.step_id = :step_id

-- name: finish_run
-- The parent to wake (wake_waiter), if the run is a child.
UPDATE everystep_workflow
SET status = :status, result = :result, error = :error, completed_at = :now
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
  AND claim_epoch = :claim_epoch
RETURNING id, parent_id AS wake_parent

-- name: requeue
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
  AND claim_epoch = :claim_epoch
RETURNING id

-- name: requeue_all
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE status = 'running' AND claimed_by = :claimer
RETURNING id

-- name: queue_stats
SELECT
    (SELECT count(*) FROM everystep_workflow
       WHERE status = 'scheduled' AND coalesce(not_before, created_at) <= :now) AS pending,
    (SELECT count(*) FROM everystep_workflow
       WHERE status = 'scheduled' AND coalesce(not_before, created_at) > :now) AS waiting,
    (SELECT count(*) FROM everystep_workflow WHERE status = 'running') AS running,
    (SELECT count(*) FROM everystep_workflow WHERE status = 'blocked') AS blocked,
    (SELECT :now_epoch - (julianday(min(coalesce(not_before, created_at))) - 2440587.5) * 86400.0
       FROM everystep_workflow
       WHERE status = 'scheduled' AND coalesce(not_before, created_at) <= :now) AS oldest_age

-- name: count_scheduled
SELECT count(*) AS scheduled FROM everystep_workflow
WHERE status = 'scheduled' AND name IN (SELECT value FROM json_each(:names))

-- name: lock_run
SELECT {run_columns} FROM everystep_workflow WHERE id = :id

-- name: lock_step
SELECT {step_columns} FROM everystep_step WHERE workflow_id = :run_id AND step_id = :step_id

-- name: resolve_step_outcome
UPDATE everystep_step
SET status = :status, result = :result, error = :error, completed_at = :now
WHERE workflow_id = :run_id AND step_id = :step_id AND status = 'started'

-- name: delete_step
DELETE FROM everystep_step
WHERE workflow_id = :run_id AND step_id = :step_id AND status = 'started'

-- name: reschedule
-- Admin transitions back to the queue; the epoch bump fences the previous
-- executor.
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL,
    error = NULL, result = NULL, completed_at = NULL, claim_epoch = claim_epoch + 1
WHERE id = :run_id AND status = :from_status
RETURNING id

-- name: lock_runner
-- Under BEGIN IMMEDIATE, so concurrent starters under one name serialise.
SELECT name, kind, host, pid, lease_seconds, started_at, heartbeat_at,
       :now_epoch - heartbeat_epoch AS silent,
       (SELECT count(*) FROM everystep_workflow w
        WHERE w.status = 'running' AND w.claimed_by = :name) AS running,
       instance
FROM everystep_runner WHERE name = :name

-- name: insert_runner
INSERT INTO everystep_runner
    (name, instance, kind, host, pid, lease_seconds, started_at, heartbeat_at, heartbeat_epoch)
VALUES (:name, :instance, :kind, :host, :pid, :lease, :now, :now, :now_epoch)
ON CONFLICT (name) DO NOTHING
RETURNING name

-- name: replace_runner
UPDATE everystep_runner
SET instance = :instance, kind = :kind, host = :host, pid = :pid, lease_seconds = :lease,
    started_at = :now, heartbeat_at = :now, heartbeat_epoch = :now_epoch
WHERE name = :name

-- name: fence_runner_runs
UPDATE everystep_workflow SET claim_epoch = claim_epoch + 1
WHERE status = 'running' AND claimed_by = :name
RETURNING id

-- name: heartbeat
UPDATE everystep_runner SET heartbeat_at = :now, heartbeat_epoch = :now_epoch
WHERE name = :name AND instance = :instance
RETURNING name

-- name: unregister_runner
DELETE FROM everystep_runner WHERE name = :name AND instance = :instance

-- name: expired_runners
SELECT name FROM everystep_runner
WHERE heartbeat_epoch < :now_epoch - lease_seconds AND name <> :me

-- name: requeue_dead_runners_runs
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, claim_epoch = claim_epoch + 1
WHERE status = 'running' AND claimed_by = :claimer
RETURNING id

-- name: forget_runner
DELETE FROM everystep_runner WHERE name = :name AND heartbeat_epoch < :now_epoch - lease_seconds
RETURNING name

-- name: list_runners
SELECT r.name, r.kind, r.host, r.pid, r.lease_seconds, r.started_at, r.heartbeat_at,
       :now_epoch - r.heartbeat_epoch AS silent,
       (SELECT count(*) FROM everystep_workflow w WHERE w.status = 'running' AND w.claimed_by = r.name)
           AS running,
       r.instance
FROM everystep_runner AS r
ORDER BY r.name

-- name: claim_states
SELECT id, status, claimed_by, claim_epoch FROM everystep_workflow
WHERE id IN (SELECT value FROM json_each(:ids))

-- name: create_migration_table
CREATE TABLE IF NOT EXISTS everystep_migration (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)

-- name: applied_migrations
SELECT version, name FROM everystep_migration

-- name: rename_migration
UPDATE everystep_migration SET name = :name, applied_at = :now WHERE version = :version

-- name: insert_migration
INSERT INTO everystep_migration (version, name, applied_at) VALUES (:version, :name, :now)

-- name: migration_table_exists
SELECT count(*) AS present FROM sqlite_master WHERE type = 'table' AND name = 'everystep_migration'

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM everystep_migration

-- name: function_table_exists
-- Where each stored function's file was last applied (store/functions/;
-- this backend has none).
SELECT count(*) AS present FROM sqlite_master WHERE type = 'table' AND name = 'everystep_function'

-- name: applied_functions
SELECT name, sha256 FROM everystep_function

-- name: record_function
INSERT INTO everystep_function (name, sha256, applied_at) VALUES (:name, :sha256, :now)
ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256, applied_at = excluded.applied_at

-- name: connection_setup
-- Run on every new connection (the busy timeout is the driver's connect
-- argument; journal_mode is set apart, see sqlite.py).
PRAGMA synchronous = NORMAL;
PRAGMA foreign_keys = ON

-- name: journal_mode
PRAGMA journal_mode

-- name: use_wal
PRAGMA journal_mode = WAL

-- name: begin_write
-- Take the write lock before reading: what makes claimers disjoint.
BEGIN IMMEDIATE

-- name: commit
COMMIT

-- name: rollback
ROLLBACK

-- -- The operations console and operator requests (migration 0005) -----------

-- name: submit_request
INSERT INTO everystep_request (runner, command, args, requested_by, created_at)
VALUES (:runner, :command, :args, :requested_by, :now)
RETURNING id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at, 0.0 AS age

-- name: take_requests
UPDATE everystep_request SET status = 'taken', taken_at = :now
WHERE id IN (
    SELECT id FROM everystep_request
    WHERE runner = :runner AND status = 'pending'
    ORDER BY id
    LIMIT :limit
)
RETURNING id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at, NULL AS age

-- name: answer_request
UPDATE everystep_request SET status = 'answered', reply = :reply, answered_at = :now
WHERE id = :id AND status = 'taken'
RETURNING id

-- name: expire_request
UPDATE everystep_request SET status = 'expired', answered_at = :now
WHERE id = :id AND status = 'pending'
RETURNING id

-- name: get_request
SELECT id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at, NULL AS age
FROM everystep_request WHERE id = :id

-- name: prune_requests
DELETE FROM everystep_request WHERE created_at < :cutoff

-- name: publish_runner_detail
UPDATE everystep_runner SET detail = :detail
WHERE name = :name AND instance = :instance
RETURNING name

-- name: runner_details
SELECT name, instance, detail FROM everystep_runner WHERE detail IS NOT NULL

-- name: page_runs_older
SELECT {run_columns} FROM everystep_workflow
WHERE id >= :lo AND id <= :hi AND id < :cursor_id
  AND (:name IS NULL OR name = :name)
  AND (:queue IS NULL OR queue = :queue)
ORDER BY id DESC
LIMIT :limit

-- name: page_runs_newer
SELECT {run_columns} FROM everystep_workflow
WHERE id >= :lo AND id <= :hi AND id > :cursor_id
  AND (:name IS NULL OR name = :name)
  AND (:queue IS NULL OR queue = :queue)
ORDER BY id ASC
LIMIT :limit

-- name: page_runs_status_older
SELECT {run_columns} FROM everystep_workflow
WHERE status = :status
  AND (:waiting_at IS NULL OR not_before > :waiting_at)
  AND created_at <= :cursor_at AND (created_at, id) < (:cursor_at, :cursor_id)
  AND id >= :lo AND id <= :hi
  AND (:name IS NULL OR name = :name)
  AND (:queue IS NULL OR queue = :queue)
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: page_runs_status_newer
SELECT {run_columns} FROM everystep_workflow
WHERE status = :status
  AND (:waiting_at IS NULL OR not_before > :waiting_at)
  AND created_at >= :cursor_at AND (created_at, id) > (:cursor_at, :cursor_id)
  AND id >= :lo AND id <= :hi
  AND (:name IS NULL OR name = :name)
  AND (:queue IS NULL OR queue = :queue)
ORDER BY created_at ASC, id ASC
LIMIT :limit

-- name: count_status_upto
SELECT count(*) AS total FROM (
    SELECT 1 FROM everystep_workflow WHERE status = :status LIMIT :cap
)

-- name: count_statuses
SELECT status, count(*) AS total FROM everystep_workflow GROUP BY status

-- name: estimate_statuses
-- SQLite keeps no statistics the console could use: counts are exact.
SELECT -1.0 AS estimated_rows, NULL AS status_values, NULL AS status_shares

-- name: steps_of_runs
SELECT {step_columns} FROM everystep_step
WHERE workflow_id IN (SELECT value FROM json_each(:ids))
ORDER BY workflow_id, id

-- name: waiting_steps_of_runs
SELECT {step_columns} FROM everystep_step
WHERE workflow_id IN (SELECT value FROM json_each(:ids)) AND status IN {step_waiting_statuses}
ORDER BY workflow_id, id

-- name: prune_count
-- What `everystep prune` would delete (its --dry-run and progress total).
SELECT count(*) AS runs, (SELECT count(*) FROM everystep_step AS s
                  JOIN everystep_workflow AS w ON w.id = s.workflow_id
                  WHERE w.status IN (SELECT value FROM json_each(:statuses))
                    AND w.status NOT IN {active_statuses}
                    AND w.completed_at < :cutoff) AS steps
FROM everystep_workflow
WHERE status IN (SELECT value FROM json_each(:statuses)) AND status NOT IN {active_statuses}
  AND completed_at < :cutoff

-- name: prune_pick
-- One batch of finished runs to delete, under the write lock (BEGIN
-- IMMEDIATE). The NOT IN is the guarantee that no unfinished run is ever
-- pruned, whatever statuses the caller passes.
SELECT id FROM everystep_workflow
WHERE status IN (SELECT value FROM json_each(:statuses)) AND status NOT IN {active_statuses}
  AND completed_at < :cutoff
LIMIT :limit

-- name: prune_steps
DELETE FROM everystep_step WHERE workflow_id IN (SELECT value FROM json_each(:ids))

-- name: prune_runs
DELETE FROM everystep_workflow
WHERE id IN (SELECT value FROM json_each(:ids)) AND status NOT IN {active_statuses}

-- -- The run lifecycle (migration 0006) --------------------------------------

-- name: release
-- Back to the queue until :not_before (a retry's backoff, a durable sleep),
-- fenced like every executor write.
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = :not_before, wait_key = NULL
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
  AND claim_epoch = :claim_epoch
RETURNING id

-- name: defer
-- Back to the queue until :not_before after one of the engine's own
-- statements failed, holding that error meanwhile (everystep/engine_errors.py).
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = :not_before, wait_key = NULL,
    error = :error
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
  AND claim_epoch = :claim_epoch
RETURNING id

-- name: insert_attempt
INSERT INTO everystep_attempt (workflow_id, step_id, attempt, error, started_at, failed_at, retry_at)
VALUES (:run_id, :step_id, :attempt, :error, :started_at, :failed_at, :wake_at)
ON CONFLICT DO NOTHING

-- name: get_attempts
SELECT workflow_id, step_id, attempt, error, started_at, failed_at, retry_at
FROM everystep_attempt WHERE workflow_id = :id ORDER BY step_id, attempt

-- name: next_due
-- When the next scheduled run of one queue that is not due yet becomes due
-- (no row: none); the caller asks for each queue it serves.
SELECT (julianday(not_before) - julianday(:now)) * 86400.0 AS wait
FROM everystep_workflow INDEXED BY everystep_workflow_waiting
WHERE status = 'scheduled' AND not_before IS NOT NULL AND queue = :queue AND not_before > :now
ORDER BY not_before
LIMIT 1

-- name: cancel_run
UPDATE everystep_workflow
SET status = 'cancelled', error = :error, completed_at = :now
WHERE id = :run_id AND status = :from_status
RETURNING id

-- name: record_cancelled_step
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at)
SELECT :run_id, :step_id, :name, :args, :kwargs, :status, :result, :error, :started_at, :now,
       :attempt, :wake_at
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = :run_id AND status = 'cancelled' AND claimed_by = :claimer
      AND claim_epoch = :claim_epoch
)
ON CONFLICT (workflow_id, step_id) DO UPDATE
SET name = excluded.name, args = coalesce(excluded.args, everystep_step.args),
    kwargs = coalesce(excluded.kwargs, everystep_step.kwargs),
    status = excluded.status, result = excluded.result, error = excluded.error,
    started_at = excluded.started_at, completed_at = excluded.completed_at,
    attempt = excluded.attempt, wake_at = excluded.wake_at
WHERE everystep_step.status IN {step_open_statuses}
RETURNING completed_at

-- name: cron_ticks
SELECT c.name, c.last_tick, c.last_run, w.status AS last_status
FROM everystep_cron AS c
LEFT JOIN everystep_workflow AS w ON w.id = c.last_run
WHERE c.name IN (SELECT value FROM json_each(:names))

-- name: record_cron_tick
INSERT INTO everystep_cron (name, last_tick, last_run) VALUES (:name, :tick, :run_id)
ON CONFLICT (name) DO UPDATE SET last_tick = excluded.last_tick, last_run = excluded.last_run
WHERE everystep_cron.last_tick < excluded.last_tick

-- -- Queues and flow control (migration 0007) ---------------------------------

-- name: lock_queue
-- Inside BEGIN IMMEDIATE, which already holds the write lock.
SELECT name, concurrency, key_concurrency, rate_limit, rate_period, paused
FROM everystep_queue WHERE name = :name

-- name: put_queue
INSERT INTO everystep_queue (name, concurrency, key_concurrency, rate_limit, rate_period, paused, updated_at)
VALUES (:name, :concurrency, :key_concurrency, :rate_limit, :rate_period, :paused, :now)
ON CONFLICT (name) DO UPDATE
SET concurrency = excluded.concurrency, key_concurrency = excluded.key_concurrency,
    rate_limit = excluded.rate_limit, rate_period = excluded.rate_period, paused = excluded.paused,
    updated_at = excluded.updated_at

-- name: queue_settings
SELECT name, concurrency, key_concurrency, rate_limit, rate_period, paused FROM everystep_queue ORDER BY name

-- name: queue_has_runs
-- Whether any run, finished or not, names the queue (an operator command
-- checking a name; a name no run has scans the table).
SELECT 1 AS found FROM everystep_workflow WHERE queue = :name LIMIT 1

-- name: queue_counts
SELECT queue,
       sum(CASE WHEN status = 'scheduled' AND coalesce(not_before, created_at) <= :now THEN 1 ELSE 0 END)
           AS pending,
       sum(CASE WHEN status = 'scheduled' AND coalesce(not_before, created_at) > :now THEN 1 ELSE 0 END)
           AS waiting,
       sum(CASE WHEN status = 'running' THEN 1 ELSE 0 END) AS running,
       sum(CASE WHEN status = 'blocked' THEN 1 ELSE 0 END) AS blocked,
       :now_epoch - (julianday(min(CASE WHEN status = 'scheduled' AND coalesce(not_before, created_at) <= :now
                                        THEN coalesce(not_before, created_at) END)) - 2440587.5) * 86400.0
           AS oldest_age
FROM everystep_workflow
WHERE status IN {active_statuses}
GROUP BY queue
ORDER BY queue

-- name: read_only_session
-- A session that cannot write (connect(read_only=True): everystep replay).
PRAGMA query_only = ON

-- -- Waiting on the world: messages, events, child runs, deadlines (migration 0013) --
-- Writers serialise on the write lock (BEGIN IMMEDIATE), so a "lock" here
-- is a plain read inside the write transaction.

-- name: lock_run_wait
SELECT id, name, status, wait_key, continued_as FROM everystep_workflow WHERE id = :run_id

-- name: lock_claimed
SELECT id, deadline, app_version FROM everystep_workflow
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer AND claim_epoch = :claim_epoch

-- name: message_by_key
SELECT id FROM everystep_message WHERE workflow_id = :run_id AND idempotency_key = :key

-- name: insert_message
INSERT INTO everystep_message (workflow_id, topic, payload, idempotency_key, created_at)
VALUES (:run_id, :topic, :payload, :key, :now)
RETURNING id

-- name: wake_waiter
UPDATE everystep_workflow
SET not_before = CASE WHEN status = 'scheduled' AND wait_key IN (:wait_key, '*') THEN :now ELSE not_before END,
    wait_key = CASE WHEN status = 'scheduled' AND wait_key IN (:wait_key, '*') THEN NULL ELSE wait_key END
WHERE id = :run_id
RETURNING id

-- name: wake_watchers
-- A set_event's wake of the runs waiting for that event alone (see the
-- PostgreSQL statement; one writer at a time here, so no wake is lost).
UPDATE everystep_workflow SET not_before = :now, wait_key = NULL
WHERE status = 'scheduled' AND wait_key = :wait_key

-- name: lock_watched
SELECT id FROM everystep_workflow WHERE id = :run_id

-- name: next_message
SELECT id, payload FROM everystep_message
WHERE workflow_id = :run_id AND topic = :topic AND consumed_step IS NULL
ORDER BY id
LIMIT 1

-- name: consume_message
UPDATE everystep_message SET consumed_step = :step_id, consumed_at = :now
WHERE id = :message_id AND consumed_step IS NULL
RETURNING id

-- name: release_wait
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = :not_before,
    wait_key = :wait_key
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer AND claim_epoch = :claim_epoch
RETURNING id

-- name: put_event
INSERT INTO everystep_event (workflow_id, key, value, updated_at)
VALUES (:run_id, :key, :value, :now)
ON CONFLICT (workflow_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at

-- name: get_event
SELECT key, value, updated_at FROM everystep_event WHERE workflow_id = :run_id AND key = :key

-- name: list_events
SELECT key, value, updated_at FROM everystep_event WHERE workflow_id = :run_id ORDER BY key

-- name: list_messages
SELECT id, topic, payload, idempotency_key, created_at, consumed_step, consumed_at
FROM everystep_message WHERE workflow_id = :run_id ORDER BY id

-- name: run_links
SELECT id, parent_id, deadline, wait_key FROM everystep_workflow WHERE id = :run_id

-- name: child_outcome
SELECT id, status, result, error, parent_id, continued_as FROM everystep_workflow WHERE id = :run_id

-- name: run_ended
-- A wait for a run's end is over (everystep.wait_kinds): a row when the
-- run has ended, or is gone.
SELECT 1 AS ended WHERE NOT EXISTS (
    SELECT 1 FROM everystep_workflow WHERE id = :run_id AND status IN {active_statuses})

-- name: list_children
SELECT {run_columns} FROM everystep_workflow WHERE parent_id = :run_id
ORDER BY created_at, id
LIMIT :limit

-- name: active_children
SELECT id FROM everystep_workflow WHERE parent_id = :run_id AND status IN {active_statuses}

-- name: expired_deadlines
SELECT id FROM everystep_workflow
WHERE deadline IS NOT NULL AND deadline <= :now AND status IN {active_statuses}
ORDER BY deadline
LIMIT :limit

-- name: stale_child_waits
SELECT p.id, p.wait_key FROM everystep_workflow AS p
JOIN everystep_workflow AS c ON p.wait_key = {wait_prefix_child} || c.id
WHERE p.status = 'scheduled' AND substr(p.wait_key, 1, {wait_prefix_child_length}) = {wait_prefix_child} AND c.status NOT IN {active_statuses}
LIMIT 100

-- name: waiting_counts
SELECT {wait_kind_of} AS kind,
       count(*) AS runs
FROM everystep_workflow
WHERE status = 'scheduled' AND not_before > :now
GROUP BY 1

-- -- Continuing as new (migration 0016) --

-- name: lock_continuing
-- continue_as_new: the run's row under its claim, locked, with what its
-- successor takes over (everystep/store/base/continuations.py).
SELECT id, name, idempotency_key, queue, priority, concurrency_key, parent_id, deadline
FROM everystep_workflow
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer AND claim_epoch = :claim_epoch

-- name: end_continued
-- The run ends `continued`, pointing at its successor, and gives its
-- idempotency key up to it (the unique index on (name, key) allows one).
UPDATE everystep_workflow
SET status = 'continued', completed_at = :now, continued_as = :new_id, idempotency_key = NULL,
    result = NULL, error = NULL
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer AND claim_epoch = :claim_epoch

-- name: insert_continuation
-- Its successor (see the PostgreSQL statement).
INSERT INTO everystep_workflow (id, name, args, idempotency_key, status, created_at, queue, priority,
                                concurrency_key, app_version, parent_id, deadline, continued_from)
VALUES (:new_id, :name, :args, :idempotency_key, 'scheduled', :now, :queue,
        :priority, :concurrency_key, :app_version, :parent_id, :deadline, :run_id)

-- name: move_unconsumed_messages
-- The messages nobody received yet go to the successor, which receives them
-- as this run would have.
UPDATE everystep_message SET workflow_id = :new_id WHERE workflow_id = :run_id AND consumed_step IS NULL

-- name: copy_events
-- What the run published stays readable on its successor.
INSERT INTO everystep_event (workflow_id, "key", value, updated_at)
SELECT :new_id, "key", value, updated_at FROM everystep_event WHERE workflow_id = :run_id

-- name: adopt_children
-- Its unfinished children are its successor's: a cancel of the chain's
-- newest run reaches them.
UPDATE everystep_workflow SET parent_id = :new_id
WHERE parent_id = :run_id AND status IN {active_statuses}

-- name: step_ids
-- Long histories (store/base/histories.py). Every step id of a run in the
-- order first recorded, as get_steps reads them: what a page of steps is
-- cut from, without reading the arguments and results of the others.
SELECT step_id FROM everystep_step WHERE workflow_id = :id ORDER BY id

-- name: steps_by_id
SELECT {step_columns} FROM everystep_step
WHERE workflow_id = :id AND step_id IN (SELECT value FROM json_each(:step_ids))

-- name: step_outline
-- Every step of a run in the order first recorded: its id, function and
-- status (and the result of the steps named results_of: a patch marker's
-- answer), what the step graph is drawn from however long the history.
SELECT step_id, name, status, CASE WHEN name = :results_of THEN result END AS result
FROM everystep_step WHERE workflow_id = :id ORDER BY id

-- name: note_history
-- A run's history as its execution under this claim left it.
UPDATE everystep_workflow SET history = :records WHERE id = :run_id AND claim_epoch = :claim_epoch

-- name: largest_history
SELECT max(history) AS records FROM everystep_workflow WHERE status IN {active_statuses}

-- name: run_cost
-- What a run's measured steps cost, summed where the rows are (no step
-- row leaves the database): `everystep show`'s cost line.
SELECT count(cpu_seconds) AS measured, sum(cpu_seconds) AS cpu_seconds,
       max(CASE WHEN cpu_seconds IS NOT NULL THEN coalesce(peak_rss_bytes, 0) END) AS peak_rss_bytes
FROM everystep_step WHERE workflow_id = :id

-- -- Streams (migration 0019, everystep.streams; see postgres.sql) -----------

-- name: stream_tail
SELECT (SELECT seq FROM everystep_stream WHERE workflow_id = w.id AND key = :key
        ORDER BY seq DESC LIMIT 1) AS seq,
       (SELECT CASE WHEN closed AND NOT withdrawn THEN 1 ELSE 0 END FROM everystep_stream
        WHERE workflow_id = w.id AND key = :key ORDER BY seq DESC LIMIT 1) AS closed
FROM everystep_workflow AS w
WHERE w.id = :run_id AND w.status = 'running' AND w.claimed_by = :claimer AND w.claim_epoch = :claim_epoch

-- name: stream_tail_live
-- `stream_tail` for a write from a step's code (see postgres.sql).
SELECT (SELECT seq FROM everystep_stream WHERE workflow_id = w.id AND key = :key
        ORDER BY seq DESC LIMIT 1) AS seq,
       (SELECT CASE WHEN closed AND NOT withdrawn THEN 1 ELSE 0 END FROM everystep_stream
        WHERE workflow_id = w.id AND key = :key ORDER BY seq DESC LIMIT 1) AS closed
FROM everystep_workflow AS w
WHERE w.id = :run_id AND w.status = 'running' AND w.claimed_by = :claimer AND w.claim_epoch = :claim_epoch

-- name: stream_withdraw
UPDATE everystep_stream SET withdrawn = 1, value = NULL
WHERE workflow_id = :run_id AND step_id = :step_id AND attempt IS NOT NULL
  AND attempt <> :attempt AND NOT withdrawn

-- name: stream_append
INSERT INTO everystep_stream (workflow_id, key, seq, value, step_id, attempt, closed, written_at)
VALUES (:run_id, :key, :seq, :value, :step_id, :attempt, :closed, :now)
ON CONFLICT DO NOTHING

-- name: stream_read
SELECT seq, value, step_id, attempt, closed, written_at FROM everystep_stream
WHERE workflow_id = :run_id AND key = :key AND seq > :after AND NOT withdrawn
ORDER BY seq LIMIT :limit

-- name: stream_keys
SELECT key, max(seq) AS seq, max(CASE WHEN closed THEN 1 ELSE 0 END) AS closed
FROM everystep_stream WHERE workflow_id = :run_id AND NOT withdrawn
GROUP BY key ORDER BY key

-- -- Debounced scheduling (migration 0020; store/base/debounce.py) --

-- name: debounce_take
-- See queries/postgres.sql. The upsert is the first write of the
-- transaction: it takes SQLite's one write lock, so schedulers of any key
-- run one after another from here to their commit.
INSERT INTO everystep_debounce (name, debounce_key, run_id, first_at)
VALUES (:name, :debounce_key, :id, :now)
ON CONFLICT (name, debounce_key) DO UPDATE SET calls = everystep_debounce.calls + 1
RETURNING run_id, first_at

-- name: debounce_fold
UPDATE everystep_workflow
SET args = :args, not_before = :not_before, debounce_calls = debounce_calls + 1
WHERE id = :run_id AND status = 'scheduled' AND first_claimed_at IS NULL AND debounce_calls IS NOT NULL
RETURNING {run_columns}, debounce_calls

-- name: debounce_move
UPDATE everystep_debounce SET run_id = :id, first_at = :now
WHERE name = :name AND debounce_key = :debounce_key
RETURNING run_id

-- name: debounce_open
INSERT INTO everystep_workflow (id, name, args, status, created_at, not_before, queue, priority,
                                concurrency_key, app_version, deadline, wait_key, debounce_calls)
VALUES (:id, :name, :args, 'scheduled', :now, :not_before, :queue, :priority, :concurrency_key, :app_version,
        :deadline, :wait_key, 1)
RETURNING {run_columns}, debounce_calls

-- name: debounce_windows
SELECT id, wait_key, debounce_calls FROM everystep_workflow
WHERE id IN (SELECT value FROM json_each(:ids)) AND debounce_calls IS NOT NULL
