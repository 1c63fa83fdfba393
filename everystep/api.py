"""The public API: ``@workflow``, ``@step``, ``parallel``, ``schedule``, ``sleep``.

Decorated functions stay plain functions outside a running workflow, so they
can be unit-tested directly; inside one, each step call is recorded (or
replayed) by the runner.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from . import async_steps, body_calls, client, forks, loops, new_run, registry, resources, sleeps, steps, waits
from . import stream_reader, streams
from .store import step_pages
from . import transactional as transactional_steps
from .body_rules import BodyRule, declare
from .context import recording_context as runner_context
from .cron_schedule import CronSchedule
from .errors import EverystepError
from .models import Run, StepRecord
from .new_run import aware, positive_seconds
from .queues import Placement
from .retry import RetryPolicy
from .refusals import refused_in_body
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
    seconds = positive_seconds(timeout, "workflow timeout") if timeout is not None else None

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
    if isinstance(seconds, dt.timedelta):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        raise EverystepError(f"sleep needs a finite number of seconds, 0 or more, not {seconds!r}")
    sleeps.sleep_until(utcnow() + dt.timedelta(seconds=seconds), everystep_id)


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


def _workflow_name(wf: WorkflowFunction | str | Callable[..., Any]) -> str:
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
    """
    new = _decided(wf, args, idempotency_key, run_at, delay, queue, priority, concurrency_key, app_version, deadline,
                   timeout)
    ctx = body_calls.body_context("schedule", database=database, conn=conn)
    if ctx is not None:
        return body_calls.schedule(ctx, new, everystep_id)
    return client.schedule(new, database, conn)


def _decided(wf: WorkflowFunction | str, args: tuple[Any, ...], idempotency_key: str | None,
             run_at: dt.datetime | None, delay: float | dt.timedelta | None, queue: str | None,
             priority: int | None, concurrency_key: str | None, app_version: str | None,
             deadline: dt.datetime | None, timeout: float | dt.timedelta | None) -> new_run.NewRun:
    """A new run's options as ``everystep.new_run.decide`` decides them for
    every way of starting one, checked before anything is written."""
    return new_run.decide(_workflow_name(wf), args, idempotency_key=idempotency_key, run_at=run_at, delay=delay,
                          queue=queue, priority=priority, concurrency_key=concurrency_key, app_version=app_version,
                          deadline=deadline, timeout=timeout)


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
            deadline=deadline, timeout=timeout, everystep_id=everystep_id)
    new = _decided(wf, args, idempotency_key, run_at, delay, queue, priority, concurrency_key, app_version, deadline,
                   timeout)
    return await client.schedule_async(new, conn)


# -- waiting on the world ------------------------------------------------------


@declare(BodyRule.WAIT, 'Consumes its message in the transaction that records it; released while none is there.',
         records=(waits.RECV_STEP,))
def recv(topic: str, timeout: float | dt.timedelta | None = None, everystep_id: str | None = None) -> Any:
    """Inside a workflow: the next message sent to this run on ``topic``
    (``send``), oldest first; each message is consumed by exactly one
    ``recv``, and a message sent before the ``recv`` waits for it. While
    none is there the run is released (status ``scheduled``, its step
    ``waiting``: a row, no process), until a send wakes it or ``timeout``
    seconds pass, when ``RecvTimeout`` is raised (catchable by the body;
    recorded, so replays raise it again). No timeout: it waits for ever."""
    return waits.recv(topic, timeout, everystep_id)


@declare(BodyRule.RECORDED, 'The message is stored in the transaction that records the step; a replay returns its id and sends nothing.',
         records=(body_calls.SEND_STEP,))
def send(run_id: str, topic: str, payload: Any, idempotency_key: str | None = None,
         database: str | Store | None = None, conn: Any = None, everystep_id: str | None = None) -> int:
    """Send ``payload`` (JSON-serialisable, as step results are) to run
    ``run_id`` on ``topic``, from any process; returns the message's id.
    The send's commit wakes the run if it waits in ``recv`` on that topic.
    With ``conn``, in the caller's open transaction (as ``schedule(conn=)``):
    nothing is delivered if it rolls back. A second send with the same
    ``idempotency_key`` stores nothing and returns the first one's id.
    ``SendRefused`` for a run that is unknown, finished or cancelled.
    From a step's own code without ``database``, it sends through the
    database that run lives in. In a workflow body the send is a step
    (``everystep_id`` names it): the message is stored in the transaction
    that records it, so a replay returns its id and sends nothing again
    (``conn`` and ``database`` are refused there)."""
    payload_json = waits.message_json(topic, payload, idempotency_key)
    ctx = body_calls.body_context("send", database=database, conn=conn)
    if ctx is not None:
        return body_calls.send(ctx, run_id, topic, payload_json, idempotency_key, everystep_id)
    return client.send(run_id, topic, payload_json, idempotency_key, database, conn)


