"""The replay engine: execute a claimed run, from the top, to its next
resting point, and settle it.

Every execution re-runs the workflow body from the top. A step whose id is
recorded returns its stored result (or re-raises its stored exception)
without running; the first unrecorded step runs and is recorded; and so on to
the end. What a body's calls record is in the modules of the recorded calls
(``steps``, ``last_step``, ``sleeps``, ``forks``, ``waits``, ``body_calls``,
``transactional``, ``patches``), all built on one recording kit
(``recording``); this module runs the body and writes how the run ends:

- its records loaded, its ``Execution`` and top ``Context`` made, the
  observers told (``start_execution``);
- the body called (an async one on a loop of its own: ``loops.run_body``);
- the run settled (``_settle``): a verdict (``_verdict``), then its one
  write, fenced by the claim: the terminal status (with the body's held
  last step, in one transaction: ``last_step``), or the run back to the
  queue: released until its earliest wake time when a scope waits,
  requeued when drained, given back after a backoff when an engine
  statement failed (``engine_errors``).

Fencing. Every claim bumps the run's epoch, so an execution superseded by a
later claim (an operator's forced requeue, a re-claim by the same runner
name, a takeover of that name) learns at its first refused write that the
run is no longer its own (``ClaimLost``): no new step starts after that.

Crash windows. A process that dies after a step's effect and before its
record leaves no row: the step runs again on the next claim (at-least-once);
an unsafe step leaves its ``started`` row and the next claim ends the run
``blocked``. ``fault`` (below) lets tests stop at that exact point with
``SimulatedCrash``, after which nothing more is written; it is read live at
each crash point through the execution (``Execution.hooks``).

The database. A write that fails because the database is unreachable
interrupts the run without marking it failed (``StoreUnavailable``); one that
the database refuses (``StoreError``) interrupts it too, and the run goes
back to the queue after a growing backoff: only the workflow's own doing
fails a run.

Cancelling. An operator's cancel turns the run ``cancelled`` at once, so
every write of its execution is refused; the runner tells a refusal caused
by a cancel from a lost claim (``Cancelled``), records the step it just
finished through the one write a cancelled claim still allows, and stops.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, cast

from . import engine_errors, loops, outcomes, recording, registry, serde, telemetry, versions
from .context import Context, Execution, FaultHooks, Flag, StepMeter, SCOPE
from .errors import (
    Cancelled,
    ContinuedAsNew,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    SimulatedCrash,
    StoreError,
    StoreUnavailable,
    Suspended,
    Terminal,
    WorkflowCodeError,
)
from .models import EXECUTION_ENDS, Outcome, Outcomes, Run, StepRecord
from .context import Observer
from .observer import Observers
from .recovery import requeue_patiently
from .store import Store

logger = logging.getLogger("everystep")


#: Test hook, called ``(ctx, step_id)`` after a step's effect and before its
#: record. Raising ``SimulatedCrash`` there leaves the database exactly as a
#: process death would.
fault: Callable[[Context, str], None] | None = None



def execute(
    store: Store,
    run: Run,
    *,
    claimer: str,
    draining: Flag | None = None,
    observer: Observer | None = None,
    meter: StepMeter | None = None,
) -> Outcome:
    """Execute a run this ``claimer`` holds (at ``run.claim_epoch``), from the
    top, to its next resting point. Returns the run's new status
    (``completed``, ``failed``, ``stopped``, ``blocked``), or ``requeued``
    (drained at a step boundary), ``lost`` (the claim moved on; nothing
    written) or ``unfinished`` (the database failed mid-run; the caller
    should requeue). ``SimulatedCrash`` propagates with nothing written.
    ``meter`` measures and bounds each step executed (``everystep.resources``).
    """
    ex, ctx, token, workflow = start_execution(store, run, claimer, draining, observer, meter)
    raised: BaseException | None = None
    value: Any = None
    context_token = SCOPE.set(ctx)
    try:
        if workflow is None:
            raised = unregistered(run)
        elif workflow.is_async:
            # On its own event loop; its last step is not held back (its
            # frames are not under ``execute``: ``_is_last_act``).
            value = loops.run_body(workflow.fn, run.args)
        else:
            ex.body_code = getattr(workflow.fn, "__code__", None)
            ex.body_caller = execute.__code__
            value = workflow.fn(*run.args)
    except BaseException as exc:
        raised = body_raised(ctx, token, exc)
    finally:
        SCOPE.reset(context_token)
    return finish_execution(ctx, token, value, raised)


def start_execution(store: Store, run: Run, claimer: str, draining: Flag | None, observer: Observer | None,
                    meter: StepMeter | None) -> tuple[Execution, Context, Any, Any]:
    """Before the body: its records loaded, its ``Execution`` and top
    ``Context``, the observers told (their token), and the workflow (None:
    not registered here). Shared by ``execute`` and ``aio.execute_async``."""
    fanned = _fan_out(observer)
    workflow = registry.get_workflow(run.name)
    fresh = workflow is None or run.has_steps is False
    outcomes = Outcomes() if fresh else store.load_outcomes(run.id)
    ex = Execution(run=run, store=store, claimer=claimer, outcomes=outcomes, observer=fanned, draining=draining,
                   meter=meter, hooks=_HOOKS)
    ctx = Context(ex)
    return ex, ctx, fanned.run_started(run, ctx), workflow


def unregistered(run: Run) -> WorkflowCodeError:
    return WorkflowCodeError(f"workflow {run.name!r} is not registered in this process (is its module in --app?)")


def body_raised(ctx: Context, token: Any, exc: BaseException) -> BaseException | None:
    """What the body's exception is for the run: an ``Exception`` is its
    failure, ``ContinuedAsNew`` its end, ``Suspended`` none (``ex.wake_at``
    says until when: the run is released); anything else (KeyboardInterrupt, SystemExit: the process
    is going away) is re-raised with nothing written, and the claim is
    recovered like a crash's."""
    if isinstance(exc, (Exception, ContinuedAsNew)):
        return exc
    if isinstance(exc, Suspended):
        return None
    ctx.execution.observer.run_finished(ctx.run, ctx, "crashed", exc, token)
    raise exc


