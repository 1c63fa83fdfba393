"""The calls made from outside a running body: schedule, send, read, wait.

Each goes to one place, chosen one way (``target``): the caller's own
connection when it passes ``conn=`` (the statement runs in its open
transaction: visible on its commit, gone on its rollback); else the host
framework's connection (``everystep.provider``: Django's) unless
``database=`` names one; else everystep's own store for ``database`` (a URL,
a ``Store``, or the default). From a step's own code a send goes through
the database that step's run lives in.

A workflow body never comes here: its calls are recorded steps
(``everystep.body_calls``, ``everystep.waits``), and the public face
(``everystep.api``) sends each call to one side or the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

from . import body_calls, new_run, waits
from .store import borrowed, step_pages
from .context import current
from .errors import ChildTimeout
from .models import COMPLETED, CONTINUED, TERMINAL_STATUSES, Run, StepRecord
from .new_run import NewRun
from .provider import connection_provider
from .store import Store, default_store
from .store.base.waits import ChildOutcome


class Borrowed:
    """The calls on a connection everystep does not own (``borrowed``),
    with the ``Store`` methods' names, so a call need not ask which it has."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def schedule(self, new: NewRun) -> Run:
        if new.debounce is not None:
            period, max_wait = new.debounce.seconds()
            return borrowed.schedule_debounced(self.conn, new.name, new.args_json, new.debounce.key, period, max_wait,
                                               new.placement, new.app_version, deadline=new.deadline)
        return borrowed.schedule(self.conn, new.name, new.args_json, new.idempotency_key, new.not_before,
                                 new.placement, new.app_version, deadline=new.deadline)

    def send(self, run_id: str, topic: str, payload_json: str, idempotency_key: str | None) -> int:
        return borrowed.send(self.conn, run_id, topic, payload_json, idempotency_key)

    def get_run(self, run_id: str) -> Run:
        return borrowed.get_run(self.conn, run_id)

    def get_steps(self, run_id: str, after: str | None, limit: int | None) -> list[StepRecord]:
        return borrowed.get_steps(self.conn, run_id, after=after, limit=limit)


class Owned:
    """The same calls on a ``Store`` of everystep's own."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def schedule(self, new: NewRun) -> Run:
        return new_run.schedule(self.store, new)

    def send(self, run_id: str, topic: str, payload_json: str, idempotency_key: str | None) -> int:
        return self.store.send(run_id, topic, payload_json, idempotency_key)

    def get_run(self, run_id: str) -> Run:
        return self.store.get_run(run_id)

    def get_steps(self, run_id: str, after: str | None, limit: int | None) -> list[StepRecord]:
        self.store.get_run(run_id)  # RunNotFound for an unknown run
        if after is None and limit is None:
            return self.store.get_steps(run_id)
        return step_pages.read_page(self.store, run_id, after, limit).steps


def store_for(database: str | Store | None) -> Store:
    """``database`` as a ``Store``: itself, or the store for its URL (the
    default database for None)."""
    return database if isinstance(database, Store) else default_store(database)


@contextlib.contextmanager
def target(database: str | Store | None = None, conn: Any = None) -> Iterator[Borrowed | Owned]:
    """Where a call goes (see the module): the caller's connection, the
    host's, or a store of everystep's own."""
    if conn is not None:
        yield Borrowed(conn)
        return
    provider = connection_provider() if database is None else None
    if provider is not None:
        with provider() as provided:
            yield Borrowed(provided)
        return
    yield Owned(store_for(database))


def schedule(new: NewRun, database: str | Store | None = None, conn: Any = None) -> Run:
    with target(database, conn) as place:
        return place.schedule(new)


def send(run_id: str, topic: str, payload_json: str, idempotency_key: str | None = None,
         database: str | Store | None = None, conn: Any = None) -> int:
    running = current()
    if conn is None and database is None and running is not None:
        # From a step's own code: the database its run lives in.
        return running.execution.store.send(run_id, topic, payload_json, idempotency_key)
    with target(database, conn) as place:
        return place.send(run_id, topic, payload_json, idempotency_key)


def get_run(run_id: str, database: str | Store | None = None) -> Run:
    with target(database) as place:
        return place.get_run(run_id)


def get_steps(run_id: str, database: str | Store | None = None, after: str | None = None,
              limit: int | None = None) -> list[StepRecord]:
    with target(database) as place:
        return place.get_steps(run_id, after, limit)


def get_event(run_id: str, key: str, seconds: float, database: str | Store | None = None,
              poll: float = 0.05) -> Any:
    """Run ``run_id``'s event ``key``, polled for up to ``seconds``."""
    store = store_for(database)
    give_up = time.monotonic() + seconds
    store.get_run(run_id)  # RunNotFound for an unknown run
    while True:
        event = store.get_event(run_id, key)
        if event is not None:
            return event.value
        if time.monotonic() >= give_up:
            raise body_calls.no_event(run_id, key, seconds)
        time.sleep(min(poll, max(give_up - time.monotonic(), 0.0)) or poll)


