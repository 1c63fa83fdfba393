"""A run's lifecycle state in words, shared by ``everystep show``,
``everystep runs`` and the console: what a scheduled run waits for, which
waits a finished run left unended, and which step's effect is uncertain."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import wait_kinds
from .models import (
    ACTIVE_STATUSES, RUNNING, SCHEDULED, STEP_WAITING, STEP_RETRYING, STEP_SLEEPING, STEP_STARTED, STEP_WAITING_STATUSES,
    WAIT_FOREVER, WAITING, Run, StepRecord,
)

if TYPE_CHECKING:
    from .store import DebounceWindow, Store


def is_waiting(run: Run, now: dt.datetime) -> bool:
    """A scheduled run not due yet (``models.WAITING``; the store's
    ``--status waiting`` filter says the same in SQL)."""
    return run.status == SCHEDULED and run.not_before is not None and run.not_before > now


def in_status(run: Run, status: str, now: dt.datetime) -> bool:
    """Whether ``run`` passes a list's status filter (a status or ``waiting``)."""
    return is_waiting(run, now) if status == WAITING else run.status == status


def waiting_for(run: Run, steps: list[StepRecord], now: dt.datetime | None = None,
                debounce: DebounceWindow | None = None) -> str | None:
    """What a scheduled run whose not-before time is ahead waits for: a
    message, a child run, a durable sleep, a retry's backoff, its debounce
    window (``debounce``, for a run never claimed yet: ``Store.debounce_windows``)
    or its delayed start (None otherwise)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if not is_waiting(run, now) or run.not_before is None:
        return None
    if debounce is not None and run.first_claimed_at is None and not steps:
        what = wait_kinds.DEBOUNCE.describe([debounce.key, debounce.calls])
        return f"waiting for {what} until {run.not_before.isoformat()}"
    waits = [describe_wait(step) for step in steps if step.status == STEP_WAITING]
    if waits:
        return " and ".join(waits)
    until = run.not_before.isoformat()
    retrying = [step for step in steps if step.status == STEP_RETRYING and step.wake_at == run.not_before]
    if retrying:
        step = retrying[0]
        return f"waiting to retry step {step.step_id} ({step.name}): attempt {step.attempt + 1} at {until}"
    if any(step.status == STEP_SLEEPING and step.wake_at == run.not_before for step in steps):
        return f"sleeping until {until}"
    return f"delayed until {until}"


def waits_of(store: Store, runs: Sequence[Run]) -> dict[str, str]:
    """What each waiting run of ``runs`` waits for (``waiting_for``), their
    steps read in one query: a list of runs says it beside each status."""
    now = dt.datetime.now(dt.timezone.utc)
    waiting = [run for run in runs if is_waiting(run, now)]
    if not waiting:
        return {}
    steps = store.steps_of_runs([run.id for run in waiting], waiting_only=True)
    windows = store.debounce_windows([run.id for run in waiting if run.first_claimed_at is None])
    found = {run.id: waiting_for(run, steps.get(run.id, []), now, windows.get(run.id)) for run in waiting}
    return {run_id: text for run_id, text in found.items() if text}


def describe_wait(step: StepRecord) -> str:
    """A ``waiting`` step in words: ``waiting for message "approved"``,
    ``waiting for child 01a23bd9-…``, ``waiting for run …``, ``waiting for
    event "status" of run …``, with its timeout if it has one."""
    kind = wait_kinds.by_step.get(step.name, wait_kinds.MESSAGE)
    what = kind.describe(step.args)
    until = f" until {step.wake_at.isoformat()}" if step.wake_at is not None and step.wake_at < WAIT_FOREVER else ""
    return f"waiting for {what}{until}"


def ended_wait(run: Run, step: StepRecord) -> str | None:
    """A step left waiting (for a message, a child, the clock or a retry)
    by a run that has ended since (cancelled, by an operator or its
    deadline), in words: ``the run ended (cancelled) while waiting for
    child 01a2…``. Nothing will end that wait any more. None for any other step."""
    if step.status not in STEP_WAITING_STATUSES or run.status in ACTIVE_STATUSES:
        return None
    if step.status == STEP_WAITING:
        what = describe_wait(step)
    elif step.status == STEP_SLEEPING:
        what = "sleeping"
    else:
        what = f"waiting to retry (attempt {step.attempt + 1})"
    return f"the run ended ({run.status}) while {what}"


def effect_uncertain(run: Run, step: StepRecord) -> bool:
    """An unsafe step's ``started`` row outside a running run (blocked, or
    cut off by a cancel): it may have had its effect, and nothing recorded
    says whether it did."""
    return step.status == STEP_STARTED and run.status != RUNNING


__all__ = ["describe_wait", "effect_uncertain", "ended_wait", "in_status", "is_waiting", "waiting_for",
           "waits_of"]
