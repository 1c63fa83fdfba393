"""Statements on a connection everystep does not own: the caller's.

``schedule(conn=...)`` and the connection provider (``everystep.provider``)
hand everystep a connection that belongs to someone else. It may carry a row
factory (``sqlite3.Row``, psycopg dict rows), a framework's cursor class
(Django's client-side binding psycopg cursor), a framework's loaders (Django
loads ``timestamptz`` in its configured zone, or naive) and converters
(Django's SQLite connection parses declared types), and it may be inside the
owner's transaction or one of its savepoints.

So every statement here runs on a cursor of our own that reads plain tuples
with everystep's JSON and timestamp loaders, and nothing here changes the
connection for its owner or commits, rolls back or closes it: the owner's
transaction decides whether a scheduled run exists. The one exception is
``migrate``, which needs the connection outside any transaction (it takes
the same lock and writes the same version table as ``Store.migrate()``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

from ..errors import EverystepError, RunNotFound
from ..models import Attempt, Run, StepRecord
from ..queues import Placement
from . import Store, backend_for_connection, step_pages
from .base import statements
from .postgres import PostgresStore


@contextlib.contextmanager
def cursor(conn: Any) -> Iterator[tuple[type[Store], Any]]:
    """A cursor of our own on ``conn`` (rows by name, everystep's loaders),
    and the Store class whose statements and row mapping fit it."""
    store_class = backend_for_connection(conn)
    with store_class._caller_cursor(conn) as cur:
        yield store_class, cur


def schedule(conn: Any, name: str, args_json: str, idempotency_key: str | None,
             not_before: dt.datetime | None = None, placement: Placement | None = None,
             app_version: str | None = None, *, deadline: dt.datetime | None = None) -> Run:
    """Insert a run in ``conn``'s open transaction (or commit it at once if
    the connection is in autocommit mode)."""
    return backend_for_connection(conn).schedule_on(conn, name, args_json, idempotency_key, not_before, placement,
                                                    app_version, deadline=deadline)


def schedule_debounced(conn: Any, name: str, args_json: str, key: str, period: float, max_wait: float,
                       placement: Placement | None = None, app_version: str | None = None, *,
                       deadline: dt.datetime | None = None) -> Run:
    """A debounced schedule (``Store.schedule_debounced``) in ``conn``'s open
    transaction: the key's window stays locked until the owner commits."""
    return backend_for_connection(conn).schedule_debounced_on(conn, name, args_json, key, period, max_wait,
                                                              placement, app_version, deadline=deadline)


def send(conn: Any, run_id: str, topic: str, payload_json: str, idempotency_key: str | None) -> int:
    """Store a message in ``conn``'s open transaction: it exists, and wakes
    its run, once the owner commits."""
    return backend_for_connection(conn).send_on(conn, run_id, topic, payload_json, idempotency_key)


# -- a caller's psycopg.AsyncConnection ----------------------------------------------


def is_async_connection(conn: Any) -> bool:
    """Whether ``conn`` is a psycopg ``AsyncConnection`` (PostgreSQL)."""
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(conn, psycopg.AsyncConnection)


def _async_postgres(conn: Any) -> Any:
    if not is_async_connection(conn):
        raise EverystepError(f"conn must be a psycopg.AsyncConnection here, not {type(conn).__name__} (with a "
                             "sync connection, call the sync form in your own thread: its connection is not "
                             "this task's to hand to another)")
    return PostgresStore


async def schedule_async(conn: Any, name: str, args_json: str, idempotency_key: str | None,
                         not_before: dt.datetime | None = None, placement: Placement | None = None,
                         app_version: str | None = None, *, deadline: dt.datetime | None = None) -> Run:
    """``schedule`` in the open transaction of a caller's ``AsyncConnection``."""
    store_class = _async_postgres(conn)
    params = store_class._schedule_params(name, args_json, idempotency_key, not_before, placement, app_version,
                                          deadline=deadline)
    async with store_class.caller_cursor_async(conn) as cur:
        return await statements.run_async(cur, store_class._schedule_statements(params))


