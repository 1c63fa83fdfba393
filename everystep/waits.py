"""Workflows that wait on the world: messages in, events out, child runs.

Every wait here is the one mechanism durable sleep uses (``runner``): the
waiting step is recorded ``waiting`` (what for in its args, its timeout in
``wake_at``), the scope unwinds with ``Suspended``, and the run is released
back to ``scheduled`` with that time as its not-before time (or
``models.WAIT_FOREVER``) and a ``wait_key`` saying what ends the wait
early. No process, thread or connection waits. A send or a child's end
makes the run due in the transaction that ends the wait, and on PostgreSQL
wakes runners by NOTIFY; the locking that keeps a wake from being lost
between a run's last look and its release is in ``store/base/waits.py``.

Each call is a step with a position of its own, named like any step
(``everystep_id=``):

- ``recv(topic)`` (``everystep.recv``): consumes the oldest message on the
  topic in the transaction that records the step ``done`` with its payload,
  so a crash before that commit delivers the message again and one after it
  replays the recorded payload: each message reaches the body exactly once.
  Past its timeout the step is recorded failed with ``RecvTimeout``.
- ``set_event(key, value)`` (``everystep.set_event``): publishes in the
  transaction that records the step; a replay does not write again.
- ``start(workflow, ...)`` (``everystep.start``): schedules the child in the
  transaction that records the step with the child's id, so a replay
  returns the same child and never schedules a second.
- ``handle.result()`` (``everystep.child``): waits for the child's end and
  records its result, or ``ChildFailed`` (``ChildTimeout`` past a timeout).

Fault injection: ``runner.fault`` is called ``(ctx, step_id)`` just before
a ``recv`` consumes its message (a crash there delivers it again); a crash
right after the consuming commit is the next step's fault point.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from . import runner, serde
from .context import Context, Execution, current, recording_context
from .errors import ChildFailed, ChildTimeout, EverystepError, RecvTimeout, SimulatedCrash, StoreUnavailable
from .models import (
    ACTIVE_STATUSES,
    COMPLETED,
    STEP_AWAITING,
    STEP_DONE,
    STEP_FAILED,
    WAIT_FOREVER,
    StepRecord,
)
from .store import NewStep, utcnow
from .store.base.waits import child_key, message_key

if TYPE_CHECKING:
    from .new_run import NewRun
    from .store import Store

RECV_STEP = "everystep.recv"
EVENT_STEP = "everystep.set_event"
START_STEP = "everystep.start"
CHILD_STEP = "everystep.child"
#: The function names of the steps this module records: what each waits for.
WAIT_STEPS = {RECV_STEP: "message", CHILD_STEP: "child"}


def _timeout_at(now: dt.datetime, timeout: float | dt.timedelta | None, what: str) -> dt.datetime | None:
    if timeout is None:
        return None
    seconds = timeout.total_seconds() if isinstance(timeout, dt.timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        raise EverystepError(f"{what} timeout must be a finite number of seconds, 0 or more, not {timeout!r}")
    return now + dt.timedelta(seconds=seconds)


def _workflow_context(call: str) -> Context:
    ctx = recording_context()
    if ctx is None:
        raise EverystepError(f"everystep.{call}() is called inside a running workflow (not in a step's own "
                             "code, nor outside a workflow)")
    return ctx


# -- the start every recorded wait shares ---------------------------------------


class _Entered(NamedTuple):
    step_id: str
    started_at: dt.datetime
    deadline: dt.datetime | None
    first: bool  # no row yet: the wait's first execution


def _enter_wait(ex: Any, ctx: Any, name: str | None, step_name: str, wait_key: str, what: str,
                timeout: float | dt.timedelta | None, label: str) -> tuple[_Entered | None, Any]:
    """Where a recorded wait (recv, a child's result) stands at its step id:
    a recorded outcome is replayed (``(None, value)``); a step still waiting
    keeps its start and deadline (a dry replay stops there); a new one is
    allowed to start and gets its deadline from ``timeout``."""
    step_id = runner._next_id(ex, ctx, name)
    recorded = ex.outcomes.get(step_id)
    if recorded is not None:
        if recorded.name != step_name:
            raise runner._diverged(ex, step_id, recorded.name, step_name)
        if recorded.status != STEP_AWAITING:
            return None, runner._replay(ex, recorded)
        entered = _Entered(step_id, recorded.started_at or utcnow(), recorded.wake_at, False)
        if ex.dry_run:
            raise runner._suspend(ex, entered.deadline or WAIT_FOREVER, wait_key, what)
        return entered, None
    runner._may_start(ex, step_id, step_name)
    started_at = utcnow()
    try:
        deadline = _timeout_at(started_at, timeout, label)
    except EverystepError as exc:
        raise ex.interrupt_with(exc) from None
    return _Entered(step_id, started_at, deadline, True), None


# -- messages ------------------------------------------------------------------


def recv(topic: str, timeout: float | dt.timedelta | None = None, name: str | None = None) -> Any:
    """See ``everystep.recv``."""
    if not isinstance(topic, str) or not topic:
        raise EverystepError(f"recv needs a topic, a non-empty string, not {topic!r}")
    ctx = _workflow_context("recv")
    ex = ctx.execution
    what = f'message "{topic}"'
    entered, replayed = _enter_wait(ex, ctx, name, RECV_STEP, message_key(topic), what, timeout, "recv")
    if entered is None:
        return replayed
    step_id, started_at, deadline, first = entered
    args_json = serde.dumps([topic], "recv")
    done = NewStep(step_id, RECV_STEP, args_json, "{}", started_at, status=STEP_DONE, wake_at=deadline)
    waiting = NewStep(step_id, RECV_STEP, args_json, "{}", started_at, status=STEP_AWAITING,
                      wake_at=deadline) if first else None
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=RECV_STEP, status=STEP_DONE, args=[topic],
                         started_at=started_at, wake_at=deadline)
    _fault(ctx, step_id)
    write = _call(ex, lambda: ex.store.take_message(ex.claim, topic, done, waiting, decoded))
    if write.record.status != STEP_AWAITING:
        ex.outcomes[step_id] = write.record
        return write.record.result if write.ours else runner._replay(ex, write.record)
    if deadline is not None and runner._due(ex, deadline):
        return _fail(ex, step_id, RECV_STEP, [topic], started_at, deadline,
                     RecvTimeout(f"no message on topic {topic!r} within the timeout (run {ex.run.id}, "
                                 f"step {step_id})"))
    raise runner._suspend(ex, deadline or WAIT_FOREVER, message_key(topic), what)


def message_json(topic: str, payload: Any, idempotency_key: str | None) -> str:
    """A message's payload as JSON, once its topic and key are checked."""
    if not isinstance(topic, str) or not topic:
        raise EverystepError(f"send needs a topic, a non-empty string, not {topic!r}")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
        raise EverystepError("idempotency_key must be a non-empty string")
    return serde.dumps(payload, f"message on topic {topic!r}")


def send(run_id: str, topic: str, payload: Any, idempotency_key: str | None = None,
         database: str | Store | None = None, conn: Any = None) -> int:
    """See ``everystep.send``."""
    from . import api, borrowed

    payload_json = message_json(topic, payload, idempotency_key)
    if conn is not None:
        return borrowed.send(conn, run_id, topic, payload_json, idempotency_key)
    running = current()
    if database is None and running is not None:
        # From a workflow or its step's code: the database the run lives in.
        return running.execution.store.send(run_id, topic, payload_json, idempotency_key)
    provider = api._provided(database)
    if provider is not None:
        with provider() as provided:
            return borrowed.send(provided, run_id, topic, payload_json, idempotency_key)
    return api._store(database).send(run_id, topic, payload_json, idempotency_key)


# -- events ------------------------------------------------------------------------


def set_event(key: str, value: Any, name: str | None = None) -> None:
    """See ``everystep.set_event``."""
    if not isinstance(key, str) or not key:
        raise EverystepError(f"set_event needs a key, a non-empty string, not {key!r}")
    ctx = _workflow_context("set_event")
    ex = ctx.execution
    step_id = runner._next_id(ex, ctx, name)
    recorded = ex.outcomes.get(step_id)
    if recorded is not None:
        if recorded.name != EVENT_STEP:
            raise runner._diverged(ex, step_id, recorded.name, EVENT_STEP)
        runner._replay(ex, recorded)
        return
    runner._may_start(ex, step_id, EVENT_STEP)
    try:
        value_json = serde.dumps(value, f"event {key!r}")
        args_json = serde.dumps([key, value], f"event {key!r}")
    except EverystepError as exc:
        raise ex.interrupt_with(exc) from None
    entry = NewStep(step_id, EVENT_STEP, args_json, "{}", utcnow(), status=STEP_DONE, result_json="null")
    write = _call(ex, lambda: ex.store.record_with_event(ex.claim, entry, key, value_json))
    assert write is not None
    ex.outcomes[step_id] = write.record


def get_event(run_id: str, key: str, timeout: float = 0, database: str | Store | None = None,
              poll: float = 0.05) -> Any:
    """See ``everystep.get_event``."""
    from . import api

    store = api._store(database)
    give_up = time.monotonic() + max(float(timeout), 0.0)
    store.get_run(run_id)  # RunNotFound for an unknown run
    while True:
        event = store.get_event(run_id, key)
        if event is not None:
            return event.value
        if time.monotonic() >= give_up:
            raise TimeoutError(f"run {run_id} has not set event {key!r}" +
                               (f" within {timeout:g}s" if timeout else ""))
        time.sleep(min(poll, max(give_up - time.monotonic(), 0.0)) or poll)


# -- child runs ----------------------------------------------------------------------


@dataclass(frozen=True)
class ChildHandle:
    """A child run started by a workflow (``everystep.start``): its id, and
    ``result()`` to wait for its end."""

    run_id: str

    def result(self, timeout: float | dt.timedelta | None = None, everystep_id: str | None = None) -> Any:
        """The child's result, waited for durably (inside a workflow the
        parent is released while the child runs, holding no process); raises
        ``ChildFailed`` if the child failed, stopped or was cancelled, and
        ``ChildTimeout`` after ``timeout`` seconds. Outside a workflow it
        polls the database."""
        return await_child(self.run_id, timeout, everystep_id)

    async def result_async(self, timeout: float | dt.timedelta | None = None,
                           everystep_id: str | None = None) -> Any:
        """``result()`` in an async workflow: the same step, the same release."""
        from . import aio

        return await aio.in_thread(await_child, self.run_id, timeout, everystep_id)

    def __str__(self) -> str:
        return self.run_id


def start_child(decide: Callable[[], NewRun], step_name: str | None = None) -> ChildHandle:
    """See ``everystep.start``: inside a workflow only. ``decide`` gives the
    child's options (``everystep.new_run``), called only when the child is
    started, never on a replay of the step."""
    ctx = _workflow_context("start")
    ex = ctx.execution
    step_id = runner._next_id(ex, ctx, step_name)
    recorded = ex.outcomes.get(step_id)
    if recorded is not None:
        if recorded.name != START_STEP:
            raise runner._diverged(ex, step_id, recorded.name, START_STEP)
        return ChildHandle(str(runner._replay(ex, recorded)))
    runner._may_start(ex, step_id, START_STEP)
    child = decide()
    entry = NewStep(step_id, START_STEP, serde.dumps([child.name], "start"), "{}", utcnow(), status=STEP_DONE)
    write = _call(ex, lambda: ex.store.start_child(ex.claim, entry, child.name, child.args_json,
                                                   child.idempotency_key, child.placement, child.deadline,
                                                   child.app_version))
    assert write is not None
    ex.outcomes[step_id] = write.record
    return ChildHandle(str(runner._replay(ex, write.record)))


def await_child(child_id: str, timeout: float | dt.timedelta | None = None, name: str | None = None) -> Any:
    ctx = recording_context()
    if ctx is None:
        return _poll_child(child_id, timeout)
    ex = ctx.execution
    what = f"child {child_id}"
    entered, replayed = _enter_wait(ex, ctx, name, CHILD_STEP, child_key(child_id), what, timeout, "child result")
    if entered is None:
        return replayed
    step_id, started_at, deadline, first = entered
    outcome = _call_value(ex, lambda: ex.store.child_outcome(child_id))
    if outcome is None:
        return _fail(ex, step_id, CHILD_STEP, [child_id], started_at, deadline,
                     ChildFailed(f"child run {child_id} does not exist (deleted?)", child_id, "missing", None))
    if outcome.status not in ACTIVE_STATUSES:
        if outcome.status == COMPLETED:
            return _finish(ex, step_id, [child_id], started_at, deadline, outcome.result)
        return _fail(ex, step_id, CHILD_STEP, [child_id], started_at, deadline, _child_failed(child_id, outcome))
    if deadline is not None and runner._due(ex, deadline):
        return _fail(ex, step_id, CHILD_STEP, [child_id], started_at, deadline,
                     ChildTimeout(f"child run {child_id} did not end within the timeout (run {ex.run.id}, "
                                  f"step {step_id})"))
    if first:
        entry = NewStep(step_id, CHILD_STEP, serde.dumps([child_id], "child"), "{}", started_at,
                        status=STEP_AWAITING, wake_at=deadline)
        write = _call(ex, lambda: ex.store.record_step(ex.claim, entry))
        assert write is not None
        if not write.ours:
            ex.outcomes[step_id] = write.record
            return runner._replay(ex, write.record)
    raise runner._suspend(ex, deadline or WAIT_FOREVER, child_key(child_id), what)


def _child_failed(child_id: str, outcome: Any) -> ChildFailed:
    cause = serde.decode_exception(outcome.error)
    detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
    return ChildFailed(f"child run {child_id} ended {outcome.status}{detail}", child_id, outcome.status,
                       outcome.error)


def _poll_child(child_id: str, timeout: float | dt.timedelta | None) -> Any:
    from . import api

    seconds = timeout.total_seconds() if isinstance(timeout, dt.timedelta) else timeout
    try:
        run = api.wait(child_id, timeout=seconds if seconds is not None else 10 ** 9)
    except TimeoutError as exc:
        raise ChildTimeout(str(exc)) from None
    if run.status == COMPLETED:
        return run.result
    from .store.base.waits import ChildOutcome

    raise _child_failed(child_id, ChildOutcome(run.status, run.result, run.error))


# -- recording -------------------------------------------------------------------------


def _fault(ctx: Context, step_id: str) -> None:
    if runner.fault is not None:
        try:
            runner.fault(ctx, step_id)
        except SimulatedCrash as crash:
            raise ctx.execution.interrupt_with(crash) from None


def _call(ex: Execution, action: Any) -> Any:
    """A write of a wait step: a refused one interrupts as every step write's does."""
    return runner._store_call(ex, action)


def _call_value(ex: Execution, read: Any) -> Any:
    try:
        return read()
    except StoreUnavailable as exc:
        raise ex.interrupt_with(exc) from None


def _finish(ex: Execution, step_id: str, args: list[Any], started_at: dt.datetime, deadline: dt.datetime | None,
            result: Any) -> Any:
    entry = NewStep(step_id, CHILD_STEP, serde.dumps(args, "child"), "{}", started_at, status=STEP_DONE,
                    result_json=serde.dumps(result, "child result"), wake_at=deadline)
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=CHILD_STEP, status=STEP_DONE, args=args,
                         result=result, started_at=started_at, wake_at=deadline)
    write = _call(ex, lambda: ex.store.record_step(ex.claim, entry, decoded))
    ex.outcomes[step_id] = write.record
    return runner._replay(ex, write.record)


def _fail(ex: Execution, step_id: str, step_name: str, args: list[Any], started_at: dt.datetime,
          deadline: dt.datetime | None, error: Exception) -> Any:
    """Record the wait step failed with ``error`` and raise what is recorded."""
    encoded = serde.encode_exception(error)
    entry = NewStep(step_id, step_name, serde.dumps(args, step_name), "{}", started_at, status=STEP_FAILED,
                    error_json=serde.dumps(encoded, f"exception of step {step_id}"), wake_at=deadline)
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=step_name, status=STEP_FAILED, args=args,
                         error=encoded, started_at=started_at, wake_at=deadline)
    write = _call(ex, lambda: ex.store.record_step(ex.claim, entry, decoded))
    ex.outcomes[step_id] = write.record
    return runner._replay(ex, write.record)


__all__ = ["CHILD_STEP", "EVENT_STEP", "RECV_STEP", "START_STEP", "WAIT_STEPS", "ChildHandle", "await_child",
           "get_event", "recv", "send", "set_event", "start_child"]
