"""The public API: ``@workflow``, ``@step``, ``parallel``, ``schedule``, ``sleep``.

Decorated functions stay plain functions outside a running workflow, so they
can be unit-tested directly; inside one, each step call is recorded (or
replayed) by the runner. What runs say to each other (messages, events,
children, reading and waiting for runs) is ``everystep.between_runs``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Callable
from typing import Any, TypeVar, overload

from . import async_steps, body_calls, client, durations, forks, loops, new_run, registry, resources, sleeps, steps
from . import transactional as transactional_steps
from .body_rules import BodyRule, declare
from .context import recording_context as runner_context
from .cron_schedule import CronSchedule
from .errors import EverystepError
from .models import Run
from .new_run import aware
from .queues import Placement
from .retry import RetryPolicy
from .store import Store, utcnow

F = TypeVar("F", bound=Callable[..., Any])


@declare(BodyRule.PLAIN, "A workflow's type: calling one directly runs its body as a plain function (a child run is start() or call()).")
class WorkflowFunction:
    """A registered workflow. Calling it directly runs the body as a plain
    function (steps inside are plain calls too)."""

    def __init__(self, fn: Callable[..., Any], name: str, cron: CronSchedule | None = None,
                 placement: Placement | None = None, timeout: float | None = None) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name
        #: Whether the body is ``async def``, decided once: runners ask on every run.
        self.is_async = loops.is_async(fn)
        #: Seconds a run may take from its schedule before it is cancelled
        #: (reason "deadline"), unless ``schedule()`` gives its own.
        self.timeout = timeout
        #: Periodic workflows: runners enqueue a run per tick (see ``everystep.cron``).
        self.cron = cron
        #: The queue and priority its runs get unless ``schedule()`` says otherwise.
        self.placement = placement or Placement()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def schedule(self, *args: Any, **options: Any) -> Run:
        """Shorthand for ``schedule(this_workflow, *args, **options)``."""
        return schedule(self, *args, **options)

    def __repr__(self) -> str:
        return f"<workflow {self.name}>"


@declare(BodyRule.PLAIN, "A step's type: called in a body, a step is recorded like every @step.")
class StepFunction:
    """A step: recorded inside a running workflow, a plain call outside.

    The call-site keyword ``everystep_id="name"`` names the step (it is
    popped before the function is called, in both cases).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        unsafe_to_repeat: bool = False,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        memory_limit: int | None = None,
        cpu_limit: float | None = None,
        transactional: bool = False,
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = name
        #: Whether it is ``async def``, decided once: asked on every call.
        self.is_async = loops.is_async(fn)
        self.unsafe_to_repeat = unsafe_to_repeat
        self.timeout = timeout
        self.retry = retry
        #: Bytes the step may add to its process, and CPU seconds it may use
        #: (None: the supervisor's default, if any). See ``everystep.resources``.
        self.memory_limit = memory_limit
        self.cpu_limit = cpu_limit
        #: Its writes through ``step_connection()`` commit with its record
        #: (``everystep.transactional``): exactly once.
        self.transactional = transactional

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Entry point of every ``@step`` call: a plain call outside a
        running body (and in a step's own code); in an async body an
        awaitable (``everystep.async_steps``); in a body, recorded now
        (``everystep.steps``)."""
        name = kwargs.pop("everystep_id", None)
        ctx = runner_context()
        if ctx is None:
            return self.fn(*args, **kwargs)
        if loops.in_async_body():
            return async_steps.step_call(self, args, kwargs, name)
        return steps.run_step(ctx, self, args, kwargs, name)

    def __repr__(self) -> str:
        flags = " unsafe_to_repeat" if self.unsafe_to_repeat else " transactional" if self.transactional else ""
        return f"<step {self.name}{flags}>"

    def describe_limits(self) -> str:
        """``memory_limit=256 MiB, cpu_limit=30s`` (empty without limits)."""
        parts = []
        if self.memory_limit is not None:
            parts.append(f"memory_limit={resources.format_size(self.memory_limit)}")
        if self.cpu_limit is not None:
            parts.append(f"cpu_limit={resources.format_cpu(self.cpu_limit)}")
        return ", ".join(parts)


@overload
def workflow(fn: F) -> WorkflowFunction: ...
@overload
def workflow(
    *, name: str | None = None, cron: str | None = None, timezone: str | None = None,
    queue: str | None = None, priority: int | None = None, timeout: float | dt.timedelta | None = None,
) -> Callable[[F], WorkflowFunction]: ...


@declare(BodyRule.PLAIN, 'A decorator: it registers a workflow when its module is imported.')
def workflow(fn: Callable[..., Any] | None = None, *, name: str | None = None, cron: str | None = None,
             timezone: str | None = None, queue: str | None = None, priority: int | None = None,
             timeout: float | dt.timedelta | None = None) -> Any:
    """Register a workflow under ``module.qualname`` (or ``name``).

    ``queue`` (default ``default``) and ``priority`` (default 0; larger is
    claimed first within the queue) are where its runs go unless
    ``schedule()`` says otherwise (see ``everystep.queues``).

    ``cron`` makes it periodic: every runner with it loaded enqueues one run
    per tick of the cron expression, evaluated in ``timezone`` (an IANA
    name; default UTC), whose single argument is the tick time (see
    ``everystep.cron``; needs the extra ``everystep[cron]``).

    ``timeout`` (seconds, or a timedelta): each run's deadline is that long
    after it is scheduled, unless ``schedule()`` gives one; a run still
    unfinished then is cancelled (reason ``deadline``), as ``everystep
    cancel`` does."""
    if timezone is not None and cron is None:
        raise EverystepError("timezone= applies to a cron schedule: give cron= too")
    schedule = CronSchedule.parse(cron, timezone) if cron is not None else None
    placement = Placement.of(queue, priority)
    seconds = durations.seconds(timeout, "workflow timeout", positive=True) if timeout is not None else None

    def decorate(fn: Callable[..., Any]) -> WorkflowFunction:
        qualified = name or registry.qualified_name(fn)
        if schedule is not None:  # each tick's run gets the tick time: refused now, not at every tick
            new_run.check_call(fn, qualified, [schedule.next_after(utcnow())])
        wf = WorkflowFunction(fn, qualified, schedule, placement, seconds)
        registry.register_workflow(wf.name, wf)
        return wf

    return decorate(fn) if fn is not None else decorate


@overload
def step(fn: F) -> StepFunction: ...
@overload
def step(
    *, unsafe_to_repeat: bool = False, timeout: float | None = None, name: str | None = None,
    retries: int = 0, backoff: float = 1.0, backoff_max: float = 300.0, jitter: bool = True,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    memory_limit: str | int | None = None, cpu_limit: float | None = None, transactional: bool = False,
) -> Callable[[F], StepFunction]: ...


@declare(BodyRule.PLAIN, 'A decorator: the step it declares is recorded when a body calls it.')
def step(
    fn: Callable[..., Any] | None = None,
    *,
    unsafe_to_repeat: bool = False,
    timeout: float | None = None,
    name: str | None = None,
    retries: int = 0,
    backoff: float = 1.0,
    backoff_max: float = 300.0,
    jitter: bool = True,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    memory_limit: str | int | None = None,
    cpu_limit: float | None = None,
    transactional: bool = False,
) -> Any:
    """Declare a step. ``unsafe_to_repeat=True`` records a ``started`` row
    before the effect so a crash mid-effect blocks the run instead of
    repeating it. ``timeout`` (seconds) is enforced by the supervisor, which
    kills the step's process and records ``StepTimeout``.

    ``retries``: a failure in ``retry_on`` is retried up to this many times;
    before attempt k+1 the run waits ``min(backoff_max, backoff * 2**(k-1))``
    seconds (with ``jitter``, 50 % to 100 % of that), released: no process
    or thread waits (see ``everystep.retry`` for what is never retried).
    ``memory_limit`` (``"512M"``, ``"2G"``, or bytes: what the step may add
    to its process) and ``cpu_limit`` (CPU seconds) are enforced by the
    supervisor too: a step over either fails with ``StepResourceExceeded``.
    The threaded worker cannot enforce them and refuses to start while a
    step declares one (see ``everystep.resources``).

    ``transactional=True``: the step's SQL, run on ``step_connection()``,
    commits in one transaction with its record, so its database writes
    happen exactly once (see ``everystep.transactional``)."""
    if transactional:
        transactional_steps.check_declaration(unsafe_to_repeat)
    if timeout is not None and not timeout > 0:
        raise EverystepError(f"step timeout must be a positive number of seconds, not {timeout!r}")
    policy = RetryPolicy.build(retries, backoff, backoff_max, jitter, retry_on)
    if policy is not None and unsafe_to_repeat:
        raise EverystepError("an unsafe_to_repeat step is never retried (its effect may have happened): "
                             "drop retries= or unsafe_to_repeat=")
    memory = resources.parse_size(memory_limit) if memory_limit is not None else None
    cpu = resources.parse_cpu(cpu_limit) if cpu_limit is not None else None

    def decorate(fn: Callable[..., Any]) -> StepFunction:
        declared = StepFunction(fn, name or registry.qualified_name(fn), unsafe_to_repeat, timeout, policy,
                                memory_limit=memory, cpu_limit=cpu, transactional=transactional)
        if memory is not None or cpu is not None:
            registry.register_step_limits(declared.name, declared.describe_limits())
        if transactional:
            registry.register_transactional_step(declared.name)
        return declared

    return decorate(fn) if fn is not None else decorate


@declare(BodyRule.PLAIN, "A fork: each branch's calls follow their own class, under the branch's step ids.")
def parallel(*branches: Any, everystep_id: str | None = None) -> tuple[Any, ...]:
    """Run branches concurrently, each on its own thread; return their results
    in branch order.

    A branch is a zero-argument callable, or a list of them run in sequence
    (that branch returns a tuple). One failing branch re-raises its exception
    as is; several raise ``ExceptionGroup``; ``Terminal``,
    ``EffectUncertain`` and ``DrainOrphan`` are raised ahead of any group.
    Healthy branches still run to completion and are recorded. Branch steps
    get ids under ``<fork id>.<branch index>.``.
    """
    return forks.run_parallel(branches, everystep_id)


@declare(BodyRule.PLAIN, "The async fork: each branch's calls follow their own class, as in parallel.")
async def gather(*branches: Any, everystep_id: str | None = None) -> tuple[Any, ...]:
    """The async form of ``parallel``, awaited in an async workflow: run
    branches concurrently as tasks on the run's event loop; return their
    results in branch order.

    A branch is an awaitable (``my_step(x)``, a coroutine), a zero-argument
    callable (its result awaited if it is awaitable), or a list of those run
    in sequence (that branch returns a tuple). The fork id, the branch step
    ids (``<fork id>.<branch index>.``) and the error rules are those of
    ``parallel``: healthy branches run to completion and are recorded, one
    failure re-raises as is, several as ``ExceptionGroup``, interrupts first.
    """
    return await async_steps.gather(branches, everystep_id)


@declare(BodyRule.WAIT, 'Recorded with its wake time; the run is released until then.',
         records=(sleeps.SLEEP_STEP,))
def sleep(seconds: float | dt.timedelta, everystep_id: str | None = None) -> None:
    """Wait ``seconds`` (a number or a ``timedelta``), durably.

    Inside a workflow the sleep is a step: recorded with its wake time, and
    the run is released until then (status ``scheduled`` with that
    not-before time: a row, not a process), so a 30-day sleep costs nothing
    while it lasts and survives restarts; the replay after the wake time
    returns from it. In a ``parallel`` branch only that branch waits: the
    others carry on until they settle or wait too, and the run is released
    until the earliest wake time. Outside a workflow (or inside a step's own
    code) it is ``time.sleep``.
    """
    sleeps.sleep_until(utcnow() + dt.timedelta(seconds=durations.seconds(seconds, "sleep")), everystep_id)


@declare(BodyRule.WAIT, 'Recorded with its wake time; the run is released until then.',
         records=(sleeps.SLEEP_STEP,))
def sleep_until(when: dt.datetime, everystep_id: str | None = None) -> None:
    """Wait until ``when`` (an aware datetime), durably: see ``sleep``."""
    sleeps.sleep_until(aware(when, "sleep_until"), everystep_id)


@declare(BodyRule.WAIT, 'Recorded with its wake time; the run is released until then.',
         records=(sleeps.SLEEP_STEP,))
async def sleep_async(seconds: float | dt.timedelta, everystep_id: str | None = None) -> None:
    """``sleep`` in an async workflow: the same recorded step and release.
    Outside a workflow it is ``asyncio.sleep``."""
    if runner_context() is None:
        await asyncio.sleep(seconds.total_seconds() if isinstance(seconds, dt.timedelta) else seconds)
        return
    await loops.in_thread(sleep, seconds, everystep_id)


@declare(BodyRule.WAIT, 'Recorded with its wake time; the run is released until then.',
         records=(sleeps.SLEEP_STEP,))
async def sleep_until_async(when: dt.datetime, everystep_id: str | None = None) -> None:
    """``sleep_until`` in an async workflow: see ``sleep_async``."""
    if runner_context() is None:
        await asyncio.sleep(max((aware(when, "sleep_until") - utcnow()).total_seconds(), 0.0))
        return
    await loops.in_thread(sleep_until, when, everystep_id)


def workflow_name(wf: WorkflowFunction | str | Callable[..., Any]) -> str:
    if isinstance(wf, WorkflowFunction):
        return wf.name
    if isinstance(wf, str):
        if not wf:
            raise EverystepError("workflow name must not be empty")
        return wf
    raise EverystepError(f"{wf!r} is not a workflow: decorate it with @workflow")


@declare(BodyRule.RECORDED, 'A detached run (no parent, not cancelled with this one) inserted in the transaction that records the step; a replay returns the same run.',
         records=(body_calls.SCHEDULE_STEP,))
def schedule(
    wf: WorkflowFunction | str,
    *args: Any,
    idempotency_key: str | None = None,
    conn: Any = None,
    database: str | Store | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    queue: str | None = None,
    priority: int | None = None,
    concurrency_key: str | None = None,
    app_version: str | None = None,
    deadline: dt.datetime | None = None,
    timeout: float | dt.timedelta | None = None,
    everystep_id: str | None = None,
    debounce: new_run.Debounce | None = None,
) -> Run:
    """Schedule a run of ``wf`` with positional ``args``; returns the ``Run``.

    ``run_at`` (an aware datetime) or ``delay`` (seconds, or a timedelta):
    the run is not claimable before then.

    ``queue`` and ``priority`` override the workflow's own (see
    ``@workflow``); ``concurrency_key`` groups runs that a queue's
    key concurrency limits (``everystep queue set NAME --key-concurrency N``).

    The arguments are validated before anything is written. Without ``conn``
    the run is committed at once. With ``conn`` (a psycopg, sqlite3 or pymysql
    connection) it is inserted in the caller's open transaction: claimable
    on commit, gone on rollback. With ``idempotency_key``, scheduling the
    same workflow and key again (even concurrently) returns the existing run.
    ``wf`` may be a registered workflow or its name.

    The run records ``app_version``, by default the process's
    (``--app-version``) or its workflow's code hash (``everystep.versions``).

    ``deadline`` (an aware datetime) or ``timeout`` (seconds from now; the
    default is the workflow's own ``timeout``): a run still unfinished then
    is cancelled with reason ``deadline``, as ``everystep cancel`` does (a
    step in flight under a supervisor is killed), and so are its children.

    When a host framework installed a connection provider
    (``everystep.provider``; ``everystep.contrib.django`` does) and neither
    ``conn`` nor ``database`` is given, the run is inserted through the
    host's connection, in whatever transaction it has open.

    In a workflow body the schedule is a step (``everystep_id`` names it):
    the run is inserted in the transaction that records it, and a replay
    returns the same run and never schedules a second. That run is
    detached: no parent, not cancelled with the caller (a run that belongs
    to this one is a child: ``start``). ``conn`` and ``database`` are
    refused there.

    ``debounce=Debounce(key, period, max_wait)``: many schedules, one run
    after the burst. The first schedule of ``key`` (keys are per workflow)
    creates a run that is not due until ``period`` seconds pass with no
    further schedule of that key; each further schedule while that run has
    not started replaces its arguments (the last call wins; its other
    options are the first call's) and pushes its start back, never past
    ``max_wait`` seconds after the first. A schedule after the run started
    opens the next window. Returns the run the call was folded into. The
    state is rows (any number of processes and hosts share a window);
    with ``conn`` the fold is part of the caller's transaction. Not with
    ``idempotency_key`` (the key already makes one run per window) nor
    ``run_at``/``delay`` (the window decides the start).
    """
    new = _decided(wf, args, idempotency_key, run_at, delay, queue, priority, concurrency_key, app_version, deadline,
                   timeout, debounce)
    ctx = body_calls.body_context("schedule", database=database, conn=conn)
    if ctx is not None:
        return body_calls.schedule(ctx, new, everystep_id)
    return client.schedule(new, database, conn)


def _decided(wf: WorkflowFunction | str, args: tuple[Any, ...], idempotency_key: str | None,
             run_at: dt.datetime | None, delay: float | dt.timedelta | None, queue: str | None,
             priority: int | None, concurrency_key: str | None, app_version: str | None,
             deadline: dt.datetime | None, timeout: float | dt.timedelta | None,
             debounce: new_run.Debounce | None = None) -> new_run.NewRun:
    """A new run's options as ``everystep.new_run.decide`` decides them for
    every way of starting one, checked before anything is written."""
    return new_run.decide(workflow_name(wf), args, idempotency_key=idempotency_key, run_at=run_at, delay=delay,
                          queue=queue, priority=priority, concurrency_key=concurrency_key, app_version=app_version,
                          deadline=deadline, timeout=timeout, debounce=debounce)


@declare(BodyRule.RECORDED, 'A detached run inserted in the transaction that records the step; a replay returns the same run.',
         records=(body_calls.SCHEDULE_STEP,))
async def schedule_async(
    wf: WorkflowFunction | str,
    *args: Any,
    idempotency_key: str | None = None,
    conn: Any = None,
    database: str | Store | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    queue: str | None = None,
    priority: int | None = None,
    concurrency_key: str | None = None,
    app_version: str | None = None,
    deadline: dt.datetime | None = None,
    timeout: float | dt.timedelta | None = None,
    everystep_id: str | None = None,
    debounce: new_run.Debounce | None = None,
) -> Run:
    """``schedule`` from async code; the same options and checks.

    With ``conn``, a ``psycopg.AsyncConnection`` (PostgreSQL), the run is
    inserted in the caller's open transaction, on that connection, without
    leaving the loop: claimable on commit, gone on rollback. A sync
    connection is refused (it cannot be handed to another thread safely).

    Without ``conn``, the sync ``schedule`` runs in a worker thread
    (``asyncio.to_thread``) on everystep's own connection, committed at
    once: on SQLite and MariaDB that is the only way, and on PostgreSQL
    the way without a connection of yours. In an async body, a step as
    ``schedule``'s (``conn`` refused)."""
    if conn is None or body_calls.body_context("schedule_async", conn=conn) is not None:
        return await loops.in_thread(
            schedule, wf, *args, idempotency_key=idempotency_key, database=database, run_at=run_at, delay=delay,
            queue=queue, priority=priority, concurrency_key=concurrency_key, app_version=app_version,
            deadline=deadline, timeout=timeout, everystep_id=everystep_id, debounce=debounce)
    new = _decided(wf, args, idempotency_key, run_at, delay, queue, priority, concurrency_key, app_version, deadline,
                   timeout, debounce)
    return await client.schedule_async(new, conn)


__all__ = ["StepFunction", "WorkflowFunction", "gather", "parallel", "schedule", "schedule_async", "sleep", "sleep_async", "sleep_until", "sleep_until_async", "step", "workflow", "workflow_name"]
