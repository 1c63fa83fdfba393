"""The replay engine: execute a claimed run, recording each step as it ends.

Every execution re-runs the workflow body from the top. A step whose id is
recorded returns its stored result (or re-raises its stored exception)
without running; the first unrecorded step runs and is recorded; and so on to
the end. The runner writes, for the run it was handed:

- one row per executed step, only while this execution's claim (the
  claimer's name and the claim epoch the run had when it was claimed) is
  still the run's current one (``Store.record_step``);
- for an unsafe-to-repeat step, a ``started`` row *before* the effect, whose
  insert is the atomic claim on the effect, then its outcome;
- the terminal status, again guarded by the claim.

Fencing. Every claim bumps the run's epoch, so an execution superseded by a
later claim (an operator's forced requeue, a re-claim by the same runner
name, a takeover of that name) learns at its first refused write that the
run is no longer its own (``ClaimLost``): no new step starts after that, and
an unsafe step's ``started`` insert is fenced like every other write.

Crash windows. A process that dies after a step's effect and before its
record leaves no row: the step runs again on the next claim (at-least-once).
For an unsafe step it leaves the ``started`` row: the next claim ends the run
``blocked`` instead of repeating the effect. ``fault`` lets tests stop at that
exact point with ``SimulatedCrash``, after which nothing more is written.

Budgets and costs. A runner may hand ``execute`` a ``StepMeter``
(``everystep.resources``): each step's function then runs inside its gauge,
which may bound it (what it raises on the step's behalf, such as
``StepResourceExceeded``, is the step's failure) and measures it; the cost
is written with the step's row. Without one, nothing is measured.

A step write that fails because the database is unreachable interrupts the
run without marking it failed (``StoreUnavailable``); the caller requeues it
once the database is back, and replay redoes the unrecorded step.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import threading
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from . import outcomes, registry, serde, telemetry
from .context import (
    NOT_AN_INTERRUPT,
    Context,
    Execution,
    Flag,
    _current,
    _in_step,
    interrupt_rank,
    recording_context,
)
from .errors import (
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    SimulatedCrash,
    StepFailure,
    StoreUnavailable,
    Terminal,
    WorkflowCodeError,
)
from .models import (
    STEP_DONE,
    STEP_FAILED,
    STEP_STARTED,
    Run,
    StepRecord,
)
from .observer import Observer, Observers
from .recovery import requeue_patiently
from .resources import StepCost, StepGauge, StepMeter
from .store import LOST, NewStep, Store, StepWrite, utcnow

if TYPE_CHECKING:
    from .api import StepFunction

logger = logging.getLogger("everystep")

#: Test hook, called ``(ctx, step_id)`` after a step's effect and before its
#: record. Raising ``SimulatedCrash`` there leaves the database exactly as a
#: process death would.
fault: Callable[[Context, str], None] | None = None

class Outcome(StrEnum):
    """Where one execution of a run left it: a run status, or one of the
    three ways an execution ends without writing one."""

    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"
    BLOCKED = "blocked"
    REQUEUED = "requeued"  # drained at a step boundary, back in the queue
    LOST = "lost"  # the claim moved on: nothing more was written
    UNFINISHED = "unfinished"  # the database failed mid-run; still claimed, to be retried

    @property
    def settled(self) -> bool:
        """The run reached a resting point (a status, or back in the queue)."""
        return self not in (Outcome.LOST, Outcome.UNFINISHED)


REQUEUED = Outcome.REQUEUED
LOST_CLAIM = Outcome.LOST
UNFINISHED = Outcome.UNFINISHED


# -- steps -----------------------------------------------------------------


def call_step(step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Entry point of every ``@step`` call."""
    name = kwargs.pop("everystep_id", None)
    ctx = recording_context()
    if ctx is None:
        return step.fn(*args, **kwargs)
    return run_step(ctx, step, args, kwargs, name)


