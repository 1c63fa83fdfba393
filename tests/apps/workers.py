"""Workflows for the CLI and worker tests, importable by real worker
processes (``everystep worker --app tests.apps.workers``).

The tests cannot look inside a worker process, so the steps here leave
traces on disk instead. Every workflow takes one ``spec`` dict whose
``"dir"`` is a directory shared with the test:

- each step appends ``"<run id> <event>"`` to ``<dir>/effects``, one line
  per event, so a test sees exactly which steps ran and how many times
  (an at-least-once re-run shows up as a second ``middle:start``);
- a step given a gate name (``spec["gate"]`` for ``middle``,
  ``spec["charge_gate"]`` for ``charge``, ``spec["body_gate"]`` for the
  workflow body of ``pause_in_body``) blocks until ``<dir>/<gate>`` exists,
  which lets a test signal or kill a worker while that step is in flight and
  then let it finish (``open_gate``). A gate nobody opens makes a step that
  never ends.

The helpers at the bottom are the test side of that file protocol.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from everystep import StepFailure, step, workflow
from everystep.context import current
from tests.support.waiting import wait_for_file

EFFECTS = "effects"
GATE_POLL_SECONDS = 0.02
#: A gate nobody opens must not keep a test process alive forever.
GATE_GIVE_UP_SECONDS = 300.0



def _effect(spec: dict[str, Any], event: str) -> None:
    ctx = current()
    run_id = ctx.workflow_id if ctx is not None else "-"
    with open(Path(spec["dir"]) / EFFECTS, "a", encoding="utf-8") as handle:
        handle.write(f"{run_id} {event}\n")


def _wait_for_gate(spec: dict[str, Any], gate: str | None) -> None:
    if gate:
        wait_for_file(Path(spec["dir"]) / gate, GATE_GIVE_UP_SECONDS, GATE_POLL_SECONDS)


# -- three steps, the middle one gated ------------------------------------------


@step
def first(spec: dict[str, Any]) -> str:
    _effect(spec, "first")
    return "one"


@step
def middle(spec: dict[str, Any]) -> str:
    _effect(spec, "middle:start")
    _wait_for_gate(spec, spec.get("gate"))
    _effect(spec, "middle:end")
    return "two"


@step
def last(spec: dict[str, Any]) -> str:
    _effect(spec, "last")
    return "three"


@workflow
def three_steps(spec: dict[str, Any]) -> list[str]:
    return [first(spec), middle(spec), last(spec)]


# -- an unsafe-to-repeat effect with durable cleanup ------------------------------


@step
def prepare(spec: dict[str, Any]) -> str:
    _effect(spec, "prepare")
    return "prepared"


@step(unsafe_to_repeat=True)
def charge(spec: dict[str, Any]) -> dict[str, Any]:
    _effect(spec, "charge:start")
    _wait_for_gate(spec, spec.get("charge_gate"))
    _effect(spec, "charge")
    return {"receipt": "r-1"}


@step
def refund(spec: dict[str, Any], reason: str) -> str:
    _effect(spec, f"refund:{reason}")
    return "refunded"


@workflow
def unsafe_flow(spec: dict[str, Any]) -> dict[str, Any]:
    prepare(spec)
    try:
        receipt = charge(spec)
    except StepFailure as exc:
        # A recorded failure (``resolve-step --error``) lands here on replay.
        refund(spec, str(exc))
        return {"charged": False, "reason": str(exc)}
    return {"charged": True, "receipt": receipt}


# -- a pause in the body, between steps ------------------------------------------


@workflow
def pause_in_body(spec: dict[str, Any]) -> list[str]:
    """One step, then the body itself waits on ``body_gate`` (not a step, so
    no write is in flight), then optionally a second step."""
    done = [first(spec)]
    _effect(spec, "body:waiting")
    _wait_for_gate(spec, spec["body_gate"])
    if spec.get("then_step"):
        done.append(last(spec))
    return done


# -- small workflows ----------------------------------------------------------


@step
def plus_one(n: int) -> int:
    return n + 1


@workflow
def add_one(n: int) -> int:
    return plus_one(n)


@step
def collect(args: list[Any]) -> list[Any]:
    return args


@workflow
def echo(*args: Any) -> list[Any]:
    """Returns its positional arguments: shows how the CLI mapped ARGS_JSON."""
    return collect(list(args))


# -- the test side ------------------------------------------------------------


def effects(directory: str | os.PathLike[str], run_id: str | None = None) -> list[str]:
    """The events recorded in ``directory`` (of one run when ``run_id`` is given)."""
    path = Path(directory) / EFFECTS
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        owner, _, event = line.partition(" ")
        if run_id is None or owner == run_id:
            events.append(event)
    return events


def open_gate(directory: str | os.PathLike[str], gate: str) -> None:
    (Path(directory) / gate).touch()
