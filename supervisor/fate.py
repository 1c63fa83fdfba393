"""What becomes of a run when the child executing it dies: a pure decision.

The arbiter knows why a child ended (it killed it, and for what; the child
said it was leaving; or neither: a crash), which steps were in flight, how
often this run's children died already and whether the supervisor is
stopping. ``decide`` turns that into a ``Decision`` the arbiter applies: the
steps to record as failed, then one action for the run. Nothing here
touches a process or the database, so every case is a line in a table test.

The rules:

- the child said goodbye and exited cleanly before starting the run (it was
  still in its channel): hand the run to another child, no crash;
- a step timeout: each overdue step fails with ``StepTimeout`` (not an
  unsafe-to-repeat one: its ``started`` row stays, so the replay ends the
  run ``blocked``), then the run goes to a fresh child, whose replay lets
  the body's ``except`` see the timeout; a step whose retry policy retries
  timeouts (``StepInFlight.retry_in``) has the attempt recorded instead,
  and the fresh child's replay finds it waiting and releases the run until
  the next attempt;
- ``ctl kill``: the same with ``StepKilled``; killed between steps, the run
  itself fails with ``StepKilled``;
- a step over its memory or CPU budget (the parent killed the child for
  it, or the kernel did: its out-of-memory killer, or the CPU rlimit): the
  steps in flight that have a budget for that resource, or every step in
  flight if none has one (an out-of-memory kill with no limit set), fail
  with ``StepResourceExceeded`` (not unsafe ones, as for timeouts), then
  the run goes to a fresh child. Killed for memory between steps, with no
  step to blame, it is a crash;
- fenced (the run was taken from this execution): nothing, its current
  holder carries on;
- cancelled (an operator cancelled the run; it is ``cancelled`` already):
  each step in flight fails with ``Cancelled``, through the one write the
  cancelled claim still allows (an unsafe step keeps its ``started`` row:
  its effect is uncertain); nothing else;
- ``ctl kill --requeue``, a drain deadline, a fast stop, an unresponsive
  child, or any death while the supervisor stops: back to the queue;
- anything else is a crash: the run is handed to another child, and fails
  with ``ChildCrashed`` once its children died ``max_crashes`` times.

A run handed to another child while the supervisor is stopping goes back to
the queue instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from everystep.errors import Cancelled, ChildCrashed, EverystepError, StepKilled, StepResourceExceeded, StepTimeout
from everystep.models import Run
from everystep.resources import Resource, exceeded_message

from .states import ByeReason, KillReason, RestartReason, StepInFlight


class Action(StrEnum):
    REDISPATCH = "redispatch"  # to another child, from its recorded steps
    REQUEUE = "requeue"        # back to the queue, for any runner
    FAIL_RUN = "fail-run"      # ends failed with ``Decision.run_error``
    FORGET = "forget"          # not ours any more: write nothing
    CANCELLED = "cancelled"    # cancelled: record the steps cut off (``fail_steps``) as its holder, nothing more


@dataclass(frozen=True)
class Overrun:
    """A resource a child's steps went over, as the parent established it."""

    resource: Resource
    #: How the child ended for it, to finish the step's error message: "its
    #: process (pid 42) was killed by the kernel's out-of-memory killer".
    how: str
    #: What the step reached when it was stopped, when known: bytes above
    #: the memory it started with, or CPU seconds it used.
    peak: float | None = None


@dataclass(frozen=True)
class ChildEnd:
    """What the parent knows about a child that died holding a run."""

    run: Run
    pid: int
    how: str  # as the wait status reads: "killed by SIGKILL", "exited with code 1"
    clean_exit: bool  # exited with code 0
    kill_reason: KillReason | None  # why the parent killed it, if it did
    bye_reason: ByeReason | None  # why it said it was leaving, if it did
    steps: tuple[StepInFlight, ...] = ()  # overdue (timeout) or in flight (kill) when it died
    crashes: int = 0  # deaths of children running this run before this one
    max_crashes: int = 3
    stopping: bool = False
    overrun: Overrun | None = None  # a resource its steps went over, if that is why it died


@dataclass(frozen=True)
class Decision:
    action: Action
    #: Steps to record as failed, with the error each one gets.
    fail_steps: tuple[tuple[StepInFlight, EverystepError], ...] = ()
    run_error: EverystepError | None = None
    crashed: bool = False  # counts toward ``max_crashes``
    #: Steps whose failed attempt is recorded for a retry (``StepInFlight.retry_in`` seconds later).
    retry_steps: tuple[tuple[StepInFlight, EverystepError], ...] = ()