def run_step(ctx: Context, step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> Any:
    """Replay or execute one step call in ``ctx``."""
    ex = ctx.execution
    ex.check_interrupt()
    step_id = _fatal_on_error(ex, lambda: ctx.next_id(name))
    recorded = ex.outcomes.get(step_id)
    if recorded is not None:
        if recorded.name != step.name:
            raise ex.interrupt_with(
                WorkflowCodeError(
                    f"run {ex.run.id}: step {step_id} recorded {recorded.name!r} but the workflow now "
                    f"calls {step.name!r}; the code diverged from the recorded run"
                )
            )
        if recorded.status != STEP_STARTED:
            return _replay(ex, recorded)
        if step.unsafe_to_repeat:
            raise ex.interrupt_with(_uncertain(ex.run, step_id, step.name))
        # A started row without outcome, for a step no longer marked unsafe:
        # current code says it may repeat, so it runs again.
    if ex.dry_run:
        from .dryrun import StopBeforeStep

        raise StopBeforeStep(step_id, step.name)
    if ex.draining is not None and ex.draining.is_set():
        raise ex.interrupt_with(DrainOrphan(f"run {ex.run.id}: draining before step {step_id}"))
    args_json = _fatal_on_error(ex, lambda: serde.dumps(list(args), f"arguments of step {step_id}"))
    kwargs_json = _fatal_on_error(ex, lambda: serde.dumps(kwargs, f"keyword arguments of step {step_id}")) \
        if kwargs else "{}"
    started_at = utcnow()
    started: StepRecord | None = None
    entry = NewStep(step_id, step.name, args_json, kwargs_json, started_at)
    if step.unsafe_to_repeat:
        write = _store_call(ex, lambda: ex.store.start_step(ex.claim, entry))
        if not write.ours:
            if write.record.status == STEP_STARTED:
                raise ex.interrupt_with(_uncertain(ex.run, step_id, step.name))
            ex.outcomes[step_id] = write.record
            return _replay(ex, write.record)
        started = write.record
        ex.outcomes[step_id] = started
    gauge = ex.meter.begin(ctx, step_id, step) if ex.meter is not None else None
    cost: StepCost | None = None
    try:
        token = ex.observer.step_started(ctx, step_id, step.name, step.timeout, step.unsafe_to_repeat)
        result, error = _invoke(step, args, kwargs, gauge)
    finally:
        if gauge is not None:
            cost = gauge.end()
    if isinstance(error, Terminal):
        # The run stops now, not once this step's record is written: a
        # sibling branch must not start a new step during that write.
        ex.interrupt_with(error)
    if isinstance(error, SimulatedCrash):
        ex.observer.step_finished(ctx, step_id, step.name, "crashed", error, token)
        raise ex.interrupt_with(error)
    if fault is not None:
        try:
            fault(ctx, step_id)
        except SimulatedCrash as crash:
            ex.observer.step_finished(ctx, step_id, step.name, "crashed", crash, token)
            raise ex.interrupt_with(crash) from None
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
        error=encoded_error, args=list(args), kwargs=dict(kwargs), started_at=started_at,
        cpu_seconds=cpu_seconds, peak_rss_bytes=peak_rss,
    )
    try:
        if started is not None:
            write = _store_call(ex, lambda: ex.store.finish_step(
                ex.claim, started, status, result_json, error_json, decoded, cost
            ))
        else:
            finished = dataclasses.replace(entry, status=status, result_json=result_json, error_json=error_json,
                                           cpu_seconds=cpu_seconds, peak_rss_bytes=peak_rss)
            write = _store_call(ex, lambda: ex.store.record_step(ex.claim, finished, decoded))
    except BaseException as exc:
        ex.observer.step_finished(ctx, step_id, step.name, "unrecorded", exc, token)
        raise
    ex.outcomes[step_id] = write.record
    ex.observer.step_finished(ctx, step_id, step.name, status, error, token)
    if not write.ours:
        # A racing execution recorded this step first: its outcome is the
        # one replays will see, so it is the one this execution goes on with.
        return _replay(ex, write.record)
    if error is not None:
        raise error
    return result


def _invoke(step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any],
            gauge: StepGauge | None = None) -> tuple[Any, Exception | None]:
    token = _in_step.set(True)
    try:
        if gauge is not None:
            # Inside this ``try``: whatever the gauge raises on the step's
            # behalf (StepResourceExceeded) is the step's failure.
            return gauge.call(step.fn, args, kwargs), None
        return step.fn(*args, **kwargs), None
    except Exception as exc:
        return None, exc
    finally:
        _in_step.reset(token)


