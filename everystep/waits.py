"""Workflows that wait on the world: messages in, events out, child runs.

Every wait here is the one mechanism durable sleep uses (``sleeps``): the
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
a ``recv`` consumes its message (a crash there delivers it again), and
before the one transaction of a ``set_event`` or a ``start`` (a crash there
writes nothing); a crash right after a commit is the next step's fault
point.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from . import body_calls, durations, recording, serde
from .context import Context, Execution, recording_context
from .errors import STORE_FAILURES, ChildFailed, ChildTimeout, EverystepError, RecvTimeout, RunNotFound
from .models import (
    ACTIVE_STATUSES,
    COMPLETED,
    CONTINUED,
    STEP_WAITING,
    STEP_DONE,
    STEP_FAILED,
    TERMINAL_STATUSES,
    WAIT_FOREVER,
    Run,
    StepRecord,
    row_fields,
)
from .store import NewStep, utcnow
from .store.base.values import checked_run_id
from .wait_kinds import CHILD, EVENT, MESSAGE, RUN

if TYPE_CHECKING:
    from .new_run import NewRun

RECV_STEP = MESSAGE.step
EVENT_STEP = "everystep.set_event"
START_STEP = "everystep.start"
CHILD_STEP = CHILD.step
#: A body's ``wait(run_id)``: a wait for that run's end.
RUN_STEP = RUN.step

#: A wait on another run (its event, its end) that nothing may wake at once
#: (a run waiting for several things at the moment the event is set; a run
#: that is not this one's child ending) is checked again after a tenth of
#: the time it has waited, at least ``RECHECK_MIN`` and at most
#: ``RECHECK_MAX`` seconds.
RECHECK_MIN = 0.5
RECHECK_MAX = 30.0


def _timeout_at(now: dt.datetime, timeout: float | dt.timedelta | None, what: str) -> dt.datetime | None:
    if timeout is None:
        return None
    return now + dt.timedelta(seconds=durations.seconds(timeout, f"{what} timeout"))


def _workflow_context(call: str) -> Context:
    ctx = recording_context()
    if ctx is None:
        raise EverystepError(f"everystep.{call}() must be called inside a running workflow's body (not in a "
                             "step's own code, nor outside a workflow)")
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
    step_id = recording.next_step_id(ex, ctx, name)
    recorded = recording.recorded_at(ex, step_id, step_name)
    if recorded is not None:
        if recorded.status != STEP_WAITING:
            return None, recording.replay_outcome(ex, recorded)
        entered = _Entered(step_id, recorded.started_at or utcnow(), recorded.wake_at, False)
        if ex.dry_run:
            raise recording.suspend(ex, entered.deadline or WAIT_FOREVER, wait_key, what)
        return entered, None
    recording.may_start(ex, step_id, step_name)
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
    entered, replayed = _enter_wait(ex, ctx, name, RECV_STEP, MESSAGE.key(topic), what, timeout, "recv")
    if entered is None:
        return replayed
    step_id, started_at, deadline, first = entered
    args_json = serde.dumps([topic], "recv")
    done = NewStep(step_id, RECV_STEP, args_json, "{}", started_at, status=STEP_DONE, wake_at=deadline)
    waiting = NewStep(step_id, RECV_STEP, args_json, "{}", started_at, status=STEP_WAITING,
                      wake_at=deadline) if first else None
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=RECV_STEP, status=STEP_DONE, args=[topic],
                         started_at=started_at, wake_at=deadline)
    recording.crash_point(ctx, step_id)
    write = _call(ex, lambda markers: ex.store.take_message(ex.claim, topic, done, waiting, decoded, markers))
    if write.record.status != STEP_WAITING:
        ex.outcomes[step_id] = write.record
        return write.record.result if write.ours else recording.replay_outcome(ex, write.record)
    if deadline is not None and recording.is_due(ex, deadline):
        return _fail(ex, step_id, RECV_STEP, [topic], started_at, deadline,
                     RecvTimeout(f"no message on topic {topic!r} within the timeout (run {ex.run.id}, "
                                 f"step {step_id})"))
    raise recording.suspend(ex, deadline or WAIT_FOREVER, MESSAGE.key(topic), what)


def message_json(topic: str, payload: Any, idempotency_key: str | None) -> str:
    """A message's payload as JSON, once its topic and key are checked."""
    if not isinstance(topic, str) or not topic:
        raise EverystepError(f"send needs a topic, a non-empty string, not {topic!r}")
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key):
        raise EverystepError("idempotency_key must be a non-empty string")
    return serde.dumps(payload, f"message on topic {topic!r}")


