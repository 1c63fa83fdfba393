"""The hot statements' own path to libpq, past psycopg's cursor.

A runner repeats a few statements all day: the claim, a step's record, the
last step's record with the run's status. Through a psycopg cursor each
pays for the query converted, a dumper looked up for every parameter, the
prepared-statement cache consulted, and results and a row maker set up per
call. This path prepares each statement once per connection under a name
of its own, sends its parameters as text and reads the few column types
these statements return. Measured on a step record (``tests`` and
``docs/explanation/performance.md``): about 60 µs of client CPU against 110, and 76,000
instructions against 112,000.

psycopg still owns the connection: its wait loop (interruptible, the query
cancelled on Ctrl-C), its exceptions (``psycopg.errors`` by SQLSTATE, so
the store's error handling is the same for both paths), its notice and
notification handling. The values read are the ones psycopg's loaders give
this store (``PostgresStore._open``): uuid as text, json through
``serde.loads``, timestamptz as an aware datetime in the session's zone.

Behind a transaction pooler (``?pooler=transaction``) the next statement may
reach another server session, where nothing is prepared: there each
statement is sent whole, as an unnamed statement the server parses every
time (``Prepared(named=False)``), with this path's parameters, and its
columns are read as they come (a type this path does not read is read by
psycopg's own loader for it, since the statement cannot be sent again).
What is sent there for a step record is a call of its PL/pgSQL function
(``PostgresStore``: ``FUNCTION_FORMS``), so the server parses the call,
not the statement, whose plan it keeps in the session.

Whatever this path cannot do exactly as psycopg would (a session not in
ISO DateStyle or not in UTF-8, a parameter or column type it does not
know), it leaves to psycopg: that statement takes the cursor path, nothing
is guessed.

It leans on three things psycopg does not publish: ``psycopg.generators``,
``Connection.wait`` (and the connection's ``lock``) and
``psycopg.errors.error_from_result``. Importing this module never fails for
their lack; ``available()`` says whether this psycopg has them, and
``PostgresStore`` sends everything through the cursor when it has not
(pyproject pins the psycopg releases this path is tested on).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
import psycopg.errors
from psycopg.pq import DiagnosticField, ExecStatus, Format

try:  # psycopg's internals: ``available()`` says whether they are all there
    from psycopg import generators
except ImportError:  # a psycopg that moved them: the cursor path only
    generators = None  # type: ignore[assignment]

from .. import serde
from .base import Row

Loader = Callable[[bytes], Any]

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")

#: Prepared statement names: ``everystep_hot_N``, never psycopg's ``_pg3_N``.
_PREFIX = "everystep_hot_"

#: SQLSTATE 26000: the server forgot the statement (``DISCARD ALL`` by a
#: connection pooler, say): prepare it again and send it once more.
_UNKNOWN_STATEMENT = "26000"
#: SQLSTATE 42P05: prepared already (a statement prepared again after the
#: server forgot the statement, or after a reply that never arrived).
_ALREADY_PREPARED = "42P05"


def missing() -> list[str]:
    """What this path uses that the installed psycopg lacks (empty: none)."""
    needs = {
        "psycopg.generators.execute": getattr(generators, "execute", None),
        "psycopg.Connection.wait": getattr(psycopg.Connection, "wait", None),
        "psycopg.errors.error_from_result": getattr(psycopg.errors, "error_from_result", None),
    }
    return [name for name, found in needs.items() if not callable(found)]


def available() -> bool:
    """Whether the installed psycopg has everything this path uses."""
    return not missing()


class HotStatement:
    """One statement of the store's queries, sent through this path.

    Built once per store; what is prepared is remembered per connection
    (``Prepared``), since a prepared statement lives in one session.
    """

    def __init__(self, number: int, sql: str) -> None:
        self.name = f"{_PREFIX}{number}".encode()
        self.sql = sql
        names: list[str] = []

        def numbered(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "%"
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        self.text = _PLACEHOLDER.sub(numbered, sql).encode()
        self.params = tuple(names)


class Prepared:
    """What one connection has prepared: the statement's column decoders,
    or None where this path stands aside for psycopg. ``named``: prepared
    once under a name (else sent whole each time: a transaction pooler)."""

    def __init__(self, conn: psycopg.Connection[Any], named: bool = True) -> None:
        pgconn = conn.pgconn
        self.named = named
        self.usable = (pgconn.parameter_status(b"DateStyle") or b"").startswith(b"ISO") and (
            pgconn.parameter_status(b"client_encoding") == b"UTF8") and hasattr(conn, "lock")
        #: Per statement name: how to read its columns, or None (psycopg's).
        self.columns: dict[bytes, tuple[tuple[str, Loader], ...] | None] = {}


def execute(conn: psycopg.Connection[Any], prepared: Prepared, statement: HotStatement,
            params: Mapping[str, Any]) -> list[Row] | None:
    """Run ``statement`` on ``conn`` and return its rows; None: this path
    stands aside, and psycopg's cursor must run it."""
    if not prepared.usable:
        return None
    values = _encode(statement, params)
    if values is None:
        return None
    if not prepared.named:
        return _execute_whole(conn, prepared, statement, values)
    with conn.lock:
        if statement.name not in prepared.columns:
            prepared.columns[statement.name] = _prepare(conn, statement)
        columns = prepared.columns[statement.name]
        if columns is None:
            return None
        result = _send(conn, statement, values)
        if _failed(result) == _UNKNOWN_STATEMENT:
            prepared.columns[statement.name] = columns = _prepare(conn, statement)
            if columns is None:
                return None
            result = _send(conn, statement, values)
        if _failed(result) is not None:
            raise psycopg.errors.error_from_result(result, encoding="utf-8")
    return _rows(result, columns)


