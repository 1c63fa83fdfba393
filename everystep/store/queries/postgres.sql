-- Every SQL statement everystep runs on PostgreSQL, by name.
-- Parameters use psycopg's %(name)s style. Runs are selected with the
-- column list of `run_columns`; steps with `step_columns`.

-- name: schedule
-- Insert a run and wake LISTENing runners in the same transaction: the
-- notification is delivered on commit, never for a rolled-back insert. A
-- delayed run (not_before) notifies too: runners re-read the earliest due
-- time and set their timer by it.
WITH inserted AS (
    INSERT INTO everystep_workflow (id, name, args, idempotency_key, status, created_at, not_before,
                                    queue, priority, concurrency_key, app_version, parent_id, deadline)
    VALUES (%(id)s, %(name)s, %(args)s::json, %(idempotency_key)s, 'scheduled', clock_timestamp(),
            %(not_before)s, %(queue)s, %(priority)s, %(concurrency_key)s, %(app_version)s, %(parent_id)s::uuid,
            %(deadline)s::timestamptz)
    ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING {run_columns}
)
SELECT inserted.*, pg_notify('{scheduled_channel}', inserted.name)::text AS notified FROM inserted

-- name: insert_fork
-- A run forked from run_id (everystep fork): the same workflow, in the
-- same queue, scheduled now (with its workflow's deadline, if any); its
-- copied steps follow (fork_steps), in the same transaction.
WITH inserted AS (
    INSERT INTO everystep_workflow (id, name, args, status, created_at, queue, priority, concurrency_key,
                                    app_version, forked_from, deadline)
    VALUES (%(id)s, %(name)s, %(args)s::json, 'scheduled', clock_timestamp(), %(queue)s, %(priority)s,
            %(concurrency_key)s, %(app_version)s, %(run_id)s, %(deadline)s::timestamptz)
    RETURNING {run_columns}
)
SELECT inserted.*, pg_notify('{scheduled_channel}', inserted.name)::text AS notified FROM inserted

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
SELECT {step_columns} FROM everystep_step WHERE workflow_id = %(run_id)s ORDER BY id

-- name: forks_of
-- The runs forked from a run, oldest first (its page says them).
SELECT {run_columns} FROM everystep_workflow WHERE forked_from = %(id)s ORDER BY created_at, id

-- name: get_run_by_key
SELECT {run_columns} FROM everystep_workflow
WHERE name = %(name)s AND idempotency_key = %(idempotency_key)s

-- name: get_run
SELECT {run_columns} FROM everystep_workflow WHERE id = %(id)s

-- name: list_runs
-- `everystep runs`; waiting_at, when given (`--status waiting`), keeps the
-- scheduled runs not due before it: those that wait.
SELECT {run_columns} FROM everystep_workflow
WHERE (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(version)s::text IS NULL OR app_version = %(version)s)
  AND (%(waiting_at)s::timestamptz IS NULL OR not_before > %(waiting_at)s::timestamptz)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: count_runs_upto
-- `everystep runs` says how many runs its filters match, counting no
-- further than `cap` rows.
SELECT count(*) AS total FROM (
    SELECT 1 FROM everystep_workflow
    WHERE (%(status)s::text IS NULL OR status = %(status)s)
      AND (%(name)s::text IS NULL OR name = %(name)s)
      AND (%(version)s::text IS NULL OR app_version = %(version)s)
      AND (%(waiting_at)s::timestamptz IS NULL OR not_before > %(waiting_at)s::timestamptz)
    LIMIT %(cap)s
) AS capped

-- name: get_steps
SELECT {step_columns} FROM everystep_step WHERE workflow_id = %(id)s ORDER BY id

-- name: replay_steps
-- What a replay needs of each step, and nothing more (not its arguments,
-- its costs or when it ended): read once per claim of a run with history.
-- Results and errors as text: decoded when the replay reaches their step
-- (PostgresStore._replay_json), not each by psycopg's loader as read.
SELECT step_id, name, status, result::text AS result, error::text AS error, attempt, started_at, wake_at
FROM everystep_step WHERE workflow_id = %(id)s ORDER BY id

-- name: ping
SELECT 1 AS one

-- name: claim
-- Runs that are due (not_before passed, or none), from the queues this
-- runner serves (NULL: all) that are not paused, each queue within its
-- limits, highest priority first, then earliest due; SKIP LOCKED lets
-- concurrent claimers take disjoint sets without waiting on each other.
-- Only workflows this runner knows. The statement lives in functions
-- (migrations 0003, 0006, 0007) that pin the plan to the partial index of
-- scheduled runs, stop at the first run not yet due, enforce the queue
-- limits under the queue's row lock, and commit asynchronously; see there.
SELECT * FROM everystep_claim(%(claimer)s, %(names)s, %(limit)s, %(queues)s::text[], %(versions)s::text[])

-- name: claim_own
-- Catch-up: re-claim runs left running under this name by a process that
-- died (or that nothing here executes any more). Re-claiming bumps the
-- epoch, so a stale execution of the same run under this name is fenced.
WITH picked AS (
    SELECT id FROM everystep_workflow
    WHERE status = 'running' AND claimed_by = %(claimer)s AND name = ANY(%(names)s)
      AND NOT (id = ANY(%(exclude)s::uuid[]))
    ORDER BY created_at
    LIMIT %(limit)s
    FOR UPDATE
)
UPDATE everystep_workflow AS w
SET claim_epoch = w.claim_epoch + 1
FROM picked
WHERE w.id = picked.id AND w.status = 'running' AND w.claimed_by = %(claimer)s
RETURNING {run_columns_w},
    -- A probe per run, never a hash of the step table (see migration 0010).
    coalesce((SELECT true FROM everystep_step AS s WHERE s.workflow_id = w.id LIMIT 1), false) AS has_steps

-- name: _claim_fence
-- Fragment: the fence of every executor write, "while this claim (claimer
-- and epoch) is still the run's current one".
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
)

-- name: _step_row
-- Fragment: the step row a record inserts, a SELECT for the fence to follow.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at, cpu_seconds, peak_rss_bytes)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s::json, %(kwargs)s::json, %(status)s,
       %(result)s::json, %(error)s::json, %(started_at)s, clock_timestamp(), %(attempt)s,
       %(wake_at)s::timestamptz, %(cpu_seconds)s::float8, %(peak_rss_bytes)s::bigint

