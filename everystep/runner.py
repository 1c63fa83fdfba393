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

The last step and the status together. When the body's last act is a step
(``return step(...)`` or ``x = step(...); return x`` at the body's own top
level, read from the bytecode by ``tail_position``) and that step succeeds
and is safe to repeat, its record is held back (a ``HeldRecord``, in
``Execution.held``) and committed with the ``completed`` status in one
transaction (``Store.finish_run_with_step``): one commit less per run. If
that write is refused, the step is flushed alone, which says why as any
step write does; if anything but ``completed`` is to be written, or the
body calls another step after all, the record is flushed first, on its
own. Held back, the record is exactly as durable as a step whose process
died after its effect: a replay runs that step again.

Reading order: a step call (``run_step``: replay, begin, run, record),
the held last step, durable sleeps, parallel forks, then a whole run
(``execute``) and how it settles (``_settle``: a verdict, then its write).

Fencing. Every claim bumps the run's epoch, so an execution superseded by a
later claim (an operator's forced requeue, a re-claim by the same runner
name, a takeover of that name) learns at its first refused write that the
run is no longer its own (``ClaimLost``): no new step starts after that, and
an unsafe step's ``started`` insert is fenced like every other write.

Crash windows. A process that dies after a step's effect and before its
record leaves no row: the step runs again on the next claim (at-least-once);
for a last step held back, that window runs to the commit of the terminal
status. For an unsafe step it leaves the ``started`` row: the next claim
ends the run ``blocked`` instead of repeating the effect. ``fault`` lets
tests stop at that exact point with ``SimulatedCrash``, after which nothing
more is written.

Transactional steps (``@step(transactional=True)``) have no such window:
their SQL runs on ``step_connection()`` inside the transaction that writes
their record, and one commit ends both (``everystep.transactional``).