def _pinned(database: str | Store | None) -> str | Store | None:
    """What a polling wait reads through: the host's connection each time
    when it has one (a run scheduled in its open transaction is visible
    to it), else one store for the whole wait."""
    return database if connection_provider() is not None and database is None else store_for(database)


def wait(run_id: str, timeout: float | None = 60.0, poll: float = 0.1, database: str | Store | None = None) -> Run:
    """Poll until the run reaches a terminal status; ``TimeoutError`` past ``timeout``."""
    deadline = time.monotonic() + (timeout if timeout is not None else math.inf)
    database = _pinned(database)
    while True:
        run = get_run(run_id, database)
        if run.status == CONTINUED and run.continued_as:
            run_id = run.continued_as  # a run that continued as new ends with its chain's last run
            continue
        if run.status in TERMINAL_STATUSES:
            return run
        if time.monotonic() >= deadline:
            raise TimeoutError(f"run {run_id} is still {run.status} after {timeout}s")
        time.sleep(poll)


def child_result(child_id: str, timeout: float | None) -> Any:
    """A child's result waited for outside a body: polled (``wait``)."""
    try:
        run = wait(child_id, timeout=timeout if timeout is not None else 10 ** 9)
    except TimeoutError as exc:
        raise ChildTimeout(str(exc)) from None
    if run.status == COMPLETED:
        return run.result
    raise waits.child_failed(child_id, ChildOutcome(run.status, run.result, run.error))


# -- async callers -------------------------------------------------------------------


async def schedule_async(new: NewRun, conn: Any) -> Run:
    """``schedule`` in the open transaction of a caller's ``AsyncConnection``."""
    if new.debounce is not None:
        period, max_wait = new.debounce.seconds()
        return await borrowed.schedule_debounced_async(conn, new.name, new.args_json, new.debounce.key, period,
                                                       max_wait, new.placement, new.app_version, deadline=new.deadline)
    return await borrowed.schedule_async(conn, new.name, new.args_json, new.idempotency_key, new.not_before,
                                         new.placement, new.app_version, deadline=new.deadline)


async def send_async(run_id: str, topic: str, payload_json: str, idempotency_key: str | None, conn: Any) -> int:
    return await borrowed.send_async(conn, run_id, topic, payload_json, idempotency_key)


async def get_run_async(run_id: str, database: str | Store | None = None, conn: Any = None) -> Run:
    if conn is not None:
        return await borrowed.get_run_async(conn, run_id)
    return await asyncio.to_thread(get_run, run_id, database)


async def wait_async(run_id: str, timeout: float | None = 60.0, poll: float = 0.1,
                     database: str | Store | None = None, conn: Any = None) -> Run:
    """``wait`` with ``get_run_async`` and ``asyncio.sleep``: the loop is
    never blocked between polls."""
    deadline = time.monotonic() + (timeout if timeout is not None else math.inf)
    if conn is None:
        database = _pinned(database)
    while True:
        run = await get_run_async(run_id, database, conn)
        if run.status == CONTINUED and run.continued_as:
            run_id = run.continued_as
            continue
        if run.status in TERMINAL_STATUSES:
            return run
        if time.monotonic() >= deadline:
            raise TimeoutError(f"run {run_id} is still {run.status} after {timeout}s")
        await asyncio.sleep(poll)


__all__ = ["Borrowed", "Owned", "child_result", "get_event", "get_run", "get_run_async", "get_steps", "schedule",
           "schedule_async", "send", "send_async", "store_for", "target", "wait", "wait_async"]