def finish_execution(ctx: Context, token: Any, value: Any, raised: BaseException | None) -> Outcome:
    """After the body: settle the run (``_settle``) and tell the observers."""
    ex = ctx.execution
    status, error = _settle(ex, value, raised)
    if isinstance(error, SimulatedCrash):
        ex.observer.run_finished(ex.run, ctx, "crashed", error, token)
        raise error
    ex.observer.run_finished(ex.run, ctx, status, error, token)
    return status


def _fan_out(observer: Observer | None) -> Observers:
    """The default observers and the caller's, as one. A runner passes the
    same observer for every run, so the fan-out is built once for it."""
    try:
        return _fan_out_cached(observer)
    except TypeError:  # an unhashable observer
        return _fan_out_new(observer)


def _fan_out_new(observer: Observer | None) -> Observers:
    return Observers([*telemetry.default_observers(), *([observer] if observer else [])])


_fan_out_cached = functools.lru_cache(maxsize=16)(_fan_out_new)


def execute_guarded(
    store: Store,
    run: Run,
    *,
    claimer: str,
    draining: Flag | None = None,
    observer: Observer | None = None,
    meter: StepMeter | None = None,
) -> Outcome:
    """``execute`` for runners: never raises an ``Exception``.

    A database outage (even before the first step) gives the run back to the
    queue, riding out the outage for a bounded time: ``requeued``, or
    ``unfinished`` if the database stayed away. An engine statement the
    database refused gives it back after a backoff: ``deferred``. A crash
    outside the runner (a bug, a broken observer) fails the run, guarded on
    the claim, and is reported: ``failed``.
    """
    try:
        status = execute(store, run, claimer=claimer, draining=draining, observer=observer, meter=meter)
    except BaseException as exc:
        status = guarded_failure(store, run, claimer, exc)
    return guarded_status(store, run, claimer, status)