def _execute_whole(conn: psycopg.Connection[Any], prepared: Prepared, statement: HotStatement,
                   values: Sequence[bytes | None]) -> list[Row]:
    """``statement`` sent whole (parsed, bound and executed in one message
    train), its columns read from the result's own description."""
    with conn.lock:
        conn.pgconn.send_query_params(statement.text, values)
        results = conn.wait(generators.execute(conn.pgconn))
    result = next((result for result in results if result.status == ExecStatus.FATAL_ERROR), results[-1])
    if _failed(result) is not None:
        raise psycopg.errors.error_from_result(result, encoding="utf-8")
    columns = prepared.columns.get(statement.name)
    if columns is None:
        columns = prepared.columns[statement.name] = tuple(
            ((result.fname(index) or b"").decode(), _loader(result.ftype(index), conn) or _psycopg_loader(
                result.ftype(index), conn)) for index in range(result.nfields))
    return _rows(result, columns)


def _psycopg_loader(oid: int, conn: psycopg.Connection[Any]) -> Loader:
    """psycopg's own text loader for ``oid``, as this connection has it."""
    loader = conn.adapters.get_loader(oid, Format.TEXT)
    assert loader is not None  # psycopg has a text loader for every type
    return loader(oid, conn).load


def _failed(result: Any) -> str | None:
    """The SQLSTATE of a failed result ("" if it has none); None if it did not fail."""
    if result.status != ExecStatus.FATAL_ERROR:
        return None
    return (result.error_field(DiagnosticField.SQLSTATE) or b"").decode()


def _send(conn: psycopg.Connection[Any], statement: HotStatement, values: Sequence[bytes | None]) -> Any:
    conn.pgconn.send_query_prepared(statement.name, values)
    results = conn.wait(generators.execute(conn.pgconn))
    for result in results:
        if result.status == ExecStatus.FATAL_ERROR:
            return result
    return results[-1]