@declare(BodyRule.WAIT, 'Consumes its message in the transaction that records it; released while none is there.',
         records=(waits.RECV_STEP,))
async def recv_async(topic: str, timeout: float | dt.timedelta | None = None,
                     everystep_id: str | None = None) -> Any:
    """``recv`` in an async workflow: the same step, the same release."""
    return await loops.in_thread(waits.recv, topic, timeout, everystep_id)


@declare(BodyRule.RECORDED, 'Published in the transaction that records the step; a replay does not publish again.',
         records=(waits.EVENT_STEP,))
def set_event(key: str, value: Any, everystep_id: str | None = None) -> None:
    """Inside a workflow: publish ``value`` under ``key`` for anyone outside
    to read (``get_event``). A durable step: a replay does not write it
    again; a later ``set_event`` of the same key overwrites it."""
    waits.set_event(key, value, everystep_id)


@declare(BodyRule.RECORDED, 'Recorded: every replay sees the value the first execution read. With a timeout, a wait (woken by the set_event) that holds no process.',
         records=(body_calls.GET_EVENT_STEP,))
def get_event(run_id: str, key: str, timeout: float = 0, database: str | Store | None = None,
              everystep_id: str | None = None) -> Any:
    """The value run ``run_id`` published under ``key``, waiting up to
    ``timeout`` seconds for it to appear (``TimeoutError`` if it does not;
    ``RunNotFound`` for an unknown run).

    In a workflow body it is a step (``everystep_id`` names it): what the
    first execution read (value or error) is what every replay sees; with
    a timeout it is a durable wait, like ``recv``: the run is released
    until the event is set (which wakes it) or the timeout passes."""
    waits.event_key_checked(key)
    seconds = waits.finite_seconds(timeout, "get_event timeout")
    ctx = body_calls.body_context("get_event", database=database)
    if ctx is None:
        return client.get_event(run_id, key, seconds, database)
    if seconds > 0:
        return waits.await_event(ctx, run_id, key, seconds, everystep_id)
    return body_calls.get_event(ctx, run_id, key, everystep_id)


@declare(BodyRule.RECORDED, "Recorded as get_event(); with a timeout, a wait that holds no process.",
         records=(body_calls.GET_EVENT_STEP,))
async def get_event_async(run_id: str, key: str, timeout: float = 0, database: str | Store | None = None,
                          everystep_id: str | None = None) -> Any:
    """``get_event`` from async code: in a worker thread, so the loop goes
    on (in an async body, the same step or wait as ``get_event``'s)."""
    return await loops.in_thread(get_event, run_id, key, timeout, database, everystep_id)


@declare(BodyRule.PLAIN, "A handle on a child run (start() makes one): its result() is a wait that holds no process.")
@dataclass(frozen=True)
class ChildHandle:
    """A child run started by a workflow (``everystep.start``): ``run_id``,
    the child run's id (``str(handle)`` is the same), and ``result()`` to
    wait for its end."""

    run_id: str

    @declare(BodyRule.WAIT, "The child's end is recorded with its result; the run is released while the child runs.",
             records=(waits.CHILD_STEP,))
    def result(self, timeout: float | dt.timedelta | None = None, everystep_id: str | None = None) -> Any:
        """The child's result, waited for durably (inside a workflow the
        parent is released while the child runs, holding no process); raises
        ``ChildFailed`` if the child failed, stopped or was cancelled, and
        ``ChildTimeout`` after ``timeout`` seconds. Outside a workflow it
        polls the database."""
        ctx = runner_context()
        if ctx is None:
            seconds = timeout.total_seconds() if isinstance(timeout, dt.timedelta) else timeout
            return client.child_result(self.run_id, seconds)
        return waits.await_child(ctx, self.run_id, timeout, everystep_id)

    @declare(BodyRule.WAIT, "result() in an async workflow: the same step, the same release.",
             records=(waits.CHILD_STEP,))
    async def result_async(self, timeout: float | dt.timedelta | None = None,
                           everystep_id: str | None = None) -> Any:
        """``result()`` in an async workflow: the same step, the same release."""
        return await loops.in_thread(self.result, timeout, everystep_id)

    def __str__(self) -> str:
        return self.run_id


@declare(BodyRule.RECORDED, 'The child is scheduled in the transaction that records the step; a replay returns the same child.',
         records=(waits.START_STEP,))
