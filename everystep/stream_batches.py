"""Values written from steps' code, committed in batches by a thread of the
execution's own (group commit).

A step that writes a value per row of an import or per token of a model's
answer would spend a commit on each. Instead ``write_stream`` from a
step's code puts the value on its execution's queue and returns; a writer
thread takes everything queued at once and writes it in one transaction
(``Store.append_batch``), then takes what was queued meanwhile. A lone
value is written at once (the thread wakes when it is queued), so a reader
sees it one commit later; under a burst the batches grow and each commit
carries many values.

::

    step's code            queue              writer thread            database
    ───────────            ─────              ─────────────            ────────
    write_stream(v1) ──▶ [v1] ──wakes──▶ take [v1] ────────────▶ one transaction
    write_stream(v2) ──▶ [v2]                                  ◀── commit (NOTIFY)
    write_stream(v3) ──▶ [v2 v3]          take [v2 v3] ────────▶ one transaction
    (returns)                                                   ◀── commit
    settle(step) ── waits until the step has nothing queued or in flight;
                    a refusal of its values is raised there, in the step

The step's end waits for its values (``settle``, called by the step's
driver after the step's function returned or raised, before its record),
so every value a step wrote commits before its outcome is recorded. A
refusal (a full or closed stream) is raised in the step, at its next write
or at its end, and is the step's exception; a lost claim or an unreachable
database interrupts the run, as any write of the execution would. The
first batch holding a step's values withdraws what other executions of
that step wrote (``everystep.streams`` says why). The thread ends after a
second with nothing to write and is started again by the next value.
"""

from __future__ import annotations

import threading
from typing import Any

from . import recording
from .context import Execution, current
from .errors import StreamRefused
from .store import StreamBounds

#: Seconds the writer thread waits for a value before it ends.
IDLE = 1.0


class StepStreams:
    """One execution's queue of step values and the thread that writes them."""

    def __init__(self, ex: Execution) -> None:
        self._ex = ex
        self._cond = threading.Condition()
        self._queue: list[tuple[str, str, str | None]] = []
        self._in_flight: set[str] = set()
        self._errors: dict[str, BaseException] = {}
        self._bounds: StreamBounds | None = None
        self._thread: threading.Thread | None = None

    def put(self, step_id: str, key: str, value_json: str | None, bounds: StreamBounds) -> None:
        """Queue a value of step ``step_id`` (None: close ``key``); a
        refusal of its earlier values is raised here first."""
        with self._cond:
            self._raise_for(step_id)
            self._queue.append((step_id, key, value_json))
            self._bounds = bounds
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_forever, name="everystep-stream-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def settle(self, step_id: str, quietly: bool = False) -> None:
        """Wait until step ``step_id`` has nothing queued or being written;
        raise a refusal of its values unless ``quietly`` (its code raised
        already: that is its outcome)."""
        with self._cond:
            while step_id in self._in_flight or any(row[0] == step_id for row in self._queue):
                self._cond.wait()
            if quietly:
                self._errors.pop(step_id, None)
            else:
                self._raise_for(step_id)

    def _raise_for(self, step_id: str) -> None:
        error = self._errors.pop(step_id, None)
        if error is None:
            return
        if isinstance(error, StreamRefused):
            raise error
        raise self._ex.interrupt_with(error)

    def _write_forever(self) -> None:
        ex = self._ex
        while True:
            with self._cond:
                while not self._queue:
                    if not self._cond.wait(IDLE) and not self._queue:
                        self._thread = None
                        return
                batch, self._queue = self._queue, []
                self._in_flight = {row[0] for row in batch}
                bounds = self._bounds
            assert bounds is not None
            error: BaseException | None = None
            withdraw = self._in_flight - ex.streamed
            try:
                if ex.store.append_batch(ex.claim, ex.attempt_id, batch, bounds, withdraw):
                    ex.streamed.update(withdraw)
                else:
                    error = recording.refused(ex)
            except Exception as exc:  # a refusal, or the database's failure: the step learns of it
                error = exc
            with self._cond:
                if error is not None:
                    for step_id in self._in_flight:
                        self._errors[step_id] = error
                self._in_flight = set()
                self._cond.notify_all()


#: Guards the making of an execution's queue (parallel steps may write first at once).
_MAKING = threading.Lock()


def of(ex: Execution) -> StepStreams:
    """The execution's queue, made on its first value."""
    with _MAKING:
        if ex.stream_batches is None:
            ex.stream_batches = StepStreams(ex)
        found: Any = ex.stream_batches
    return found  # type: ignore[no-any-return]


def active() -> bool:
    """Whether this execution's steps have written values (an async step's
    driver hops to a thread to ``settle`` only then)."""
    ctx = current()
    return ctx is not None and ctx.execution.stream_batches is not None


def settle(step_id: str, quietly: bool = False) -> None:
    """The end of step ``step_id``'s function: wait for its values (see the
    module). Costs one attribute read for an execution whose steps wrote none."""
    ctx = current()
    queue = ctx.execution.stream_batches if ctx is not None else None
    if queue is not None:
        queue.settle(step_id, quietly)


__all__ = ["IDLE", "StepStreams", "active", "of", "settle"]
