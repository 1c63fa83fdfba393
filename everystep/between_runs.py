"""What runs say to each other, and what a caller asks of a run: messages
(``recv``, ``send``), events (``set_event``, ``get_event``), children
(``start``, ``call``, ``ChildHandle``), reading and waiting for runs
(``get_run``, ``get_steps``, ``wait``) and streams out of a run
(``write_stream``, ``close_stream``, ``read_stream``), each with its async
twin.

Each is declared with its class in a body (``body_rules``): recorded, or a
wait that holds no process. Outside a body they are the client's calls
(``everystep.client``). The decorators, forks, sleeps and ``schedule`` are
in ``everystep.api``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from . import body_calls, client, durations, loops, new_run, stream_reader, streams, waits
from .body_rules import BodyRule, declare
from .context import recording_context as runner_context
from .errors import EverystepError
from .models import Run, StepRecord
from .refusals import refused_in_body
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
    seconds = durations.seconds(timeout, "get_event timeout")
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
    seconds = None if timeout is None else durations.seconds(timeout, "read_stream timeout")
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
    seconds = None if timeout is None else durations.seconds(timeout, "read_stream timeout")
    streams.key_checked(key, "read_stream")
    reader = stream_reader.StreamReader(client.store_for(database), run_id, key, _position(after))
    await asyncio.to_thread(reader.open)
    return stream_reader.read_async(reader, seconds, items)


def _position(after: Any) -> int:
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise EverystepError(f"read_stream's after= is a position in the stream, 0 or more, not {after!r}")
    return after


__all__ = ["close_stream", "close_stream_async", "read_stream", "read_stream_async", "write_stream", "write_stream_async", "ChildHandle", "call", "call_async", "get_event", "get_event_async", "get_run", "get_run_async", "get_steps", "get_steps_async", "recv", "recv_async", "send", "send_async", "set_event", "set_event_async", "start", "start_async", "wait", "wait_async"]