def start(wf: WorkflowFunction | str, *args: Any, idempotency_key: str | None = None, queue: str | None = None,
          priority: int | None = None, concurrency_key: str | None = None, deadline: dt.datetime | None = None,
          timeout: float | dt.timedelta | None = None, app_version: str | None = None,
          everystep_id: str | None = None) -> ChildHandle:
    """Inside a workflow: start a child run of ``wf`` (a durable step: a
    replay returns the same child, never schedules a second). The child
    records this run as its parent, and this run's code version unless
    ``app_version`` says another (so the runners serving this run's release
    run its children); its deadline is the earlier of its own
    (``deadline``/``timeout``, or its workflow's) and this run's. Returns a
    handle whose ``result()`` waits for the child's end."""
    name = _workflow_name(wf)

    def child() -> new_run.NewRun:
        return new_run.decide(name, args, idempotency_key=idempotency_key, queue=queue, priority=priority,
                              concurrency_key=concurrency_key, app_version=app_version, deadline=deadline,
                              timeout=timeout, child=True)

    return ChildHandle(waits.start_child(child, everystep_id))


@declare(BodyRule.WAIT, "start() and the wait for the child's end: two steps; released while the child runs.",
         records=(waits.START_STEP, waits.CHILD_STEP))
def call(wf: WorkflowFunction | str, *args: Any, **options: Any) -> Any:
    """Inside a workflow: ``start(wf, *args, **options).result()``, two steps."""
    return start(wf, *args, **options).result()


@declare(BodyRule.RECORDED, 'Published in the transaction that records the step; a replay does not publish again.',
         records=(waits.EVENT_STEP,))
async def set_event_async(key: str, value: Any, everystep_id: str | None = None) -> None:
    """``set_event`` in an async workflow."""
    await loops.in_thread(set_event, key, value, everystep_id)


@declare(BodyRule.RECORDED, 'The child is scheduled in the transaction that records the step; a replay returns the same child.',
         records=(waits.START_STEP,))
async def start_async(wf: WorkflowFunction | str, *args: Any, **options: Any) -> ChildHandle:
    """``start`` in an async workflow; await ``handle.result_async()``."""
    return await loops.in_thread(start, wf, *args, **options)


@declare(BodyRule.WAIT, "start() and the wait for the child's end: two steps; released while the child runs.",
         records=(waits.START_STEP, waits.CHILD_STEP))
async def call_async(wf: WorkflowFunction | str, *args: Any, **options: Any) -> Any:
    """``call`` in an async workflow: ``await (await start_async(...)).result_async()``."""
    handle = await start_async(wf, *args, **options)
    return await handle.result_async()


@declare(BodyRule.RECORDED, 'The message is stored in the transaction that records the step; a replay returns its id and sends nothing.',
         records=(body_calls.SEND_STEP,))
async def send_async(run_id: str, topic: str, payload: Any, idempotency_key: str | None = None,
                     database: str | Store | None = None, conn: Any = None, everystep_id: str | None = None) -> int:
    """``send`` from async code. With ``conn`` (a ``psycopg.AsyncConnection``)
    in the caller's open transaction, on the loop; without, the sync
    ``send`` in a worker thread (in an async body, a step as ``send``'s)."""
    if conn is None or body_calls.body_context("send_async", conn=conn) is not None:
        return await loops.in_thread(send, run_id, topic, payload, idempotency_key, database, None, everystep_id)
    return await client.send_async(run_id, topic, waits.message_json(topic, payload, idempotency_key),
                                   idempotency_key, conn)


@declare(BodyRule.RECORDED, 'Recorded: every replay sees the run as the first execution read it.',
         records=(body_calls.GET_RUN_STEP,))
def get_run(run_id: str, database: str | Store | None = None, everystep_id: str | None = None) -> Run:
    """Read a run; raises ``RunNotFound`` for an unknown id. (Through the
    host's connection when a provider is installed, so a run scheduled in
    the host's open transaction is visible to it.) In a workflow body it is
    a step: every replay sees the run as the first execution read it."""
    ctx = body_calls.body_context("get_run", database=database)
    if ctx is not None:
        return body_calls.get_run(ctx, run_id, everystep_id)
    return client.get_run(run_id, database)


@declare(BodyRule.RECORDED, 'Recorded: every replay sees the run as the first execution read it.',
         records=(body_calls.GET_RUN_STEP,))
