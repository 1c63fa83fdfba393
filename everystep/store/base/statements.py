"""Statements as a sequence, apart from the connection that runs them.

A few operations run on a caller's connection, which may be a sync or an
async one (``schedule_async(conn=AsyncConnection)``). Rather than write
each twice, the operation is a generator (``Statements``) that yields each
statement it needs (``Statement``: SQL, parameters, one row or all) and is
sent back the rows; ``run`` drives it on a sync cursor, ``run_async`` on an
async one. The order of statements, their parameters and what is made of
their rows are written once.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")


class Statement(NamedTuple):
    sql: str
    params: dict[str, Any]
    #: Every row (a list) rather than the first (or None).
    all: bool = False


#: Yields statements, is sent each one's row (or rows), returns its result.
Statements = Generator[Statement, Any, T]


def run(cursor: Any, statements: Statements[T]) -> T:
    """Run ``statements`` on a sync cursor (or connection)."""
    rows: Any = None
    try:
        while True:
            statement = statements.send(rows)
            executed = cursor.execute(statement.sql, statement.params)
            rows = executed.fetchall() if statement.all else executed.fetchone()
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def run_async(cursor: Any, statements: Statements[T]) -> T:
    """Run ``statements`` on an async cursor (psycopg's ``AsyncCursor``)."""
    rows: Any = None
    try:
        while True:
            statement = statements.send(rows)
            await cursor.execute(statement.sql, statement.params)
            rows = await (cursor.fetchall() if statement.all else cursor.fetchone())
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
