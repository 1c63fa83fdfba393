"""Cancel in-process, on both backends: a cancelled scheduled or blocked
run is final, a run cancelled while it executes is fenced (its step's
record goes through, nothing after it), and a threaded worker stops a
cancelled run at the next step boundary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import everystep
from everystep import admin, schedule, step, workflow
from everystep.models import CANCELLED, RUNNING, STEP_DONE
from everystep.runner import Outcome
from everystep.store import Store
from everystep.worker import Worker
from tests.apps.lifecycle_in_process import gated_then_last, plain, sleeps
from tests.support.runs import execute_run, worker_running
from tests.support.waiting import wait_until

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled

def test_cancel_of_scheduled_and_blocked_runs_is_final(store: Store) -> None:
    waiting = schedule(sleeps, 0, database=store, delay=3600)
    cancelled = admin.cancel(store, waiting.id, "not needed")
    assert (cancelled.status, cancelled.error["message"]) == (CANCELLED, "not needed")
    assert cancelled.completed_at is not None
    assert store.claim("tester", 10, [sleeps.name]) == []
    with store.connection() as conn:
        marker = "?" if store.backend == "sqlite" else "%s"
        run = schedule(sleeps, 0, database=store)
        conn.execute(f"UPDATE everystep_workflow SET status = 'blocked' WHERE id = {marker}", (run.id,))
    assert admin.cancel(store, run.id).error["message"] == "cancelled by an operator"
    for finished in (waiting.id, run.id):
        with pytest.raises(admin.AdminError, match="only scheduled, running or blocked runs can be cancelled"):
            admin.cancel(store, finished)
    assert everystep.wait(run.id, timeout=1, database=store).status == CANCELLED


def test_cancel_of_a_running_run_fences_its_execution(store: Store) -> None:
    """The executor finds its next write refused, records the step it just
    finished through the cancelled claim's one write, and stops."""
    holder: dict[str, Any] = {}

    @step
    def cancels_itself(run_id: str) -> str:
        holder["cancelled"] = admin.cancel(store, run_id, "from inside")
        return "effect done"

    @workflow(name=f"cancelled_mid_step_{store.backend}")
    def cancelled_mid_step() -> str:
        from everystep.context import current

        ctx = current()
        assert ctx is not None
        cancels_itself(ctx.workflow_id)
        return plain("never")

    run = schedule(cancelled_mid_step, database=store)
    assert execute_run(store, run.id) == Outcome.CANCELLED
    after = store.get_run(run.id)
    assert (after.status, after.error["message"]) == (CANCELLED, "from inside")
    assert [(s.step_id, s.status, s.result) for s in store.get_steps(run.id)] == [("1", STEP_DONE, "effect done")]


def test_a_threaded_worker_stops_a_cancelled_run_at_the_next_step_boundary(store: Store, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run = schedule(gated_then_last, str(gate), database=store)
    worker = Worker(pool_size=1, poll=0.05, name=f"cancel-{store.backend}", database=store, drain=30)
    with worker_running(worker):
        try:
            wait_until(lambda: store.get_run(run.id).status == RUNNING, "the worker to claim the run")
            admin.cancel(store, run.id)
            gate.touch()
            wait_until(lambda: store.get_steps(run.id), "the gated step's record")
            wait_until(lambda: not worker._active or all(f.done() for f in worker._active),
                       "the run's thread to end")
        finally:
            gate.touch()
    assert [(s.step_id, s.status, s.result) for s in store.get_steps(run.id)] == [("1", STEP_DONE, "through")]
    assert store.get_run(run.id).status == CANCELLED