async def get_run_async(run_id: str, database: str | Store | None = None, conn: Any = None,
                        everystep_id: str | None = None) -> Run:
    """``get_run`` from async code: through ``conn`` (a
    ``psycopg.AsyncConnection``, which sees its own open transaction) on
    the loop, else the sync read in a worker thread (in an async body, the
    same step as ``get_run``'s)."""
    if conn is not None and body_calls.body_context("get_run_async", conn=conn) is None:
        return await client.get_run_async(run_id, conn=conn)
    return await loops.in_thread(get_run, run_id, database, everystep_id)


@declare(BodyRule.RECORDED, 'Recorded: every replay sees the steps the first execution read.',
         records=(body_calls.GET_STEPS_STEP,))
def get_steps(run_id: str, database: str | Store | None = None, everystep_id: str | None = None, *,
              after: str | None = None, limit: int | None = None) -> list[StepRecord]:
    """The recorded steps of a run, in the order they were first recorded.
    In a workflow body it is a step: every replay sees what the first
    execution read (a page included).

    With ``limit`` or ``after``, one page of them (``everystep.store.step_pages``):
    at most ``limit`` steps, those recorded after step ``after`` (an id of
    the run's; None: from the first); the next page is
    ``after=page[-1].step_id``, and a page shorter than ``limit`` is the
    last. A page costs its own rows and the run's step ids, not the whole
    history."""
    step_pages.check_page(after, limit)
    ctx = body_calls.body_context("get_steps", database=database)
    if ctx is not None:
        return body_calls.get_steps(ctx, run_id, everystep_id, after, limit)
    return client.get_steps(run_id, database, after, limit)


@declare(BodyRule.RECORDED, "Recorded as get_steps().",
         records=(body_calls.GET_STEPS_STEP,))
async def get_steps_async(run_id: str, database: str | Store | None = None, everystep_id: str | None = None, *,
                          after: str | None = None, limit: int | None = None) -> list[StepRecord]:
    """``get_steps`` from async code, in a worker thread (in an async body,
    the same step as ``get_steps``'s)."""
    return await loops.in_thread(get_steps, run_id, database, everystep_id, after=after, limit=limit)


@declare(BodyRule.WAIT, "A recorded wait for the run's end that holds no process, checked again after a tenth of the time waited (0.5 s to 30 s); returns the run as it ended.",
         records=(waits.RUN_STEP,))
def wait(run_id: str, timeout: float | None = 60.0, poll: float = 0.1, database: str | Store | None = None,
         everystep_id: str | None = None) -> Run:
    """Poll until the run reaches a terminal status; ``TimeoutError`` past
    ``timeout`` seconds (None: no limit).

    In a workflow body it is a durable wait (``everystep_id`` names its
    step) that holds no process: the run is released and checks again
    after a tenth of the time it has waited (0.5 to 30 seconds; ``poll``
    is for callers outside a body), and the ``Run`` it returns is the one
    recorded, the same on every replay. For a child started with
    ``start``, ``handle.result()`` is woken by the child's end at once."""
    ctx = body_calls.body_context("wait", database=database)
    if ctx is not None:
        return waits.wait_for_run(ctx, run_id, timeout, everystep_id)
    return client.wait(run_id, timeout, poll, database)


@declare(BodyRule.WAIT, "A recorded wait for the run's end that holds no process, as wait().",
         records=(waits.RUN_STEP,))
async def wait_async(run_id: str, timeout: float | None = 60.0, poll: float = 0.1,
                     database: str | Store | None = None, conn: Any = None, everystep_id: str | None = None) -> Run:
    """``wait`` from async code: polls with ``get_run_async`` and
    ``asyncio.sleep``, so the loop is never blocked between polls. In an
    async body, the durable wait of ``wait`` (``conn`` refused)."""
    if body_calls.body_context("wait_async", database=database, conn=conn) is not None:
        return await loops.in_thread(wait, run_id, timeout, poll, None, everystep_id)
    return await client.wait_async(run_id, timeout, poll, database, conn)



# -- streams ---------------------------------------------------------------------


@declare(BodyRule.RECORDED, "In a body, a step: the value is written in the transaction that records it, and a replay "
         "writes nothing. From a step's code, part of that step's attempt: a later attempt withdraws it.",
         records=(streams.WRITE_STEP,))
def write_stream(key: str, value: Any, everystep_id: str | None = None) -> int | None:
    """Inside a workflow (its body or a step's code): append ``value``
    (JSON-serialisable, as step results are) to this run's stream ``key``,
    for readers outside to see at once (``read_stream``, the console's
    run page).

    From a body it is a durable step (``everystep_id`` names it) that
    returns the value's position in the stream (1, 2, …): a replay does
    not write it again. From a step's code it is queued and returns None:
    a thread of the run's execution commits the queue at once, in batches
    (one commit for the values written while the last one committed), and
    the step's values are all committed before its outcome is recorded.
    They are part of that step's attempt: if the attempt never records its
    outcome (its process was killed), the next attempt's first write
    withdraws them, so readers never see them beside the retry's (see the
    how-to "Streams"). ``StreamRefused`` past the size bounds or after
    ``close_stream`` (from a step's code: at its next write or its end);
    a value that is not JSON is refused before anything is written."""
    return streams.write(key, value, everystep_id)