Budgets and costs. A runner may hand ``execute`` a ``StepMeter``
(``everystep.resources``): each step's function then runs inside its gauge,
which may bound it (what it raises on the step's behalf, such as
``StepResourceExceeded``, is the step's failure) and measures it; the cost
is written with the step's row. Without one, nothing is measured.

A step write that fails because the database is unreachable interrupts the
run without marking it failed (``StoreUnavailable``); the caller requeues it
once the database is back, and replay redoes the unrecorded step. One that
the database refuses (``StoreError``: any of the engine's own statements,
never the workflow's) interrupts it too, and the run goes back to the queue
after a growing backoff (``deferred``, ``engine_errors.give_back``): only
the workflow's own doing fails a run.

Waiting. A step that fails and will be retried (``@step(retries=...)``) is
recorded ``retrying``, with its attempt and the time of the next one, and a
durable sleep (``everystep.sleep``) is recorded ``sleeping`` with its wake
time. The scope that waits unwinds (``Suspended``); sibling parallel branches
carry on until they settle or wait too; then the run is *released*: back to
``scheduled``, not claimable before the earliest wake time (a write fenced
by the claim like every other). No process or thread sits through the wait.
The next claim replays: a wait whose time has come ends (the sleep is
recorded ``done``, the step runs its next attempt), one still ahead waits
again. Wake times are compared with the later of this host's clock and the
database's time of the claim, so a host whose clock runs behind the
database's cannot release a due run again and again.

Cancelling. An operator's cancel turns the run ``cancelled`` at once, so
every write of its execution is refused; the runner tells a refusal caused
by a cancel from a lost claim (``Cancelled``), records the step it just
finished through the one write a cancelled claim still allows, and stops.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
import functools
import logging
import sys
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from . import aio, engine_errors, outcomes, registry, serde, telemetry, transactional
from .context import (
    NOT_AN_INTERRUPT,
    Context,
    Execution,
    Flag,
    StepAttempt,
    _current,
    _in_step,
    interrupt_rank,
    recording_context,
)
from .errors import (
    STORE_FAILURES,
    Cancelled,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    SimulatedCrash,
    StepFailure,
    StepTimeout,
    StoreError,
    StoreUnavailable,
    Suspended,
    Terminal,
    WorkflowCodeError,
)
from .models import (
    EXECUTION_ENDS,
    STEP_DONE,
    STEP_FAILED,
    STEP_RETRYING,
    STEP_SLEEPING,
    STEP_STARTED,
    Outcome,
    Run,
    StepRecord,
)
from .observer import Observer, Observers
from .recovery import requeue_patiently
from .resources import StepCost, StepGauge, StepMeter
from .store import LOST, Marker, NewStep, Store, StepWrite, utcnow
from .store.base.step_transactions import StepTransaction
from .tail_position import is_tail_call

if TYPE_CHECKING:
    from .api import StepFunction

logger = logging.getLogger("everystep")

#: Test hook, called ``(ctx, step_id)`` after a step's effect and before its
#: record. Raising ``SimulatedCrash`` there leaves the database exactly as a
#: process death would.
fault: Callable[[Context, str], None] | None = None

#: The function name recorded for a durable sleep's step row.
SLEEP_STEP = "everystep.sleep"


def crash_point(ctx: Context, step_id: str) -> None:
    """Call the ``fault`` hook, if any, for step ``step_id`` of an engine
    call (a send, a read, a wait); a ``SimulatedCrash`` it raises becomes
    the run's interrupt, so nothing more is written."""
    if fault is not None:
        try:
            fault(ctx, step_id)
        except SimulatedCrash as crash:
            raise ctx.execution.interrupt_with(crash) from None


# -- steps -----------------------------------------------------------------


def call_step(step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Entry point of every ``@step`` call. In an async workflow (a step
    called on a thread whose event loop runs the body) the call is an
    awaitable (``everystep.aio``); elsewhere it runs now."""
    name = kwargs.pop("everystep_id", None)
    ctx = recording_context()
    if ctx is None:
        return step.fn(*args, **kwargs)
    if aio.in_async_body():
        return aio.step_call(step, args, kwargs, name)
    return run_step(ctx, step, args, kwargs, name)


def run_step(ctx: Context, step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> Any:
    """Replay or execute one step call in ``ctx``, on this thread: the
    phases of ``step_phases``, the step's function called between them (an
    async one on this thread's own loop: ``aio.blocking``)."""
    phases = step_phases(ctx, step, args, kwargs, name)
    done, gauge = advance(phases, None)
    if done:
        return gauge  # replayed: the recorded outcome
    done, value = advance(phases, _invoke(step, args, kwargs, gauge))
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


def step_phases(ctx: Context, step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any],
                name: str | None) -> StepPhases:
    """One step call in three phases: replay (a recorded outcome returns or
    raises without running the step), begin (checks before the effect; an
    unsafe step's ``started`` row claims the effect), then, once the driver
    has run the step's function and sent back how it ended, the record
    (``_record``). The one path for sync and async steps alike (``run_step``
    and ``aio.step_call`` only call the function), so both record the same
    rows under the same ids."""
    ex = ctx.execution
    step_id = next_step_id(ex, ctx, name)
    attempt = 1
    if ex.replay_log is not None:
        ex.replay_log.reaching(step_id, step.name)
    recorded = ex.outcomes.get(step_id)
    if recorded is not None:
        attempt = _attempt_to_run(ex, step, step_id, recorded)
        if attempt == _RECORDED:
            if ex.replay_log is not None:
                ex.replay_log.matched(step_id, step.name, recorded)
            return replay_outcome(ex, recorded)
    entry = _begin(ex, step, step_id, args, kwargs, attempt)
    started: StepRecord | None = None
    if step.unsafe_to_repeat:
        started = _claim_effect(ex, step, entry)
        if started.status != STEP_STARTED:
            return replay_outcome(ex, started)  # a racing execution recorded its outcome first
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


#: ``_attempt_to_run``: the recorded outcome stands, the step does not run.
_RECORDED = 0


def _attempt_to_run(ex: Execution, step: StepFunction, step_id: str, recorded: StepRecord) -> int:
    """The replay phase, for a step id with a row: which attempt of the step
    runs now, or ``_RECORDED`` (its outcome is replayed). A retry not yet
    due waits; an unsafe step started without outcome blocks the run."""
    if recorded.name != step.name:
        raise diverged(ex, step_id, recorded.name, step.name)
    if recorded.status == STEP_RETRYING:
        if not is_due(ex, recorded.wake_at):
            raise suspend(ex, recorded.wake_at)
        return recorded.attempt + 1  # its time has come: the next attempt runs
    if recorded.status != STEP_STARTED:
        return _RECORDED
    if step.unsafe_to_repeat:
        raise ex.interrupt_with(_uncertain(ex.run, step_id, step.name))
    # A started row without outcome, for a step no longer marked unsafe:
    # current code says it may repeat, so it runs again.
    return 1


def may_start(ex: Execution, step_id: str, name: str) -> None:
    """No new step starts in a dry run (it stops before the first
    unrecorded one) or once the runner drains (the run is requeued)."""
    if ex.dry_run:
        from .dryrun import StopBeforeStep

        if ex.replay_log is not None:
            ex.replay_log.unrecorded(step_id, name)
        raise StopBeforeStep(step_id, name)
    if ex.draining is not None and ex.draining.is_set():
        raise ex.interrupt_with(DrainOrphan(f"run {ex.run.id}: draining before step {step_id}"))


def _begin(ex: Execution, step: StepFunction, step_id: str, args: tuple[Any, ...], kwargs: dict[str, Any],
           attempt: int) -> NewStep:
    """The begin phase: the step may start, and its arguments are stored
    as they are now, before the effect (unstorable ones end the run)."""
    may_start(ex, step_id, step.name)
    try:
        args_json = serde.dumps(list(args), f"arguments of step {step_id}")
        kwargs_json = serde.dumps(kwargs, f"keyword arguments of step {step_id}") if kwargs else "{}"
    except EverystepError as exc:
        raise ex.interrupt_with(exc) from None
    return NewStep(step_id, step.name, args_json, kwargs_json, utcnow(), attempt=attempt)


def _claim_effect(ex: Execution, step: StepFunction, entry: NewStep) -> StepRecord:
    """An unsafe step's ``started`` row, whose insert is the atomic claim on
    its effect. Returns that row, or the outcome a racing execution already
    recorded; one that started and has no outcome blocks the run."""
    write = store_write(ex, lambda markers: ex.store.start_step(ex.claim, entry, markers))
    if write.ours or write.record.status != STEP_STARTED:
        ex.outcomes[entry.step_id] = write.record
        return write.record
    raise ex.interrupt_with(_uncertain(ex.run, entry.step_id, step.name))


def _record(ex: Execution, ctx: Context, step: StepFunction, entry: NewStep, started: StepRecord | None,
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
    if fault is not None:
        try:
            fault(ctx, step_id)
        except SimulatedCrash as crash:
            ex.observer.step_finished(ctx, step_id, step.name, "crashed", crash, token)
            raise ex.interrupt_with(crash) from None
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
    if error is None and started is None and tx is None and _is_last_act(ex, ctx):
        ex.held = HeldRecord(ctx, finished, decoded, token)
        return result
    try:
        if started is not None:
            write = store_write(ex, lambda markers: ex.store.finish_step(
                ex.claim, started, status, result_json, error_json, decoded, cost, markers
            ), finished)
        elif tx is not None and tx.open:
            # Refused, its writes are rolled back: a cancel records nothing of it.
            write = store_write(ex, lambda markers: transactional.record(ex, ctx, tx, finished, decoded, markers))
        else:
            write = store_write(ex, lambda markers: ex.store.record_step(ex.claim, finished, decoded, markers),
                                finished)
    except BaseException as exc:
        ex.observer.step_finished(ctx, step_id, step.name, "unrecorded", exc, token)
        raise
    ex.outcomes[step_id] = write.record
    ex.observer.step_finished(ctx, step_id, step.name, status, error, token)
    if not write.ours:
        # A racing execution recorded this step first: its outcome is the
        # one replays will see, so it is the one this execution goes on with.
        return replay_outcome(ex, write.record)
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
        write = store_write(ex, lambda markers: ex.store.record_attempt(ex.claim, waiting, decoded, markers))
    except BaseException as exc:
        ex.observer.step_finished(ctx, entry.step_id, name, "unrecorded", exc, token)
        raise
    ex.outcomes[entry.step_id] = write.record
    ex.observer.step_finished(ctx, entry.step_id, name, STEP_RETRYING, error, token)
    if not write.ours:
        return replay_outcome(ex, write.record)
    logger.info("everystep: run %s step %s (%s) attempt %d failed (%s: %s); attempt %d at %s",
                ex.run.id, entry.step_id, name, entry.attempt, type(error).__name__, error, entry.attempt + 1,
                retry_at.isoformat(), extra={"run_id": ex.run.id, "workflow": ex.run.name, "event": "step_retry"})
    raise suspend(ex, retry_at)


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


def _invoke(step: StepFunction, args: tuple[Any, ...], kwargs: dict[str, Any],
            gauge: StepGauge | None = None) -> tuple[Any, Exception | None]:
    token = _in_step.set(True)
    fn = aio.blocking(step.fn) if step.is_async else step.fn
    try:
        if gauge is not None:
            # Inside this ``try``: whatever the gauge raises on the step's
            # behalf (StepResourceExceeded) is the step's failure.
            return gauge.call(fn, args, kwargs), None
        return fn(*args, **kwargs), None
    except Exception as exc:
        return None, exc
    finally:
        _in_step.reset(token)


def replay_outcome(ex: Execution, recorded: StepRecord) -> Any:
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
        raise ex.interrupt_with(_refused(ex, outcome))
    return write


def _refused(ex: Execution, outcome: NewStep | None = None) -> BaseException:
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


# -- the last step -------------------------------------------------------------


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
            write = store_write(ex, lambda markers: ex.store.record_step(ex.claim, self.entry, self.decoded,
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
_ENGINE_MODULES = frozenset({__name__, "everystep.api"})


def _is_last_act(ex: Execution, ctx: Context) -> bool:
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
            and frame.f_back.f_code is execute.__code__ and is_tail_call(frame.f_code, frame.f_lasti))


# -- durable sleep -------------------------------------------------------------


def sleep_until(wake_at: dt.datetime, name: str | None = None) -> None:
    """A durable sleep inside a workflow (see ``api.sleep``); outside one,
    a plain ``time.sleep`` until ``wake_at``."""
    ctx = recording_context()
    if ctx is None:
        import time

        time.sleep(max((wake_at - utcnow()).total_seconds(), 0.0))
        return
    ex = ctx.execution
    step_id = next_step_id(ex, ctx, name)
    recorded = recorded_at(ex, step_id, SLEEP_STEP)
    if recorded is not None:
        if recorded.status != STEP_SLEEPING:
            replay_outcome(ex, recorded)
            return
        if not is_due(ex, recorded.wake_at):
            raise suspend(ex, recorded.wake_at)
        if ex.dry_run:
            return  # it would wake now; a dry replay writes nothing
        _record_sleep(ex, step_id, recorded.wake_at, recorded.started_at or utcnow(), STEP_DONE)
        return
    may_start(ex, step_id, SLEEP_STEP)
    now = utcnow()
    if wake_at <= now:
        _record_sleep(ex, step_id, wake_at, now, STEP_DONE)
        return
    write = _record_sleep(ex, step_id, wake_at, now, STEP_SLEEPING)
    if write.record.status == STEP_DONE:
        return  # a racing execution recorded it over already
    raise suspend(ex, wake_at)


def _record_sleep(ex: Execution, step_id: str, wake_at: dt.datetime | None, started_at: dt.datetime,
                  status: str) -> StepWrite:
    args_json = serde.dumps([wake_at], "sleep")
    entry = NewStep(step_id, SLEEP_STEP, args_json, "{}", started_at, status=status,
                    result_json="null" if status == STEP_DONE else None, wake_at=wake_at)
    decoded = StepRecord(workflow_id=ex.run.id, step_id=step_id, name=SLEEP_STEP, status=status,
                         args=[wake_at], started_at=started_at, wake_at=wake_at)
    write = store_write(ex, lambda markers: ex.store.record_step(ex.claim, entry, decoded, markers), entry)
    ex.outcomes[step_id] = write.record
    return write


# -- parallel ----------------------------------------------------------------


def run_parallel(branches: tuple[Any, ...], name: str | None) -> tuple[Any, ...]:
    """Run branches on threads; results in branch order. See ``api.parallel``."""
    bodies = [_branch_body(branch, index) for index, branch in enumerate(branches)]
    ctx = recording_context()
    if ctx is None:
        return _gather([(body, None) for body in bodies])
    ex = ctx.execution
    fork_id = next_step_id(ex, ctx, name)
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
    (crash, lost claim, cancel, ``Terminal``, ``EffectUncertain``, drain) come
    first, and anything that is not an ``Exception`` (KeyboardInterrupt)
    before all. A branch that waits (``Suspended``) comes after interrupts and
    before failures: the fork cannot return before that branch is done, so
    the run waits; the failures are recorded and re-raised on the replay
    that finds every branch settled."""
    if not errors:
        return
    for error in errors:
        if not isinstance(error, (Exception, Suspended)):
            raise error
    interrupts = [error for error in errors if interrupt_rank(error) < NOT_AN_INTERRUPT]
    if interrupts:
        raise min(interrupts, key=interrupt_rank)
    waiting = [error for error in errors if isinstance(error, Suspended)]
    if waiting:
        raise min(waiting, key=lambda suspended: suspended.wake_at)
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
    ex, ctx, token, workflow = start_execution(store, run, claimer, draining, observer, meter)
    raised: BaseException | None = None
    value: Any = None
    context_token = _current.set(ctx)
    try:
        if workflow is None:
            raised = unregistered(run)
        elif workflow.is_async:
            # On its own event loop; its last step is not held back (its
            # frames are not under ``execute``: ``_is_last_act``).
            value = aio.run_body(workflow.fn, run.args)
        else:
            ex.body_code = getattr(workflow.fn, "__code__", None)
            value = workflow.fn(*run.args)
    except BaseException as exc:
        raised = body_raised(ctx, token, exc)
    finally:
        _current.reset(context_token)
    return finish_execution(ctx, token, value, raised)


def start_execution(store: Store, run: Run, claimer: str, draining: Flag | None, observer: Observer | None,
                    meter: StepMeter | None) -> tuple[Execution, Context, Any, Any]:
    """Before the body: its records loaded, its ``Execution`` and top
    ``Context``, the observers told (their token), and the workflow (None:
    not registered here). Shared by ``execute`` and ``aio.execute_async``."""
    fanned = _fan_out(observer)
    workflow = registry.get_workflow(run.name)
    fresh = workflow is None or run.has_steps is False
    outcomes = {} if fresh else store.load_outcomes(run.id)
    ex = Execution(run=run, store=store, claimer=claimer, outcomes=outcomes, observer=fanned, draining=draining,
                   meter=meter)
    ctx = Context(ex)
    return ex, ctx, fanned.run_started(run, ctx), workflow


def unregistered(run: Run) -> WorkflowCodeError:
    return WorkflowCodeError(f"workflow {run.name!r} is not registered in this process (is its module in --app?)")


def body_raised(ctx: Context, token: Any, exc: BaseException) -> BaseException | None:
    """What the body's exception is for the run: an ``Exception`` is its
    failure, ``Suspended`` none (``ex.wake_at`` says until when: the run
    is released); anything else (KeyboardInterrupt, SystemExit: the process
    is going away) is re-raised with nothing written, and the claim is
    recovered like a crash's."""
    if isinstance(exc, Exception):
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
        return replay_outcome(ex, recorded), None
    except Exception as exc:
        return None, exc


def _lost(ex: Execution) -> Outcome:
    """A settling write was refused: cancelled under this claim, or lost."""
    return Outcome.CANCELLED if isinstance(_refused(ex), Cancelled) else Outcome.LOST
