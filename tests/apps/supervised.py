"""Workflows for the supervisor tests, imported by real supervisor processes
(``everystep-supervisor --app tests.apps.supervised``).

The tests cannot look inside the supervisor's children, so these steps leave
traces: each returns the pid of the process that ran it, and each appends
``"<run id> <pid> <event>"`` to ``<spec["dir"]>/effects`` (one line per
event), so a test sees which steps ran, how many times and where. Every
workflow takes one ``spec`` dict whose ``"dir"`` is a directory shared with
the test.

- ``gated``: blocks until the file ``<dir>/<gate>`` exists, which holds a run
  mid-step while a test signals, kills or inspects the supervisor (a gate
  nobody opens makes a step that never ends);
- ``burn``: CPU-bound busy work that records its wall-clock start and end and
  keeps burning until ``spec["peers"]`` runs have started, so two runs that
  truly execute at the same time produce overlapping intervals;
- ``slow`` / ``sluggish`` / ``unsafe_slow`` / ``unsafe_sluggish``: sleep far
  past a timeout (``@step(timeout=1)`` or ``--step-timeout`` only, safe or
  unsafe to repeat);
- ``suicide``: SIGKILLs its own process, every time it runs;
- ``hog``: keeps ``spec["mb"]`` MiB alive in the child after the run.

The helpers at the bottom are the test side of the file protocol.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from everystep import step, workflow
from everystep.context import current
from tests.support.waiting import wait_for_file

EFFECTS = "effects"
GATE_POLL_SECONDS = 0.02
#: Waits inside steps must end even if a test forgets them.
GIVE_UP_SECONDS = 300.0


#: Memory ``hog`` keeps alive so the child's RSS stays high after the run.
_HOARD: list[bytearray] = []


def _run_id() -> str:
    ctx = current()
    return ctx.workflow_id if ctx is not None else "-"


def _effect(spec: dict[str, Any], event: str) -> None:
    with open(Path(spec["dir"]) / EFFECTS, "a", encoding="utf-8") as handle:
        handle.write(f"{_run_id()} {os.getpid()} {event}\n")


def _wait_for(path: Path) -> None:
    wait_for_file(path, GIVE_UP_SECONDS, GATE_POLL_SECONDS)


# -- small steps ----------------------------------------------------------------


@step
def note(spec: dict[str, Any], label: str) -> dict[str, Any]:
    _effect(spec, label)
    return {"label": label, "pid": os.getpid()}


@step
def gated(spec: dict[str, Any], gate: str) -> dict[str, Any]:
    _effect(spec, "gated:start")
    _wait_for(Path(spec["dir"]) / gate)
    _effect(spec, "gated:end")
    return {"pid": os.getpid()}


@step
def cleanup(spec: dict[str, Any], reason: str) -> dict[str, Any]:
    _effect(spec, f"cleanup:{reason}")
    return {"reason": reason, "pid": os.getpid()}


@workflow
def gated_flow(spec: dict[str, Any]) -> dict[str, Any]:
    """``note first`` → ``gated`` (held on ``spec["gate"]``) → ``note last``.
    With ``spec["catch"]`` the body catches the gated step's failure and runs
    a cleanup step instead of failing."""
    first = note(spec, "first")
    try:
        middle = gated(spec, spec["gate"])
    except Exception as exc:
        if not spec.get("catch"):
            raise
        cleanup(spec, type(exc).__name__)
        return {"caught": type(exc).__name__}
    last = note(spec, "last")
    return {"first": first["pid"], "gated": middle["pid"], "last": last["pid"]}


@step(unsafe_to_repeat=True)
def unsafe_gated(spec: dict[str, Any], gate: str) -> dict[str, Any]:
    """Unsafe to repeat, held on ``gate``: its effect is the pair of lines."""
    _effect(spec, "unsafe:start")
    _wait_for(Path(spec["dir"]) / gate)
    _effect(spec, "unsafe:end")
    return {"pid": os.getpid()}


@workflow
def fenced_flow(spec: dict[str, Any]) -> dict[str, Any]:
    """``note first`` → a step held on ``spec["gate"]`` (``unsafe_gated`` when
    ``spec["unsafe"]``, else ``gated``) → ``note last``: every effect logged,
    so a test counts how often each ran and in which process."""
    first = note(spec, "first")
    held = (unsafe_gated if spec.get("unsafe") else gated)(spec, spec["gate"])
    last = note(spec, "last")
    return {"first": first["pid"], "held": held["pid"], "last": last["pid"]}


@workflow
def broken_flow(spec: dict[str, Any]) -> Any:
    """One step, then a bug in the body: the run fails with KeyError."""
    note(spec, "first")
    return {}["item"]


@step
def whoami(spec: dict[str, Any]) -> int:
    _effect(spec, "whoami")
    return os.getpid()


@workflow
def tiny(spec: dict[str, Any]) -> int:
    """One quick step; returns the pid that ran it."""
    return whoami(spec)


# -- CPU-bound ----------------------------------------------------------------------


@step
def burn(spec: dict[str, Any]) -> dict[str, Any]:
    """Busy CPU work for at least ``spec["seconds"]``, and until
    ``spec["peers"]`` runs have started (each drops a marker file): a run
    that executes alone never sees its peer and ends only at the give-up
    deadline, with intervals that do not overlap."""
    start = time.time()
    directory = Path(spec["dir"])
    (directory / f"burn-started-{_run_id()}").touch()
    _effect(spec, "burn:start")
    deadline = time.monotonic() + float(spec.get("give_up", 30.0))
    began = time.monotonic()
    total = 0
    while True:
        for number in range(20_000):  # pure-Python work: holds the GIL
            total += number * number
        peers = len(list(directory.glob("burn-started-*")))
        long_enough = time.monotonic() - began >= float(spec.get("seconds", 1.0))
        if (long_enough and peers >= int(spec.get("peers", 1))) or time.monotonic() > deadline:
            break
    end = time.time()
    _effect(spec, "burn:end")
    return {"pid": os.getpid(), "start": start, "end": end, "peers": peers, "total": total % 1000}


@workflow
def cpu_bound(spec: dict[str, Any]) -> dict[str, Any]:
    return burn(spec)


# -- timeouts ---------------------------------------------------------------------


@step(timeout=1)
def slow(spec: dict[str, Any]) -> dict[str, Any]:
    """Declares a 1 s timeout and sleeps far past it."""
    _effect(spec, "slow:start")
    time.sleep(float(spec.get("sleep", 120.0)))
    _effect(spec, "slow:end")
    return {"pid": os.getpid()}


@step
def sluggish(spec: dict[str, Any]) -> dict[str, Any]:
    """No timeout of its own: only ``--step-timeout`` stops it."""
    _effect(spec, "sluggish:start")
    time.sleep(float(spec.get("sleep", 120.0)))
    _effect(spec, "sluggish:end")
    return {"pid": os.getpid()}


@step(unsafe_to_repeat=True, timeout=1)
def unsafe_slow(spec: dict[str, Any]) -> dict[str, Any]:
    _effect(spec, "unsafe_slow:start")
    time.sleep(float(spec.get("sleep", 120.0)))
    _effect(spec, "unsafe_slow:end")
    return {"pid": os.getpid()}


@step(unsafe_to_repeat=True)
def unsafe_sluggish(spec: dict[str, Any]) -> dict[str, Any]:
    """Unsafe to repeat, no timeout of its own: only ``--step-timeout`` stops it."""
    _effect(spec, "unsafe_sluggish:start")
    time.sleep(float(spec.get("sleep", 120.0)))
    _effect(spec, "unsafe_sluggish:end")
    return {"pid": os.getpid()}


_SLOW_STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "slow": slow, "sluggish": sluggish, "unsafe_slow": unsafe_slow, "unsafe_sluggish": unsafe_sluggish,
}


@workflow
def timeout_flow(spec: dict[str, Any]) -> dict[str, Any]:
    """``note before`` → the slow step named by ``spec["which"]``; its failure
    is caught and a cleanup step named after the exception type runs. With
    ``spec["reraise"]`` the body re-raises after cleaning up (the run fails)."""
    note(spec, "before")
    try:
        _SLOW_STEPS[spec["which"]](spec)
    except Exception as exc:
        cleanup(spec, type(exc).__name__)
        if spec.get("reraise"):
            raise
        return {"caught": type(exc).__name__}
    return {"caught": None}


# -- crashes and memory -------------------------------------------------------------


@step
def suicide(spec: dict[str, Any]) -> None:
    """Kills its own process, every time: a crash loop for --max-crashes."""
    _effect(spec, "suicide")
    os.kill(os.getpid(), signal.SIGKILL)


@workflow
def crash_flow(spec: dict[str, Any]) -> str:
    note(spec, "first")
    suicide(spec)
    note(spec, "unreachable")
    return "survived"


@step
def hog(spec: dict[str, Any]) -> int:
    """Keeps ``spec["mb"]`` MiB alive in this process (touched, so resident)."""
    _HOARD.append(bytearray(b"x" * (int(spec["mb"]) * 1024 * 1024)))
    _effect(spec, "hog")
    return os.getpid()


@workflow
def hog_flow(spec: dict[str, Any]) -> int:
    return hog(spec)


# -- the test side ---------------------------------------------------------------


def effect_lines(directory: str | os.PathLike[str], run_id: str | None = None) -> list[tuple[int, str]]:
    """``(pid, event)`` pairs recorded in ``directory``, of one run if given."""
    path = Path(directory) / EFFECTS
    if not path.exists():
        return []
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        owner, pid, event = line.split(" ", 2)
        if run_id is None or owner == run_id:
            lines.append((int(pid), event))
    return lines


def effects(directory: str | os.PathLike[str], run_id: str | None = None) -> list[str]:
    """The events recorded in ``directory`` (of one run when ``run_id`` is given)."""
    return [event for _pid, event in effect_lines(directory, run_id)]


def open_gate(directory: str | os.PathLike[str], gate: str) -> None:
    (Path(directory) / gate).touch()