# -- events ------------------------------------------------------------------------


def set_event(key: str, value: Any, name: str | None = None) -> None:
    """See ``everystep.set_event``."""
    event_key_checked(key, "set_event")
    ctx = _workflow_context("set_event")
    ex = ctx.execution
    step_id = recording.next_step_id(ex, ctx, name)
    recorded = recording.recorded_at(ex, step_id, EVENT_STEP)
    if recorded is not None:
        recording.replay_outcome(ex, recorded)
        return
    recording.may_start(ex, step_id, EVENT_STEP)
    try:
        value_json = serde.dumps(value, f"event {key!r}")
        args_json = serde.dumps([key, value], f"event {key!r}")
    except EverystepError as exc:
        raise ex.interrupt_with(exc) from None
    entry = NewStep(step_id, EVENT_STEP, args_json, "{}", utcnow(), status=STEP_DONE, result_json="null")
    recording.crash_point(ctx, step_id)  # before its one transaction: a crash publishes nothing
    write = _call(ex, lambda markers: ex.store.record_with_event(ex.claim, entry, key, value_json, markers))
    assert write is not None
    ex.outcomes[step_id] = write.record


def event_key_checked(key: Any, call: str = "get_event") -> str:
    """An event's key, refused (one line) unless it is a non-empty string."""
    if not isinstance(key, str) or not key:
        raise EverystepError(f"{call} needs a key, a non-empty string, not {key!r}")
    return key


def await_event(ctx: Context, run_id: str, key: str, seconds: float, name: str | None) -> Any:
    """A body's ``get_event`` with a timeout: a recorded wait for run
    ``run_id``'s event ``key`` that holds no process. The publisher's
    ``set_event`` wakes it (``Store.record_with_event``); past the timeout
    it is recorded failed with ``TimeoutError``, as outside a body."""
    ex = ctx.execution
    step_name = body_calls.GET_EVENT_STEP
    what = f'event "{key}" of run {run_id}'
    entered, replayed = _enter_wait(ex, ctx, name, step_name, EVENT.key(f"{checked_run_id(run_id)}:{key}"), what, seconds, "get_event")
    if entered is None:
        return replayed
    step_id, started_at, deadline, first = entered
    args = [run_id, key]
    try:
        event = _call_value(ex, lambda: body_calls.read_event(ex.store, run_id, key))
    except RunNotFound as exc:
        return _fail(ex, step_id, step_name, args, started_at, deadline, exc)
    except TimeoutError:
        pass
    else:
        return _finish(ex, step_id, step_name, args, started_at, deadline, event)
    if deadline is not None and recording.is_due(ex, deadline):
        return _fail(ex, step_id, step_name, args, started_at, deadline, body_calls.no_event(run_id, key, seconds))
    return _watch(ex, step_id, step_name, args, started_at, deadline, first, EVENT.key(f"{checked_run_id(run_id)}:{key}"), what)


def wait_for_run(ctx: Context, run_id: str, timeout: float | None, name: str | None) -> Run:
    """A body's ``wait(run_id)``: a recorded wait for that run to reach a
    terminal status, holding no process; returns the run as it ended (the
    same ``Run`` on every replay). Past ``timeout`` seconds it is recorded
    failed with ``TimeoutError``, as outside a body. Its end does not wake
    this run at once (unless it is this run's child: wait for those with
    ``ChildHandle.result()``): the wait is checked again after a tenth of
    the time waited so far (``RECHECK_MIN`` to ``RECHECK_MAX`` seconds)."""
    ex = ctx.execution
    what = f"run {run_id}"
    entered, replayed = _enter_wait(ex, ctx, name, RUN_STEP, RUN.key(run_id), what, timeout, "wait")
    if entered is None:
        return body_calls.run_of(replayed)
    step_id, started_at, deadline, first = entered
    try:
        run = _call_value(ex, lambda: ex.store.get_run(run_id))
        while run.status == CONTINUED and run.continued_as:  # its chain's last run decides
            successor = run.continued_as
            run = _call_value(ex, lambda: ex.store.get_run(successor))
    except RunNotFound as exc:
        return _fail(ex, step_id, RUN_STEP, [run_id], started_at, deadline, exc)  # type: ignore[no-any-return]
    if run.status in TERMINAL_STATUSES:
        return body_calls.run_of(_finish(ex, step_id, RUN_STEP, [run_id], started_at, deadline, row_fields(run)))
    if deadline is not None and recording.is_due(ex, deadline):
        return _fail(ex, step_id, RUN_STEP, [run_id], started_at, deadline,  # type: ignore[no-any-return]
                     TimeoutError(f"run {run_id} is still {run.status} after {timeout:g}s"))
    return _watch(ex, step_id, RUN_STEP, [run_id], started_at, deadline, first, RUN.key(run.id), what)  # type: ignore[no-any-return]


