"""The client calls a workflow body makes, recorded so a replay repeats none.

A body runs again from the top after every crash, wait and resume. The
calls it makes that reach the world (``send``, ``schedule``) or read it
(``get_run``, ``get_steps``, ``get_event``) are steps of the engine's own
here, with a position in their scope like any step (``everystep_id=``
names one):

- ``record_write``: the effect and the step's record commit in one
  transaction, fenced by the claim (``Store.record_send``,
  ``Store.record_schedule``). A crash before that commit leaves neither, a
  crash after it leaves both: the replay returns the recorded outcome (the
  message's id, the scheduled run) and never repeats the effect. A refusal
  of the effect (``SendRefused``) is recorded as the step's failure, so
  every replay raises it again.
- ``record_read``: the read, then its record; a replay returns what the
  first execution read, so a later step sees what the first one saw. A
  read's failure (``RunNotFound``, ``TimeoutError``) is recorded too.

The waits (``recv``, ``get_event`` with a timeout, ``wait``, a child's
result) are in ``everystep.waits``. What each public function is in a body
is declared next to it (``everystep.body_rules``); ``refused_in_body``
declares a refused one and enforces it.

Fault injection: ``runner.fault`` is called ``(ctx, step_id)`` just before a
write's transaction (a crash there sends or schedules nothing) and just
after a read (a crash there reads again on the replay).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import recording, serde
from .context import Context, Execution, recording_context
from .errors import STORE_FAILURES, BodyCallRefused, EverystepError, RunNotFound, SendRefused, StreamRefused
from .models import STEP_DONE, STEP_FAILED, Run, StepRecord, row_fields, row_from_fields
from .new_run import NewRun
from .store import Marker, NewStep, Store, StepWrite, step_pages, utcnow
from .wait_kinds import EVENT

SEND_STEP = "everystep.send"
SCHEDULE_STEP = "everystep.schedule"
GET_RUN_STEP = "everystep.get_run"
GET_STEPS_STEP = "everystep.get_steps"
GET_EVENT_STEP = EVENT.step  # while it waits (with a timeout), an event wait

#: What a read may end with that the body sees and every replay sees again.
RECORDED_FAILURES: tuple[type[Exception], ...] = (RunNotFound, SendRefused, StreamRefused, TimeoutError)


def send(ctx: Context, run_id: str, topic: str, payload_json: str, idempotency_key: str | None,
         name: str | None) -> int:
    """A body's ``send``: the message stored in the transaction that
    records the step with its id."""
    return int(record_write(
        ctx, SEND_STEP, [run_id, topic], name,
        lambda ex, entry, markers: ex.store.record_send(ex.claim, entry, run_id, topic, payload_json,
                                                        idempotency_key, markers)))


def schedule(ctx: Context, new: NewRun, name: str | None) -> Run:
    """A body's ``schedule``: a detached run inserted in the transaction
    that records the step with that run."""
    return record_write(  # type: ignore[no-any-return]
        ctx, SCHEDULE_STEP, [new.name], name,
        lambda ex, entry, markers: ex.store.record_schedule(
            ex.claim, entry, new.name, new.args_json, new.idempotency_key, new.not_before, new.placement,
            new.app_version, new.deadline, markers,
            debounce=(new.debounce.key, *new.debounce.seconds()) if new.debounce is not None else None),
        run_of)


def get_run(ctx: Context, run_id: str, name: str | None) -> Run:
    """A body's ``get_run``: recorded, so every replay sees the same run."""
    store = ctx.execution.store
    return record_read(ctx, GET_RUN_STEP, [run_id], name, lambda: store.get_run(run_id),  # type: ignore[no-any-return]
                       row_fields, run_of)


def get_steps(ctx: Context, run_id: str, name: str | None, after: str | None = None,
              limit: int | None = None) -> list[StepRecord]:
    """A body's ``get_steps``: recorded, so every replay sees the same steps
    (a page's arguments recorded with it)."""
    store = ctx.execution.store
    paged = after is not None or limit is not None

    def read() -> list[StepRecord]:
        store.get_run(run_id)  # RunNotFound for an unknown run
        return step_pages.read_page(store, run_id, after, limit).steps if paged else store.get_steps(run_id)

    arguments = [run_id, after, limit] if paged else [run_id]
    return record_read(ctx, GET_STEPS_STEP, arguments, name, read,  # type: ignore[no-any-return]
                       lambda steps: [row_fields(step) for step in steps],
                       lambda fields: [row_from_fields(StepRecord, step) for step in fields])


def get_event(ctx: Context, run_id: str, key: str, name: str | None) -> Any:
    """A body's ``get_event`` without a timeout: recorded, value or error
    (``everystep.waits.await_event`` is the one with a timeout)."""
    return record_read(ctx, GET_EVENT_STEP, [run_id, key], name, lambda: read_event(ctx.execution.store, run_id, key))


def run_of(fields: Any) -> Run:
    """A run recorded by a body's step (``schedule``, ``get_run``, ``wait``)."""
    return row_from_fields(Run, fields)


def no_event(run_id: str, key: str, seconds: float) -> TimeoutError:
    return TimeoutError(f"run {run_id} has not set event {key!r}" + (f" within {seconds:g}s" if seconds else ""))


def read_event(store: Store, run_id: str, key: str) -> Any:
    """Run ``run_id``'s event ``key`` now: the value, or ``TimeoutError``."""
    store.get_run(run_id)  # RunNotFound for an unknown run
    event = store.get_event(run_id, key)
    if event is None:
        raise no_event(run_id, key, 0)
    return event.value


