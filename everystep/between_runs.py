"""What runs say to each other, and what a caller asks of a run: messages
(``recv``, ``send``), events (``set_event``, ``get_event``), children
(``start``, ``call``, ``ChildHandle``), and reading and waiting for runs
(``get_run``, ``get_steps``, ``wait``), each with its async twin.

Each is declared with its class in a body (``body_rules``): recorded, or a
wait that holds no process. Outside a body they are the client's calls
(``everystep.client``). The decorators, forks, sleeps and ``schedule`` are
in ``everystep.api``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from . import body_calls, client, loops, new_run, waits
from .body_rules import BodyRule, declare
from .context import recording_context as runner_context
from .models import Run, StepRecord
from .store import Store, step_pages
from .api import WorkflowFunction, workflow_name


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
    name = workflow_name(wf)

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


__all__ = ["ChildHandle", "call", "call_async", "get_event", "get_event_async", "get_run", "get_run_async", "get_steps", "get_steps_async", "recv", "recv_async", "send", "send_async", "set_event", "set_event_async", "start", "start_async", "wait", "wait_async"]