@declare(BodyRule.RECORDED, "In a body, a step: the stream is closed in the transaction that records it.",
         records=(streams.CLOSE_STEP,))
def close_stream(key: str, everystep_id: str | None = None) -> int | None:
    """Inside a workflow: close this run's stream ``key``; its readers stop
    after the values before it, and a later write to it is refused. A run's
    streams end with the run anyway (readers stop once it has ended), so
    closing is for a stream that is done before its run is. A step from a
    body (its position returned), queued from a step's code, as
    ``write_stream``; closing a closed stream does nothing."""
    return streams.close(key, everystep_id)


@declare(BodyRule.RECORDED, "write_stream() in an async workflow or step: the same step, the same rule.",
         records=(streams.WRITE_STEP,))
async def write_stream_async(key: str, value: Any, everystep_id: str | None = None) -> int | None:
    """``write_stream`` from async code (its write in a worker thread)."""
    return await loops.in_thread(write_stream, key, value, everystep_id)


@declare(BodyRule.RECORDED, "close_stream() in an async workflow or step: the same step.",
         records=(streams.CLOSE_STEP,))
async def close_stream_async(key: str, everystep_id: str | None = None) -> int | None:
    """``close_stream`` from async code."""
    return await loops.in_thread(close_stream, key, everystep_id)


@refused_in_body("a step whose code reads it (read_stream blocks and is not recorded), or get_event",
                 "Reading a stream blocks for values as they come, and is not recorded.")
def read_stream(run_id: str, key: str, *, timeout: float | dt.timedelta | None = None, after: int = 0,
                items: bool = False, database: str | Store | None = None) -> Any:
    """Every value run ``run_id`` writes to its stream ``key``, in order:
    an iterator that blocks for the next value (up to ``timeout`` seconds
    each: ``TimeoutError`` past it; None: as long as it takes) and ends
    when the stream is closed or the run has ended. ``after``: start after
    that position (a reader resuming). ``items=True`` yields ``StreamItem``
    rows instead (``seq``, ``value``, ``step_id``, ``attempt``: which
    step and which execution of it wrote the value). ``RunNotFound`` at the
    call for an unknown run. On PostgreSQL the reader is woken by each
    write's commit (LISTEN); elsewhere it polls every 20 ms."""
    seconds = None if timeout is None else waits.finite_seconds(timeout, "read_stream timeout")
    streams.key_checked(key, "read_stream")
    return stream_reader.read(client.store_for(database), run_id, key, seconds, _position(after), items)


@refused_in_body("a step whose code reads it, or get_event_async",
                 "Reading a stream waits for values as they come, and is not recorded.")
async def read_stream_async(run_id: str, key: str, *, timeout: float | dt.timedelta | None = None, after: int = 0,
                            items: bool = False, database: str | Store | None = None) -> AsyncIterator[Any]:
    """``read_stream`` from async code: awaited, it checks the run
    (``RunNotFound``) and returns an async iterator (``async for value in
    await read_stream_async(...)``), whose reads run in worker threads and
    whose waits are on the loop (PostgreSQL's LISTEN socket watched by
    it)."""
    seconds = None if timeout is None else waits.finite_seconds(timeout, "read_stream timeout")
    streams.key_checked(key, "read_stream")
    reader = stream_reader.StreamReader(client.store_for(database), run_id, key, _position(after))
    await asyncio.to_thread(reader.open)
    return stream_reader.read_async(reader, seconds, items)


def _position(after: Any) -> int:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise EverystepError(f"read_stream's after= is a position in the stream, 0 or more, not {after!r}")
    return after

__all__ = ["StepFunction", "WorkflowFunction", "call", "call_async", "gather", "get_event", "get_event_async",
           "get_run", "get_steps", "get_steps_async", "get_run_async", "parallel", "recv", "recv_async", "schedule", "schedule_async", "send", "send_async", "set_event", "set_event_async", "sleep",
           "sleep_async", "sleep_until", "sleep_until_async", "start", "start_async", "step", "wait", "wait_async", "workflow",
           "write_stream", "write_stream_async", "close_stream", "close_stream_async", "read_stream",
           "read_stream_async"]