-- name: _step_upsert
-- Fragment: a row still waiting for its outcome is replaced (see record_step).
ON CONFLICT (workflow_id, step_id) DO UPDATE
SET name = EXCLUDED.name, args = EXCLUDED.args, kwargs = EXCLUDED.kwargs,
    status = EXCLUDED.status, result = EXCLUDED.result, error = EXCLUDED.error,
    started_at = EXCLUDED.started_at, completed_at = EXCLUDED.completed_at,
    attempt = EXCLUDED.attempt, wake_at = EXCLUDED.wake_at,
    cpu_seconds = EXCLUDED.cpu_seconds, peak_rss_bytes = EXCLUDED.peak_rss_bytes
WHERE everystep_step.status IN {step_open_statuses}

-- name: record_step
-- Record a finished step, but only while this claim (claimer and epoch) is
-- still the run's current one.
-- A row still waiting for its outcome is replaced: `started` (the step was
-- unsafe in older code), `retrying` (this is its next attempt), `sleeping`
-- (the sleep is over). The cost columns (migration 0008) are NULL where
-- nothing measured the step.
{_step_row}
{_claim_fence}
{_step_upsert}
RETURNING completed_at

-- name: record_step_marked
-- record_step and one patch marker (everystep.patches) in one statement,
-- so the marker takes no statement or transaction of its own (and, on the
-- runner's path, no round trip).
WITH marker AS (
    INSERT INTO everystep_step
        (workflow_id, step_id, name, args, kwargs, status, result, started_at, completed_at, attempt)
    SELECT %(run_id)s, %(marker_id)s, %(marker_name)s, %(marker_args)s::json, '{{}}'::json, 'done',
           %(marker_result)s::json, clock_timestamp(), clock_timestamp(), 1
    {_claim_fence}
    ON CONFLICT (workflow_id, step_id) DO NOTHING
)
{_step_row}
{_claim_fence}
{_step_upsert}
RETURNING step_id, completed_at

-- name: record_marker
-- A patch marker (everystep.patches), in the transaction of the write it
-- goes with, before that write. Fenced like every step record; a marker
-- already recorded is left as it is.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, started_at, completed_at, attempt)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s::json, '{{}}'::json, 'done', %(result)s::json,
       clock_timestamp(), clock_timestamp(), 1
{_claim_fence}
ON CONFLICT (workflow_id, step_id) DO NOTHING

-- name: start_step
-- The atomic claim on an unsafe step's effect: exactly one insert wins. A
-- `retrying` row (the step was retried under older code that did not mark
-- it unsafe) is taken over the same way: one update wins.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, started_at)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s::json, %(kwargs)s::json, 'started',
       %(started_at)s
{_claim_fence}
ON CONFLICT (workflow_id, step_id) DO UPDATE
SET name = EXCLUDED.name, args = EXCLUDED.args, kwargs = EXCLUDED.kwargs, status = 'started',
    error = NULL, started_at = EXCLUDED.started_at, completed_at = NULL, wake_at = NULL
WHERE everystep_step.status = 'retrying'
RETURNING started_at

-- name: finish_step
UPDATE everystep_step
SET status = %(status)s, result = %(result)s::json, error = %(error)s::json,
    completed_at = clock_timestamp(),
    cpu_seconds = %(cpu_seconds)s::float8, peak_rss_bytes = %(peak_rss_bytes)s::bigint
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND status = 'started'
  AND EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
  )
RETURNING completed_at

-- name: record_step_locked
-- A transactional step's record, in the transaction of its own writes
-- (everystep/store/base/step_transactions.py): record_step, except that
-- the run's row is locked FOR SHARE, to the commit, so a claim cannot bump
-- the epoch between this fence check and the commit (it waits for it).
{_step_row}
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
    FOR SHARE
)
{_step_upsert}
RETURNING completed_at

-- name: begin_write
-- A transactional step's transaction (the store's own use conn.transaction()).
BEGIN

-- name: commit
COMMIT

-- name: rollback
ROLLBACK

-- name: step_conflict
-- After a refused step write: do we still own the run, and what is recorded?
SELECT (SELECT count(*) FROM everystep_workflow
        WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
          AND claim_epoch = %(claim_epoch)s) AS owned,
       {step_columns_s}
FROM (SELECT 1) AS one
LEFT JOIN everystep_step AS s ON s.workflow_id = %(run_id)s AND s.step_id = %(step_id)s

-- name: _wake_parent
-- Fragment: the CTE that wakes the parent of the run a statement just
-- `finished`, if it waits for that child (see finish_run); `woken` rows
-- are notified by the statement's last line.
woke AS (
    UPDATE everystep_workflow AS p
    SET not_before = CASE WHEN p.status = 'scheduled' AND p.wait_key IN ({wait_prefix_child} || finished.id::text, '*')
                          THEN clock_timestamp() ELSE p.not_before END,
        wait_key = CASE WHEN p.status = 'scheduled' AND p.wait_key IN ({wait_prefix_child} || finished.id::text, '*')
                        THEN NULL ELSE p.wait_key END
    FROM finished
    WHERE p.id = finished.parent_id
    RETURNING p.name, p.status = 'scheduled' AND p.wait_key IS NULL AS woken
)

-- name: finish_run
-- Asynchronous commit, like claims: every step is already durable, so if a
-- crash loses this write the run is still running under its claimer and a
-- replay from the recorded steps writes the same outcome again.
-- A child run's end wakes its parent if the parent waits for it (`woke`,
-- as wake_waiter: the parent's row is locked whatever it holds, so a
-- parent releasing itself at this moment sees this end or is woken by it).
-- wake_parent is NULL: nothing is left for the caller to wake.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), finished AS (
    UPDATE everystep_workflow
    SET status = %(status)s, result = %(result)s::json, error = %(error)s::json,
        completed_at = clock_timestamp()
    FROM async_commit
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
    RETURNING id, parent_id
), {_wake_parent}
SELECT finished.id, NULL::uuid AS wake_parent FROM finished
WHERE (SELECT count(pg_notify('{scheduled_channel}', woke.name)) FROM woke WHERE woke.woken) >= 0

