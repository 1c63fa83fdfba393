"""The recording kit: what every recorded call of a workflow body does, in
one place, for the engine's calls (steps, sleeps, forks, waits, the body's
client calls) and for any new one.

A recorded call, in order:

1. ``next_step_id``: its position in its scope (a held last step is written
   first, an interrupt re-raised: no call starts once the run is ending);
2. ``recorded_at``: its record, if the run has one (a record of another
   function is a divergence, ``diverged``; ``everystep replay`` is told);
   a record is replayed with ``replay_outcome`` (its result, or its error
   raised again);
3. ``may_start``: none, so it may start, unless this is a dry replay (it
   stops there, ``StopBeforeStep``) or the runner drains;
4. ``crash_point``: the test hook ``everystep.runner.fault``, at the
   call's crash window;
5. ``store_write``: the write, handed the patch markers decided before it;
   a refused one interrupts the run (``refused`` says why: a cancel or a
   lost claim), a failing database interrupts it too;
6. a wait: ``suspend`` unwinds the scope until ``wake_at`` (``is_due``
   says whether that time has come).

The kit imports nothing above the store and the execution state, so every
recorded call can use it and none needs another's private names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from .context import Context, Execution
from .errors import (
    STORE_FAILURES,
    Cancelled,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    SimulatedCrash,
    StepFailure,
    Suspended,
    Terminal,
    WorkflowCodeError,
)
from .models import STEP_DONE, STEP_FAILED, Run, StepRecord
from .serde import decode_exception
from .store import LOST, Marker, NewStep, StepWrite, utcnow


class StopBeforeStep(BaseException):
    """Raised in a dry replay instead of executing a step (``may_start``).

    A ``BaseException``, so the workflow's own ``except Exception`` clauses
    cannot catch it and wander into code the real run would not reach.
    """

    def __init__(self, step_id: str, name: str) -> None:
        super().__init__(step_id, name)
        self.step_id = step_id
        self.name = name


def crash_point(ctx: Context, step_id: str) -> None:
    """Call the ``fault`` hook, if any, for step ``step_id`` of an engine
    call (a send, a read, a wait); a ``SimulatedCrash`` it raises becomes
    the run's interrupt, so nothing more is written."""
    fault = ctx.execution.fault_hook()
    if fault is not None:
        try:
            fault(ctx, step_id)
        except SimulatedCrash as crash:
            raise ctx.execution.interrupt_with(crash) from None


def next_step_id(ex: Execution, ctx: Context, name: str | None) -> str:
    """Where every step, fork and sleep begins: a held record is written
    first (the body went on after its last step after all), an interrupt
    is re-raised (no step starts once the run is ending), then the id is
    allocated; a bad name ends the run, even if the body catches it."""
    if ex.held is not None:
        ex.held.flush(ex)
    ex.check_interrupt()
    try:
        return ctx.next_id(name)
    except EverystepError as exc:
        raise ex.interrupt_with(exc) from None


def may_start(ex: Execution, step_id: str, name: str) -> None:
    """No new step starts in a dry run (it stops before the first
    unrecorded one) or once the runner drains (the run is requeued)."""
    if ex.dry_run:
        if ex.replay_log is not None:
            ex.replay_log.unrecorded(step_id, name)
        raise StopBeforeStep(step_id, name)
    if ex.draining is not None and ex.draining.is_set():
        raise ex.interrupt_with(DrainOrphan(f"run {ex.run.id}: draining before step {step_id}"))


def recorded_at(ex: Execution, step_id: str, step_name: str) -> StepRecord | None:
    """The record at ``step_id`` as a replay meets it, for the engine's own
    steps (``step_phases`` does the same for the workflow's): a record of
    another function is a divergence, and ``everystep replay``'s log is told
    the step is reached (``--until-step``) and how it matched."""
    log = ex.replay_log
    if log is not None:
        log.reaching(step_id, step_name)
    recorded = ex.outcomes.get(step_id)
    if recorded is None:
        return None
    if recorded.name != step_name:
        raise diverged(ex, step_id, recorded.name, step_name)
    if log is not None:
        log.matched(step_id, step_name, recorded)
    return recorded


