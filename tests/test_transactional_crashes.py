"""A transactional step's process SIGKILLed around its commit, on every backend.

A forked process executes ``three_rows`` (each step inserts one row through
``step_connection()``) and SIGKILLs itself at step 2: before its record
(``runner.fault``), once the record is written and before COMMIT, or right
after COMMIT (``transactional.commit_fault``). The database must then hold
both the row and the record of step 2, or neither; the replay that follows
must leave exactly one row per step.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from everystep import runner, schedule, transactional
from everystep.models import COMPLETED, RUNNING, STEP_DONE, Outcome
from everystep.store import Store, connect
from tests.support.runs import claim_run
from tests.test_transactional_steps import effects, rows, three_rows  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(180)

#: Where the child dies, and whether step 2's row and record survive it.
POINTS = {"before-record": False, "before-commit": False, "after-commit": True}


def execute_and_die(url: str, run: Any, point: str) -> int:
    """Execute ``run`` in a forked process that SIGKILLs itself at ``point``
    of step 2; returns its wait status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            def die() -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            if point == "before-record":
                runner.fault = lambda ctx, step_id: die() if step_id == "2" else None
            else:
                phase = "committing" if point == "before-commit" else "committed"
                transactional.commit_fault = (
                    lambda ctx, step_id, at: die() if (step_id, at) == ("2", phase) else None)
            store = connect(url)
            runner.execute(store, run, claimer="doomed")
        finally:
            os._exit(3)  # never reached when the kill lands
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.parametrize("point", list(POINTS))
def test_sigkill_around_the_commit_leaves_both_or_neither(store: Store, effects: str, point: str) -> None:
    run = schedule(three_rows, "k", database=store)
    claimed = claim_run(store, run.id, "doomed")
    status = execute_and_die(effects, claimed, point)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status

    survived = POINTS[point]
    recorded = {s.step_id: s.status for s in store.get_steps(run.id)}
    assert rows(effects, run.id) == (["k-1", "k-2"] if survived else ["k-1"])
    assert recorded == ({"1": STEP_DONE, "2": STEP_DONE} if survived else {"1": STEP_DONE})
    assert store.get_run(run.id).status == RUNNING

    # The next claim replays: step 1 (and step 2 if it committed) from the
    # record, the rest executed, each row exactly once.
    assert store.requeue(claimed.claim)
    replay = claim_run(store, run.id, "heir")
    assert runner.execute(store, replay, claimer="heir") == Outcome.COMPLETED
    assert rows(effects, run.id) == ["k-1", "k-2", "k-3"]
    done = store.get_run(run.id)
    assert done.status == COMPLETED and done.result == ["k-1", "k-2", "k-3"]
