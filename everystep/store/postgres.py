"""PostgreSQL backend (psycopg 3), the production store.

Connections run in autocommit mode: each step record is its own short
transaction, and multi-statement operations (claims, admin changes) open an
explicit one. json columns (stored verbatim, so key order survives replay)
are parsed straight into tagged Python values by a per-connection loader,
and rows are read by column name. psycopg prepares a statement server-side
after it has been executed a few times on a connection; the three a runner
sends for every run (``HOT_STATEMENTS``) are prepared at once and sent past
psycopg's cursor, by ``postgres_hot``, where the installed psycopg has what
that path needs (``postgres_hot.available()``); elsewhere they take the
cursor like every other statement, and each store opened says so at DEBUG.

``statement_timeout`` bounds every statement on this store's connections,
and opening one (the supervisor parent sets it, so a stuck lock or a
server that stopped answering can never freeze its loop).

Behind a transaction pooler (``?pooler=transaction``, ``pooling``) nothing
is prepared: the step records (``FUNCTION_FORMS``) are then calls of their
PL/pgSQL functions, planned once per server session, and the statement
timeout (and a read-only store's read-only mode) is set inside each
transaction rather than for the session: a
statement outside a transaction is sent after ``set_config(..., true)`` in
one pipeline, which is one implicit transaction and one round trip, and an
explicit transaction sets it first. ``listen()`` then needs a URL of its
own (``listen_url``): a notification reaches only the server session that
listened.
"""

from __future__ import annotations

import contextlib
import logging
import re
import select
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import psycopg
import psycopg.errors
from psycopg.abc import Params
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import set_json_loads
from psycopg.types.string import TextLoader

from .. import serde
from ..errors import EverystepError, StoreError
from ..models import Claim, ReplayRow, StepRecord
from . import pooling, postgres_hot
from .base import LOST, Marker, NewStep, Notifications, Row, StepWrite, Store, core
from .base.step_transactions import CommitGuard

log = logging.getLogger(__name__)

#: What a runner sends for every run: these go through ``postgres_hot``.
HOT_STATEMENTS = ("claim", "record_step", "finish_run_with_step", "record_step_marked",
                  "finish_run_with_step_marked")
#: Hot statements that behind a transaction pooler are called as the
#: PL/pgSQL function of the same name (``everystep_NAME``, in
#: ``functions/postgres/step_records.sql``), whose plans the server keeps
#: per session; the claim is a function already.
FUNCTION_FORMS = ("record_step", "finish_run_with_step", "record_step_marked", "finish_run_with_step_marked")


#: Connection failures that are a configuration the server or libpq
#: refuses, which no amount of waiting fixes (a server down, starting up or
#: unknown to DNS yet is waited for instead).
_MISCONFIGURED = re.compile(
    r'database ".*" does not exist|role ".*" does not exist|password authentication failed'
    r'|no pg_hba\.conf entry|invalid \w+ value|invalid connection option|invalid URI'
    r'|missing "=" after|server does not support SSL|no password supplied|unsupported startup parameter'
    r'|certificate verify failed|root certificate file .* does not exist|could not read root certificate')
#: What a transaction pooler does to prepared statements: the error then
#: suggests ``?pooler=transaction``.
_LOST_PREPARED = re.compile(r'prepared statement "\w+" (does not|already) exist')


