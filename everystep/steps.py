"""A step call, recorded: replay, begin, the step's function, the record.

Every ``@step`` call in a running body goes through ``step_phases``, one
generator for sync and async steps alike (``run_step`` drives it on this
thread; ``everystep.async_steps`` awaits the function on the run's loop),
so both record the same rows under the same ids:

- replay: a recorded outcome returns (or its error is raised again)
  without running the step; a retry not due yet waits; an unsafe step
  started without an outcome blocks the run;
- begin: the arguments stored as they are now (unstorable ones end the
  run); an unsafe step's ``started`` row is the atomic claim on its effect;
- the record (``_record``): how the step ended, written under the claim. A
  failure its retry policy retries is recorded ``retrying`` and the scope
  waits (``_retry_later``); the body's last step, succeeding and safe to
  repeat, is held back to go with the run's status
  (``everystep.last_step``); a transactional step's record commits with its
  own writes (``everystep.transactional``).

Crash windows: a process that dies after a step's effect and before its
record leaves no row, and the step runs again on the next claim
(at-least-once); for an unsafe step it leaves the ``started`` row, and the
next claim ends the run ``blocked``. The ``fault`` hook stops at that point.

Budgets and costs: a runner's ``StepMeter`` (``everystep.resources``) runs
each step's function inside its gauge, which may bound it and measures it;
the cost is written with the step's row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Generator
from typing import Any

from . import loops, recording, serde, stream_batches, transactional
from .context import Context, Execution, StepAttempt, StepGauge, IN_STEP
from .errors import STORE_FAILURES, EverystepError, SimulatedCrash, StepTimeout, Terminal
from .last_step import HeldRecord, is_last_act
from .models import STEP_DONE, STEP_FAILED, STEP_RETRYING, STEP_STARTED, StepRecord
from .registry import DeclaredStep
from .resources import StepCost
from .store import NewStep, utcnow
from .store.base.step_transactions import StepTransaction

logger = logging.getLogger("everystep")


def run_step(ctx: Context, step: DeclaredStep, args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> Any:
    """Replay or execute one step call in ``ctx``, on this thread: the
    phases of ``step_phases``, the step's function called between them (an
    async one on this thread's own loop: ``loops.blocking``). A step
    recorded ``done`` returns its result at the cost of a lookup: what a
    resume does for every step it replays."""
    ex = ctx.execution
    step_id = recording.next_step_id(ex, ctx, name)
    if ex.replay_log is None:
        replayed, result = ex.outcomes.done_result(step_id, step.name)
        if replayed:
            return result
    phases = step_phases(ctx, step, args, kwargs, step_id)
    done, gauge = advance(phases, None)
    if done:
        return gauge  # replayed: the recorded outcome
    done, value = advance(phases, _invoke(step, args, kwargs, gauge, step_id))
    assert done, "a step's phases yield once"
    return value


#: What ``step_phases`` yields to its driver (the gauge the step's function
#: runs in, or None), and is sent back (the function's result and error).
StepPhases = Generator["StepGauge | None", "tuple[Any, Exception | None]", Any]


def advance(phases: StepPhases, sent: tuple[Any, Exception | None] | None) -> tuple[bool, Any]:
    """Drive ``phases`` to its next point: (False, the gauge to run the
    step's function in) or (True, the step's value, once recorded)."""
    try:
        return False, phases.send(sent)  # type: ignore[arg-type]  # None starts the generator
    except StopIteration as stop:
        return True, stop.value


def step_phases(ctx: Context, step: DeclaredStep, args: tuple[Any, ...], kwargs: dict[str, Any],
                step_id: str) -> StepPhases:
    """One step call in three phases: replay (a recorded outcome returns or
    raises without running the step), begin (checks before the effect; an
    unsafe step's ``started`` row claims the effect), then, once the driver
    has run the step's function and sent back how it ended, the record
    (``_record``). The one path for sync and async steps alike (``run_step``
    and ``async_steps.step_call`` only call the function), so both record the same
    rows under the same ids. ``step_id``: the call's, allocated by the
    driver (``recording.next_step_id``)."""
    ex = ctx.execution
    attempt = 1
    if ex.replay_log is not None:
        ex.replay_log.reaching(step_id, step.name)
    recorded = ex.outcomes.get(step_id)
    if recorded is not None:
        attempt = _attempt_to_run(ex, step, step_id, recorded)
        if attempt == _RECORDED:
            if ex.replay_log is not None:
                ex.replay_log.matched(step_id, step.name, recorded)
            return recording.replay_outcome(ex, recorded)
    entry = _begin(ex, step, step_id, args, kwargs, attempt)
    started: StepRecord | None = None
    if step.unsafe_to_repeat:
        started = _claim_effect(ex, step, entry)
        if started.status != STEP_STARTED:
            return recording.replay_outcome(ex, started)  # a racing execution recorded its outcome first
    policy = step.retry
    ex.starting[step_id] = StepAttempt(attempt, policy.delay_after(attempt, StepTimeout()) if policy else None)
    gauge = ex.meter.begin(ctx, step_id, step) if ex.meter is not None else None
    cost: StepCost | None = None
    # A transactional step's transaction: its writes and record, one commit.
    with transactional.opened(ex, step) if step.transactional else _NO_TRANSACTION as tx:
        try:
            try:
                token = ex.observer.step_started(ctx, step_id, step.name, step.timeout, step.unsafe_to_repeat)
            finally:
                ex.starting.pop(step_id, None)
            result, error = yield gauge
        finally:
            if gauge is not None:
                cost = gauge.end()
        return _record(ex, ctx, step, entry, started, args, kwargs, result, error, cost, token, tx)


#: What a plain step runs in instead of ``transactional.opened`` (cheaper
#: than entering that generator for nothing on every step).
_NO_TRANSACTION: contextlib.nullcontext[None] = contextlib.nullcontext()


#: ``_attempt_to_run``: the recorded outcome stands, the step does not run.
_RECORDED = 0


def _attempt_to_run(ex: Execution, step: DeclaredStep, step_id: str, recorded: StepRecord) -> int:
    """The replay phase, for a step id with a row: which attempt of the step
    runs now, or ``_RECORDED`` (its outcome is replayed). A retry not yet
    due waits; an unsafe step started without outcome blocks the run."""
    if recorded.name != step.name:
        raise recording.diverged(ex, step_id, recorded.name, step.name)
    if recorded.status == STEP_RETRYING:
        if not recording.is_due(ex, recorded.wake_at):
            raise recording.suspend(ex, recorded.wake_at)
        return recorded.attempt + 1  # its time has come: the next attempt runs
    if recorded.status != STEP_STARTED:
        return _RECORDED
    if step.unsafe_to_repeat:
        raise ex.interrupt_with(recording.uncertain(ex.run, step_id, step.name))
    # A started row without outcome, for a step no longer marked unsafe:
    # current code says it may repeat, so it runs again.
    return 1


def _begin(ex: Execution, step: DeclaredStep, step_id: str, args: tuple[Any, ...], kwargs: dict[str, Any],
           attempt: int) -> NewStep:
    """The begin phase: the step may start, and its arguments are stored
    as they are now, before the effect (unstorable ones end the run)."""
    recording.may_start(ex, step_id, step.name)
    try:
        args_json = serde.dumps(list(args), f"arguments of step {step_id}")
        kwargs_json = serde.dumps(kwargs, f"keyword arguments of step {step_id}") if kwargs else "{}"
    except EverystepError as exc:
        raise ex.interrupt_with(exc) from None
    return NewStep(step_id, step.name, args_json, kwargs_json, utcnow(), attempt=attempt)


def _claim_effect(ex: Execution, step: DeclaredStep, entry: NewStep) -> StepRecord:
    """An unsafe step's ``started`` row, whose insert is the atomic claim on
    its effect. Returns that row, or the outcome a racing execution already
    recorded; one that started and has no outcome blocks the run."""
    write = recording.store_write(ex, lambda markers: ex.store.start_step(ex.claim, entry, markers))
    if write.ours or write.record.status != STEP_STARTED:
        ex.outcomes[entry.step_id] = write.record
        return write.record
    raise ex.interrupt_with(recording.uncertain(ex.run, entry.step_id, step.name))


def _record(ex: Execution, ctx: Context, step: DeclaredStep, entry: NewStep, started: StepRecord | None,
            args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, error: Exception | None,
            cost: StepCost | None, token: Any, tx: StepTransaction | None = None) -> Any:
    """The record phase: write how the step ended and return its result (or
    raise its error). A crash writes nothing; a failure the step's policy
    retries is recorded as a wait; the body's last step is held back to go
    with the run's status (``HeldRecord``). A transactional step's record
    commits with its writes (``tx``); a failed one's writes roll back first."""
    step_id = entry.step_id
    if tx is not None:
        try:
            error = transactional.body_ended(tx, error)
        except STORE_FAILURES as exc:
            ex.observer.step_finished(ctx, step_id, step.name, "unrecorded", exc, token)
            raise ex.interrupt_with(exc) from None
    if isinstance(error, Terminal):
        # The run stops now, not once this step's record is written: a
        # sibling branch must not start a new step during that write.
        ex.interrupt_with(error)
    if isinstance(error, SimulatedCrash):
        ex.observer.step_finished(ctx, step_id, step.name, "crashed", error, token)
        raise ex.interrupt_with(error)
    try:
        recording.crash_point(ctx, step_id)
    except SimulatedCrash as crash:
        ex.observer.step_finished(ctx, step_id, step.name, "crashed", crash, token)
        raise
    if error is not None and step.retry is not None:
        delay = step.retry.delay_after(entry.attempt, error)
        if delay is not None:
            return _retry_later(ex, ctx, step.name, entry, args, kwargs, error, delay, token)
    if error is None:
        try:
            result_json = serde.dumps(result, f"result of step {step_id} ({step.name})")
        except EverystepError as exc:
            # The effect happened but cannot be recorded: nothing is written,
            # so the step runs again if the run is ever resumed.
            ex.observer.step_finished(ctx, step_id, step.name, STEP_FAILED, exc, token)
            raise ex.interrupt_with(exc) from None
        status, error_json, encoded_error = STEP_DONE, None, None
    else:
        status, result_json = STEP_FAILED, None
        encoded_error = serde.encode_exception(error)
        error_json = serde.dumps(encoded_error, f"exception of step {step_id}")
    cpu_seconds, peak_rss = (cost.cpu_seconds, cost.peak_rss_bytes) if cost is not None else (None, None)
    decoded = StepRecord(
        workflow_id=ex.run.id, step_id=step_id, name=step.name, status=status, result=result,
        error=encoded_error, args=list(args), kwargs=dict(kwargs), started_at=entry.started_at,
        attempt=entry.attempt, cpu_seconds=cpu_seconds, peak_rss_bytes=peak_rss,
    )
    finished = NewStep(step_id, step.name, entry.args_json, entry.kwargs_json, entry.started_at, status=status,
                       result_json=result_json, error_json=error_json, attempt=entry.attempt,
                       cpu_seconds=cpu_seconds, peak_rss_bytes=peak_rss)
    if error is None and started is None and tx is None and is_last_act(ex, ctx):
        ex.held = HeldRecord(ctx, finished, decoded, token)
        return result
    try:
        if started is not None:
            write = recording.store_write(ex, lambda markers: ex.store.finish_step(
                ex.claim, started, status, result_json, error_json, decoded, cost, markers
            ), finished)
        elif tx is not None and tx.open:
            # Refused, its writes are rolled back: a cancel records nothing of it.
            write = recording.store_write(ex, lambda markers: transactional.record(ex, ctx, tx, finished, decoded, markers))
        else:
            write = recording.store_write(ex, lambda markers: ex.store.record_step(ex.claim, finished, decoded, markers),
                                finished)
    except BaseException as exc:
        ex.observer.step_finished(ctx, step_id, step.name, "unrecorded", exc, token)
        raise
    ex.outcomes[step_id] = write.record
    ex.observer.step_finished(ctx, step_id, step.name, status, error, token)
    if not write.ours:
        # A racing execution recorded this step first: its outcome is the
        # one replays will see, so it is the one this execution goes on with.
        return recording.replay_outcome(ex, write.record)
    if error is not None:
        raise error
    return result


def _retry_later(ex: Execution, ctx: Context, name: str, entry: NewStep, args: tuple[Any, ...],
                 kwargs: dict[str, Any], error: Exception, delay: float, token: Any) -> Any:
    """Record a failed attempt that will be retried, then wait (``Suspended``)
    until the next one is due; the run is released meanwhile."""
    retry_at = utcnow() + dt.timedelta(seconds=delay)
    encoded = serde.encode_exception(error)
    waiting = dataclasses.replace(entry, status=STEP_RETRYING, wake_at=retry_at,
                                  error_json=serde.dumps(encoded, f"exception of step {entry.step_id}"))
    decoded = StepRecord(
        workflow_id=ex.run.id, step_id=entry.step_id, name=name, status=STEP_RETRYING, error=encoded,
        args=list(args), kwargs=dict(kwargs), started_at=entry.started_at, attempt=entry.attempt, wake_at=retry_at,
    )
    try:
        write = recording.store_write(ex, lambda markers: ex.store.record_attempt(ex.claim, waiting, decoded, markers))
    except BaseException as exc:
        ex.observer.step_finished(ctx, entry.step_id, name, "unrecorded", exc, token)
        raise
    ex.outcomes[entry.step_id] = write.record
    ex.observer.step_finished(ctx, entry.step_id, name, STEP_RETRYING, error, token)
    if not write.ours:
        return recording.replay_outcome(ex, write.record)
    logger.info("everystep: run %s step %s (%s) attempt %d failed (%s: %s); attempt %d at %s",
                ex.run.id, entry.step_id, name, entry.attempt, type(error).__name__, error, entry.attempt + 1,
                retry_at.isoformat(), extra={"run_id": ex.run.id, "workflow": ex.run.name, "event": "step_retry"})
    raise recording.suspend(ex, retry_at)


def _invoke(step: DeclaredStep, args: tuple[Any, ...], kwargs: dict[str, Any],
            gauge: StepGauge | None = None, step_id: str = "?") -> tuple[Any, Exception | None]:
    token = IN_STEP.set(step_id)
    fn = loops.blocking(step.fn) if step.is_async else step.fn
    try:
        if gauge is not None:
            # Inside this ``try``: whatever the gauge raises on the step's
            # behalf (StepResourceExceeded) is the step's failure.
            result = gauge.call(fn, args, kwargs)
        else:
            result = fn(*args, **kwargs)
        # The values its code wrote to streams commit before its record;
        # a refusal of them is its failure.
        stream_batches.settle(step_id)
        return result, None
    except Exception as exc:
        stream_batches.settle(step_id, quietly=True)
        return None, exc
    finally:
        IN_STEP.reset(token)


__all__ = ["StepPhases", "advance", "run_step", "step_phases"]
