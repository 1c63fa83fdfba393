"""Workflows with step budgets, for the resource tests
(``everystep-supervisor --app tests.apps.resources``).

Only supervisor processes import this module: it declares steps with
memory and CPU limits, and the threaded worker refuses to start in a
process that imported any (the tests schedule these workflows by name).

Every workflow takes one ``spec`` dict; each catches the failure of its
bounded step, keeps what it says, and then runs ``after``, which returns
the pid of its process, so a test sees that the run went on (in a fresh
child when the old one was killed).

- ``memory_flow``: ``hog`` touches ``spec["mb"]`` MiB under
  ``memory_limit="256M"``;
- ``cpu_flow``: ``spin`` burns CPU for up to ``spec["seconds"]`` under
  ``cpu_limit=2``, on the main thread or (``spec["branch"]``) in a parallel
  branch, where only the parent can stop it;
- ``costs_flow``: a step burning ``spec["cpu"]`` CPU seconds, one sleeping,
  one touching ``spec["mb"]`` MiB, each unbounded, for their recorded cost;
- ``greedy_flow``: ``grab`` touches ``spec["mb"]`` MiB with no limit at all
  (the out-of-memory test runs the supervisor in a small cgroup).
"""

from __future__ import annotations

import os
import time
from typing import Any

from everystep import parallel, step, workflow
from everystep.errors import StepResourceExceeded

PAGE = 4096


def _touch(mb: int) -> bytearray:
    block = bytearray(mb * 1024 * 1024)
    for offset in range(0, len(block), PAGE):
        block[offset] = 1
    return block


def _failure(exc: StepResourceExceeded) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "resource": exc.resource, "limit": exc.limit,
            "peak": exc.peak, "pid": os.getpid()}


@step
def after(label: str) -> dict[str, Any]:
    return {"label": label, "pid": os.getpid()}


# -- memory -------------------------------------------------------------------------


@step(memory_limit="256M")
def hog(mb: int) -> int:
    return len(_touch(mb))


@workflow
def memory_flow(spec: dict[str, Any]) -> dict[str, Any]:
    first = after("before")
    try:
        outcome: Any = hog(spec["mb"])
    except StepResourceExceeded as exc:
        outcome = _failure(exc)
    return {"before": first, "hog": outcome, "after": after("after")}


# -- CPU ------------------------------------------------------------------------------


@step(cpu_limit=2)
def spin(seconds: float) -> float:
    """Burn CPU until this thread used ``seconds`` of it (far past the limit)."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
    return time.thread_time() - start


@workflow
def cpu_flow(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        if spec.get("branch"):
            outcome: Any = parallel(lambda: spin(spec["seconds"]), lambda: after("sibling"))
        else:
            outcome = spin(spec["seconds"])
    except StepResourceExceeded as exc:
        outcome = _failure(exc)
    return {"spin": outcome, "after": after("after")}


# -- costs ----------------------------------------------------------------------------


@step
def burn(seconds: float) -> float:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
    return time.thread_time() - start


@step
def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@step
def touch(mb: int) -> int:
    return len(_touch(mb))


@workflow
def costs_flow(spec: dict[str, Any]) -> dict[str, Any]:
    return {"burn": burn(spec["cpu"]), "nap": nap(spec["sleep"]), "touch": touch(spec["mb"]),
            "again": touch(spec["mb"]), "pid": after("after")["pid"]}


# -- the kernel's out-of-memory killer -----------------------------------------------


@step
def grab(mb: int) -> int:
    return len(_touch(mb))


@workflow
def greedy_flow(spec: dict[str, Any]) -> dict[str, Any]:
    first = after("before")
    try:
        outcome: Any = grab(spec["mb"])
    except StepResourceExceeded as exc:
        outcome = _failure(exc)
    return {"before": first, "grab": outcome, "after": after("after")}