def _watch(ex: Execution, step_id: str, step_name: str, args: list[Any], started_at: dt.datetime,
           deadline: dt.datetime | None, first: bool, wait_key: str, what: str) -> Any:
    """Wait (``Suspended``) for what another run does: the step recorded
    ``waiting`` on its first execution; the run released until the
    deadline or its next check (``RECHECK_MIN`` to ``RECHECK_MAX``)."""
    if first:
        entry = NewStep(step_id, step_name, serde.dumps(args, step_name), "{}", started_at, status=STEP_WAITING,
                        wake_at=deadline)
        write = _call(ex, lambda markers: ex.store.record_step(ex.claim, entry, None, markers))
        if not write.ours:
            ex.outcomes[step_id] = write.record
            return recording.replay_outcome(ex, write.record)
    now = utcnow()
    waited = max((now - started_at).total_seconds(), 0.0)
    check = now + dt.timedelta(seconds=min(RECHECK_MAX, max(RECHECK_MIN, waited / 10)))
    raise recording.suspend(ex, min(check, deadline) if deadline is not None else check, wait_key, what)


# -- child runs ----------------------------------------------------------------------


def start_child(decide: Callable[[], NewRun], step_name: str | None = None) -> str:
    """See ``everystep.start``: inside a workflow only. ``decide`` gives the
    child's options (``everystep.new_run``), called only when the child is
    started, never on a replay of the step."""
    ctx = _workflow_context("start")
    ex = ctx.execution
    step_id = recording.next_step_id(ex, ctx, step_name)
    recorded = recording.recorded_at(ex, step_id, START_STEP)
    if recorded is not None:
        return str(recording.replay_outcome(ex, recorded))
    recording.may_start(ex, step_id, START_STEP)
    child = decide()
    entry = NewStep(step_id, START_STEP, serde.dumps([child.name], "start"), "{}", utcnow(), status=STEP_DONE)
    recording.crash_point(ctx, step_id)  # before its one transaction: a crash starts no child
    write = _call(ex, lambda markers: ex.store.start_child(ex.claim, entry, child.name, child.args_json,
                                                           child.idempotency_key, child.placement, child.deadline,
                                                           child.app_version, markers))
    assert write is not None
    ex.outcomes[step_id] = write.record
    return str(recording.replay_outcome(ex, write.record))


