"""The store's core: connections, the driver-error choke point, dialect hooks.

A ``Store`` owns a small pool of connections to one database. A connection
is used by one thread at a time and never crosses ``fork()``: the pool
remembers the pid that opened it and refuses to hand out inherited
connections, and ``close()`` before forking leaves nothing for a child to
finalise. A connection that fails mid-statement is closed, not pooled, so
the next checkout opens a fresh one; the transaction it held is rolled back
by the server, never half committed.

An idle connection is checked before it is handed out again: one the
server closed while it sat in the pool (a restart, a failover, an idle
timeout) is discarded without a round trip (``_usable``), so the first
call after the database came back opens a fresh one instead of failing.

Driver errors leave through one choke point (``connection()``, and
``error_for`` for the transactional step's connection):
``StoreUnavailable`` when the database cannot be reached (its subclass
``StoreMisconfigured`` when it refuses the configuration: no such database
or role, a bad password or option), ``SchemaMissing``
when everystep's tables do not exist, ``StoreError`` (with the driver's
name for the error as its ``kind``) for anything else it refused, each
with the driver's exception chained.

The hooks (``_open``, ``_transaction``, ``_time``, ``_names`` …) are what a
backend subclass fills in; the concerns beside this module hold the logic
of each operation once, for every backend.
"""

from __future__ import annotations

import abc
import contextlib
import datetime as dt
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from ...errors import EverystepError, SchemaMissing, StoreError, StoreMisconfigured, StoreUnavailable
from ...models import Claim, Run, StepRecord
from .. import queries
from .values import Notifications, checked_run_id, float_or_none, int_or_none, utcnow

MAX_IDLE_CONNECTIONS = 8

#: Test hook, called ``(store, statement name)`` just before a store sends
#: a statement by name: raising a driver error of the store's backend there
#: (``psycopg.errors.…``) is the database refusing that statement, mapped
#: by the choke point as one is.
statement_fault: Callable[[StoreCore, str], None] | None = None

Row = Mapping[str, Any]
"""A result row, read by column name (``dict_row`` or ``sqlite3.Row``)."""