def decide(end: ChildEnd) -> Decision:
    reason = end.kill_reason
    if reason is None and end.bye_reason is not None and end.clean_exit:
        return _handed_on(end)
    if reason == KillReason.FENCED:
        return Decision(Action.FORGET)
    failed: tuple[tuple[StepInFlight, EverystepError], ...]
    if reason == KillReason.CANCELLED:
        failed = tuple(
            (step, Cancelled(f"step {step.step} ({step.name}) was cut off by a cancel of run {end.run.id}: "
                             f"its process (pid {end.pid}) was killed"))
            for step in end.steps if not step.unsafe
        )
        return Decision(Action.CANCELLED, fail_steps=failed)
    if end.overrun is not None and (reason is None or reason == KillReason.RESOURCE):
        blamed = _blamed(end.overrun, end.steps)
        if blamed or reason == KillReason.RESOURCE:
            return _handed_on(end, _over_budget(end.overrun, blamed))
    if reason == KillReason.TIMEOUT:
        timed_out = tuple(
            (step, StepTimeout(f"step {step.step} ({step.name}) ran past its timeout of {step.timeout:g}s "
                               f"and its process (pid {end.pid}) was killed"))
            for step in end.steps if not step.unsafe and step.timeout is not None
        )
        failed = tuple(pair for pair in timed_out if pair[0].retry_in is None)
        retried = tuple(pair for pair in timed_out if pair[0].retry_in is not None)
        decision = _handed_on(end, failed)
        return Decision(decision.action, fail_steps=failed, retry_steps=retried)
    if reason == KillReason.KILL:
        failed = tuple(
            (step, StepKilled(f"step {step.step} ({step.name}) was killed by an operator (pid {end.pid})"))
            for step in end.steps if not step.unsafe
        )
        if end.steps:
            return _handed_on(end, failed)
        return Decision(Action.FAIL_RUN, run_error=StepKilled(
            f"run {end.run.id} was killed by an operator between steps"))
    if reason is not None or end.stopping:
        return Decision(Action.REQUEUE)
    crashes = end.crashes + 1
    if crashes >= end.max_crashes:
        return Decision(Action.FAIL_RUN, crashed=True, run_error=ChildCrashed(
            f"the process running this run died {end.max_crashes} times; last: {end.how}"))
    return Decision(Action.REDISPATCH, crashed=True)


def _limit_of(step: StepInFlight, resource: Resource) -> float | None:
    return step.memory_limit if resource == Resource.MEMORY else step.cpu_limit


def _blamed(overrun: Overrun, steps: tuple[StepInFlight, ...]) -> list[StepInFlight]:
    """The steps in flight to blame: those with a budget for the resource,
    or every one when none has one (memory the kernel ran out of)."""
    bounded = [step for step in steps if _limit_of(step, overrun.resource) is not None]
    return bounded or (list(steps) if overrun.resource == Resource.MEMORY else [])


def _over_budget(overrun: Overrun, blamed: list[StepInFlight]) -> tuple[tuple[StepInFlight, EverystepError], ...]:
    """Their failures; never an unsafe step's (its ``started`` row stays, so
    the replay ends the run ``blocked``)."""
    failed = []
    for step in blamed:
        if step.unsafe:
            continue
        limit = _limit_of(step, overrun.resource)
        message = exceeded_message(step.step, step.name, overrun.resource, limit, overrun.peak, overrun.how)
        failed.append((step, StepResourceExceeded(message, overrun.resource.value, limit, overrun.peak)))
    return tuple(failed)


def _handed_on(end: ChildEnd, failed: tuple[tuple[StepInFlight, EverystepError], ...] = ()) -> Decision:
    return Decision(Action.REQUEUE if end.stopping else Action.REDISPATCH, fail_steps=failed)


def restart_reason(kill_reason: KillReason | None, bye_reason: ByeReason | None, had_run: bool,
                   overrun: bool = False) -> RestartReason:
    """Why a child is being replaced, for the restarts metric (``overrun``:
    the kernel killed it for a step over its budget)."""
    if kill_reason == KillReason.RESOURCE or (kill_reason is None and overrun):
        return RestartReason.RESOURCE
    if kill_reason == KillReason.TIMEOUT:
        return RestartReason.TIMEOUT
    if kill_reason == KillReason.FENCED:
        return RestartReason.FENCED
    if kill_reason == KillReason.CANCELLED:
        return RestartReason.CANCELLED
    if kill_reason in (KillReason.KILL, KillReason.KILL_REQUEUE):
        return RestartReason.KILL
    if kill_reason is not None:
        return RestartReason.EXIT
    if bye_reason is not None and bye_reason.recycles:
        return RestartReason.RECYCLE
    if bye_reason is not None and not had_run:
        return RestartReason.EXIT
    return RestartReason.CRASH


__all__ = ["Action", "ChildEnd", "Decision", "Overrun", "decide", "restart_reason"]