-- name: _owned_locked
-- Fragment: the CTE locking the run's row under this claim, first, so every
-- write of the statement sees the same claim (the last write's forms).
owned AS (
    SELECT id FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
    FOR UPDATE
)

-- name: _last_step_and_status
-- Fragment: after `owned`, the last step's record (`step`), the run's
-- terminal status only if that row was written (`finished`), its parent
-- woken if it waits for this run (`woke`), and the statement's one row.
step AS (
    INSERT INTO everystep_step
        (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
         attempt, wake_at, cpu_seconds, peak_rss_bytes)
    SELECT owned.id, %(step_id)s, %(name)s, %(args)s::json, %(kwargs)s::json, %(step_status)s,
           %(step_result)s::json, %(step_error)s::json, %(started_at)s, clock_timestamp(), %(attempt)s,
           %(wake_at)s::timestamptz, %(cpu_seconds)s::float8, %(peak_rss_bytes)s::bigint
    FROM owned
    {_step_upsert}
    RETURNING completed_at
), finished AS (
    UPDATE everystep_workflow
    SET status = %(status)s, result = %(result)s::json, error = %(error)s::json,
        completed_at = clock_timestamp()
    WHERE id = (SELECT id FROM owned) AND EXISTS (SELECT 1 FROM step)
    RETURNING id, parent_id
), {_wake_parent}
SELECT step.completed_at FROM step, finished
WHERE (SELECT count(pg_notify('{scheduled_channel}', woke.name)) FROM woke WHERE woke.woken) >= 0

-- name: finish_run_with_step
-- The run's last step and its terminal status in one statement: one round
-- trip and one durable commit (the step record needs it) where record_step
-- and finish_run take two. The run row is locked first, under the claim,
-- so both writes see the same claim; the status changes only if the step
-- row was written (a step that already has an outcome writes nothing). No
-- row back means nothing was written.
WITH {_owned_locked}, {_last_step_and_status}

-- name: finish_run_with_step_marked
-- finish_run_with_step and one patch marker (everystep.patches), in one
-- statement: the marker is written under the same lock of the run row.
WITH {_owned_locked}, marker AS (
    INSERT INTO everystep_step
        (workflow_id, step_id, name, args, kwargs, status, result, started_at, completed_at, attempt)
    SELECT owned.id, %(marker_id)s, %(marker_name)s, %(marker_args)s::json, '{{}}'::json, 'done',
           %(marker_result)s::json, clock_timestamp(), clock_timestamp(), 1
    FROM owned
    ON CONFLICT (workflow_id, step_id) DO NOTHING
), {_last_step_and_status}

-- name: requeue
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s
RETURNING id

-- name: requeue_all
-- A supervisor's last act at exit, once every child is gone: whatever is
-- still claimed under its name goes back to the queue.
UPDATE everystep_workflow
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL
WHERE status = 'running' AND claimed_by = %(claimer)s
RETURNING id

-- name: queue_stats
-- Pending: scheduled and due; waiting: scheduled for later (delayed,
-- sleeping, retry backoff). The oldest pending age counts from the due
-- time, so a run that slept for a month is not a month late. now() (not
-- clock_timestamp()) is stable, so it bounds the scan of the due-time index.
SELECT
    (SELECT count(*) FROM everystep_workflow
       WHERE status = 'scheduled' AND coalesce(not_before, created_at) <= now()) AS pending,
    (SELECT count(*) FROM everystep_workflow
       WHERE status = 'scheduled' AND coalesce(not_before, created_at) > now()) AS waiting,
    (SELECT count(*) FROM everystep_workflow WHERE status = 'running') AS running,
    (SELECT count(*) FROM everystep_workflow WHERE status = 'blocked') AS blocked,
    (SELECT extract(epoch FROM clock_timestamp() - min(coalesce(not_before, created_at)))
       FROM everystep_workflow
       WHERE status = 'scheduled' AND coalesce(not_before, created_at) <= now()) AS oldest_age

-- name: count_scheduled
SELECT count(*) AS scheduled FROM everystep_workflow WHERE status = 'scheduled' AND name = ANY(%(names)s)

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
-- Admin transitions back to the queue, guarded on the status seen. The epoch
-- is bumped, so whoever executed the run before can write nothing more, and
-- LISTENing runners are woken as for a new run.
WITH moved AS (
    UPDATE everystep_workflow
    SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL,
        error = NULL, result = NULL, completed_at = NULL, claim_epoch = claim_epoch + 1
    WHERE id = %(run_id)s AND status = %(from_status)s
    RETURNING id, name
)
SELECT moved.id, pg_notify('{scheduled_channel}', moved.name)::text AS notified FROM moved

-- name: notify_fenced
-- Tell a supervisor that a run it holds was taken from it (requeue --force),
-- so it kills the stale child now instead of at its next heartbeat.
SELECT pg_notify('{fence_channel}', %(runner)s || ' ' || %(run_id)s) AS notified

-- name: lock_runner
-- The current holder of a runner name, locked while a new instance decides
-- whether it may take the name.
SELECT name, kind, host, pid, lease_seconds, started_at, heartbeat_at,
       extract(epoch FROM clock_timestamp() - heartbeat_at) AS silent,
       (SELECT count(*) FROM everystep_workflow w
        WHERE w.status = 'running' AND w.claimed_by = %(name)s) AS running,
       instance
FROM everystep_runner WHERE name = %(name)s
FOR UPDATE

-- name: insert_runner
-- Take a free name; concurrent starters under one name serialise on the
-- primary key, and all but one find the row taken.
INSERT INTO everystep_runner (name, instance, kind, host, pid, lease_seconds, started_at, heartbeat_at)
VALUES (%(name)s, %(instance)s, %(kind)s, %(host)s, %(pid)s, %(lease)s, clock_timestamp(), clock_timestamp())
ON CONFLICT (name) DO NOTHING
RETURNING name

-- name: replace_runner
UPDATE everystep_runner
SET instance = %(instance)s, kind = %(kind)s, host = %(host)s, pid = %(pid)s,
    lease_seconds = %(lease)s, started_at = clock_timestamp(), heartbeat_at = clock_timestamp()
WHERE name = %(name)s

-- name: fence_runner_runs
-- A takeover: the previous holder's executions can write nothing more.
UPDATE everystep_workflow SET claim_epoch = claim_epoch + 1
WHERE status = 'running' AND claimed_by = %(name)s
RETURNING id

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
SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, claim_epoch = w.claim_epoch + 1
FROM dead
WHERE w.status = 'running' AND w.claimed_by = dead.name
RETURNING w.id, dead.name AS runner

-- name: list_runners
SELECT r.name, r.kind, r.host, r.pid, r.lease_seconds, r.started_at, r.heartbeat_at,
       extract(epoch FROM clock_timestamp() - r.heartbeat_at) AS silent,
       (SELECT count(*) FROM everystep_workflow w WHERE w.status = 'running' AND w.claimed_by = r.name)
           AS running,
       r.instance
FROM everystep_runner AS r
ORDER BY r.name

-- name: claim_states
-- Where the runs a supervisor believes it executes stand now: a run whose
-- claimer or epoch changed was taken from it, and its child must stop.
SELECT id, status, claimed_by, claim_epoch FROM everystep_workflow
WHERE id = ANY(%(ids)s::uuid[])

-- name: migration_lock
-- Any fixed 64-bit number: the advisory lock that serialises migrators,
-- released when their transaction ends.
SELECT pg_advisory_xact_lock(7309466358203447156)

-- name: create_migration_table
CREATE TABLE IF NOT EXISTS everystep_migration (
    version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL)

-- name: applied_migrations
SELECT version, name FROM everystep_migration

-- name: rename_migration
-- A placeholder version recorded earlier, now applied for real.
UPDATE everystep_migration SET name = %(name)s, applied_at = %(now)s WHERE version = %(version)s

-- name: insert_migration
INSERT INTO everystep_migration (version, name, applied_at) VALUES (%(version)s, %(name)s, %(now)s)

-- name: migration_table_exists
SELECT to_regclass('everystep_migration') IS NOT NULL AS present

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM everystep_migration

-- name: function_table_exists
-- Where each stored function's file was last applied (store/functions/).
SELECT to_regclass('everystep_function') IS NOT NULL AS present

-- name: applied_functions
SELECT name, sha256 FROM everystep_function

-- name: record_function
INSERT INTO everystep_function (name, sha256, applied_at) VALUES (%(name)s, %(sha256)s, %(now)s)
ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256, applied_at = excluded.applied_at

-- name: listen
-- Newly scheduled runs (payload: the workflow name), runs taken from their
-- holder (payload: "RUNNER RUN_ID") and operator requests (payload: the
-- runner's name). Every listener hears all three and keeps what it needs.
LISTEN {scheduled_channel};
LISTEN {fence_channel};
LISTEN {request_channel}

-- -- The operations console and operator requests (migration 0005) -----------

-- name: submit_request
-- An operator request for a runner; the NOTIFY (delivered on commit) wakes
-- the supervisor holding that name at once, polling is the fallback.
WITH inserted AS (
    INSERT INTO everystep_request (runner, command, args, requested_by, created_at)
    VALUES (%(runner)s, %(command)s, %(args)s::json, %(requested_by)s, clock_timestamp())
    RETURNING id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at
)
SELECT inserted.*, 0.0::float8 AS age, pg_notify('{request_channel}', inserted.runner)::text AS notified
FROM inserted

-- name: take_requests
-- This runner's pending requests, oldest first, with their age by the
-- database's clock (hosts' clocks may disagree). SKIP LOCKED: two instances
-- racing on one name never take the same request twice.
UPDATE everystep_request SET status = 'taken', taken_at = clock_timestamp()
WHERE id IN (
    SELECT id FROM everystep_request
    WHERE runner = %(runner)s AND status = 'pending'
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at,
          extract(epoch FROM clock_timestamp() - created_at)::float8 AS age

-- name: answer_request
UPDATE everystep_request SET status = 'answered', reply = %(reply)s::json, answered_at = clock_timestamp()
WHERE id = %(id)s AND status = 'taken'
RETURNING id

-- name: expire_request
-- The requester gave up waiting: only a request nobody took can expire.
UPDATE everystep_request SET status = 'expired', answered_at = clock_timestamp()
WHERE id = %(id)s AND status = 'pending'
RETURNING id

-- name: get_request
SELECT id, runner, command, args, status, reply, requested_by, created_at, taken_at, answered_at,
       extract(epoch FROM clock_timestamp() - created_at)::float8 AS age
FROM everystep_request WHERE id = %(id)s

-- name: prune_requests
DELETE FROM everystep_request WHERE created_at < clock_timestamp() - %(keep)s * interval '1 second'

-- name: publish_runner_detail
-- Only the live holder of the name writes its row.
UPDATE everystep_runner SET detail = %(detail)s::json
WHERE name = %(name)s AND instance = %(instance)s
RETURNING name

-- name: runner_details
SELECT name, instance, detail FROM everystep_runner WHERE detail IS NOT NULL

-- name: page_runs_older
-- The console's runs list without a status filter: newest first along the
-- primary key (ids are UUIDv7, ordered by creation time), keyset-paginated,
-- so a page costs the same on the millionth row as on the first. lo/hi
-- bound the id range (an id prefix search); cursor_id is the last id seen.
SELECT {run_columns} FROM everystep_workflow
WHERE id >= %(lo)s::uuid AND id <= %(hi)s::uuid AND id < %(cursor_id)s::uuid
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: page_runs_newer
SELECT {run_columns} FROM everystep_workflow
WHERE id >= %(lo)s::uuid AND id <= %(hi)s::uuid AND id > %(cursor_id)s::uuid
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY id ASC
LIMIT %(limit)s

-- name: page_runs_status_older
-- With a status filter: along the (status, created_at) index (for
-- `scheduled`, its partial index), keyset on (created_at, id).
SELECT {run_columns} FROM everystep_workflow
WHERE status = %(status)s
  AND (%(waiting_at)s::timestamptz IS NULL OR not_before > %(waiting_at)s::timestamptz)
  AND created_at <= %(cursor_at)s::timestamptz
  AND (created_at, id) < (%(cursor_at)s::timestamptz, %(cursor_id)s::uuid)
  AND id >= %(lo)s::uuid AND id <= %(hi)s::uuid
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: page_runs_status_newer
SELECT {run_columns} FROM everystep_workflow
WHERE status = %(status)s
  AND (%(waiting_at)s::timestamptz IS NULL OR not_before > %(waiting_at)s::timestamptz)
  AND created_at >= %(cursor_at)s::timestamptz
  AND (created_at, id) > (%(cursor_at)s::timestamptz, %(cursor_id)s::uuid)
  AND id >= %(lo)s::uuid AND id <= %(hi)s::uuid
  AND (%(name)s::text IS NULL OR name = %(name)s)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
ORDER BY created_at ASC, id ASC
LIMIT %(limit)s

-- name: count_status_upto
-- An exact count that stops at `cap` rows, so its cost is bounded however
-- large a backlog grows (scheduled and running read their partial indexes).
SELECT count(*) AS total FROM (
    SELECT 1 FROM everystep_workflow WHERE status = %(status)s LIMIT %(cap)s
) AS capped

-- name: count_statuses
SELECT status, count(*) AS total FROM everystep_workflow GROUP BY status

-- name: estimate_statuses
-- The planner's statistics (kept by autovacuum's ANALYZE): the table's
-- estimated row count and the share of each common status value.
SELECT c.reltuples::float8 AS estimated_rows, s.most_common_vals::text::text[] AS status_values,
       s.most_common_freqs::float8[] AS status_shares
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stats AS s ON s.schemaname = n.nspname AND s.tablename = c.relname AND s.attname = 'status'
WHERE c.oid = 'everystep_workflow'::regclass

-- name: steps_of_runs
SELECT {step_columns} FROM everystep_step WHERE workflow_id = ANY(%(ids)s::uuid[]) ORDER BY workflow_id, id

-- name: waiting_steps_of_runs
-- What a page of waiting runs waits for (`everystep runs`, the console's
-- list): their waiting rows only, however long their histories.
SELECT {step_columns} FROM everystep_step
WHERE workflow_id = ANY(%(ids)s::uuid[]) AND status IN {step_waiting_statuses}
ORDER BY workflow_id, id

-- name: prune_count
-- What `everystep prune` would delete (its --dry-run and progress total).
SELECT count(*) AS runs, (SELECT count(*) FROM everystep_step AS s
                  JOIN everystep_workflow AS w ON w.id = s.workflow_id
                  WHERE w.status = ANY(%(statuses)s) AND w.status NOT IN {active_statuses}
                    AND w.completed_at < %(cutoff)s) AS steps
FROM everystep_workflow
WHERE status = ANY(%(statuses)s) AND status NOT IN {active_statuses}
  AND completed_at < %(cutoff)s

-- name: prune_pick
-- One batch of finished runs to delete. The NOT IN is the guarantee that
-- no unfinished run is ever pruned, whatever statuses the caller passes;
-- FOR UPDATE re-checks the row after locking it, and SKIP LOCKED never
-- waits for an operator command holding one.
SELECT id FROM everystep_workflow
WHERE status = ANY(%(statuses)s) AND status NOT IN {active_statuses}
  AND completed_at < %(cutoff)s
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: prune_steps
DELETE FROM everystep_step WHERE workflow_id = ANY(%(ids)s::uuid[])

-- name: prune_runs
DELETE FROM everystep_workflow
WHERE id = ANY(%(ids)s::uuid[]) AND status NOT IN {active_statuses}

-- -- The run lifecycle (migration 0006) --------------------------------------

-- name: release
-- Give the run back to the queue until `not_before`: a retry's backoff or a
-- durable sleep. Fenced like every executor write, so only the execution
-- holding the claim can release the run, and nothing can claim it again
-- before that time (the claim only takes due runs). LISTENing runners are
-- told, so each sets its timer by the new due time. Committed
-- asynchronously like finish_run: what the release follows (the attempt or
-- the sleep) is already durable, and a release lost in a crash leaves the
-- run running under its claimer, whose replay releases it again.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
), released AS (
    UPDATE everystep_workflow
    SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = %(not_before)s, wait_key = NULL
    FROM async_commit
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
    RETURNING id, name
)
SELECT released.id, pg_notify('{scheduled_channel}', released.name)::text AS notified FROM released