def diverged(ex: Execution, step_id: str, recorded: str, called: str) -> BaseException:
    if ex.replay_log is not None:
        ex.replay_log.diverged(step_id, recorded, called)
    return ex.interrupt_with(
        WorkflowCodeError(
            f"run {ex.run.id}: step {step_id} recorded {recorded!r} but the workflow now "
            f"calls {called!r}; the code diverged from the recorded run"
        )
    )


def replay_outcome(ex: Execution, recorded: StepRecord) -> Any:
    if recorded.status == STEP_DONE:
        return recorded.result
    exc = decode_exception(recorded.error) or StepFailure("step failed without a stored error")
    if isinstance(exc, Terminal):
        ex.interrupt_with(exc)
    raise exc


def uncertain(run: Run, step_id: str, name: str) -> EffectUncertain:
    return EffectUncertain(
        f"run {run.id}: step {step_id} ({name}) is unsafe to repeat and started without a recorded "
        f"outcome; check its effect, then: everystep resolve-step {run.id} {step_id} "
        "--result JSON | --error MESSAGE | --discard"
    )


def is_due(ex: Execution, wake_at: dt.datetime | None) -> bool:
    """Whether a wait ending at ``wake_at`` is over: by this host's clock, or
    by the database's time of the claim (it only hands out due runs)."""
    if wake_at is None:
        return True
    claimed = ex.run.claimed_at
    now = utcnow()
    return wake_at <= (claimed if claimed is not None and claimed > now else now)


def suspend(ex: Execution, wake_at: dt.datetime | None, wait_key: str | None = None,
             what: str | None = None) -> Suspended:
    """The scope waits until ``wake_at`` (and for ``wait_key``, described as
    ``what``): remember it, unwind with ``Suspended``."""
    assert wake_at is not None
    ex.wait_until(wake_at, wait_key)
    return Suspended(wake_at, what)


def store_write(ex: Execution, action: Callable[[tuple[Marker, ...]], StepWrite | None],
                outcome: NewStep | None = None) -> StepWrite:
    """Make a step write of this execution: ``action`` is handed the patch
    markers decided and not yet written, and writes them first in its
    transaction, so no step after a patch point is ever durable without
    its marker (``everystep.patches``). A refused write interrupts the run:
    ``Cancelled`` if an operator cancelled it under this claim
    (``outcome``, the step just finished, is then recorded through the one
    write a cancelled claim still allows), else ``ClaimLost``."""
    markers = ex.take_markers()
    try:
        write = action(markers)
    except STORE_FAILURES as exc:
        raise ex.interrupt_with(exc) from None
    if write is LOST:
        raise ex.interrupt_with(refused(ex, outcome))
    return write


def refused(ex: Execution, outcome: NewStep | None = None) -> BaseException:
    """Why a write of this execution was refused: a cancel or a lost claim."""
    try:
        state = ex.store.claim_states([ex.run.id]).get(ex.run.id)
        if state is not None and state.cancelled_under(ex.claim):
            if outcome is not None and outcome.status in (STEP_DONE, STEP_FAILED):
                ex.store.record_cancelled_step(ex.claim, outcome)
            return Cancelled(f"run {ex.run.id} was cancelled while this execution ({ex.claimer!r}) held it; "
                             "it stopped at the step boundary")
    except STORE_FAILURES:
        pass
    return ClaimLost(f"run {ex.run.id} is no longer held by this execution ({ex.claimer!r}, claim "
                     f"epoch {ex.claim.epoch}); stopping it without writing anything more")


__all__ = ["StopBeforeStep", "crash_point", "diverged", "is_due", "may_start", "next_step_id", "recorded_at",
           "refused", "replay_outcome", "store_write", "suspend", "uncertain"]