async def schedule_debounced_async(conn: Any, name: str, args_json: str, key: str, period: float, max_wait: float,
                                   placement: Placement | None = None, app_version: str | None = None, *,
                                   deadline: dt.datetime | None = None) -> Run:
    """``schedule_debounced`` in the open transaction of a caller's ``AsyncConnection``."""
    store_class = _async_postgres(conn)
    async with store_class.caller_cursor_async(conn) as cur:
        return await statements.run_async(cur, store_class._debounce_statements(
            name, args_json, key, period, max_wait, placement, app_version, deadline))


async def send_async(conn: Any, run_id: str, topic: str, payload_json: str, idempotency_key: str | None) -> int:
    """``send`` in the open transaction of a caller's ``AsyncConnection``."""
    store_class = _async_postgres(conn)
    async with store_class.caller_cursor_async(conn) as cur:
        sent = await statements.run_async(
            cur, store_class._send_statements(store_class.statements(), run_id, topic, payload_json,
                                              idempotency_key))
    return int(sent.id)


async def get_run_async(conn: Any, run_id: str) -> Run:
    """``get_run`` through a caller's ``AsyncConnection``."""
    store_class = _async_postgres(conn)
    async with store_class.caller_cursor_async(conn) as cur:
        await cur.execute(store_class.statements()["get_run"], {"id": _run_id(run_id)})
        row = await cur.fetchone()
    if row is None:
        raise RunNotFound(f"no run with id {run_id}")
    return store_class._run(row)  # type: ignore[no-any-return]


def get_run(conn: Any, run_id: str) -> Run:
    with cursor(conn) as (store_class, cur):
        row = cur.execute(store_class.statements()["get_run"], {"id": _run_id(run_id)}).fetchone()
        if row is None:
            raise RunNotFound(f"no run with id {run_id}")
        return store_class._run(row)


def get_steps(conn: Any, run_id: str, *, after: str | None = None, limit: int | None = None) -> list[StepRecord]:
    """A run's recorded steps (``RunNotFound`` for an unknown run); with
    ``after`` or ``limit``, one page of them (``everystep.store.step_pages``)."""
    step_pages.check_page(after, limit)
    with cursor(conn) as (store_class, cur):
        sql = store_class.statements()
        params = {"id": _run_id(run_id)}
        if cur.execute(sql["get_run"], params).fetchone() is None:
            raise RunNotFound(f"no run with id {run_id}")
        if after is None and limit is None:
            steps = [store_class._step(row) for row in cur.execute(sql["get_steps"], params).fetchall()]
        else:
            step_ids = [row["step_id"] for row in cur.execute(sql["step_ids"], params).fetchall()]
            chosen = step_pages.page_of(run_id, step_ids, after, limit)[0]
            steps = step_pages.in_order(store_class.steps_by_id_on(cur, sql, params["id"], chosen), chosen)
        if not any(step.attempt > 1 or step.status == "retrying" for step in steps):
            return steps
        history: dict[str, list[Attempt]] = {}
        for row in cur.execute(sql["get_attempts"], params).fetchall():
            history.setdefault(row["step_id"], []).append(store_class._attempt(row))
        return [dataclasses.replace(step, attempts=history.get(step.step_id, [])) for step in steps]


def migrate(conn: Any) -> list[str]:
    """Apply everystep's pending schema versions through ``conn``, which must
    be in autocommit mode outside any transaction. Returns what was applied."""
    return backend_for_connection(conn).migrate_on(conn)


def _run_id(run_id: str) -> str:
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        raise RunNotFound(f"no run with id {run_id!r} (run ids are UUIDs)") from None


__all__ = ["cursor", "get_run", "get_run_async", "get_steps", "is_async_connection", "migrate", "schedule",
           "schedule_debounced", "schedule_debounced_async",
           "schedule_async", "send_async"]