-- name: defer
-- Give the run back to the queue until `not_before` after one of the
-- engine's own statements failed (everystep/engine_errors.py), holding
-- that error (and how many times it was given back for one) as its error
-- meanwhile; its end overwrites it. Fenced like every executor write;
-- LISTENing runners are told, so each sets its timer by the new due time.
WITH deferred AS (
    UPDATE everystep_workflow
    SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = %(not_before)s, wait_key = NULL,
        error = %(error)s::json
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
    RETURNING id, name
)
SELECT deferred.id, pg_notify('{scheduled_channel}', deferred.name)::text AS notified FROM deferred

-- name: insert_attempt
-- One failed attempt of a retried step, written in the transaction that
-- recorded the step `retrying` (which is what fences it).
INSERT INTO everystep_attempt (workflow_id, step_id, attempt, error, started_at, failed_at, retry_at)
VALUES (%(run_id)s, %(step_id)s, %(attempt)s, %(error)s::json, %(started_at)s, %(failed_at)s, %(wake_at)s)
ON CONFLICT DO NOTHING

-- name: get_attempts
SELECT workflow_id, step_id, attempt, error, started_at, failed_at, retry_at
FROM everystep_attempt WHERE workflow_id = %(id)s ORDER BY step_id, attempt

-- name: next_due
-- Seconds until the next scheduled run of the served queues that is not
-- due yet becomes due; see the function (migration 0007).
SELECT everystep_next_due(%(queues)s::text[]) AS wait