def _prepare(conn: psycopg.Connection[Any], statement: HotStatement) -> tuple[tuple[str, Loader], ...] | None:
    """Prepare ``statement`` on ``conn`` (parameter types inferred by the
    server, as for psycopg's untyped text parameters) and work out how to
    read its columns; None if one of them is of a type this path does not read."""
    pgconn = conn.pgconn
    pgconn.send_prepare(statement.name, statement.text)
    result = conn.wait(generators.execute(pgconn))[-1]
    if _failed(result) not in (None, _ALREADY_PREPARED):
        raise psycopg.errors.error_from_result(result, encoding="utf-8")
    pgconn.send_describe_prepared(statement.name)
    description = conn.wait(generators.execute(pgconn))[-1]
    if _failed(description) is not None:
        raise psycopg.errors.error_from_result(description, encoding="utf-8")
    columns = []
    for index in range(description.nfields):
        loader = _loader(description.ftype(index), conn)
        if loader is None or description.fformat(index) != Format.TEXT:
            return None
        columns.append(((description.fname(index) or b"").decode(), loader))
    return tuple(columns)


def _rows(result: Any, columns: tuple[tuple[str, Loader], ...]) -> list[Row]:
    if result.status != ExecStatus.TUPLES_OK:
        return []
    get = result.get_value
    return [
        {name: None if (value := get(row, index)) is None else load(value)
         for index, (name, load) in enumerate(columns)}
        for row in range(result.ntuples)
    ]


# -- parameters --------------------------------------------------------------


def _encode(statement: HotStatement, params: Mapping[str, Any]) -> list[bytes | None] | None:
    """The parameters as text, in ``$n`` order; None if one is of a type
    this path does not write (psycopg's dumpers then do)."""
    values: list[bytes | None] = []
    try:
        for name in statement.params:
            value = params[name]
            encode = _ENCODERS.get(type(value))
            if encode is None:
                if not isinstance(value, str):
                    return None
                # A str subclass (the runner's status enums): its value, as
                # psycopg's str dumper sends it.
                encode = str.encode
            values.append(encode(value))
    except _Unsupported:
        return None
    return values


class _Unsupported(Exception):
    """A value this path leaves to psycopg's dumpers."""


def _float(value: float) -> bytes:
    if math.isfinite(value):
        return repr(value).encode()
    return b"NaN" if math.isnan(value) else (b"Infinity" if value > 0 else b"-Infinity")


def _text_array(value: list[Any]) -> bytes:
    """A list of str as a text[] literal (psycopg sends such a list as text[]
    too; anything else in a list is psycopg's to adapt)."""
    if not all(type(item) is str for item in value):
        raise _Unsupported
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in value)
    return ("{" + ",".join(quoted) + "}").encode()


_ENCODERS: dict[type[Any], Callable[[Any], bytes | None]] = {
    type(None): lambda value: None,
    str: str.encode,
    int: lambda value: str(value).encode(),
    bool: lambda value: b"t" if value else b"f",
    float: _float,
    dt.datetime: lambda value: value.isoformat().encode(),
    list: _text_array,
}


# -- columns -----------------------------------------------------------------


def _text(value: bytes) -> str:
    return value.decode()


def _bool(value: bytes) -> bool:
    return value == b"t"


def _loader(oid: int, conn: psycopg.Connection[Any]) -> Loader | None:
    if oid == _TIMESTAMPTZ:
        zone = conn.info.timezone

        def timestamptz(value: bytes) -> dt.datetime:
            return dt.datetime.fromisoformat(value.decode()).astimezone(zone)
        return timestamptz
    return _LOADERS.get(oid)


_TIMESTAMPTZ = 1184

#: Column types by OID, read as ``PostgresStore``'s psycopg loaders read them.
_LOADERS: dict[int, Loader] = {
    25: _text, 1043: _text, 19: _text, 1042: _text,  # text, varchar, name, char(n)
    2950: _text,  # uuid: text, as PostgresStore registers it
    20: int, 21: int, 23: int, 26: int,  # int8, int2, int4, oid
    700: float, 701: float,
    16: _bool,
    114: serde.loads, 3802: serde.loads,  # json, jsonb
    1114: lambda value: dt.datetime.fromisoformat(value.decode()),  # timestamp
}
