"""Fill a database with a row in every status: runs, steps and operator
requests, with the messages, events, failed attempts, queue settings and
runner rows they come with, each written by the engine itself.

Upgrade tests run it under an older schema (``python -m
tests.support.older_schema N -m tests.support.every_status URL``), then
check that migrating keeps every row. ``fill`` returns (and the command
prints, as JSON) the ids of the runs by status, by workflow for the waits
(``"retries"``: an attempt; ``"waits"``: a message and an event), a run
left scheduled that an upgraded database must still complete (``"due"``),
and the id of the newest operator request, deleted (``"deleted request"``).
"""

from __future__ import annotations

import json
import sys

from everystep import admin, continue_as_new, recv, schedule, set_event, sleep, step, workflow
from everystep.errors import SimulatedCrash, Terminal
from everystep.models import RequestStatus, RunStatus, StepStatus
from everystep.queues import QueueSettings
from everystep.store import Store, connect
from tests.support.older_schema import FUNCTIONS_SINCE
from tests.support.runs import claim_run, crash_at, execute_run


@step
def add(a: int, b: int) -> int:
    return a + b


@step
def explode() -> None:
    raise ValueError("a step that fails")


@step(retries=3, backoff=3600.0, jitter=False)
def flaky() -> None:
    raise ValueError("an attempt that fails")


@step(unsafe_to_repeat=True)
def charge(amount: int) -> int:
    return amount


@workflow
def completes(x: int) -> int:
    return add(x, 1)


@workflow
def fails() -> None:
    add(1, 2)
    explode()


@workflow
def stops() -> None:
    add(1, 2)
    raise Terminal("enough", {"why": "a deliberate stop"})


@workflow
def blocks() -> int:
    return charge(5)


@workflow
def retries() -> None:
    flaky()


@workflow
def sleeps() -> None:
    sleep(3600)


@workflow
def waits() -> object:
    set_event("phase", "waiting")
    first = recv("first")
    return first, recv("second")


@workflow
def continues(n: int) -> int:
    if n == 0:
        continue_as_new(1)
    return n


#: The schema version from which a database accepts ``continued`` runs:
#: the one whose status checks are rendered from models.py (before it, the
#: checks listed the statuses of their day).
CONTINUED_SINCE = FUNCTIONS_SINCE["statuses"]


def fill(store: Store) -> dict[str, str]:
    """Write the rows; returns the ids the module's docstring lists."""
    runs: dict[str, str] = {}
    done = schedule(completes, 41, database=store, idempotency_key="done-once", queue="billing")
    assert execute_run(store, done.id) == RunStatus.COMPLETED
    runs[RunStatus.COMPLETED] = done.id
    failed = schedule(fails, database=store)
    assert execute_run(store, failed.id) == RunStatus.FAILED
    runs[RunStatus.FAILED] = failed.id
    stopped = schedule(stops, database=store)
    assert execute_run(store, stopped.id) == RunStatus.STOPPED
    runs[RunStatus.STOPPED] = stopped.id
    blocked = schedule(blocks, database=store)
    crash_at("1")
    try:
        execute_run(store, blocked.id)
    except SimulatedCrash:  # between the effect and its record, as a process death
        pass
    assert store.requeue(store.get_run(blocked.id).claim_as("tester"))
    assert execute_run(store, blocked.id) == RunStatus.BLOCKED
    runs[RunStatus.BLOCKED] = blocked.id
    cancelled = schedule(sleeps, database=store)
    execute_run(store, cancelled.id)  # a sleeping step, then a cancel
    admin.cancel(store, cancelled.id, "an operator's cancel")
    runs[RunStatus.CANCELLED] = cancelled.id
    if store.schema_version() >= CONTINUED_SINCE:
        continued = schedule(continues, 0, database=store)
        execute_run(store, continued.id)
        runs[RunStatus.CONTINUED] = continued.id
    for label, wf in (("retries", retries), ("sleeps", sleeps), ("waits", waits)):
        run = schedule(wf, database=store)
        execute_run(store, run.id)
        runs[label] = run.id
    admin.send(store, runs["waits"], "second", {"early": True}, key="m-1")  # pending: the run waits for "first"
    runs[RunStatus.RUNNING] = claim_run(store, schedule(completes, 1, database=store).id).id
    runs["due"] = runs[RunStatus.SCHEDULED] = schedule(completes, 2, database=store, priority=3).id
    store.update_queue("billing", lambda settings: QueueSettings("billing", concurrency=4, rate_limit=10,
                                                                 rate_period=60.0))
    store.register_runner("old-runner", "instance-1", "worker", "host-1", 4242, 30.0, lambda holder: None)
    pending = store.submit_request("old-runner", "status", {}, "tester")
    taken = store.submit_request("old-runner", "status", {}, "tester")
    answered = store.submit_request("old-runner", "status", {}, "tester")
    expired = store.submit_request("old-runner", "status", {"why": "nobody"}, "tester")
    assert store.expire_request(expired.id)
    assert [request.id for request in store.take_requests("old-runner")] == [pending.id, taken.id, answered.id]
    assert store.answer_request(answered.id, {"ok": True})
    _put_back(store, pending.id)
    gone = store.submit_request("old-runner", "status", {}, "tester")
    with store.connection() as conn:  # the newest request deleted: its id must never come back
        conn.execute(f"DELETE FROM everystep_request WHERE id = {int(gone.id)}")
    runs["deleted request"] = str(gone.id)
    _check(store, runs)
    return runs


def _put_back(store: Store, request_id: int) -> None:
    """A request nobody took yet (``take_requests`` took them all)."""
    with store.connection() as conn:
        conn.execute(f"UPDATE everystep_request SET status = 'pending', taken_at = NULL WHERE id = {int(request_id)}")


def _check(store: Store, runs: dict[str, str]) -> None:
    """Every status of every vocabulary is there (``continued`` from the
    schema that brought it)."""
    too_new = set() if store.schema_version() >= CONTINUED_SINCE else {RunStatus.CONTINUED}
    with store.connection() as conn:
        for table, vocabulary in (("everystep_workflow", RunStatus), ("everystep_step", StepStatus),
                                  ("everystep_request", RequestStatus)):
            found = {row[0] if isinstance(row, tuple) else row["status"]
                     for row in conn.execute(f"SELECT DISTINCT status FROM {table}").fetchall()}
            assert found == set(vocabulary) - too_new, (table, found)


def main() -> None:
    # Through the module's own name: run as ``__main__``, its workflows
    # would be registered (and their runs stored) under ``__main__.…``.
    from tests.support import every_status

    store = connect(sys.argv[1])
    try:
        store.migrate()  # the schema this everystep ships (SQLite's migrated on opening)
        print(json.dumps(every_status.fill(store)))
    finally:
        store.close()


if __name__ == "__main__":
    main()