-- name: cancel_run
-- An operator's cancel, under the run's row lock, guarded on the status
-- seen. claimed_by and claim_epoch stay: the supervisor holding a running
-- run may still record the step it cuts off (record_cancelled_step), while
-- every write of the execution itself, conditional on 'running', is refused.
UPDATE everystep_workflow
SET status = 'cancelled', error = %(error)s::json, completed_at = clock_timestamp()
WHERE id = %(run_id)s AND status = %(from_status)s
RETURNING id

-- name: record_cancelled_step
-- The step a cancel cut off, recorded by the holder of the cancelled claim
-- (the supervisor that killed its child, or a threaded worker whose write
-- was refused at the step's end): fenced by that claim and the status.
INSERT INTO everystep_step
    (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
     attempt, wake_at)
SELECT %(run_id)s, %(step_id)s, %(name)s, %(args)s::json, %(kwargs)s::json, %(status)s,
       %(result)s::json, %(error)s::json, %(started_at)s, clock_timestamp(), %(attempt)s,
       %(wake_at)s::timestamptz
WHERE EXISTS (
    SELECT 1 FROM everystep_workflow
    WHERE id = %(run_id)s AND status = 'cancelled' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
)
ON CONFLICT (workflow_id, step_id) DO UPDATE
SET name = EXCLUDED.name, args = coalesce(EXCLUDED.args, everystep_step.args),
    kwargs = coalesce(EXCLUDED.kwargs, everystep_step.kwargs),
    status = EXCLUDED.status, result = EXCLUDED.result, error = EXCLUDED.error,
    started_at = EXCLUDED.started_at, completed_at = EXCLUDED.completed_at,
    attempt = EXCLUDED.attempt, wake_at = EXCLUDED.wake_at
WHERE everystep_step.status IN {step_open_statuses}
RETURNING completed_at

-- name: cron_ticks
-- The last tick enqueued for each of these periodic workflows.
SELECT c.name, c.last_tick, c.last_run, w.status AS last_status
FROM everystep_cron AS c
LEFT JOIN everystep_workflow AS w ON w.id = c.last_run
WHERE c.name = ANY(%(names)s)

-- name: record_cron_tick
-- Remember the tick just enqueued; runners enqueueing the same tick at once
-- serialise on the primary key, and the last tick only moves forward.
INSERT INTO everystep_cron (name, last_tick, last_run) VALUES (%(name)s, %(tick)s, %(run_id)s)
ON CONFLICT (name) DO UPDATE SET last_tick = EXCLUDED.last_tick, last_run = EXCLUDED.last_run
WHERE everystep_cron.last_tick < EXCLUDED.last_tick

-- -- Queues and flow control (migration 0007) ---------------------------------

-- name: lock_queue
-- An operator's change to a queue, under its row lock (claims from a
-- limited queue hold it too, so a change lands between two claims).
SELECT name, concurrency, key_concurrency, rate_limit, rate_period, paused
FROM everystep_queue WHERE name = %(name)s FOR UPDATE