def guarded_failure(store: Store, run: Run, claimer: str, exc: BaseException) -> Outcome:
    """What an exception out of ``execute`` comes to (``execute_guarded``):
    a database outage leaves the run ``unfinished``; an engine statement
    the database refused (reading its steps) gives it back (``deferred``);
    any other ``Exception`` fails it, guarded on the claim (``failed``, or
    ``lost``); anything else is re-raised."""
    if isinstance(exc, StoreUnavailable):
        logger.warning("everystep: run %s interrupted by the database (%s); it goes back to the queue once "
                       "the database is back", run.id, exc)
        return Outcome.UNFINISHED
    if isinstance(exc, StoreError):
        return engine_errors.give_back(store, run, claimer, exc)
    if not isinstance(exc, Exception):
        raise exc
    logger.error("everystep: run %s (%s) crashed outside the runner", run.id, run.name, exc_info=exc)
    try:
        failed = outcomes.fail_run(store, run.claim_as(claimer), run, exc)
    except Exception:
        logger.exception("everystep: could not mark run %s failed", run.id)
        failed = False
    return Outcome.FAILED if failed else Outcome.LOST


def guarded_status(store: Store, run: Run, claimer: str, status: Outcome) -> Outcome:
    """An ``unfinished`` run is given back to the queue, riding out the outage."""
    if status == Outcome.UNFINISHED:
        return Outcome.REQUEUED if requeue_patiently(store, run.claim_as(claimer)) else Outcome.UNFINISHED
    return status


#: Outcomes an execution writes as it ends (the others leave the run as it is).
_WRITTEN = frozenset({*(outcome for outcome in Outcome if outcome.status in EXECUTION_ENDS), Outcome.RELEASED,
                      Outcome.REQUEUED, Outcome.DEFERRED})


def _settle(ex: Execution, value: Any, raised: BaseException | None) -> tuple[Outcome, BaseException | None]:
    """Decide and write the run's outcome; returns (outcome, exception). A
    ``SimulatedCrash`` comes back as the exception with nothing written.

    The body's held last step (``ex.held``) goes with a ``completed``
    status, in one transaction. Any other outcome has it written first, on
    its own; a refusal of that write is the run's interrupt from then on,
    and decides. If the two together are refused, the step alone is
    written, which says why the way every step write does (a cancel, a lost
    claim, a racing execution's record), and the run settles from there."""
    held, ex.held = ex.held, None
    outcome, error, result_json = _verdict(ex, value, raised)
    if held is not None and outcome != Outcome.COMPLETED:
        if not isinstance(ex.interrupt, SimulatedCrash):  # a dead process would write nothing
            with contextlib.suppress(EverystepError):
                held.flush(ex)
        held = None
        if ex.interrupt is not None:
            outcome, error, result_json = _verdict(ex, value, raised)
    if outcome not in _WRITTEN:
        return outcome, error
    ex.observer.run_settling(ex.run, outcome)
    if held is not None:
        try:
            if held.commit(ex, outcome, result_json):
                return outcome, None
            write = held.flush(ex)
        except EverystepError:
            pass  # the interrupt decides
        else:
            if not write.ours:
                # A racing execution recorded this step first: its outcome
                # is what the body returns, as on a replay.
                value, raised = _replayed(ex, write.record)
        outcome, error, result_json = _verdict(ex, value, raised)
        if outcome not in _WRITTEN:
            return outcome, error
    return _write(ex, outcome, error, result_json)