def body_context(function: str, *, database: Any = None, conn: Any = None) -> Context | None:
    """The running body's context when ``function`` is called from one
    (None from a step's own code or outside a workflow). In a body the call
    goes through the run's own database, in the engine's transaction:
    ``database=`` and ``conn=`` are refused there."""
    ctx = recording_context()
    if ctx is not None and (database is not None or conn is not None):
        given = "conn=" if conn is not None else "database="
        raise BodyCallRefused(
            f"everystep.{function}({given}...) in a workflow body: a body's {function} is recorded in the run's "
            f"own database, in the transaction that records it; call it without {given} (or from a step's own "
            "code, or outside a workflow)")
    return ctx


def record_write(ctx: Context, step_name: str, args: list[Any], everystep_id: str | None,
                 write: Callable[[Execution, NewStep, tuple[Marker, ...]], StepWrite | None],
                 decode: Callable[[Any], Any] = lambda value: value) -> Any:
    """A body's call with an effect, as a step: replayed if recorded, else
    the effect and the record in one transaction (``write``, given the
    step's ``done`` entry and the patch markers to write first); its value
    is ``decode`` of the recorded result."""
    ex = ctx.execution
    step_id, recorded = _enter(ex, ctx, step_name, everystep_id)
    if recorded is not None:
        return decode(recording.replay_outcome(ex, recorded))
    args_json = _args_json(ex, step_name, args)
    entry = NewStep(step_id, step_name, args_json, "{}", utcnow(), status=STEP_DONE)
    recording.crash_point(ctx, step_id)
    try:
        written = recording.store_write(ex, lambda markers: write(ex, entry, markers))
    except RECORDED_FAILURES as exc:
        return _record_failure(ex, entry, args, exc)
    ex.outcomes[step_id] = written.record
    return decode(recording.replay_outcome(ex, written.record))


def record_read(ctx: Context, step_name: str, args: list[Any], everystep_id: str | None,
                read: Callable[[], Any], encode: Callable[[Any], Any] = lambda value: value,
                decode: Callable[[Any], Any] = lambda value: value) -> Any:
    """A body's read, as a step: replayed if recorded, else read now and
    recorded (``encode``: the value as a step result; ``decode``: back)."""
    ex = ctx.execution
    step_id, recorded = _enter(ex, ctx, step_name, everystep_id)
    if recorded is not None:
        return decode(recording.replay_outcome(ex, recorded))
    args_json = _args_json(ex, step_name, args)
    entry = NewStep(step_id, step_name, args_json, "{}", utcnow(), status=STEP_DONE)
    try:
        value = read()
    except STORE_FAILURES as exc:
        raise ex.interrupt_with(exc) from None
    except RECORDED_FAILURES as exc:
        recording.crash_point(ctx, step_id)
        return _record_failure(ex, entry, args, exc)
    recording.crash_point(ctx, step_id)
    encoded = encode(value)
    done = NewStep(step_id, step_name, args_json, "{}", entry.started_at, status=STEP_DONE,
                   result_json=serde.dumps(encoded, f"result of {step_name}"))
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=step_name, status=STEP_DONE, args=args,
                         result=encoded, started_at=entry.started_at)
    written = recording.store_write(ex, lambda markers: ex.store.record_step(ex.claim, done, decoded, markers), done)
    ex.outcomes[step_id] = written.record
    return decode(recording.replay_outcome(ex, written.record))


def _enter(ex: Execution, ctx: Context, step_name: str, everystep_id: str | None) -> tuple[str, StepRecord | None]:
    """The step id of the call, and its record if it has one (a record of
    another call there is a divergence); none: the call may start."""
    step_id = recording.next_step_id(ex, ctx, everystep_id)
    recorded = recording.recorded_at(ex, step_id, step_name)
    if recorded is None:
        recording.may_start(ex, step_id, step_name)
    return step_id, recorded


def _args_json(ex: Execution, step_name: str, args: list[Any]) -> str:
    try:
        return serde.dumps(args, f"arguments of {step_name}")
    except EverystepError as exc:
        raise ex.interrupt_with(exc) from None


def _record_failure(ex: Execution, entry: NewStep, args: list[Any], error: Exception) -> Any:
    """Record the call failed with ``error`` and raise what is recorded."""
    encoded = serde.encode_exception(error)
    failed = NewStep(entry.step_id, entry.name, entry.args_json, "{}", entry.started_at, status=STEP_FAILED,
                     error_json=serde.dumps(encoded, f"exception of step {entry.step_id}"))
    decoded = StepRecord(workflow_id=ex.run.id, step_id=entry.step_id, name=entry.name, status=STEP_FAILED,
                         args=args, error=encoded, started_at=entry.started_at)
    written = recording.store_write(ex, lambda markers: ex.store.record_step(ex.claim, failed, decoded, markers),
                                 failed)
    ex.outcomes[entry.step_id] = written.record
    return recording.replay_outcome(ex, written.record)


__all__ = ["GET_EVENT_STEP", "GET_RUN_STEP", "GET_STEPS_STEP", "RECORDED_FAILURES", "SCHEDULE_STEP", "SEND_STEP",
           "body_context", "get_event", "get_run", "get_steps", "no_event", "read_event", "record_read",
           "record_write", "run_of", "schedule", "send"]