def await_child(ctx: Context, child_id: str, timeout: float | dt.timedelta | None = None,
                name: str | None = None) -> Any:
    """A body's wait for its child's end (``ChildHandle.result``): recorded
    with the child's result, or ``ChildFailed`` (``ChildTimeout`` past
    ``timeout``); the run is released meanwhile, and the child's end wakes
    it."""
    ex = ctx.execution
    what = f"child {child_id}"
    entered, replayed = _enter_wait(ex, ctx, name, CHILD_STEP, CHILD.key(child_id), what, timeout, "child result")
    if entered is None:
        return replayed
    step_id, started_at, deadline, first = entered
    outcome = _call_value(ex, lambda: ex.store.child_outcome(child_id))
    if first and outcome is not None and outcome.parent_id != ex.run.id and not _started_here(ex, child_id):
        # Its end would never wake this run: refused, nothing recorded.
        raise EverystepError(f"run {child_id} is not a child of run {ex.run.id}: ChildHandle.result() waits for "
                             f"a run this one started with everystep.start(); wait for any other run with "
                             f"everystep.wait({child_id!r})")
    newest = child_id
    while outcome is not None and outcome.status == CONTINUED and outcome.continued_as:
        # A child that continued as new: its result is its chain's last run's.
        newest = outcome.continued_as
        outcome = _call_value(ex, lambda: ex.store.child_outcome(newest))
    if outcome is None:
        return _fail(ex, step_id, CHILD_STEP, [child_id], started_at, deadline,
                     ChildFailed(f"child run {child_id} does not exist (deleted?)", child_id, "missing", None))
    if outcome.status not in ACTIVE_STATUSES:
        if outcome.status == COMPLETED:
            return _finish(ex, step_id, CHILD_STEP, [child_id], started_at, deadline, outcome.result)
        return _fail(ex, step_id, CHILD_STEP, [child_id], started_at, deadline, child_failed(child_id, outcome))
    if deadline is not None and recording.is_due(ex, deadline):
        return _fail(ex, step_id, CHILD_STEP, [child_id], started_at, deadline,
                     ChildTimeout(f"child run {child_id} did not end within the timeout (run {ex.run.id}, "
                                  f"step {step_id})"))
    if first:
        entry = NewStep(step_id, CHILD_STEP, serde.dumps([child_id], "child"), "{}", started_at,
                        status=STEP_WAITING, wake_at=deadline)
        write = _call(ex, lambda markers: ex.store.record_step(ex.claim, entry, None, markers))
        assert write is not None
        if not write.ours:
            ex.outcomes[step_id] = write.record
            return recording.replay_outcome(ex, write.record)
    raise recording.suspend(ex, deadline or WAIT_FOREVER, CHILD.key(newest), what)


def _started_here(ex: Execution, child_id: str) -> bool:
    """Whether a ``start`` step of this run recorded ``child_id``: a fork
    copies its source's starts, whose children keep their first parent."""
    return any(record.name == START_STEP and record.result == child_id for record in ex.outcomes.values())


def child_failed(child_id: str, outcome: Any) -> ChildFailed:
    cause = serde.decode_exception(outcome.error)
    detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
    return ChildFailed(f"child run {child_id} ended {outcome.status}{detail}", child_id, outcome.status,
                       outcome.error, cause)


# -- recording -------------------------------------------------------------------------


def _call(ex: Execution, action: Any) -> Any:
    """A write of a wait step: a refused one interrupts as every step write's does."""
    return recording.store_write(ex, action)


def _call_value(ex: Execution, read: Any) -> Any:
    try:
        return read()
    except STORE_FAILURES as exc:
        raise ex.interrupt_with(exc) from None


def _finish(ex: Execution, step_id: str, step_name: str, args: list[Any], started_at: dt.datetime,
            deadline: dt.datetime | None, result: Any) -> Any:
    """Record the wait step done with ``result`` and return what is recorded."""
    entry = NewStep(step_id, step_name, serde.dumps(args, step_name), "{}", started_at, status=STEP_DONE,
                    result_json=serde.dumps(result, f"result of {step_name}"), wake_at=deadline)
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=step_name, status=STEP_DONE, args=args,
                         result=result, started_at=started_at, wake_at=deadline)
    write = _call(ex, lambda markers: ex.store.record_step(ex.claim, entry, decoded, markers))
    ex.outcomes[step_id] = write.record
    return recording.replay_outcome(ex, write.record)


def _fail(ex: Execution, step_id: str, step_name: str, args: list[Any], started_at: dt.datetime,
          deadline: dt.datetime | None, error: Exception) -> Any:
    """Record the wait step failed with ``error`` and raise what is recorded."""
    encoded = serde.encode_exception(error)
    entry = NewStep(step_id, step_name, serde.dumps(args, step_name), "{}", started_at, status=STEP_FAILED,
                    error_json=serde.dumps(encoded, f"exception of step {step_id}"), wake_at=deadline)
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=step_name, status=STEP_FAILED, args=args,
                         error=encoded, started_at=started_at, wake_at=deadline)
    write = _call(ex, lambda markers: ex.store.record_step(ex.claim, entry, decoded, markers))
    ex.outcomes[step_id] = write.record
    return recording.replay_outcome(ex, write.record)


__all__ = ["CHILD_STEP", "EVENT_STEP", "RECHECK_MAX", "RECHECK_MIN", "RECV_STEP", "RUN_STEP", "START_STEP",
           "await_child", "await_event", "child_failed", "event_key_checked",
           "message_json", "recv", "set_event", "start_child",
           "wait_for_run"]