def _verdict(ex: Execution, value: Any, raised: BaseException | None) -> tuple[Outcome, BaseException | None,
                                                                                  str | None]:
    """What the run comes to, before anything is written: its outcome, the
    exception it ends with, and its result as JSON (``completed`` only).

    An interrupt decides first; then a wait (``ex.wake_at``: a scope sleeps
    or waits for a retry) releases the run whatever the body did after it;
    then the body's exception or value (one that cannot be stored fails
    the run)."""
    outcome = ex.interrupt or raised
    if isinstance(outcome, (SimulatedCrash, ClaimLost)):
        return Outcome.LOST, outcome, None
    if isinstance(outcome, StoreUnavailable):
        return Outcome.UNFINISHED, outcome, None
    if isinstance(outcome, Cancelled):
        return Outcome.CANCELLED, outcome, None
    if isinstance(outcome, StoreError) and outcome is ex.interrupt:
        # The engine's own statement, not the body's: the run is given back.
        return Outcome.DEFERRED, outcome, None
    if isinstance(outcome, ContinuedAsNew):
        return Outcome.CONTINUED, outcome, None
    if isinstance(outcome, DrainOrphan) or (ex.interrupt is None and ex.wake_at is not None):
        # Back to the queue: drained, or waiting (until its wake time).
        return (Outcome.RELEASED if ex.wake_at is not None else Outcome.REQUEUED), outcome, None
    if isinstance(outcome, Terminal):
        return Outcome.STOPPED, outcome, None
    if isinstance(outcome, EffectUncertain):
        return Outcome.BLOCKED, outcome, None
    if outcome is not None:
        return Outcome.FAILED, outcome, None
    try:
        return Outcome.COMPLETED, None, serde.dumps(value, f"result of run {ex.run.id}")
    except EverystepError as exc:
        return Outcome.FAILED, exc, None


def _write(ex: Execution, outcome: Outcome, error: BaseException | None,
           result_json: str | None) -> tuple[Outcome, BaseException | None]:
    """Write the run's outcome, fenced by the claim: back to the queue
    (until its wake time, if it waits, or its backoff after an engine
    error), or its terminal status. The database refusing that write
    gives the run back after a backoff."""
    if outcome == Outcome.DEFERRED:
        assert isinstance(error, StoreError)
        return engine_errors.give_back(ex.store, ex.run, ex.claimer, error), error
    try:
        if outcome == Outcome.RELEASED:
            assert ex.wake_at is not None
            if ex.wait_keys:
                written = ex.store.release_waiting(ex.claim, ex.wake_at, sorted(ex.wait_keys))
            else:
                written = outcomes.release(ex.store, ex.claim, ex.wake_at)
        elif outcome == Outcome.REQUEUED:
            written = outcomes.requeue(ex.store, ex.claim)
        elif outcome == Outcome.CONTINUED:
            assert isinstance(error, ContinuedAsNew)
            successor = ex.store.continue_run(ex.claim, error.args_json, versions.version_for(ex.run.name),
                                              ex.take_markers())
            if successor is not None:
                logger.info("everystep: run %s (%s) continued as run %s", ex.run.id, ex.run.name, successor,
                            extra={"run_id": ex.run.id, "workflow": ex.run.name, "event": "run_continued"})
            return (Outcome.CONTINUED if successor is not None else _lost(ex)), None
        else:
            error_json = serde.dumps(serde.encode_exception(error), "run error") if error is not None else None
            written = ex.store.finish_run(ex.claim, outcome, result_json, error_json, ex.take_markers())
    except StoreUnavailable as exc:
        return Outcome.UNFINISHED, exc
    except StoreError as exc:
        return _write(ex, Outcome.DEFERRED, ex.interrupt_with(exc), None)
    return (outcome if written else _lost(ex)), error


def _replayed(ex: Execution, recorded: StepRecord) -> tuple[Any, BaseException | None]:
    """What the body returns when its last step's recorded outcome is
    ``recorded``: (value, None), or (None, the exception it raises)."""
    try:
        return recording.replay_outcome(ex, recorded), None
    except Exception as exc:
        return None, exc


def _lost(ex: Execution) -> Outcome:
    """A settling write was refused: cancelled under this claim, or lost."""
    return Outcome.CANCELLED if isinstance(recording.refused(ex), Cancelled) else Outcome.LOST


#: This module, as the place the ``fault`` hook above is read from, live:
#: each execution carries it (``Execution.hooks``) to the recording kit.
_HOOKS = cast(FaultHooks, sys.modules[__name__])
