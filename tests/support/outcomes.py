"""In-process workflows that end each way a run can end, for the tests of
what the runner reports: metrics, OpenTelemetry spans and Sentry events.

- ``traced``: a step, two parallel branches (each returns the name of the
  thread it ran on), a last step; completes;
- ``failing``: its second step raises ``ValueError``; the run fails;
- ``stopping``: its second step raises ``Terminal``; the run stops;
- ``charging``: its second step is unsafe to repeat; ``make_blocked``
  leaves a run of it blocked the real way;
- ``draining``: its first step sets ``PROBE["draining"]`` (an Event the
  test passes as ``draining=``), so the run is requeued after it.

Every step appends its label to ``CALLS``. A test module that runs these
imports the autouse fixture ``reset_probes``, which empties ``CALLS`` and
``PROBE`` before each test.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from everystep import parallel, runner, schedule, step, workflow
from everystep.errors import SimulatedCrash, Terminal
from everystep.models import BLOCKED
from everystep.store import Store
from tests.support.runs import crash_at, execute_run

CALLS: list[str] = []
PROBE: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def reset_probes() -> Iterator[None]:
    CALLS.clear()
    PROBE.clear()
    yield
    runner.fault = None


@step
def t_step(label: str) -> str:
    CALLS.append(label)
    return label


@step
def t_branch(label: str) -> str:
    CALLS.append(label)
    return threading.current_thread().name


@step
def t_boom(label: str) -> None:
    CALLS.append(label)
    raise ValueError(f"boom: {label}")


@step
def t_stop(label: str) -> None:
    CALLS.append(label)
    raise Terminal("customer cancelled", {"label": label})


@step(unsafe_to_repeat=True)
def t_charge(label: str) -> str:
    CALLS.append(label)
    return f"charged {label}"


@step
def t_drain_here(label: str) -> str:
    CALLS.append(label)
    PROBE["draining"].set()
    return label


@workflow
def traced(label: str) -> list[str]:
    first = t_step(f"{label}:first")
    left, right = parallel(lambda: t_branch(f"{label}:left"), lambda: t_branch(f"{label}:right"))
    last = t_step(f"{label}:last")
    return [first, left, right, last]


@workflow
def failing(label: str) -> None:
    t_step(f"{label}:first")
    t_boom(label)


@workflow
def stopping(label: str) -> None:
    t_step(f"{label}:first")
    t_stop(label)
    t_step(f"{label}:never")


@workflow
def charging(label: str) -> str:
    t_step(f"{label}:first")
    return t_charge(label)


@workflow
def draining(label: str) -> list[str]:
    return [t_drain_here(f"{label}:first"), t_step(f"{label}:second")]


def make_blocked(store: Store, label: str) -> str:
    """A run blocked the real way: a crash in its unsafe step's effect
    window, then a replay."""
    run = schedule(charging, label, database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED
    return run.id

