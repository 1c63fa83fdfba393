"""The body's last step, written with the run's status in one transaction.

When the body's last act is a step (``return step(...)`` or ``x =
step(...); return x`` at the body's own top level, read from the bytecode by
``tail_position``) and that step succeeds and is safe to repeat, its record
is held back (a ``HeldRecord``, in ``Execution.held``) and committed with the
``completed`` status in one transaction (``Store.finish_run_with_step``):
one commit less per run. If that write is refused, the step is flushed
alone, which says why as any step write does; if anything but ``completed``
is to be written, or the body calls another step after all, the record is
flushed first, on its own. Held back, the record is exactly as durable as a
step whose process died after its effect: a replay runs that step again
(for a last step, that crash window runs to the commit of the status).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

from . import recording
from .context import Context, Execution
from .errors import STORE_FAILURES
from .models import Outcome, StepRecord
from .store import LOST, NewStep, StepWrite
from .tail_position import is_tail_call


@dataclass(frozen=True)
class HeldRecord:
    """A finished step's record, not yet written: the step was the body's
    last act (``_is_last_act``), succeeded and is safe to repeat, so its
    record goes to the database with the run's terminal status. Until then
    it is exactly as if the process had died after the step's effect: a
    replay runs the step again. Two ways out: ``commit`` (with the run's
    ``completed`` status, in one transaction) or ``flush`` (on its own, as
    any step record)."""

    ctx: Context
    entry: NewStep
    decoded: StepRecord
    token: Any

    def flush(self, ex: Execution) -> StepWrite:
        """Write the record on its own: the body went on after all, or the
        run's status cannot go with it. A refusal raises the interrupt it
        causes, as any step write's does (a cancel records the step through
        the cancelled claim)."""
        ex.held = None
        try:
            write = recording.store_write(ex, lambda markers: ex.store.record_step(ex.claim, self.entry, self.decoded,
                                                                         markers), self.entry)
        except BaseException as exc:
            self._finished(ex, "unrecorded", exc)
            raise
        self._written(ex, write)
        return write

    def commit(self, ex: Execution, status: Outcome, result_json: str | None) -> bool:
        """Write the record and the run's ``status`` in one transaction;
        False if that was refused (nothing written: ``flush`` then says
        why). The database failing raises its interrupt."""
        ex.held = None
        markers = ex.take_markers()
        try:
            write = ex.store.finish_run_with_step(ex.claim, self.entry, status, result_json, None, self.decoded,
                                                  markers)
        except STORE_FAILURES as exc:
            self._finished(ex, "unrecorded", exc)
            raise ex.interrupt_with(exc) from None
        if write is LOST:
            ex.give_back_markers(markers)  # the step alone goes next, and says why
            return False
        self._written(ex, write)
        return True

    def _written(self, ex: Execution, write: StepWrite) -> None:
        ex.outcomes[self.entry.step_id] = write.record
        self._finished(ex, self.entry.status, None)

    def _finished(self, ex: Execution, status: str, error: BaseException | None) -> None:
        ex.observer.step_finished(self.ctx, self.entry.step_id, self.entry.name, status, error, self.token)


#: Modules whose frames lie between a step call in the body and ``_record``.
_ENGINE_MODULES = frozenset({__name__, "everystep.steps", "everystep.api"})


def is_last_act(ex: Execution, ctx: Context) -> bool:
    """Whether the step being recorded is the body's last act: called at the
    body's own top level (not in a helper function, not in a parallel
    branch) in tail position, so once it returns the body returns its result
    and runs nothing more (``everystep.tail_position``)."""
    if ctx.prefix or ex.body_code is None or ex.dry_run:
        return False
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in _ENGINE_MODULES:
        frame = frame.f_back
    return (frame is not None and frame.f_code is ex.body_code and frame.f_back is not None
            and frame.f_back.f_code is ex.body_caller and is_tail_call(frame.f_code, frame.f_lasti))


__all__ = ["HeldRecord", "is_last_act"]