-- name: put_queue
-- LISTENing runners are woken on commit, as for a new run: a resumed queue
-- or a raised limit is claimed from at once, not at the next poll.
WITH put AS (
    INSERT INTO everystep_queue (name, concurrency, key_concurrency, rate_limit, rate_period, paused, updated_at)
    VALUES (%(name)s, %(concurrency)s, %(key_concurrency)s, %(rate_limit)s, %(rate_period)s, %(paused)s,
            clock_timestamp())
    ON CONFLICT (name) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, key_concurrency = EXCLUDED.key_concurrency,
        rate_limit = EXCLUDED.rate_limit, rate_period = EXCLUDED.rate_period, paused = EXCLUDED.paused,
        updated_at = EXCLUDED.updated_at
    RETURNING name
)
SELECT pg_notify('{scheduled_channel}', put.name)::text AS notified FROM put

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
       count(*) FILTER (WHERE status = 'scheduled' AND coalesce(not_before, created_at) <= now()) AS pending,
       count(*) FILTER (WHERE status = 'scheduled' AND coalesce(not_before, created_at) > now()) AS waiting,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'blocked') AS blocked,
       extract(epoch FROM clock_timestamp() - min(coalesce(not_before, created_at))
               FILTER (WHERE status = 'scheduled' AND coalesce(not_before, created_at) <= now()))::float8
           AS oldest_age
FROM everystep_workflow
WHERE status IN {active_statuses}
GROUP BY queue
ORDER BY queue

-- -- Waiting on the world: messages, events, child runs, deadlines (migration 0013) --

-- name: lock_run_wait
-- A send's first act: the target run's row lock, held to the commit, so a
-- run releasing itself at the same moment either sees the message or is
-- woken by it (everystep/store/base/waits.py). NO KEY UPDATE: it still
-- waits for that run's own lock_claimed, but not for the key-share locks
-- of step and message inserts, so two runs whose bodies send to each other
-- at once (each send recorded in its sender's transaction) never deadlock.
SELECT id, name, status, wait_key, continued_as FROM everystep_workflow WHERE id = %(run_id)s FOR NO KEY UPDATE

-- name: lock_claimed
-- The executor's own run row, locked under its claim: a recv, a child's
-- start (which takes its deadline and code version) or end of wait, or a
-- release that checks for what ended its wait.
SELECT id, deadline, app_version FROM everystep_workflow
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
  AND claim_epoch = %(claim_epoch)s
FOR UPDATE

-- name: async_commit
-- A recv's transaction commits asynchronously, as claims and a run's last
-- write do: if a crash loses it, the message and the step's record are
-- lost together, the replay consumes the same message (the oldest on its
-- topic) again, and any later durable commit flushes this one first.
SELECT set_config('synchronous_commit', 'off', true) AS async_commit

-- name: take_message
-- A recv resumed by its message, in one statement (one round trip where
-- take_message's transaction takes seven): under the run's row lock and
-- its claim, the oldest unconsumed message on the topic is marked consumed
-- by the step and the step recorded with its payload. No row back: no
-- message (or not our claim, or a final record already there): the
-- caller's transaction says which and records the wait. Committed
-- asynchronously, as async_commit says.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true) AS off
), owned AS (
    SELECT w.id FROM everystep_workflow AS w, async_commit
    WHERE w.id = %(run_id)s AND w.status = 'running' AND w.claimed_by = %(claimer)s
      AND w.claim_epoch = %(claim_epoch)s
    FOR UPDATE OF w
), picked AS (
    SELECT m.id FROM everystep_message AS m, owned
    WHERE m.workflow_id = owned.id AND m.topic = %(topic)s AND m.consumed_step IS NULL
      AND NOT EXISTS (SELECT 1 FROM everystep_step AS s WHERE s.workflow_id = owned.id
                      AND s.step_id = %(step_id)s AND s.status NOT IN {step_open_statuses})
    ORDER BY m.id
    LIMIT 1
    FOR UPDATE OF m
), consumed AS (
    UPDATE everystep_message AS m SET consumed_step = %(step_id)s, consumed_at = clock_timestamp()
    FROM picked WHERE m.id = picked.id
    RETURNING m.workflow_id, m.payload
), step AS (
    INSERT INTO everystep_step
        (workflow_id, step_id, name, args, kwargs, status, result, error, started_at, completed_at,
         attempt, wake_at)
    SELECT consumed.workflow_id, %(step_id)s, %(name)s, %(args)s::json, %(kwargs)s::json, %(status)s,
           consumed.payload, NULL, %(started_at)s, clock_timestamp(), %(attempt)s, %(wake_at)s::timestamptz
    FROM consumed
    ON CONFLICT (workflow_id, step_id) DO UPDATE
    SET name = EXCLUDED.name, args = EXCLUDED.args, kwargs = EXCLUDED.kwargs,
        status = EXCLUDED.status, result = EXCLUDED.result, error = EXCLUDED.error,
        started_at = EXCLUDED.started_at, completed_at = EXCLUDED.completed_at,
        attempt = EXCLUDED.attempt, wake_at = EXCLUDED.wake_at
    WHERE everystep_step.status IN {step_open_statuses}
    RETURNING result, completed_at
)
SELECT step.result AS payload, step.completed_at FROM step

-- name: message_by_key
SELECT id FROM everystep_message WHERE workflow_id = %(run_id)s AND idempotency_key = %(key)s

-- name: insert_message
INSERT INTO everystep_message (workflow_id, topic, payload, idempotency_key, created_at)
VALUES (%(run_id)s, %(topic)s, %(payload)s::json, %(key)s, clock_timestamp())
RETURNING id

-- name: wake_waiter
-- End a scheduled run's wait for `wait_key` ('*': it waits for several
-- things): due now, runners told on commit. The row is written whatever it
-- holds (a CASE, not a WHERE on the status), so this waits for the lock of
-- a run releasing itself, then sees its new wait.
WITH woke AS (
    UPDATE everystep_workflow
    SET not_before = CASE WHEN status = 'scheduled' AND wait_key IN (%(wait_key)s, '*')
                          THEN clock_timestamp() ELSE not_before END,
        wait_key = CASE WHEN status = 'scheduled' AND wait_key IN (%(wait_key)s, '*')
                        THEN NULL ELSE wait_key END
    WHERE id = %(run_id)s
    RETURNING name, status = 'scheduled' AND wait_key IS NULL AS woken
)
SELECT woke.woken, CASE WHEN woke.woken THEN pg_notify('{scheduled_channel}', woke.name)::text END AS notified
FROM woke

