"""everystep.context.current(): None outside a run; inside, the running
Context with ``workflow_id`` and a read-only, live view of the outcomes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from everystep import context, parallel, runner, schedule, step, workflow
from everystep.context import current
from everystep.errors import SimulatedCrash
from everystep.models import COMPLETED, STEP_DONE, STEP_FAILED
from tests.support.runs import execute_run

SEEN: dict[str, Any] = {}
EVENTS: dict[str, threading.Event] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()
    EVENTS.clear()
    EVENTS["first-recorded"] = threading.Event()


@step
def produce(value: Any) -> Any:
    return value


@step
def fails() -> None:
    raise ValueError("recorded failure")


@step
def read_outcomes_inside_a_step() -> Any:
    ctx = current()
    SEEN["inside step ctx"] = ctx
    return {step_id: (record.status, record.result) for step_id, record in sorted(ctx.outcomes.items())}


@workflow
def inspects() -> Any:
    ctx = current()
    SEEN["workflow_id"] = ctx.workflow_id
    SEEN["workflow_name"] = ctx.workflow_name
    view = ctx.outcomes
    SEEN["at start"] = dict(view)
    produce({"n": 1})
    # The view taken earlier sees the new outcome: it is live.
    SEEN["after one"] = {key: (record.status, record.result) for key, record in view.items()}
    try:
        fails()
    except ValueError:
        pass
    SEEN["failure outcome"] = (view["2"].status, view["2"].error["type"])
    try:
        view["9"] = "forged"  # type: ignore[index]
    except TypeError as exc:
        SEEN["write refused"] = type(exc)
    return read_outcomes_inside_a_step()


def test_current_is_none_outside_a_run() -> None:
    assert current() is None

    # A step called outside a run sees no context either.
    @step
    def probe() -> Any:
        return current()

    assert probe() is None


def test_context_inside_a_run(store: Any) -> None:
    run = schedule(inspects, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert SEEN["workflow_id"] == run.id
    assert SEEN["workflow_name"] == inspects.name
    assert SEEN["at start"] == {}
    assert SEEN["after one"] == {"1": (STEP_DONE, {"n": 1})}
    assert SEEN["failure outcome"] == (STEP_FAILED, "builtins.ValueError")
    assert SEEN["write refused"] is TypeError
    # Inside a step, the outcomes of the steps before it are readable.
    assert store.get_run(run.id).result == {"1": (STEP_DONE, {"n": 1}), "2": (STEP_FAILED, None)}
    assert SEEN["inside step ctx"].workflow_id == run.id
    # After the run, the thread is back outside any workflow.
    assert current() is None


@workflow
def seeded() -> Any:
    SEEN.setdefault("starts", []).append(sorted(current().outcomes))
    produce("a")
    produce("b")
    return "done"


def test_outcomes_are_seeded_with_earlier_claims(store: Any) -> None:
    run = schedule(seeded, database=store)

    def fault(ctx: Any, step_id: str) -> None:
        if step_id == "2":
            runner.fault = None
            raise SimulatedCrash("died")

    runner.fault = fault
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert current() is None
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == COMPLETED
    assert SEEN["starts"] == [[], ["1"]]


@step
def wait_for_sibling_then_read() -> Any:
    assert EVENTS["first-recorded"].wait(30)
    record = current().outcomes["1.0.1"]
    return (current().prefix, record.status, record.result)


@workflow
def siblings() -> Any:
    def signal() -> str:
        # Runs after step 1.0.1 returned, i.e. after it was recorded.
        EVENTS["first-recorded"].set()
        return "signalled"

    def branch_ctx() -> str:
        return current().prefix

    return parallel([lambda: produce("from branch 0"), signal], [wait_for_sibling_then_read, branch_ctx])


def test_branch_contexts_share_outcomes_as_they_land(store: Any) -> None:
    run = schedule(siblings, database=store)
    assert execute_run(store, run.id) == COMPLETED
    result = store.get_run(run.id).result
    assert result == (("from branch 0", "signalled"), (("1.1.", STEP_DONE, "from branch 0"), "1.1."))


def test_context_module_exposes_current() -> None:
    assert context.current is current
