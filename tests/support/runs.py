"""Helpers to drive runs in-process: claim one specific run and execute it,
expire a wait, drain every due run,
or let a threaded worker work them off."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from everystep import runner, schedule
from everystep.errors import SimulatedCrash
from everystep.models import SCHEDULED, Run
from everystep.store import Store, utcnow

if TYPE_CHECKING:
    from everystep.worker import Worker


def claim_run(store: Store, run_id: str, claimer: str = "tester") -> Run:
    """Claim exactly ``run_id`` (scheduled) for ``claimer``; other runs
    claimed along the way are put back."""
    run = store.get_run(run_id)
    assert run.status == SCHEDULED, f"run {run_id} is {run.status}"
    claimed = store.claim(claimer, 10_000, [run.name])
    mine = [item for item in claimed if item.id == run_id]
    for other in claimed:
        if other.id != run_id:
            store.requeue(other.claim)
    assert mine, f"run {run_id} could not be claimed"
    return mine[0]


def execute_run(store: Store, run_id: str, claimer: str = "tester", **options: Any) -> str:
    """Claim ``run_id`` and execute it once; returns what ``runner.execute`` returns."""
    run = claim_run(store, run_id, claimer)
    return runner.execute(store, run, claimer=claimer, **options)


def crash_at(target: str) -> list[tuple[Any, str]]:
    """Install a fault hook that dies (``SimulatedCrash``) after step
    ``target``'s effect and before its record, once, exactly as a process
    death would. Returns the ``(ctx, step_id)`` calls the hook saw."""
    seen: list[tuple[Any, str]] = []

    def fault(ctx: Any, step_id: str) -> None:
        seen.append((ctx, step_id))
        if step_id == target:
            runner.fault = None
            raise SimulatedCrash(f"died after the effect of step {step_id}")

    runner.fault = fault
    return seen


def due_now(store: Store, run_id: str) -> bool:
    """Whether the run is scheduled and claimable now."""
    run = store.get_run(run_id)
    return run.status == SCHEDULED and (run.not_before is None or run.not_before <= utcnow())


def resume(store: Store, run_id: str, claimer: str = "tester") -> str:
    """What the next claim after a crash does: the run is requeued (by an
    operator or a drain) and executed again from the top."""
    assert store.requeue(store.get_run(run_id).claim_as(claimer))
    return execute_run(store, run_id, claimer)


def leave_blocked(store: Store, wf: Any, *args: Any) -> str:
    """A run of ``wf`` blocked on its first step: the process died right
    after that unsafe step's effect, and the next claim found it uncertain."""
    run = schedule(wf, *args, database=store)
    crash_at("1")
    try:
        execute_run(store, run.id)
    except SimulatedCrash:
        pass
    else:
        raise AssertionError(f"run {run.id} did not die after its first step")
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == "blocked"
    return run.id


def expire_wait(store: Store, run_id: str, step_id: str) -> None:
    """Move a waiting step's timeout (and its run's not-before) into the
    past: the run is due, and its wait times out when it is executed."""
    past = utcnow() - dt.timedelta(seconds=1)
    value = past.isoformat() if store.backend == "sqlite" else past
    marker = "?" if store.backend == "sqlite" else "%s"
    with store.connection() as conn:
        conn.execute(f"UPDATE everystep_step SET wake_at = {marker} WHERE workflow_id = {marker} "
                     f"AND step_id = {marker}", (value, run_id, step_id))
        conn.execute(f"UPDATE everystep_workflow SET not_before = {marker} WHERE id = {marker}", (value, run_id))


def drain(store: Store, rounds: int = 50) -> None:
    """Execute every due run (children, and the parents they wake) until none is left."""
    for _ in range(rounds):
        due = [run for run in store.list_runs(status=SCHEDULED, limit=1000)
               if run.not_before is None or run.not_before <= utcnow()]
        if not due:
            return
        for run in due:
            execute_run(store, run.id)
    raise AssertionError("runs still due after draining")


def run_until_settled(store: Store, run_id: str, limit: int = 10) -> list[str]:
    """Claim and execute while the run is released due at once (backoff 0);
    returns what each execution returned."""
    outcomes = []
    for _ in range(limit):
        outcomes.append(execute_run(store, run_id))
        if store.get_run(run_id).status != SCHEDULED:
            return outcomes
    raise AssertionError(f"run {run_id} still scheduled after {limit} executions: {outcomes}")


@contextlib.contextmanager
def worker_running(worker: Worker, join: float = 60.0) -> Iterator[threading.Thread]:
    """``worker`` on a thread of its own for the block (the thread is
    yielded); stopped and joined after it, whatever the block raised."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(join)