-- name: wake_watchers
-- A set_event's wake of the runs waiting for that event alone (a body's
-- get_event with a timeout, wait_key `event:<run>:<key>`): due now,
-- runners told on commit. The publisher holds its own row (lock_claimed)
-- and a waiter releasing itself reads the event only once it has a share
-- lock on that row (lock_watched), so it sees the event or is found here.
-- A run waiting for several things ('*') is not found: its wait is checked
-- again within a bounded time (everystep.waits).
WITH woke AS (
    UPDATE everystep_workflow SET not_before = clock_timestamp(), wait_key = NULL
    WHERE status = 'scheduled' AND wait_key = %(wait_key)s
    RETURNING name
)
SELECT count(pg_notify('{scheduled_channel}', woke.name)) AS woken FROM woke

-- name: lock_watched
-- A waiter's share lock on the run whose event it waits for, taken before
-- it reads the event (see wake_watchers).
SELECT id FROM everystep_workflow WHERE id = %(run_id)s FOR SHARE

-- name: next_message
SELECT id, payload FROM everystep_message
WHERE workflow_id = %(run_id)s AND topic = %(topic)s AND consumed_step IS NULL
ORDER BY id
LIMIT 1

-- name: consume_message
UPDATE everystep_message SET consumed_step = %(step_id)s, consumed_at = clock_timestamp()
WHERE id = %(message_id)s AND consumed_step IS NULL
RETURNING id

-- name: release_wait
-- Back to the queue until `not_before` (a wait's timeout, or WAIT_FOREVER),
-- waiting for `wait_key`; in the transaction that checked, under the row
-- lock, that nothing it waits for is there already.
WITH released AS (
    UPDATE everystep_workflow
    SET status = 'scheduled', claimed_by = NULL, claimed_at = NULL, not_before = %(not_before)s,
        wait_key = %(wait_key)s
    WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s
      AND claim_epoch = %(claim_epoch)s
    RETURNING id, name
)
SELECT released.id, pg_notify('{scheduled_channel}', released.name)::text AS notified FROM released

-- name: put_event
INSERT INTO everystep_event (workflow_id, key, value, updated_at)
VALUES (%(run_id)s, %(key)s, %(value)s::json, clock_timestamp())
ON CONFLICT (workflow_id, key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at

-- name: get_event
SELECT key, value, updated_at FROM everystep_event WHERE workflow_id = %(run_id)s AND key = %(key)s

-- name: list_events
SELECT key, value, updated_at FROM everystep_event WHERE workflow_id = %(run_id)s ORDER BY key

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
SELECT 1 AS ended WHERE NOT EXISTS (
    SELECT 1 FROM everystep_workflow WHERE id = %(run_id)s AND status IN {active_statuses})

-- name: list_children
SELECT {run_columns} FROM everystep_workflow WHERE parent_id = %(run_id)s
ORDER BY created_at, id
LIMIT %(limit)s

-- name: active_children
SELECT id FROM everystep_workflow WHERE parent_id = %(run_id)s AND status IN {active_statuses}

-- name: expired_deadlines
SELECT id FROM everystep_workflow
WHERE deadline IS NOT NULL AND deadline <= clock_timestamp() AND status IN {active_statuses}
ORDER BY deadline
LIMIT %(limit)s

-- name: stale_child_waits
-- Parents still waiting for a child that has ended: the child's end and
-- its parent's wake are one statement here, so this finds only what an
-- operator's edit left behind; the other backends' sweep needs it more.
SELECT p.id, p.wait_key FROM everystep_workflow AS p
JOIN everystep_workflow AS c ON p.wait_key = {wait_prefix_child} || c.id::text
WHERE p.status = 'scheduled' AND substr(p.wait_key, 1, {wait_prefix_child_length}) = {wait_prefix_child} AND c.status NOT IN {active_statuses}
LIMIT 100

-- name: waiting_counts
-- Scheduled runs whose not-before time is ahead, by what they wait for.
SELECT {wait_kind_of} AS kind,
       count(*) AS runs
FROM everystep_workflow
WHERE status = 'scheduled' AND not_before > clock_timestamp()
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
SET status = 'continued', completed_at = clock_timestamp(), continued_as = %(new_id)s::uuid, idempotency_key = NULL,
    result = NULL, error = NULL
WHERE id = %(run_id)s AND status = 'running' AND claimed_by = %(claimer)s AND claim_epoch = %(claim_epoch)s

-- name: insert_continuation
-- Its successor: the same workflow, queue, priority, concurrency key,
-- parent, deadline and idempotency key; new arguments; due now; runners
-- told on commit.
WITH inserted AS (
    INSERT INTO everystep_workflow (id, name, args, idempotency_key, status, created_at, queue, priority,
                                    concurrency_key, app_version, parent_id, deadline, continued_from)
    VALUES (%(new_id)s, %(name)s, %(args)s::json, %(idempotency_key)s, 'scheduled', clock_timestamp(),
            %(queue)s, %(priority)s, %(concurrency_key)s, %(app_version)s, %(parent_id)s::uuid,
            %(deadline)s::timestamptz, %(run_id)s::uuid)
    RETURNING id, name
)
SELECT inserted.id, pg_notify('{scheduled_channel}', inserted.name)::text AS notified FROM inserted

-- name: move_unconsumed_messages
-- The messages nobody received yet go to the successor, which receives them
-- as this run would have.
UPDATE everystep_message SET workflow_id = %(new_id)s WHERE workflow_id = %(run_id)s AND consumed_step IS NULL

-- name: copy_events
-- What the run published stays readable on its successor.
INSERT INTO everystep_event (workflow_id, "key", value, updated_at)
SELECT %(new_id)s, "key", value, updated_at FROM everystep_event WHERE workflow_id = %(run_id)s

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
SELECT {step_columns} FROM everystep_step WHERE workflow_id = %(id)s AND step_id = ANY(%(step_ids)s)

-- name: step_outline
-- Every step of a run in the order first recorded: its id, function and
-- status (and the result of the steps named results_of: a patch marker's
-- answer), what the step graph is drawn from however long the history.
SELECT step_id, name, status, CASE WHEN name = %(results_of)s THEN result END AS result
FROM everystep_step WHERE workflow_id = %(id)s ORDER BY id

-- name: note_history
-- A run's history as its execution under this claim left it; a newer
-- claim's execution notes its own. Committed asynchronously, as a run's
-- last write is: a crash that loses it leaves the gauge one execution
-- behind, nothing else.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
UPDATE everystep_workflow SET history = %(records)s
FROM async_commit
WHERE id = %(run_id)s AND claim_epoch = %(claim_epoch)s

-- name: largest_history
-- The longest noted history among unfinished runs: one pass over the
-- status index's unfinished entries, no step counted.
SELECT max(history) AS records FROM everystep_workflow WHERE status IN {active_statuses}

-- name: run_cost
-- What a run's measured steps cost, summed where the rows are (no step
-- row leaves the database): `everystep show`'s cost line.
SELECT count(cpu_seconds) AS measured, sum(cpu_seconds) AS cpu_seconds,
       max(CASE WHEN cpu_seconds IS NOT NULL THEN coalesce(peak_rss_bytes, 0) END) AS peak_rss_bytes
FROM everystep_step WHERE workflow_id = %(id)s

-- -- Streams (migration 0019, everystep.streams) ----------------------------

-- name: stream_tail
-- The last row of stream `key` of run `run_id` (its seq; 1 if it is the
-- closing marker), read by the execution holding the run's claim: no row
-- at all when the claim moved on, so a stale execution writes nothing.
SELECT (SELECT seq FROM everystep_stream WHERE workflow_id = w.id AND key = %(key)s
        ORDER BY seq DESC LIMIT 1) AS seq,
       (SELECT CASE WHEN closed AND NOT withdrawn THEN 1 ELSE 0 END FROM everystep_stream
        WHERE workflow_id = w.id AND key = %(key)s ORDER BY seq DESC LIMIT 1) AS closed
FROM everystep_workflow AS w
WHERE w.id = %(run_id)s AND w.status = 'running' AND w.claimed_by = %(claimer)s
  AND w.claim_epoch = %(claim_epoch)s

-- name: stream_tail_live
-- `stream_tail` for a write from a step's code, whose transaction commits
-- without waiting for its WAL flush (synchronous_commit off, for this
-- transaction only): a value of an attempt in flight. WAL is written in
-- order, so the step's record, flushed at its own commit, makes every value
-- the step wrote before it durable too; a database crash before that loses
-- the step's record as well, and the step runs again.
WITH async_commit AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
SELECT (SELECT seq FROM everystep_stream WHERE workflow_id = w.id AND key = %(key)s
        ORDER BY seq DESC LIMIT 1) AS seq,
       (SELECT CASE WHEN closed AND NOT withdrawn THEN 1 ELSE 0 END FROM everystep_stream
        WHERE workflow_id = w.id AND key = %(key)s ORDER BY seq DESC LIMIT 1) AS closed
FROM everystep_workflow AS w, async_commit
WHERE w.id = %(run_id)s AND w.status = 'running' AND w.claimed_by = %(claimer)s
  AND w.claim_epoch = %(claim_epoch)s

-- name: stream_withdraw
-- An earlier execution's values of step `step_id` (written from inside
-- it, by an attempt that never recorded), withdrawn before this
-- execution's first value of that step: their seqs stay taken.
UPDATE everystep_stream SET withdrawn = true, value = NULL
WHERE workflow_id = %(run_id)s AND step_id = %(step_id)s AND attempt IS NOT NULL
  AND attempt <> %(attempt)s AND NOT withdrawn

