"""Durable sleep: ``everystep.sleep`` and ``sleep_until`` in a body.

The sleep is a step recorded ``sleeping`` with its wake time; the scope
unwinds (``Suspended``) and, once every other scope has settled or waits
too, the run is released until the earliest wake time: a row, no process.
The next claim replays it: a wake time that has come records the sleep
``done`` and the body goes on; one still ahead waits again. Outside a
workflow (or in a step's own code) it is ``time.sleep``.
"""

from __future__ import annotations

import datetime as dt
import time

from . import recording, serde
from .context import Execution, recording_context
from .models import STEP_DONE, STEP_SLEEPING, StepRecord
from .store import NewStep, StepWrite, utcnow


#: The function name recorded for a durable sleep's step row.
SLEEP_STEP = "everystep.sleep"


def sleep_until(wake_at: dt.datetime, name: str | None = None) -> None:
    """A durable sleep inside a workflow (see ``api.sleep``); outside one,
    a plain ``time.sleep`` until ``wake_at``."""
    ctx = recording_context()
    if ctx is None:
        time.sleep(max((wake_at - utcnow()).total_seconds(), 0.0))
        return
    ex = ctx.execution
    step_id = recording.next_step_id(ex, ctx, name)
    recorded = recording.recorded_at(ex, step_id, SLEEP_STEP)
    if recorded is not None:
        if recorded.status != STEP_SLEEPING:
            recording.replay_outcome(ex, recorded)
            return
        if not recording.is_due(ex, recorded.wake_at):
            raise recording.suspend(ex, recorded.wake_at)
        if ex.dry_run:
            return  # it would wake now; a dry replay writes nothing
        _record_sleep(ex, step_id, recorded.wake_at, recorded.started_at or utcnow(), STEP_DONE)
        return
    recording.may_start(ex, step_id, SLEEP_STEP)
    now = utcnow()
    if wake_at <= now:
        _record_sleep(ex, step_id, wake_at, now, STEP_DONE)
        return
    write = _record_sleep(ex, step_id, wake_at, now, STEP_SLEEPING)
    if write.record.status == STEP_DONE:
        return  # a racing execution recorded it over already
    raise recording.suspend(ex, wake_at)


def _record_sleep(ex: Execution, step_id: str, wake_at: dt.datetime | None, started_at: dt.datetime,
                  status: str) -> StepWrite:
    args_json = serde.dumps([wake_at], "sleep")
    entry = NewStep(step_id, SLEEP_STEP, args_json, "{}", started_at, status=status,
                    result_json="null" if status == STEP_DONE else None, wake_at=wake_at)
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=SLEEP_STEP, status=status,
                         args=[wake_at], started_at=started_at, wake_at=wake_at)
    write = recording.store_write(ex, lambda markers: ex.store.record_step(ex.claim, entry, decoded, markers), entry)
    ex.outcomes[step_id] = write.record
    return write


__all__ = ["SLEEP_STEP", "sleep_until"]