class PostgresStore(Store):
    driver: ClassVar[str] = "psycopg"
    backend: ClassVar[str] = "postgres"
    notifies: ClassVar[bool] = True
    wakes = True
    # Connection loss, shutdowns, failovers (a demoted primary refuses writes)
    # and cancelled statements (statement_timeout) are transient: the run is
    # retried, never failed.
    _unavailable: ClassVar[tuple[type[BaseException], ...]] = (
        psycopg.OperationalError,
        psycopg.InterfaceError,
        psycopg.errors.ReadOnlySqlTransaction,
    )
    _driver_errors: ClassVar[tuple[type[BaseException], ...]] = (psycopg.Error,)

    def __init__(self, url: str, statement_timeout: float | None = None, application_name: str = "everystep",
                 read_only: bool = False, listen_url: str | None = None) -> None:
        super().__init__(url, statement_timeout)
        #: What libpq is given: the URL without its ``pooler=`` parameter.
        self.conninfo, self.pooler = pooling.split(url)
        #: Sessions the server holds read-only (``connect(read_only=True)``).
        self.read_only = read_only
        #: Where ``listen()`` connects (None: ``url``, unless behind a transaction pooler).
        self.listen_url = pooling.listen_url(listen_url) if listen_url else None
        # Opening a connection is bounded by the same budget as a statement.
        self.connect_timeout = min(10.0, statement_timeout) if statement_timeout else 10.0
        self.application_name = application_name
        pooled = self.pooler == pooling.TRANSACTION
        statements = dict(self.sql)
        if pooled:
            # Whichever path sends them (the hot one, a transaction's cursor).
            self.sql.update({name: function_call(name, statements[name]) for name in FUNCTION_FORMS})
        self._hot = _hot_statements(dict(self.sql))
        self.wakes = not pooled or self.listen_url is not None
        if not self.wakes:
            self.listen_unavailable = ("LISTEN needs a direct connection; pass --listen-database "
                                       f"(or ${pooling.LISTEN_ENV_VAR})")

    def _settings(self, local: bool) -> tuple[tuple[str, str], ...]:
        """This store's settings, as (name, value): for the session, or
        (``local``) for one transaction."""
        settings = []
        if self.statement_timeout:
            settings.append(("statement_timeout", str(int(self.statement_timeout * 1000))))
        if self.read_only:
            settings.append(("transaction_read_only" if local else "default_transaction_read_only", "on"))
        return tuple(settings)

    def _open(self, url: str | None = None) -> psycopg.Connection[Any]:
        """A connection to ``url`` (this store's by default; ``listen_url``
        for LISTEN), its settings where its pooler lets them be: in the
        ``options`` startup parameter of a direct connection, set once for
        the session through a session pooler (a stock PgBouncer refuses
        ``options``), inside each transaction through a transaction pooler."""
        conninfo, pooler = pooling.split(url or self.url)
        options: dict[str, Any] = {}
        if pooler == pooling.TRANSACTION:
            # The next transaction may run in another server session, where
            # a prepared statement does not exist.
            options["prepare_threshold"] = None
        elif pooler == pooling.NONE and (settings := self._settings(local=False)):
            options["options"] = " ".join(f"-c {name}={value}" for name, value in settings)
        conn = _Connection.connect(
            conninfo,
            autocommit=True,
            connect_timeout=max(1, int(self.connect_timeout)),
            application_name=self.application_name,
            row_factory=dict_row,
            **options,
        )
        if pooler == pooling.TRANSACTION:
            conn.local_settings = self._settings(local=True)
        elif pooler == pooling.SESSION and (settings := self._settings(local=False)):
            conn.set_session(settings)
        set_json_loads(serde.loads, conn)
        # Run ids are text everywhere in Python: reading them as text skips
        # building a uuid.UUID per row only to turn it back into a string.
        conn.adapters.register_loader("uuid", TextLoader)
        if self._hot and url is None and not conn.local_settings:
            # Behind a transaction pooler nothing stays prepared: sent whole.
            # (A store with settings to send in each transaction, the
            # supervisor parent's, takes the cursor, which sends them.)
            conn.hot_prepared = postgres_hot.Prepared(conn, named=pooler != pooling.TRANSACTION)
        return conn

    def _fetchall(self, name: str, params: Mapping[str, Any], conn: Any = None) -> list[Row]:
        hot = self._hot.get(name)
        if hot is None:
            return super()._fetchall(name, params, conn)
        if conn is None:
            with self.connection() as own:
                return self._fetchall(name, params, own)
        if core.statement_fault is not None:
            core.statement_fault(self, name)
        prepared = getattr(conn, "hot_prepared", None)  # None: a caller's connection
        rows = postgres_hot.execute(conn, prepared, hot, params) if prepared is not None else None
        if rows is None:
            return conn.execute(hot.sql, params).fetchall()  # type: ignore[no-any-return]
        return rows

    def _replay_rows(self, conn: Any, params: dict[str, Any]) -> Iterable[ReplayRow]:
        """All at once, as tuples: psycopg then loads the rows in C rather
        than making each in Python (at 100,000 steps, 0.17 s instead of
        0.31); ``replay_steps`` reads results and errors as text, decoded
        when the replay reaches their step (``_replay_json``)."""
        cursor = conn.execute(self.sql["replay_steps"], params)
        cursor.row_factory = tuple_row
        try:
            return cursor.fetchall()  # type: ignore[no-any-return]
        finally:
            cursor.row_factory = conn.row_factory

    @classmethod
    def _replay_json(cls, value: Any) -> Any:
        return serde.loads(value) if value is not None else None

    def _healthy(self, conn: Any) -> bool:
        return not conn.closed and not conn.broken

    def _usable(self, conn: Any) -> bool:
        # An idle session has nothing to say; one the server ended (a
        # restart, a failover, an idle timeout) sent its FATAL and closed, so
        # its socket reads. A notice or a parameter change is read and
        # kept; an end of file means the session is gone.
        if not self._healthy(conn):
            return False
        pgconn: psycopg.pq.abc.PGconn = conn.pgconn
        try:
            for _ in range(4):
                if not select.select([pgconn.socket], [], [], 0)[0]:
                    return pgconn.status == psycopg.pq.ConnStatus.OK
                pgconn.consume_input()
        except (OSError, ValueError, psycopg.Error):
            return False
        return False  # still talking while idle: not worth the doubt

    def error_for(self, exc: BaseException) -> EverystepError:
        error = super().error_for(exc)
        if self.pooler != pooling.NONE:
            return error
        if "unsupported startup parameter" in str(exc):
            hint = "behind PgBouncer? add ?pooler=transaction to the URL (?pooler=session in session mode)"
        elif _LOST_PREPARED.search(str(exc)):
            hint = "behind a pooler in transaction mode? add ?pooler=transaction to the URL"
        else:
            return error
        return StoreError(f"{error} ({hint})", error.kind) if isinstance(error, StoreError) else (
            type(error)(f"{error} ({hint})"))

    def _misconfigured(self, exc: BaseException) -> bool:
        # libpq reports a refused connection with no SQLSTATE: its message
        # (libpq's own, or the server's FATAL in English) is all there is.
        return isinstance(exc, psycopg.OperationalError) and bool(_MISCONFIGURED.search(str(exc)))

    def _schema_missing(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.errors.UndefinedTable) and "everystep_" in str(exc)

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[Any]:
        with conn.transaction():
            yield conn

    @contextlib.contextmanager
    def _migration_transaction(self, conn: Any) -> Iterator[Any]:
        with conn.transaction():
            conn.execute(self.sql["migration_lock"])
            yield conn

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
        if len(markers) > 1:
            # Rare: the general form, one transaction holding the markers,
            # the step and the status.
            return super().finish_run_with_step(claim, step, status, result_json, error_json, decoded, markers)
        # One statement, not a transaction of two: BEGIN and COMMIT would be
        # round trips of their own (docs/explanation/performance.md measures both forms).
        # A patch marker decided since the last write rides in it.
        params = self._step_params(claim, step)
        params.update(step_status=params["status"], step_result=params["result"], step_error=params["error"],
                      status=status, result=result_json, error=error_json)
        if markers:
            row = self._fetchone("finish_run_with_step_marked", self._with_marker(params, markers[0]))
        else:
            row = self._fetchone("finish_run_with_step", params)
        if row is None:
            return LOST
        return StepWrite(self._written(claim, step, decoded, row), ours=True)

    def in_transaction(self, raw: Any) -> bool:
        return raw.info.transaction_status != TransactionStatus.IDLE  # type: ignore[no-any-return]

    def transaction_failed(self, raw: Any) -> bool:
        return raw.info.transaction_status == TransactionStatus.INERROR  # type: ignore[no-any-return]

    @classmethod
    def accepts(cls, conn: Any) -> bool:
        return isinstance(conn, psycopg.Connection)

    @classmethod
    @contextlib.contextmanager
    def _caller_cursor(cls, conn: Any) -> Iterator[Any]:
        # A framework's connection may carry its own cursor class and loaders
        # (Django loads timestamptz in its configured zone, or naive): this
        # cursor reads like ours whatever the owner set up.
        with psycopg.Cursor(conn, row_factory=dict_row) as cursor:
            set_json_loads(serde.loads, cursor)
            cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
            yield cursor

    @classmethod
    @contextlib.asynccontextmanager
    async def caller_cursor_async(cls, conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[Any]:
        """``_caller_cursor`` on a caller's ``psycopg.AsyncConnection``."""
        async with psycopg.AsyncCursor(conn, row_factory=dict_row) as cursor:
            set_json_loads(serde.loads, cursor)
            cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
            yield cursor

    @classmethod
    @contextlib.contextmanager
    def _named_rows(cls, conn: Any) -> Iterator[Any]:
        previous = conn.row_factory
        conn.row_factory = dict_row
        try:
            yield conn
        finally:
            conn.row_factory = previous

    def listen(self) -> Notifications | None:
        """A dedicated connection LISTENing for newly scheduled runs and for
        runs taken from their holder, on ``listen_url`` if there is one. The
        caller owns it (it is not pooled). None behind a transaction pooler
        without a ``listen_url`` (``listen_unavailable`` says so): runners poll."""
        if not self.wakes:
            return None
        return _Listening(self._open(self.listen_url), self.sql["listen"])

    def listen_streams(self) -> Notifications | None:
        """A dedicated connection LISTENing for stream writes (payload: the
        run's id), the caller's own; None behind a transaction pooler
        without a ``listen_url`` (stream readers poll)."""
        if not self.wakes:
            return None
        return _Listening(self._open(self.listen_url), self.sql["listen_streams"])


def _hot_statements(sql: Mapping[str, str]) -> dict[str, postgres_hot.HotStatement]:
    """The statements ``postgres_hot`` sends, by name; none (all through the
    cursor) when this psycopg lacks what that path uses."""
    lacking = postgres_hot.missing()
    if lacking:
        log.debug("psycopg %s lacks %s: the hot statements take psycopg's cursor",
                  psycopg.__version__, ", ".join(lacking))
        return {}
    return {name: postgres_hot.HotStatement(number, sql[name]) for number, name in enumerate(HOT_STATEMENTS, 1)}


def function_call(name: str, statement: str) -> str:
    """``statement`` (the named statement ``name``) as a call of its
    function, ``everystep_NAME``, its parameters passed by name
    (``p_run_id => %(run_id)s``): the function's arguments are the
    statement's parameters (``functions/postgres/step_records.sql``)."""
    params = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    arguments = ", ".join(f"p_{param} => %({param})s" for param in params)
    return f"SELECT * FROM everystep_{name}({arguments})"


class _Connection(CommitGuard, psycopg.Connection[Any]):
    """A connection whose ``execute`` reuses one cursor.

    ``Connection.execute`` makes a cursor per call, and with it a fresh
    adaptation context that looks every parameter's dumper up again: about
    a quarter of the client's CPU for a step record, which a runner pays on
    every step. Every caller in this package reads its rows before its next
    statement on the connection, which is all that reuse asks.

    Lent to a transactional step's body, it behaves as a plain psycopg
    connection (tuple rows, a cursor per ``execute``), and its ``commit()``
    and ``rollback()`` refuse (``CommitGuard``)."""

    _reused: psycopg.Cursor[Any] | None = None
    #: What this session has prepared for ``postgres_hot`` (set on open).
    hot_prepared: postgres_hot.Prepared | None = None
    #: Behind a transaction pooler, the settings every transaction begins
    #: with, as ``set_config(name, value, true)`` (set on open).
    local_settings: tuple[tuple[str, str], ...] = ()

    def execute(
        self, query: Any, params: Params | None = None, *, prepare: bool | None = None, binary: bool = False
    ) -> psycopg.Cursor[Any]:
        if self.local_settings and self.info.transaction_status == TransactionStatus.IDLE:
            # One implicit transaction (the pipeline's), one round trip.
            with self.pipeline():
                self._set_local()
                cursor = self._execute(query, params, prepare, binary)
            return cursor
        return self._execute(query, params, prepare, binary)

    def _execute(self, query: Any, params: Params | None, prepare: bool | None, binary: bool) -> psycopg.Cursor[Any]:
        if binary or not isinstance(query, str) or self.everystep_step_open:
            return super().execute(query, params, prepare=prepare, binary=binary)
        cursor = self._reused
        if cursor is None or cursor.closed:
            cursor = self._reused = self.cursor()
        return cursor.execute(query, params, prepare=prepare)

    @contextlib.contextmanager
    def transaction(self, savepoint_name: str | None = None,
                    force_rollback: bool = False) -> Iterator[psycopg.Transaction]:
        outermost = self.info.transaction_status == TransactionStatus.IDLE
        with super().transaction(savepoint_name, force_rollback) as tx:
            if outermost and self.local_settings:
                self._set_local()
            yield tx

    def _set_local(self) -> None:
        self._set(self.local_settings, local=True)

    def set_session(self, settings: Sequence[tuple[str, str]]) -> None:
        """Set ``settings`` (name, value) for the session, in one round trip."""
        self._set(settings, local=False)

    def _set(self, settings: Sequence[tuple[str, str]], local: bool) -> None:
        calls = ", ".join("set_config(%s, %s, %s)" for _ in settings)
        super().execute(f"SELECT {calls}", [item for name, value in settings for item in (name, value, local)])

    def everystep_lend(self, lent: bool) -> None:
        super().everystep_lend(lent)
        self.row_factory = tuple_row if lent else dict_row


class _Listening(Notifications):
    def __init__(self, conn: psycopg.Connection[Any], listen_sql: str) -> None:
        self._conn = conn
        conn.execute(listen_sql)
        self._fd = conn.fileno()

    def fileno(self) -> int:
        return self._fd  # a lost connection cannot say its fileno() any more

    def drain(self) -> list[tuple[str, str]]:
        return [(notify.channel, notify.payload) for notify in self._conn.notifies(timeout=0)]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()