-- name: stream_append
-- One value (or the closing marker) at `seq`; nothing when a concurrent
-- writer took that seq first (the caller reads the tail again). Readers
-- of the run are woken by the commit.
WITH added AS (
    INSERT INTO everystep_stream (workflow_id, key, seq, value, step_id, attempt, closed, written_at)
    VALUES (%(run_id)s, %(key)s, %(seq)s, %(value)s::json, %(step_id)s, %(attempt)s, %(closed)s, clock_timestamp())
    ON CONFLICT DO NOTHING
    RETURNING workflow_id
)
SELECT pg_notify('{stream_channel}', workflow_id::text) AS notified FROM added

-- name: stream_read
SELECT seq, value, step_id, attempt, closed, written_at FROM everystep_stream
WHERE workflow_id = %(run_id)s AND key = %(key)s AND seq > %(after)s AND NOT withdrawn
ORDER BY seq LIMIT %(limit)s

-- name: stream_keys
-- A run's streams: each key's last seq and whether it is closed.
SELECT key, max(seq) AS seq, max(CASE WHEN closed THEN 1 ELSE 0 END) AS closed
FROM everystep_stream WHERE workflow_id = %(run_id)s AND NOT withdrawn
GROUP BY key ORDER BY key

-- name: listen_streams
LISTEN {stream_channel}

-- -- Debounced scheduling (migration 0020; store/base/debounce.py) --

-- name: debounce_take
-- The window of (name, debounce_key), its row locked to the commit: opened
-- for the new run `id` when the key has none (run_id = id on return), else
-- the run of the window last opened and when that window began.
INSERT INTO everystep_debounce (name, debounce_key, run_id, first_at)
VALUES (%(name)s, %(debounce_key)s, %(id)s::uuid, %(now)s)
ON CONFLICT (name, debounce_key) DO UPDATE SET calls = everystep_debounce.calls + 1
RETURNING run_id, first_at

-- name: debounce_fold
-- A call folded into the window's run while it has not started: still
-- scheduled and never claimed (a claim holding the row makes this wait,
-- then match nothing). The arguments replaced, the start pushed back.
UPDATE everystep_workflow
SET args = %(args)s::json, not_before = %(not_before)s, debounce_calls = debounce_calls + 1
WHERE id = %(run_id)s::uuid AND status = 'scheduled' AND first_claimed_at IS NULL AND debounce_calls IS NOT NULL
RETURNING {run_columns}, debounce_calls

-- name: debounce_move
-- The window's run has started (or ended, or is gone): the key's row
-- points at the new run `id`, whose window begins now.
UPDATE everystep_debounce SET run_id = %(id)s::uuid, first_at = %(now)s
WHERE name = %(name)s AND debounce_key = %(debounce_key)s
RETURNING run_id

-- name: debounce_open
-- The run of a new window: `schedule`'s insert, with the window's wait key
-- and its first call counted; not due before the window's end (not_before).
WITH inserted AS (
    INSERT INTO everystep_workflow (id, name, args, status, created_at, not_before, queue, priority,
                                    concurrency_key, app_version, deadline, wait_key, debounce_calls)
    VALUES (%(id)s, %(name)s, %(args)s::json, 'scheduled', clock_timestamp(), %(not_before)s, %(queue)s,
            %(priority)s, %(concurrency_key)s, %(app_version)s, %(deadline)s::timestamptz, %(wait_key)s, 1)
    RETURNING {run_columns}, debounce_calls
)
SELECT inserted.*, pg_notify('{scheduled_channel}', inserted.name)::text AS notified FROM inserted

-- name: debounce_windows
-- The debounced runs among ids: their key (in wait_key) and calls folded.
SELECT id, wait_key, debounce_calls FROM everystep_workflow
WHERE id = ANY(%(ids)s::uuid[]) AND debounce_calls IS NOT NULL