def _replay(ex: Execution, recorded: StepRecord) -> Any:
    if recorded.status == STEP_DONE:
        return recorded.result
    exc = serde.decode_exception(recorded.error) or StepFailure("step failed without a stored error")
    if isinstance(exc, Terminal):
        ex.interrupt_with(exc)
    raise exc


def _uncertain(run: Run, step_id: str, name: str) -> EffectUncertain:
    return EffectUncertain(
        f"run {run.id}: step {step_id} ({name}) is unsafe to repeat and started without a recorded "
        f"outcome; check its effect, then: everystep resolve-step {run.id} {step_id} "
        "--result JSON | --error MESSAGE | --discard"
    )


def _fatal_on_error(ex: Execution, action: Callable[[], Any]) -> Any:
    """Engine misuse (bad step name, unstorable arguments) ends the run even
    if the body catches it: carrying on would make replays diverge."""
    try:
        return action()
    except EverystepError as exc:
        raise ex.interrupt_with(exc) from None


def _store_call(ex: Execution, action: Callable[[], StepWrite | None]) -> StepWrite:
    try:
        write = action()
    except StoreUnavailable as exc:
        raise ex.interrupt_with(exc) from None
    if write is LOST:
        raise ex.interrupt_with(
            ClaimLost(f"run {ex.run.id} is no longer held by this execution ({ex.claimer!r}, claim "
                      f"epoch {ex.claim.epoch}); stopping it without writing anything more")
        )
    return write


# -- parallel ----------------------------------------------------------------


def run_parallel(branches: tuple[Any, ...], name: str | None) -> tuple[Any, ...]:
    """Run branches on threads; results in branch order. See ``api.parallel``."""
    bodies = [_branch_body(branch, index) for index, branch in enumerate(branches)]
    ctx = recording_context()
    if ctx is None:
        return _gather([(body, None) for body in bodies])
    ex = ctx.execution
    ex.check_interrupt()
    fork_id = _fatal_on_error(ex, lambda: ctx.next_id(name))
    token = ex.observer.fork_started(ctx, fork_id, len(bodies))
    error: BaseException | None = None
    try:
        return _gather([(body, ctx.branch(fork_id, index)) for index, body in enumerate(bodies)])
    except BaseException as exc:
        error = exc
        raise
    finally:
        ex.observer.fork_finished(ctx, fork_id, error, token)


def _branch_body(branch: Any, index: int) -> Callable[[], Any]:
    if callable(branch):
        body: Callable[[], Any] = branch
        return body
    if isinstance(branch, (list, tuple)) and all(callable(item) for item in branch):
        return lambda: tuple(item() for item in branch)
    raise EverystepError(
        f"parallel branch {index} must be a zero-argument callable or a list of them, not {type(branch).__name__}"
    )


