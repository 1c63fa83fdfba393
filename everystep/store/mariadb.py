"""MariaDB backend (PyMySQL), for shops that run MariaDB rather than PostgreSQL.

``mariadb://user:password@host:3306/database`` (``mysql://`` is a synonym;
``?unix_socket=/path`` connects through a socket). MariaDB 10.6 or later:
claims are ``SELECT … FOR UPDATE SKIP LOCKED``. The driver is PyMySQL, the
``everystep[mariadb]`` extra: pure Python, so its wheel installs anywhere
without MariaDB's C headers.

What differs from PostgreSQL, and how this module covers it:

- No ``UPDATE … RETURNING``: a named statement may be a short script (a
  locking SELECT, the UPDATE on what it picked, a SELECT of the result) run
  in one transaction; ``queries/mariadb.sql`` states the rules and
  ``_Connection.execute`` applies them, so ``base.Store`` calls every
  backend the same way.
- No LISTEN/NOTIFY: ``listen()`` is a wake-up connection
  (``mariadb_wake.py``) that ``schedule()`` interrupts once its run is
  committed, so an idle supervisor picks a new run up at once; everything
  else (a run scheduled in a caller's transaction, a fence, an operator's
  request) is seen at the next poll. ``?wake=off`` in the URL turns the
  wake-up off (runners then poll only).
- DDL commits at once: migrations are serialised by ``GET_LOCK`` and written
  to be re-run, since a migration and its version row cannot share a
  transaction.
- The claim is a stored procedure (``functions/mariadb/claim.sql``,
  installed by the migrator like PostgreSQL's functions): the whole claim,
  queue limits included, in one round trip and a transaction of its own.
- A named statement that carries its own transaction (``START TRANSACTION``
  … ``COMMIT``) is sent whole, in one round trip (connections allow
  multi-statements): the last step's record and the run's terminal status.
- No partial index: the claim index leads with the status, and ``due_at``
  is a generated column.

Connections run in autocommit mode, in UTC, at READ COMMITTED, with
``CLIENT_FOUND_ROWS`` (an UPDATE counts the rows it matched, as PostgreSQL
does). Times are stored as naive UTC ``DATETIME(6)`` and read back as aware
UTC datetimes. ``statement_timeout`` bounds every statement
(``max_statement_time``), every lock wait and opening a connection.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import logging
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qs, unquote, urlsplit

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT, SERVER_STATUS

from .. import serde
from ..errors import EverystepError
from ..models import Claim, Run, StepRecord
from ..queues import Placement
from .base import Row, RunnerInfo, Store
from .base.values import LOST, Marker, NewStep, Notifications, StepWrite
from .base.step_transactions import OWN_COMMIT, CommitGuard
from .mariadb_claim import MariaDBClaim
from .mariadb_wake import Waking

log = logging.getLogger(__name__)

DEFAULT_PORT = 3306
#: The longest workflow or runner name the schema stores (VARCHAR(255)).
MAX_NAME = 255
CONNECT_TIMEOUT_SECONDS = 10.0
#: How long a migrator waits for another one to finish.
MIGRATION_LOCK_SECONDS = 300

#: Server and client error codes that mean "unreachable or gave up, try
#: again": connection lost or refused, server shutting down, a statement or
#: lock wait that timed out, a deadlock victim, a read-only server (a
#: demoted primary). Everything else the server refuses is an error.
DEADLOCK = 1213
#: Times a script in its own transaction is run again after a deadlock.
DEADLOCK_RETRIES = 3
TRANSIENT_CODES = frozenset({1040, 1053, 1205, 1213, 1290, 1792, 1836, 1927, 1969, 3024})
#: The client library's own codes (CR_*: lost, refused, gone away…). The
#: server's go on above them (4025: a CHECK constraint failed): refusals.
CLIENT_CODES = range(2000, 3000)
#: Refusals at the door that no waiting fixes: access denied to the
#: database, access denied (user or password), unknown database.
MISCONFIGURED_CODES = frozenset({1044, 1045, 1049})


class _Readable:
    """PyMySQL errors print as a tuple, ``(1045, "Access denied …")``:
    these print the server's message and its code."""

    args: tuple[Any, ...]

    def __str__(self) -> str:
        if len(self.args) >= 2 and isinstance(self.args[0], int):
            return f"{self.args[1]} (MariaDB error {self.args[0]})"
        return " ".join(str(arg) for arg in self.args)


class Unreachable(_Readable, pymysql.err.OperationalError):
    """A PyMySQL error that means the database is unavailable (transient)."""


