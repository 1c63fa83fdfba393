-- Every SQL statement everystep runs on PostgreSQL, by name.
-- Parameters use psycopg's %(name)s style. Runs are selected with the
-- column list of `run_columns`; steps with `step_columns`.

-- name: schedule
-- Insert a run and wake LISTENing runners in the same transaction: the
-- notification is delivered on commit, never for a rolled-back insert.
WITH inserted AS (
    INSERT INTO everystep_workflow (id, name, args, idempotency_key, status, created_at)
    VALUES (%(id)s, %(name)s, %(args)s::json, %(idempotency_key)s, 'scheduled', clock_timestamp())
    ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING {run_columns}
)
SELECT inserted.*, pg_notify('everystep_scheduled', inserted.name)::text AS notified FROM inserted

-- name: get_run_by_key
SELECT {run_columns} FROM everystep_workflow
WHERE name = %(name)s AND idempotency_key = %(idempotency_key)s

-- name: get_run
SELECT {run_columns} FROM everystep_workflow WHERE id = %(id)s

-- name: list_runs
SELECT {run_columns} FROM everystep_workflow
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: get_steps
SELECT {step_columns} FROM everystep_step WHERE workflow_id = %(id)s ORDER BY id

-- name: claim
-- Oldest first; SKIP LOCKED lets concurrent claimers take disjoint sets
-- without waiting on each other. Only workflows this runner knows. The
-- statement lives in a function (migration 0003) that pins its plan and
-- commits asynchronously; see there why both are safe and needed.
SELECT * FROM everystep_claim(%(claimer)s, %(names)s, %(limit)s)

-- name: claim_own
-- Startup catchup: runs a crashed process under this name left running.
SELECT {run_columns},
    EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = everystep_workflow.id)
FROM everystep_workflow
WHERE status = 'running' AND claimed_by = %(claimer)s AND name = ANY(%(names)s)
  AND NOT (id = ANY(%(exclude)s::uuid[]))
ORDER BY created_at
LIMIT %(limit)s

-- name: record_step
-- Record a finished step, but only while this claimer still owns the run.
-- A leftover `started` row (the step was unsafe in older code) is replaced.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s::json, %(kwargs)s::json, %(status)s,
       %(result)s::json, %(error)s::json, %(started_at)s, clock_timestamp()
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
)
ON CONFLICT (workflow_id, step_id) DO UPDATE
SET name = EXCLUDED.name, args = EXCLUDED.args, kwargs = EXCLUDED.kwargs,
    status = EXCLUDED.status, result = EXCLUDED.result, error = EXCLUDED.error,
    started_at = EXCLUDED.started_at, completed_at = EXCLUDED.completed_at
WHERE everystep_step.status = 'started'
RETURNING completed_at

-- name: start_step
-- The atomic claim on an unsafe step's effect: exactly one insert wins.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, started_at)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s::json, %(kwargs)s::json, 'started',
       %(started_at)s
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
)
ON CONFLICT (workflow_id, step_id) DO NOTHING
RETURNING started_at

-- name: finish_step
UPDATE everystep_step
SET status = %(status)s, result = %(result)s::json, error = %(error)s::json,
    completed_at = clock_timestamp()
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND status = 'started'
  AND EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  )
RETURNING completed_at

-- name: step_conflict
-- After a refused step write: do we still own the run, and what is recorded?
SELECT (SELECT count(*) FROM everystep_workflow
        WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s),
       {step_columns_s}
FROM (SELECT 1) AS one
LEFT JOIN everystep_step AS s ON s.workflow_id = %(run_id)s AND s.step_id = %(step_id)s

-- name: finish_run
-- Asynchronous commit, like claims: every step is already durable, so if a
-- crash loses this write the run is still running under its claimer and a
-- replay from the recorded steps writes the same outcome again.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
UPDATE everystep_workflow
SET status = %(status)s, result = %(result)s::json, error = %(error)s::json,
    completed_at = clock_timestamp()
FROM async_commit
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
RETURNING id

-- name: requeue
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
RETURNING id

-- name: requeue_all
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE status = 'running' AND claimed_by = %(claimer)s
RETURNING id

-- name: queue_stats
SELECT
    (SELECT count(*) FROM everystep_workflow WHERE status = 'scheduled'),
    (SELECT count(*) FROM everystep_workflow WHERE status = 'running'),
    (SELECT count(*) FROM everystep_workflow WHERE status = 'blocked'),
    (SELECT extract(epoch FROM clock_timestamp() - min(created_at))
       FROM everystep_workflow WHERE status = 'scheduled')