def _gather(jobs: list[tuple[Callable[[], Any], Context | None]]) -> tuple[Any, ...]:
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)

    def run(index: int, body: Callable[[], Any], scope: Context | None) -> None:
        _current.set(scope)
        try:
            results[index] = body()
        except BaseException as exc:  # re-raised in the caller's thread
            errors[index] = exc

    threads = []
    for index, (body, scope) in enumerate(jobs):
        # Each branch runs in a copy of the caller's contextvars, so tracing
        # context follows it onto its thread.
        context = contextvars.copy_context()
        thread = threading.Thread(
            target=context.run, args=(run, index, body, scope), name=f"everystep-branch-{index}", daemon=True
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    raise_branch_errors([error for error in errors if error is not None])
    return tuple(results)


def raise_branch_errors(errors: list[BaseException]) -> None:
    """One failure re-raises as is, several as ``ExceptionGroup``; interrupts
    (crash, lost claim, ``Terminal``, ``EffectUncertain``, drain) come first,
    and anything that is not an ``Exception`` (KeyboardInterrupt) before all."""
    if not errors:
        return
    for error in errors:
        if not isinstance(error, Exception):
            raise error
    interrupts = [error for error in errors if interrupt_rank(error) < NOT_AN_INTERRUPT]
    if interrupts:
        raise min(interrupts, key=interrupt_rank)
    if len(errors) == 1:
        raise errors[0]
    raise ExceptionGroup(f"{len(errors)} parallel branches failed", errors)  # type: ignore[type-var]


# -- runs --------------------------------------------------------------------


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
    observer = Observers([*telemetry.default_observers(), *([observer] if observer else [])])
    workflow = registry.get_workflow(run.name)
    fresh = workflow is None or run.has_steps is False
    outcomes = {} if fresh else store.load_outcomes(run.id)
    ex = Execution(run=run, store=store, claimer=claimer, outcomes=outcomes, observer=observer, draining=draining,
                   meter=meter)
    ctx = Context(ex)
    token = observer.run_started(run, ctx)
    raised: BaseException | None = None
    value: Any = None
    context_token = _current.set(ctx)
    try:
        if workflow is None:
            raised = WorkflowCodeError(
                f"workflow {run.name!r} is not registered in this process (is its module in --app?)"
            )
        else:
            value = workflow.fn(*run.args)
    except Exception as exc:
        raised = exc
    except BaseException as exc:
        # KeyboardInterrupt, SystemExit: the process is going away; write
        # nothing and let the claim be recovered like a crash.
        observer.run_finished(run, ctx, "crashed", exc, token)
        raise
    finally:
        _current.reset(context_token)
    status, error = _settle(ex, value, raised)
    if isinstance(error, SimulatedCrash):
        observer.run_finished(run, ctx, "crashed", error, token)
        raise error
    observer.run_finished(run, ctx, status, error, token)
    return status


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
    ``unfinished`` if the database stayed away. A crash outside the runner
    (a bug, a broken observer) fails the run, guarded on the claim, and is
    reported: ``failed``.
    """
    try:
        status = execute(store, run, claimer=claimer, draining=draining, observer=observer, meter=meter)
    except StoreUnavailable as exc:
        logger.warning("everystep: run %s interrupted by the database: %s", run.id, exc)
        status = Outcome.UNFINISHED
    except Exception as exc:
        logger.exception("everystep: run %s (%s) crashed outside the runner", run.id, run.name)
        try:
            failed = outcomes.fail_run(store, run.claim_as(claimer), run, exc)
        except Exception:
            logger.exception("everystep: could not mark run %s failed", run.id)
            failed = False
        return Outcome.FAILED if failed else Outcome.LOST
    if status == Outcome.UNFINISHED:
        return Outcome.REQUEUED if requeue_patiently(store, run.claim_as(claimer)) else Outcome.UNFINISHED
    return status


def _settle(ex: Execution, value: Any, raised: BaseException | None) -> tuple[Outcome, BaseException | None]:
    """Decide and write the run's outcome; returns (outcome, exception). A
    ``SimulatedCrash`` comes back as the exception with nothing written."""
    outcome = ex.interrupt or raised
    if isinstance(outcome, SimulatedCrash):
        return Outcome.LOST, outcome
    if isinstance(outcome, (ClaimLost, StoreUnavailable)):
        return (Outcome.LOST if isinstance(outcome, ClaimLost) else Outcome.UNFINISHED), outcome
    if isinstance(outcome, DrainOrphan):
        ex.observer.run_settling(ex.run, Outcome.REQUEUED)
        try:
            requeued = outcomes.requeue(ex.store, ex.claim)
        except StoreUnavailable as exc:
            return Outcome.UNFINISHED, exc
        return (Outcome.REQUEUED if requeued else Outcome.LOST), outcome
    result_json = None
    if isinstance(outcome, Terminal):
        status = Outcome.STOPPED
    elif isinstance(outcome, EffectUncertain):
        status = Outcome.BLOCKED
    elif outcome is not None:
        status = Outcome.FAILED
    else:
        try:
            result_json = serde.dumps(value, f"result of run {ex.run.id}")
            status = Outcome.COMPLETED
        except EverystepError as exc:
            status, outcome = Outcome.FAILED, exc
    error_json = serde.dumps(serde.encode_exception(outcome), "run error") if outcome is not None else None
    ex.observer.run_settling(ex.run, status)
    try:
        written = ex.store.finish_run(ex.claim, status, result_json, error_json)
    except StoreUnavailable as exc:
        return Outcome.UNFINISHED, exc
    if not written:
        return Outcome.LOST, outcome
    return status, outcome
