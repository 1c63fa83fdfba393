"""Workflows for the run-lifecycle tests (retries, sleeps, delayed starts,
cancels), imported by real supervisors (``--app tests.apps.lifecycle``) and
by the tests themselves.

Like ``tests.apps.supervised`` (whose file protocol they share), every step
appends ``"<run id> <pid> <event>"`` to ``<spec["dir"]>/effects``, so a test
sees which steps ran, how often and in which process; the database holds
the attempts and their times.

- ``flaky_flow``: a step that fails until its ``spec["succeed_on"]``-th
  attempt (``retries=3``, a 0.4 s backoff doubling per attempt, no jitter);
- ``doomed_flow``: a step that always fails (``retries=2``); the body catches
  the final failure and runs a cleanup step;
- ``sleepy_flow``: ``note first`` → ``everystep.sleep(spec["seconds"])`` →
  ``note last``;
- ``spin_flow``: a step stuck in a pure-Python CPU loop (safe, or unsafe to
  repeat with ``spec["unsafe"]``), for cancels;
- ``timeout_retry_flow``: a step with ``timeout=1, retries=1`` that hangs on
  its first attempt and returns on its second;
- ``gated_pair``: ``gated`` (held on ``spec["gate"]``) → ``note last``, for
  the threaded worker's cancel at a step boundary.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import everystep
from everystep import step, workflow
from tests.apps.supervised import GIVE_UP_SECONDS, _effect, _run_id, effects, gated, note

#: The backoff of ``flaky``: attempt k+1 waits 0.4 * 2**(k-1) seconds.
FLAKY_BACKOFF = 0.4


@step(retries=3, backoff=FLAKY_BACKOFF, jitter=False)
def flaky(spec: dict[str, Any]) -> int:
    attempt = effects(spec["dir"], _run_id()).count("flaky") + 1
    _effect(spec, "flaky")
    if attempt < int(spec["succeed_on"]):
        raise ValueError(f"attempt {attempt} fails")
    return attempt


@workflow
def flaky_flow(spec: dict[str, Any]) -> dict[str, Any]:
    first = note(spec, "first")
    attempts = flaky(spec)
    last = note(spec, "last")
    return {"attempts": attempts, "first": first["pid"], "last": last["pid"]}


@step(retries=2, backoff=0.2, jitter=False, retry_on=(ValueError,))
def doomed(spec: dict[str, Any]) -> None:
    _effect(spec, "doomed")
    raise ValueError("never works")


@workflow
def doomed_flow(spec: dict[str, Any]) -> dict[str, Any]:
    try:
        doomed(spec)
    except ValueError as exc:
        note(spec, "cleanup")
        return {"caught": str(exc)}
    return {"caught": None}


@workflow
def sleepy_flow(spec: dict[str, Any]) -> dict[str, Any]:
    first = note(spec, "first")
    everystep.sleep(float(spec["seconds"]))
    last = note(spec, "last")
    return {"first": first["pid"], "last": last["pid"]}


def _spin(spec: dict[str, Any]) -> int:
    """Pure-Python busy work that never looks at a clock it could be
    interrupted through: only a kill stops it (or the give-up deadline)."""
    _effect(spec, "spin:start")
    (Path(spec["dir"]) / f"spinning-{_run_id()}").touch()
    deadline = time.monotonic() + GIVE_UP_SECONDS
    total = 0
    while time.monotonic() < deadline:
        for number in range(100_000):
            total += number % 7
    _effect(spec, "spin:end")
    return os.getpid()


@step
def spin(spec: dict[str, Any]) -> int:
    return _spin(spec)


@step(unsafe_to_repeat=True)
def unsafe_spin(spec: dict[str, Any]) -> int:
    return _spin(spec)


@workflow
def spin_flow(spec: dict[str, Any]) -> int:
    note(spec, "first")
    pid = (unsafe_spin if spec.get("unsafe") else spin)(spec)
    note(spec, "unreachable")
    return int(pid)


@step(timeout=1, retries=1, backoff=0.2, jitter=False)
def hangs_once(spec: dict[str, Any]) -> int:
    attempt = effects(spec["dir"], _run_id()).count("hangs_once") + 1
    _effect(spec, "hangs_once")
    if attempt == 1:
        time.sleep(GIVE_UP_SECONDS)
    return attempt


@workflow
def timeout_retry_flow(spec: dict[str, Any]) -> int:
    return int(hangs_once(spec))


@workflow
def gated_pair(spec: dict[str, Any]) -> str:
    gated(spec, spec["gate"])
    note(spec, "last")
    return "done"