-- name: count_scheduled
SELECT count(*) FROM everystep_workflow WHERE status = 'scheduled' AND name = ANY(%(names)s)

-- name: lock_run
SELECT {run_columns} FROM everystep_workflow WHERE id = %(id)s FOR UPDATE

-- name: lock_step
SELECT {step_columns} FROM everystep_step
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s FOR UPDATE

-- name: resolve_step_outcome
UPDATE everystep_step
SET status = %(status)s, result = %(result)s::json, error = %(error)s::json,
    completed_at = clock_timestamp()
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND status = 'started'

-- name: delete_step
DELETE FROM everystep_step
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND status = 'started'

-- name: reschedule
-- Admin transitions back to the queue, guarded on the status seen.
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL,
    error = NULL, result = NULL, completed_at = NULL
WHERE id = %(run_id)s AND status = %(from_status)s
RETURNING id

-- name: register_runner
-- Take the name (a restart under the same name replaces the old row) and
-- report what was there before, so a takeover can be logged.
WITH previous AS (
    SELECT instance, extract(epoch FROM clock_timestamp() - heartbeat_at) AS silent
    FROM everystep_runner WHERE name = %(name)s
), upserted AS (
    INSERT INTO everystep_runner (name, instance, kind, host, pid, lease_seconds, started_at, heartbeat_at)
    VALUES (%(name)s, %(instance)s, %(kind)s, %(host)s, %(pid)s, %(lease)s, clock_timestamp(), clock_timestamp())
    ON CONFLICT (name) DO UPDATE
    SET instance = EXCLUDED.instance, kind = EXCLUDED.kind, host = EXCLUDED.host, pid = EXCLUDED.pid,
        lease_seconds = EXCLUDED.lease_seconds, started_at = EXCLUDED.started_at,
        heartbeat_at = EXCLUDED.heartbeat_at
    RETURNING name
)
SELECT (SELECT instance FROM previous), (SELECT silent FROM previous) FROM upserted

-- name: heartbeat
UPDATE everystep_runner SET heartbeat_at = clock_timestamp()
WHERE name = %(name)s AND instance = %(instance)s
RETURNING name

-- name: unregister_runner
DELETE FROM everystep_runner WHERE name = %(name)s AND instance = %(instance)s

-- name: recover_expired
-- Atomically forget runners silent past their lease and requeue their runs.
-- Concurrent recoverers serialise on the DELETE's row locks, so each dead
-- runner's runs are requeued exactly once.
WITH dead AS (
    DELETE FROM everystep_runner
    WHERE heartbeat_at < clock_timestamp() - lease_seconds * interval '1 second'
      AND name <> %(me)s
    RETURNING name
)
UPDATE everystep_workflow AS w
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
FROM dead
WHERE w.status = 'running' AND w.claimed_by = dead.name
RETURNING w.id, dead.name

-- name: list_runners
SELECT r.name, r.kind, r.host, r.pid, r.lease_seconds, r.started_at, r.heartbeat_at,
       extract(epoch FROM clock_timestamp() - r.heartbeat_at),
       (SELECT count(*) FROM everystep_workflow w WHERE w.status = 'running' AND w.claimed_by = r.name)
FROM everystep_runner AS r
ORDER BY r.name

-- name: prune_count
-- What `everystep prune` would delete (its --dry-run and progress total).
SELECT count(*), (SELECT count(*) FROM everystep_step AS s
                  JOIN everystep_workflow AS w ON w.id = s.workflow_id
                  WHERE w.status = ANY(%(statuses)s) AND w.status NOT IN ('scheduled', 'running', 'blocked')
                    AND w.completed_at < %(cutoff)s)
FROM everystep_workflow
WHERE status = ANY(%(statuses)s) AND status NOT IN ('scheduled', 'running', 'blocked')
  AND completed_at < %(cutoff)s

-- name: prune_pick
-- One batch of finished runs to delete. The NOT IN is the guarantee that
-- no unfinished run is ever pruned, whatever statuses the caller passes;
-- FOR UPDATE re-checks the row after locking it, and SKIP LOCKED never
-- waits for an operator command holding one.
SELECT id FROM everystep_workflow
WHERE status = ANY(%(statuses)s) AND status NOT IN ('scheduled', 'running', 'blocked')
  AND completed_at < %(cutoff)s
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: prune_steps
DELETE FROM everystep_step WHERE workflow_id = ANY(%(ids)s::uuid[])

-- name: prune_runs
DELETE FROM everystep_workflow
WHERE id = ANY(%(ids)s::uuid[]) AND status NOT IN ('scheduled', 'running', 'blocked')
