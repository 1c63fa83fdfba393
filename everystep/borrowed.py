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
import sqlite3
import uuid
from collections.abc import Iterator
from typing import Any

from . import serde
from .errors import EverystepError, RunNotFound
from .models import Run, StepRecord
from .store import Store


def backend_of(conn: Any) -> type[Store]:
    """The Store class that speaks ``conn``'s dialect; ``EverystepError`` for
    anything that is not a sqlite3 or psycopg 3 connection."""
    if isinstance(conn, sqlite3.Connection):
        from .store.sqlite import SQLiteStore

        return SQLiteStore
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        psycopg = None
    if psycopg is not None and isinstance(conn, psycopg.Connection):
        from .store.postgres import PostgresStore

        return PostgresStore
    raise EverystepError(f"conn must be a psycopg or sqlite3 connection, not {type(conn).__name__}")


@contextlib.contextmanager
def cursor(conn: Any) -> Iterator[tuple[type[Store], Any]]:
    """A cursor on ``conn`` reading tuples with everystep's loaders, and the
    Store class whose statements and row mapping fit it."""
    store_class = backend_of(conn)
    if store_class.backend == "sqlite":
        cur = conn.cursor()
        cur.row_factory = None
        try:
            yield store_class, cur
        finally:
            cur.close()
        return
    from psycopg.rows import tuple_row
    from psycopg.types.datetime import TimestamptzLoader
    from psycopg.types.json import set_json_loads

    with conn.cursor(row_factory=tuple_row) as cur:
        set_json_loads(serde.loads, cur)
        # Aware datetimes whatever the owner registered on its connection.
        cur.adapters.register_loader("timestamptz", TimestamptzLoader)
        yield store_class, cur


def schedule(conn: Any, name: str, args_json: str, idempotency_key: str | None) -> Run:
    """Insert a run in ``conn``'s open transaction (or commit it at once if
    the connection is in autocommit mode)."""
    with cursor(conn) as (store_class, cur):
        return store_class.schedule_on(cur, name, args_json, idempotency_key)


def get_run(conn: Any, run_id: str) -> Run:
    with cursor(conn) as (store_class, cur):
        row = cur.execute(store_class.statements()["get_run"], {"id": _run_id(run_id)}).fetchone()
        if row is None:
            raise RunNotFound(f"no run with id {run_id}")
        return store_class._run(row)


def get_steps(conn: Any, run_id: str) -> list[StepRecord]:
    """A run's recorded steps (``RunNotFound`` for an unknown run)."""
    with cursor(conn) as (store_class, cur):
        sql = store_class.statements()
        if cur.execute(sql["get_run"], {"id": _run_id(run_id)}).fetchone() is None:
            raise RunNotFound(f"no run with id {run_id}")
        return [store_class._step(row) for row in cur.execute(sql["get_steps"], {"id": _run_id(run_id)}).fetchall()]


def migrate(conn: Any) -> list[str]:
    """Apply everystep's pending schema versions through ``conn``, which must
    be in autocommit mode outside any transaction. Returns what was applied."""
    store_class = backend_of(conn)
    with _tuple_rows(conn, store_class.backend):
        return store_class.migrate_on(conn)


@contextlib.contextmanager
def _tuple_rows(conn: Any, backend: str) -> Iterator[None]:
    """The migrator reads through the connection itself: plain tuples for
    its duration, the owner's row factory back afterwards."""
    previous = conn.row_factory
    if backend == "sqlite":
        conn.row_factory = None
    else:
        from psycopg.rows import tuple_row

        conn.row_factory = tuple_row
    try:
        yield
    finally:
        conn.row_factory = previous


def _run_id(run_id: str) -> str:
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        raise RunNotFound(f"no run with id {run_id!r} (run ids are UUIDs)") from None


__all__ = ["backend_of", "cursor", "get_run", "get_steps", "migrate", "schedule"]