class StoreCore(abc.ABC):
    """What every concern of the store stands on: the pool, the driver-error
    choke point, the named statements and the dialect hooks a backend fills in."""

    backend: ClassVar[str] = ""
    #: The DB-API module whose connections ``schedule(conn=...)`` accepts.
    driver: ClassVar[str] = ""
    #: Whether ``listen()`` delivers notifications (LISTEN/NOTIFY); where it
    #: does not, runners poll.
    notifies: ClassVar[bool] = False
    #: Whether ``listen()`` delivers at least a wake-up when a run is
    #: scheduled (PostgreSQL's NOTIFY; MariaDB's wake-up connection, which
    #: delivers nothing else: fences and requests are seen by polling).
    wakes: bool = False
    #: Why runners must poll although the backend notifies (None: they need not).
    listen_unavailable: str | None = None
    #: Exceptions of the driver that mean "the database is unreachable".
    _unavailable: ClassVar[tuple[type[BaseException], ...]] = ()
    _driver_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(self, url: str, statement_timeout: float | None = None) -> None:
        """``statement_timeout``: seconds any one statement may take, waits
        for locks included (None: the backend's default)."""
        self.url = url
        self.statement_timeout = statement_timeout
        self.sql = _Statements(self, self.statements())
        self._idle: list[Any] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @classmethod
    def statements(cls) -> dict[str, str]:
        return queries.load(cls.backend)

    # -- backend hooks ---------------------------------------------------------

    @abc.abstractmethod
    def _open(self) -> Any:
        """A new connection in autocommit mode whose rows read by name."""

    @abc.abstractmethod
    def _transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A write transaction that takes its locks up front."""

    def _claim_transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """Around the claim statement: nothing where that one statement is
        atomic and disjoint on its own (PostgreSQL's SKIP LOCKED)."""
        return contextlib.nullcontext(conn)

    def _migration_transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A transaction that serialises concurrent migrators."""
        return self._transaction(conn)

    @classmethod
    @abc.abstractmethod
    def accepts(cls, conn: Any) -> bool:
        """Whether ``conn`` (a caller's own connection) belongs to this backend."""

    @classmethod
    @abc.abstractmethod
    def _caller_cursor(cls, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """A cursor on a caller's connection that reads rows by name and
        decodes like ours, whatever the caller configured on it."""

    @classmethod
    @abc.abstractmethod
    def _named_rows(cls, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """While inside, ``conn`` itself (a caller's connection) reads rows
        by name; its own row factory is restored afterwards."""

    def listen(self) -> Notifications | None:
        """A dedicated connection receiving notifications of newly scheduled
        runs (and, where ``notifies``, of runs taken from their holder and
        of operator requests); ``None`` where the backend has none (runners
        poll)."""
        return None

    def _healthy(self, conn: Any) -> bool:
        return True

    def _usable(self, conn: Any) -> bool:
        """Whether an idle connection taken from the pool may be handed out:
        False when the server closed it meanwhile (checked without a round trip)."""
        return True

    def _schema_missing(self, exc: BaseException) -> bool:
        """Whether a driver error says everystep's tables do not exist."""
        return False

    def _misconfigured(self, exc: BaseException) -> bool:
        """Whether a connection error is a configuration the database
        refuses (no such database or role, bad password, bad option), as
        opposed to a server that is down or restarting."""
        return False

    @classmethod
    def _names(cls, names: Sequence[str]) -> Any:
        return list(names)

    @classmethod
    def _time(cls, value: Any) -> dt.datetime | None:
        return value  # type: ignore[no-any-return]

    @classmethod
    def _json(cls, value: Any) -> Any:
        return value

    @classmethod
    def _time_param(cls, value: dt.datetime) -> Any:
        return value

    def describe(self) -> str:
        """The URL without its password, for logs and errors."""
        return _redact(self.url)

    # -- connections -----------------------------------------------------------

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """Check out a connection for this thread; broken ones are discarded.

        Driver errors come out as ``StoreUnavailable`` (connection trouble;
        ``StoreMisconfigured`` when the database refuses this configuration),
        ``SchemaMissing`` (no everystep tables: ``everystep migrate``) or
        ``EverystepError`` (anything else the database refused), with the
        driver's exception chained.
        """
        if os.getpid() != self._pid:
            raise EverystepError("a Store cannot be used across fork(); open a new one in the child")
        conn = self._checkout()
        try:
            if conn is None:
                conn = self._open()
            yield conn
        except self._unavailable as exc:
            self._discard(conn)
            raise self.error_for(exc) from exc
        except self._driver_errors as exc:
            self._release_after_error(conn)
            raise self.error_for(exc) from exc
        except BaseException:
            self._release_after_error(conn)
            raise
        else:
            self._release(conn)

    def _checkout(self) -> Any:
        """An idle connection still open at the server's end, or None."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None or self._usable(conn):
                return conn
            self._discard(conn)

    def error_for(self, exc: BaseException) -> EverystepError:
        """The everystep error a driver error ``exc`` is (see the module docstring)."""
        if isinstance(exc, self._unavailable):
            if self._misconfigured(exc):
                return StoreMisconfigured(f"database {self.describe()} refused the connection: {_first_line(exc)}")
            return StoreUnavailable(f"database {self.describe()} unavailable: {_first_line(exc)}")
        if self._schema_missing(exc):
            return SchemaMissing(
                f"database {self.describe()} has no everystep schema; run: everystep migrate --database URL")
        return StoreError(f"database error: {_first_line(exc)}", type(exc).__name__)

    def _release(self, conn: Any) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        _close_quietly(conn)

    def _release_after_error(self, conn: Any) -> None:
        if conn is None:
            return
        if self._healthy(conn):
            self._release(conn)
        else:
            self._discard(conn)

    def _discard(self, conn: Any) -> None:
        if conn is not None:
            _close_quietly(conn)

    def close(self) -> None:
        """Close every idle connection (call before ``fork()``)."""
        with self._lock:
            idle, self._idle = self._idle, []
        if os.getpid() == self._pid:
            for conn in idle:
                _close_quietly(conn)

    def ping(self) -> None:
        """Round-trip to the database (health checks); raises if unreachable."""
        self._fetchone("ping", {})

    def _fetchall(self, name: str, params: Mapping[str, Any], conn: Any = None) -> list[Row]:
        if conn is None:
            with self.connection() as own:
                return self._fetchall(name, params, own)
        return conn.execute(self.sql[name], params).fetchall()  # type: ignore[no-any-return]

    def _fetchone(self, name: str, params: Mapping[str, Any], conn: Any = None) -> Row | None:
        rows = self._fetchall(name, params, conn)
        return rows[0] if rows else None

    @classmethod
    def _params(cls, **params: Any) -> dict[str, Any]:
        now = utcnow()
        params["now"] = cls._time_param(now)
        params["now_epoch"] = now.timestamp()
        return params

    @staticmethod
    def _claim_params(claim: Claim) -> dict[str, Any]:
        return {"run_id": checked_run_id(claim.run_id), "claimer": claim.claimer, "claim_epoch": claim.epoch}

    # -- row mapping -----------------------------------------------------------

    @classmethod
    def _run(cls, row: Row) -> Run:
        return Run(
            id=str(row["id"]),
            name=row["name"],
            args=cls._json(row["args"]),
            status=row["status"],
            idempotency_key=row["idempotency_key"],
            claimed_by=row["claimed_by"],
            claimed_at=cls._time(row["claimed_at"]),
            result=cls._json(row["result"]),
            error=cls._json(row["error"]),
            created_at=cls._time(row["created_at"]),
            completed_at=cls._time(row["completed_at"]),
            claim_epoch=int(row["claim_epoch"]),
            not_before=cls._time(row["not_before"]),
            queue=row["queue"],
            priority=int(row["priority"]),
            concurrency_key=row["concurrency_key"],
            has_steps=bool(row["has_steps"]) if "has_steps" in row.keys() else None,
            # Not returned by PostgreSQL's claim function (the executor needs none).
            first_claimed_at=cls._time(row["first_claimed_at"]) if "first_claimed_at" in row.keys() else None,
            app_version=row["app_version"] if "app_version" in row.keys() else None,
            forked_from=str(row["forked_from"]) if "forked_from" in row.keys() and row["forked_from"] else None,
            continued_from=_id_or_none(row, "continued_from"),
            continued_as=_id_or_none(row, "continued_as"),
            debounce_calls=int(row["debounce_calls"]) if "debounce_calls" in row.keys()
            and row["debounce_calls"] is not None else None,
        )

    @classmethod
    def _step(cls, row: Row) -> StepRecord:
        return StepRecord(
            workflow_id=str(row["workflow_id"]),
            step_id=row["step_id"],
            name=row["name"],
            status=row["status"],
            result=cls._json(row["result"]),
            error=cls._json(row["error"]),
            args=cls._json(row["args"]) or [],
            kwargs=cls._json(row["kwargs"]) or {},
            started_at=cls._time(row["started_at"]),
            completed_at=cls._time(row["completed_at"]),
            attempt=int(row["attempt"]) if row["attempt"] is not None else 1,
            wake_at=cls._time(row["wake_at"]),
            cpu_seconds=float_or_none(row["cpu_seconds"]),
            peak_rss_bytes=int_or_none(row["peak_rss_bytes"]),
        )


class _Statements(dict[str, str]):
    """A store's statements by name. Every one is looked up right before it
    is sent, inside ``connection()``: where the test hook ``statement_fault``
    strikes, as the database would."""

    def __init__(self, store: StoreCore, statements: Mapping[str, str]) -> None:
        super().__init__(statements)
        self._store = store

    def __getitem__(self, name: str) -> str:
        if statement_fault is not None:
            statement_fault(self._store, name)
        return super().__getitem__(name)


def _id_or_none(row: Row, column: str) -> str | None:
    """A run id column a row may not have (PostgreSQL's claim returns fewer)."""
    value = row[column] if column in row.keys() else None
    return str(value) if value else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _redact(url: str) -> str:
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, host = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass
