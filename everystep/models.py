"""Row types: what a run and a recorded step look like to Python code."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from . import serde

# Run statuses (exact strings, stored in everystep_workflow.status).
SCHEDULED = "scheduled"
RUNNING = "running"
COMPLETED = "completed"
FAILED = "failed"
STOPPED = "stopped"
BLOCKED = "blocked"
RUN_STATUSES = (SCHEDULED, RUNNING, COMPLETED, FAILED, STOPPED, BLOCKED)
TERMINAL_STATUSES = (COMPLETED, FAILED, STOPPED, BLOCKED)
# Statuses a run never leaves, so retention (`everystep prune`) may delete
# such runs; blocked is terminal for a supervisor but waits for an operator.
# The one list of what may be pruned: a new final status goes here.
PRUNABLE_STATUSES = (COMPLETED, STOPPED, FAILED)

# Step statuses (everystep_step.status).
STEP_STARTED = "started"
STEP_DONE = "done"
STEP_FAILED = "failed"


@dataclass(frozen=True)
class Run:
    """One workflow run: a row of ``everystep_workflow``."""

    id: str
    name: str
    args: list[Any]
    status: str
    idempotency_key: str | None = None
    claimed_by: str | None = None
    claimed_at: dt.datetime | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None
    #: Whether the run had recorded steps when it was claimed (``None``:
    #: unknown). A run with none is on its first execution, so the runner
    #: skips reading its steps.
    has_steps: bool | None = field(default=None, compare=False)

    @property
    def exception(self) -> BaseException | None:
        """The stored error rebuilt as an exception (``None`` if there is none)."""
        return serde.decode_exception(self.error)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "args": serde.to_jsonable(self.args),
            "status": self.status,
            "idempotency_key": self.idempotency_key,
            "claimed_by": self.claimed_by,
            "claimed_at": _iso(self.claimed_at),
            "result": serde.to_jsonable(self.result),
            "error": serde.to_jsonable(self.error),
            "created_at": _iso(self.created_at),
            "completed_at": _iso(self.completed_at),
        }


@dataclass(frozen=True)
class StepRecord:
    """One recorded step: a row of ``everystep_step``.

    ``status`` is ``done`` (``result`` holds the value), ``failed`` (``error``
    holds the encoded exception) or ``started`` (an unsafe-to-repeat step
    whose effect may be under way, with no outcome yet).
    """

    workflow_id: str
    step_id: str
    name: str
    status: str
    result: Any = None
    error: dict[str, Any] | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    started_at: dt.datetime | None = None
    completed_at: dt.datetime | None = None

    @property
    def exception(self) -> BaseException | None:
        return serde.decode_exception(self.error)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workflow_id": self.workflow_id,
            "step_id": self.step_id,
            "name": self.name,
            "status": self.status,
            "result": serde.to_jsonable(self.result),
            "error": serde.to_jsonable(self.error),
            "args": serde.to_jsonable(self.args),
            "kwargs": serde.to_jsonable(self.kwargs),
            "started_at": _iso(self.started_at),
            "completed_at": _iso(self.completed_at),
        }


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
