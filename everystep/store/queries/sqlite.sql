-- Every SQL statement everystep runs on SQLite, by name.
-- Parameters use sqlite3's :name style. Timestamps are ISO-8601 UTC text
-- written by Python, JSON columns are text. Writers serialise on SQLite's
-- single write lock; claims take it up front with BEGIN IMMEDIATE.

-- name: schedule
INSERT INTO everystep_workflow (id, name, args, idempotency_key, status, created_at)
VALUES (:id, :name, :args, :idempotency_key, 'scheduled', :now)
ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING {run_columns}

-- name: get_run_by_key
SELECT {run_columns} FROM everystep_workflow
WHERE name = :name AND idempotency_key = :idempotency_key

-- name: get_run
SELECT {run_columns} FROM everystep_workflow WHERE id = :id

-- name: list_runs
SELECT {run_columns} FROM everystep_workflow
WHERE (:status IS NULL OR status = :status) AND (:name IS NULL OR name = :name)
ORDER BY created_at DESC, id DESC
LIMIT :limit

-- name: get_steps
SELECT {step_columns} FROM everystep_step WHERE workflow_id = :id ORDER BY id

-- name: claim
UPDATE everystep_workflow
SET status = 'running', claimed_by = :claimer, claimed_at = :now
WHERE id IN (
    SELECT id FROM everystep_workflow
    WHERE status = 'scheduled' AND name IN (SELECT value FROM json_each(:names))
    ORDER BY created_at
    LIMIT :limit
)
RETURNING {run_columns}

-- name: claim_own
SELECT {run_columns} FROM everystep_workflow
WHERE status = 'running' AND claimed_by = :claimer
  AND name IN (SELECT value FROM json_each(:names))
  AND id NOT IN (SELECT value FROM json_each(:exclude))
ORDER BY created_at
LIMIT :limit

-- name: record_step
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at)
SELECT :run_id, :step_id, :name, :args, :kwargs, :status, :result, :error, :started_at, :now
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
)
ON CONFLICT (workflow_id, step_id) DO UPDATE
SET name = excluded.name, args = excluded.args, kwargs = excluded.kwargs,
    status = excluded.status, result = excluded.result, error = excluded.error,
    started_at = excluded.started_at, completed_at = excluded.completed_at
WHERE everystep_step.status = 'started'
RETURNING completed_at

-- name: start_step
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, started_at)
SELECT :run_id, :step_id, :name, :args, :kwargs, 'started', :started_at
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
)
ON CONFLICT (workflow_id, step_id) DO NOTHING
RETURNING started_at

-- name: finish_step
UPDATE everystep_step
SET status = :status, result = :result, error = :error, completed_at = :now
WHERE workflow_id = :run_id AND step_id = :step_id AND status = 'started'
  AND EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
  )
RETURNING completed_at

-- name: step_conflict
SELECT (SELECT count(*) FROM everystep_workflow
        WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer),
       {step_columns_s}
FROM (SELECT 1) AS one
LEFT JOIN everystep_step AS s ON s.workflow_id = :run_id AND s.step_id = :step_id

-- name: finish_run
UPDATE everystep_workflow
SET status = :status, result = :result, error = :error, completed_at = :now
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
RETURNING id

-- name: requeue
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE id = :run_id AND status = 'running' AND claimed_by = :claimer
RETURNING id

-- name: requeue_all
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE status = 'running' AND claimed_by = :claimer
RETURNING id

-- name: queue_stats
SELECT
    (SELECT count(*) FROM everystep_workflow WHERE status = 'scheduled'),
    (SELECT count(*) FROM everystep_workflow WHERE status = 'running'),
    (SELECT count(*) FROM everystep_workflow WHERE status = 'blocked'),
    (SELECT min(created_at) FROM everystep_workflow WHERE status = 'scheduled')

-- name: count_scheduled
SELECT count(*) FROM everystep_workflow
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
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL,
    error = NULL, result = NULL, completed_at = NULL
WHERE id = :run_id AND status = :from_status
RETURNING id

-- name: previous_runner
SELECT instance, :epoch - heartbeat_epoch FROM everystep_runner WHERE name = :name

-- name: register_runner
INSERT INTO everystep_runner
    (name, instance, kind, host, pid, lease_seconds, started_at, heartbeat_at, heartbeat_epoch)
VALUES (:name, :instance, :kind, :host, :pid, :lease, :now, :now, :epoch)
ON CONFLICT (name) DO UPDATE
SET instance = excluded.instance, kind = excluded.kind, host = excluded.host, pid = excluded.pid,
    lease_seconds = excluded.lease_seconds, started_at = excluded.started_at,
    heartbeat_at = excluded.heartbeat_at, heartbeat_epoch = excluded.heartbeat_epoch

-- name: heartbeat
UPDATE everystep_runner SET heartbeat_at = :now, heartbeat_epoch = :epoch
WHERE name = :name AND instance = :instance
RETURNING name

-- name: unregister_runner
DELETE FROM everystep_runner WHERE name = :name AND instance = :instance

-- name: expired_runners
SELECT name FROM everystep_runner
WHERE heartbeat_epoch < :epoch - lease_seconds AND name <> :me

-- name: forget_runner
DELETE FROM everystep_runner WHERE name = :name AND heartbeat_epoch < :epoch - lease_seconds
RETURNING name

-- name: list_runners
SELECT r.name, r.kind, r.host, r.pid, r.lease_seconds, r.started_at, r.heartbeat_at,
       :epoch - r.heartbeat_epoch,
       (SELECT count(*) FROM everystep_workflow w WHERE w.status = 'running' AND w.claimed_by = r.name)
FROM everystep_runner AS r
ORDER BY r.name

-- name: prune_count
-- What `everystep prune` would delete (its --dry-run and progress total).
SELECT count(*), (SELECT count(*) FROM everystep_step AS s
                  JOIN everystep_workflow AS w ON w.id = s.workflow_id
                  WHERE w.status IN (SELECT value FROM json_each(:statuses))
                    AND w.status NOT IN ('scheduled', 'running', 'blocked')
                    AND w.completed_at < :cutoff)
FROM everystep_workflow
WHERE status IN (SELECT value FROM json_each(:statuses)) AND status NOT IN ('scheduled', 'running', 'blocked')
  AND completed_at < :cutoff

-- name: prune_pick
-- One batch of finished runs to delete, under the write lock (BEGIN
-- IMMEDIATE). The NOT IN is the guarantee that no unfinished run is ever
-- pruned, whatever statuses the caller passes.
SELECT id FROM everystep_workflow
WHERE status IN (SELECT value FROM json_each(:statuses)) AND status NOT IN ('scheduled', 'running', 'blocked')
  AND completed_at < :cutoff
LIMIT :limit

-- name: prune_steps
DELETE FROM everystep_step WHERE workflow_id IN (SELECT value FROM json_each(:ids))

-- name: prune_runs
DELETE FROM everystep_workflow
WHERE id IN (SELECT value FROM json_each(:ids)) AND status NOT IN ('scheduled', 'running', 'blocked')