class Refused(_Readable, pymysql.err.DatabaseError):
    """Any other error the server or the driver raised."""


def _translate(exc: pymysql.err.Error) -> pymysql.err.Error:
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
    if isinstance(exc, pymysql.err.InterfaceError) or code in TRANSIENT_CODES or code in CLIENT_CODES:
        return Unreachable(*exc.args)
    return Refused(*exc.args)


def _check_length(what: str, value: str) -> None:
    if len(value) > MAX_NAME:
        raise EverystepError(f"{what} {value[:40]!r}… is {len(value)} characters; MariaDB stores at most {MAX_NAME}")


def connect_args(url: str) -> dict[str, Any]:
    """PyMySQL's keyword arguments for a ``mariadb://`` (or ``mysql://``) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("mariadb", "mysql"):
        raise EverystepError(f"not a MariaDB URL: {url!r}")
    database = unquote(parts.path.lstrip("/"))
    if not database or "/" in database:
        raise EverystepError(f"bad MariaDB URL {url!r}: name one database, as in mariadb://user@host:3306/db")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise EverystepError(f"bad MariaDB URL {url!r}: the port is not a number") from None
    args: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": port,
        "user": unquote(parts.username) if parts.username else "root",
        "password": unquote(parts.password) if parts.password else "",
        "database": database,
    }
    query = parse_qs(parts.query)
    if "unix_socket" in query:
        args["unix_socket"] = query["unix_socket"][-1]
    return args


def wakes(url: str) -> bool:
    """Whether the URL leaves the wake-up on (``?wake=off`` turns it off)."""
    values = parse_qs(urlsplit(url).query).get("wake", ["on"])
    if values[-1] not in ("on", "off"):
        raise EverystepError(f"bad MariaDB URL {url!r}: wake is on or off")
    return values[-1] == "on"


@functools.cache
def _script(sql: str) -> tuple[str, ...]:
    """A named statement split into the statements of its script (a
    procedure's definition is one statement)."""
    if re.match(r"CREATE\s+(OR\s+REPLACE\s+)?PROCEDURE\b", sql.lstrip(), re.IGNORECASE):
        return (sql.strip(),)
    return tuple(part.strip() for part in re.split(r";[ \t]*\n", sql) if part.strip())


@functools.cache
def _locks(statements: tuple[str, ...]) -> bool:
    """Whether a script takes row locks it must hold across its statements
    (then it runs in one transaction). One without them is a single write
    and reads that follow it: each statement is atomic on its own, and the
    round trips of BEGIN and COMMIT are saved."""
    return any("FOR UPDATE" in statement or "LOCK IN SHARE MODE" in statement for statement in statements)


@functools.cache
def _whole(statements: tuple[str, ...]) -> bool:
    """Whether a named statement carries its own transaction: a procedure's
    ``CALL``, or a script from ``START TRANSACTION`` to ``COMMIT`` (sent
    whole). Neither may run inside another transaction."""
    if len(statements) == 1:
        return statements[0].upper().startswith("CALL ")
    return statements[0].upper() == "START TRANSACTION" and statements[-1].upper() == "COMMIT"


def _kept(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose ``keep`` column is true, without it (see mariadb.sql)."""
    if not rows or "keep" not in rows[0]:
        return list(rows)
    return [{key: value for key, value in row.items() if key != "keep"} for row in rows if row["keep"]]


class _Result:
    """What a statement or script returned: rows by name, and rows touched."""

    def __init__(self, rows: Sequence[Row], rowcount: int, description: Any) -> None:
        self._rows = list(rows)
        self.rowcount = rowcount
        self.description = description

    def fetchone(self) -> Row | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Row]:
        return self._rows

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows)


_NOTHING = _Result([], 0, None)


class _RawConnection(CommitGuard, pymysql.connections.Connection):
    """PyMySQL's connection, whose ``commit()`` and ``rollback()`` refuse
    while a transactional step uses it, and ``begin()`` too (MariaDB's
    START TRANSACTION commits the transaction in progress first)."""

    def begin(self) -> None:
        if self.everystep_step_open:
            raise EverystepError(OWN_COMMIT)
        super().begin()


class _Connection:
    """A PyMySQL connection with the ``execute(sql, params)`` the Store calls
    (psycopg and sqlite3 have it), running scripts as mariadb.sql says."""

    def __init__(self, raw: pymysql.connections.Connection[Any]) -> None:
        self.raw = raw

    @property
    def in_transaction(self) -> bool:
        status: int = getattr(self.raw, "server_status", 0)  # not in PyMySQL's stubs
        return bool(status & SERVER_STATUS.SERVER_STATUS_IN_TRANS)

    def execute(self, sql: str, params: Mapping[str, Any] | None = None) -> _Result:
        statements = _script(sql)
        try:
            if _whole(statements):  # a procedure's call, or a script sent whole
                if self.in_transaction:  # its START TRANSACTION would commit the caller's
                    raise EverystepError("a statement with its own transaction cannot run inside another")
                if len(statements) == 1:
                    return self._own_transaction(lambda: self._single(statements[0], params))
                return self._own_transaction(lambda: self._send_whole(sql, params))
            if len(statements) == 1:
                return self._single(statements[0], params)
            if self.in_transaction or not _locks(statements):
                return self._run_script(statements, dict(params or {}))
            return self._run_own_transaction(statements, dict(params or {}))
        except (Unreachable, Refused):
            raise
        except pymysql.err.Error as exc:
            raise _translate(exc) from exc

    def _run_own_transaction(self, statements: Sequence[str], params: dict[str, Any]) -> _Result:
        """A script in a transaction of its own."""
        def run() -> _Result:
            self.raw.begin()
            result = self._run_script(statements, dict(params))
            self.raw.commit()
            return result
        return self._own_transaction(run)

    def _own_transaction(self, run: Callable[[], _Result]) -> _Result:
        """``run()``, which opens a transaction and commits it; on an error
        the transaction is rolled back, and a deadlock victim (InnoDB rolled
        it back whole) is run again, a few times."""
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                return run()
            except pymysql.err.OperationalError as exc:
                with contextlib.suppress(pymysql.err.Error):
                    self.raw.rollback()
                if exc.args[0] != DEADLOCK or attempt == DEADLOCK_RETRIES:
                    raise
            except BaseException:
                with contextlib.suppress(pymysql.err.Error):
                    self.raw.rollback()
                raise
        raise AssertionError("unreachable")

    def _send_whole(self, sql: str, params: Mapping[str, Any] | None) -> _Result:
        """A script with its own transaction, sent in one round trip: its
        result is the rows of its last SELECT. (The server stops at the
        first statement that fails, the transaction left open: the caller
        rolls it back.)"""
        selected = _NOTHING
        with self.raw.cursor(pymysql.cursors.DictCursor) as cursor:
            cursor.execute(sql, params)
            while True:
                if cursor.description is not None:
                    rows = _kept(cursor.fetchall())
                    selected = _Result(rows, len(rows), cursor.description) if rows else _NOTHING
                if not cursor.nextset():
                    break
        return selected

    def _single(self, statement: str, params: Mapping[str, Any] | None) -> _Result:
        with self.raw.cursor(pymysql.cursors.DictCursor) as cursor:
            cursor.execute(statement, params)
            if cursor.description is not None:
                return _Result(_kept(cursor.fetchall()), cursor.rowcount, cursor.description)
            touched = cursor.rowcount
        return _Result([{"affected": touched}] if touched > 0 else [], touched, None)

    def _run_script(self, statements: Sequence[str], params: dict[str, Any]) -> _Result:
        selected: _Result | None = None
        last = _NOTHING
        with self.raw.cursor(pymysql.cursors.DictCursor) as cursor:
            for statement in statements:
                cursor.execute(statement, params)
                if cursor.description is not None:
                    rows = _kept(cursor.fetchall())
                    if not rows:
                        return _NOTHING
                    first = next(iter(rows[0]))
                    params["picked"] = tuple(row[first] for row in rows)
                    selected = last = _Result(rows, len(rows), cursor.description)
                else:
                    if cursor.rowcount <= 0:
                        return _NOTHING
                    last = _Result([{"affected": cursor.rowcount}], cursor.rowcount, None)
        return selected if selected is not None else last

    def close(self) -> None:
        self.raw.close()


class MariaDBStore(Store):
    driver: ClassVar[str] = "pymysql"
    backend: ClassVar[str] = "mariadb"
    _unavailable: ClassVar[tuple[type[BaseException], ...]] = (Unreachable, pymysql.err.InterfaceError)
    _driver_errors: ClassVar[tuple[type[BaseException], ...]] = (pymysql.err.Error,)

    def __init__(self, url: str, statement_timeout: float | None = None, read_only: bool = False) -> None:
        super().__init__(url, statement_timeout)
        #: Sessions the server holds read-only (``connect(read_only=True)``).
        self.read_only = read_only
        self.connect_args = connect_args(url)
        #: Whether ``listen()`` gives a wake-up connection and ``schedule()`` wakes it.
        self.wakes = wakes(url)
        self.connect_timeout = min(CONNECT_TIMEOUT_SECONDS, statement_timeout) if statement_timeout else (
            CONNECT_TIMEOUT_SECONDS)

    def _misconfigured(self, exc: BaseException) -> bool:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else 0
        return code in MISCONFIGURED_CODES

    def _open(self) -> _Connection:
        timeout = self.statement_timeout
        try:
            raw = _RawConnection(
                **self.connect_args,
                charset="utf8mb4",
                autocommit=True,
                client_flag=CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS,
                connect_timeout=max(1, int(math.ceil(self.connect_timeout))),
                # A server that stops answering mid-statement: give up a
                # little after the statement itself would have.
                read_timeout=int(math.ceil(timeout)) + 5 if timeout else None,
                write_timeout=int(math.ceil(timeout)) + 5 if timeout else None,
            )
        except pymysql.err.Error as exc:
            # Refused at the door: unavailable (an unknown database, user or
            # password is told apart by ``_misconfigured``).
            raise Unreachable(*exc.args) from exc
        conn = _Connection(raw)
        setup: list[tuple[str, dict[str, Any] | None]] = [
            (statement, None) for statement in _script(self.sql["connection_setup"])]
        if timeout:
            seconds = {"seconds": float(timeout), "lock_seconds": max(1, int(math.ceil(timeout)))}
            setup += [(statement, seconds) for statement in _script(self.sql["statement_timeout"])]
        if self.read_only:
            setup.append((self.sql["read_only_session"], None))
        try:
            with raw.cursor() as cursor:
                for statement, params in setup:
                    cursor.execute(statement, params)
        except pymysql.err.Error as exc:
            with contextlib.suppress(Exception):
                raw.close()
            raise _translate(exc) from exc
        return conn

    def _healthy(self, conn: Any) -> bool:
        return bool(conn.raw.open) and not conn.in_transaction

    def _raw(self, conn: Any) -> Any:
        return conn.raw

    def in_transaction(self, raw: Any) -> bool:
        return _Connection(raw).in_transaction

    def _schema_missing(self, exc: BaseException) -> bool:
        # 1146: table doesn't exist; 1305: procedure doesn't exist (a schema
        # migrated before the claim became a procedure).
        return bool(exc.args) and exc.args[0] in (1146, 1305) and "everystep_" in str(exc)

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[Any]:
        conn.execute(self.sql["begin_write"])
        try:
            yield conn
        except BaseException:
            with contextlib.suppress(Exception):
                conn.execute(self.sql["rollback"])
            raise
        else:
            conn.execute(self.sql["commit"])

    def listen(self) -> Notifications | None:
        """A wake-up connection (``mariadb_wake.py``), the caller's own."""
        if not self.wakes:
            return None
        conn = self._open()
        try:
            return Waking(conn, self.sql["wake_wait"], self._end_sleep)
        except BaseException:
            conn.close()
            raise

    def _end_sleep(self, session: int) -> None:
        """End a closing wake-up connection's sleep, on a connection of its
        own (never the pool's: a supervisor closes its wake-up connection
        just before it forks)."""
        conn = self._open()
        try:
            conn.execute(self.sql["wake_end"], {"session": session})
        finally:
            conn.close()

    def schedule(self, name: str, args_json: str, idempotency_key: str | None = None,
                 not_before: dt.datetime | None = None, placement: Placement | None = None,
                 app_version: str | None = None, *, deadline: dt.datetime | None = None) -> Run:
        run = super().schedule(name, args_json, idempotency_key, not_before, placement, app_version,
                               deadline=deadline)
        if self.wakes and run.status == "scheduled" and run.not_before is None:
            self._wake_runners()
        return run

    def _wake_runners(self) -> None:
        """Interrupt idle runners' wake-up connections (after the commit of
        what they should claim). Best effort: the run is committed already,
        and a runner not woken claims it at its next poll."""
        try:
            with self.connection() as conn:
                conn.execute(self.sql["wake_runners"])
        except EverystepError as exc:
            log.debug("could not wake the runners of %s: %s", self.describe(), exc)

    def _claim_rows(self, conn: Any, params: dict[str, Any]) -> list[Row]:
        # One round trip: the procedure (functions/mariadb/claim.sql) runs
        # the whole claim in a transaction of its own.
        rows: list[Row] = conn.execute(self.sql["claim"], {
            **params, "names": json.dumps(list(params["names"])),
            "queues": json.dumps(list(params["queues"])) if params["queues"] is not None else None,
            "versions": json.dumps(list(params["versions"])) if params["versions"] is not None else None,
        }).fetchall()
        return rows

    def _next_due_row(self, params: dict[str, Any]) -> Row | None:
        # As PostgreSQL's everystep_next_due: one probe per served queue.
        with self.connection() as conn:
            wait = MariaDBClaim(conn, self.sql, params, self._queue_settings).next_due()
        return {"wait": wait} if wait is not None else None

    def finish_run_with_step(
        self,
        claim: Claim,
        step: NewStep,
        status: str,
        result_json: str | None = None,
        error_json: str | None = None,
        decoded: StepRecord | None = None,
        markers: Sequence[Marker] = (),
    ) -> StepWrite | None:
        if markers:
            # Rare: the general form, one transaction holding the markers,
            # the step and the status.
            return super().finish_run_with_step(claim, step, status, result_json, error_json, decoded, markers)
        # One round trip, not the five of START TRANSACTION, three writes
        # and COMMIT: the script is sent whole (mariadb.sql).
        params = self._step_params(claim, step)
        params.update(step_status=params["status"], step_result=params["result"], step_error=params["error"],
                      status=status, result=result_json, error=error_json)
        row = self._fetchone("finish_run_with_step", params)
        if row is None:
            return LOST
        self._wake_parent(claim.run_id, row["wake_parent"])
        return StepWrite(self._written(claim, step, decoded, row), ours=True)

    @contextlib.contextmanager
    def _migration_transaction(self, conn: Any) -> Iterator[Any]:
        row = conn.execute(self.sql["migration_lock"], {"wait": MIGRATION_LOCK_SECONDS}).fetchone()
        if row is None or row["locked"] != 1:
            raise EverystepError(
                f"another migration of {self.describe()} held its lock for {MIGRATION_LOCK_SECONDS} s; try again"
            )
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                conn.execute(self.sql["migration_unlock"])

    @classmethod
    def accepts(cls, conn: Any) -> bool:
        return isinstance(conn, pymysql.connections.Connection)

    @classmethod
    @contextlib.contextmanager
    def _caller_cursor(cls, conn: Any) -> Iterator[Any]:
        # Rows by name whatever cursor class the caller configured: every
        # statement runs on a DictCursor of our own.
        yield _Connection(conn)

    @classmethod
    @contextlib.contextmanager
    def _named_rows(cls, conn: Any) -> Iterator[Any]:
        yield _Connection(conn)

    @classmethod
    def migrate_on(cls, conn: Any) -> list[str]:
        migrator = cls.__new__(cls)
        Store.__init__(migrator, "")
        return migrator._migrate_through(_Connection(conn))

    @classmethod
    def _schedule_through(cls, conn: Any, name: str, args_json: str, idempotency_key: str | None,
                          not_before: dt.datetime | None = None, placement: Placement | None = None,
                          app_version: str | None = None, *,
                          parent_id: str | None = None, deadline: dt.datetime | None = None) -> Run:
        # INSERT IGNORE (the idempotent insert) would cut a longer name (a
        # queue name and a concurrency key are checked by Placement).
        _check_length("workflow name", name)
        return super()._schedule_through(conn, name, args_json, idempotency_key, not_before, placement, app_version,
                                         parent_id=parent_id, deadline=deadline)

    def register_runner(self, name: str, instance: str, kind: str, host: str, pid: int, lease: float,
                        vet: Callable[[RunnerInfo], None]) -> tuple[RunnerInfo | None, list[str]]:
        _check_length("runner name", name)
        _check_length("host name", host)
        return super().register_runner(name, instance, kind, host, pid, lease, vet)

    @classmethod
    def _names(cls, names: Sequence[str]) -> tuple[str, ...]:
        # An IN list; an empty one would be a syntax error, and no name,
        # status or run id is the empty string.
        return tuple(names) or ("",)

    @classmethod
    def _json(cls, value: Any) -> Any:
        return serde.loads(value)

    @classmethod
    def _time(cls, value: Any) -> dt.datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = dt.datetime.fromisoformat(value)
        return value.replace(tzinfo=dt.timezone.utc)  # type: ignore[no-any-return]

    @classmethod
    def _time_param(cls, value: dt.datetime) -> dt.datetime:
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value

    @classmethod
    def _time_bound(cls, low: bool) -> Any:
        return dt.datetime(1000, 1, 1) if low else dt.datetime(9999, 12, 31, 23, 59, 59, 999999)

