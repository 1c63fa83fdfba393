"""SQLite backend (stdlib ``sqlite3``), the embedded default.

The database runs in WAL mode so readers never block the writer, with a busy
timeout so concurrent writers (threads, forked children) wait their turn
instead of failing. Connections are in autocommit mode; claims and admin
changes use ``BEGIN IMMEDIATE`` to take the write lock before reading, which
is what makes two claimers take disjoint runs. A fresh database migrates
itself on first use.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

from .. import serde
from ..errors import EverystepError
from ..models import ReplayRow
from .base import Marker, NewStep, Row, Store, utcnow
from .base.step_transactions import CommitGuard
from .sqlite_claim import SQLiteClaim

BUSY_TIMEOUT_SECONDS = 30.0


def _use_wal(conn: sqlite3.Connection, sql: dict[str, str]) -> None:
    """Put the database file in WAL mode (persistent, so usually a no-op).

    Switching the journal mode needs an exclusive lock and SQLite reports
    "database is locked" at once, without its busy handler, when another
    connection is opening the same fresh file: so retry until the busy
    timeout, re-reading the mode, which the other opener may have set.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
    delay = 0.001
    while True:
        try:
            if conn.execute(sql["journal_mode"]).fetchone()[0].lower() == "wal":
                return
            conn.execute(sql["use_wal"])
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def path_from_url(url: str) -> str:
    """``sqlite:///rel.db`` → ``rel.db``; ``sqlite:////abs.db`` → ``/abs.db``;
    ``sqlite://`` or ``sqlite:///:memory:`` → in-memory (SQLAlchemy's rules)."""
    if not url.startswith("sqlite:"):
        raise EverystepError(f"not a SQLite URL: {url!r}")
    rest = url[len("sqlite:"):]
    if rest in ("", "//", "///:memory:", "//:memory:"):
        return ":memory:"
    if not rest.startswith("///"):
        raise EverystepError(
            f"bad SQLite URL {url!r}: use sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    path = rest[3:].split("?", 1)[0]
    if not path:
        raise EverystepError(f"bad SQLite URL {url!r}: no file path")
    return path


class _Connection(CommitGuard, sqlite3.Connection):
    """A sqlite3 connection whose ``commit()`` and ``rollback()`` refuse
    while a transactional step uses it."""


class SQLiteStore(Store):
    driver: ClassVar[str] = "sqlite3"
    backend: ClassVar[str] = "sqlite"
    #: A transactional step's transaction holds the write lock from its
    #: BEGIN IMMEDIATE: the plain record is fenced to the commit already.
    step_record_statement: ClassVar[str] = "record_step"
    _unavailable: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.OperationalError,)
    _driver_errors: ClassVar[tuple[type[BaseException], ...]] = (sqlite3.Error,)

    def __init__(self, url: str, statement_timeout: float | None = None, read_only: bool = False) -> None:
        super().__init__(url, statement_timeout)
        #: Opened read-only (``connect(read_only=True)``): no migration, no
        #: journal mode change, connections in SQLite's ``mode=ro``.
        self.read_only = read_only
        # How long a statement waits for another writer's lock.
        self.busy_timeout = statement_timeout or BUSY_TIMEOUT_SECONDS
        self.path = path_from_url(url)
        if self.path == ":memory:":
            raise EverystepError(
                "an in-memory SQLite database cannot be shared between connections; use a file"
            )
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise EverystepError(f"cannot open SQLite database {self.path!r}: directory does not exist")
        if os.path.isdir(self.path):
            raise EverystepError(f"cannot open SQLite database {self.path!r}: it is a directory")
        if read_only:
            if not os.path.isfile(self.path):
                raise EverystepError(f"cannot open SQLite database {self.path!r} read-only: no such file")
            return
        self.migrate()

    def _open(self) -> sqlite3.Connection:
        if self.read_only:
            conn = sqlite3.connect(f"file:{os.path.abspath(self.path)}?mode=ro", uri=True, timeout=self.busy_timeout,
                                   isolation_level=None, check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute(self.sql["read_only_session"])
            return conn
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False,
                               factory=_Connection)
        conn.row_factory = sqlite3.Row
        _use_wal(conn, self.sql)
        for statement in self.sql["connection_setup"].split(";"):
            conn.execute(statement)
        return conn

    @contextlib.contextmanager
    def _transaction(self, conn: Any) -> Iterator[Any]:
        conn.execute(self.sql["begin_write"])
        try:
            yield conn
        except BaseException:
            conn.execute(self.sql["rollback"])
            raise
        else:
            conn.execute(self.sql["commit"])

    def _record_step_marked(self, conn: Any, params: dict[str, Any], step: NewStep, marker: Marker) -> Row | None:
        """The step's row and the marker's in one statement without RETURNING
        (see ``record_step_marked``): two changes, the usual case, mean both
        were written, the step's ``completed_at`` being ``now``. Anything
        else is None, and the caller reads the step back (``_conflict``); in
        the rare case of a marker already recorded beside this step's own new
        row, that row comes back as a record with the same outcome."""
        cursor = conn.execute(self.sql["record_step_marked"], self._with_marker(params, marker))
        return {"completed_at": params["now"]} if cursor.rowcount == 2 else None

    def _claim_transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        return self._transaction(conn)  # BEGIN IMMEDIATE: the write lock first

    def _claim_rows(self, conn: Any, params: dict[str, Any]) -> list[Row]:
        # The clock is read under the write lock, so claim times (and the
        # rate windows they fill) follow the order claims commit in.
        now = utcnow()
        params = {**params, "now": self._time_param(now), "now_epoch": now.timestamp()}
        return SQLiteClaim(conn, self.sql, params, self._queue_settings).run()

    def _next_due_row(self, params: dict[str, Any]) -> Row | None:
        # As PostgreSQL's everystep_next_due: one probe per served queue.
        with self.connection() as conn:
            wait = SQLiteClaim(conn, self.sql, params, self._queue_settings).next_due()
        return {"wait": wait} if wait is not None else None

    def _replay_rows(self, conn: Any, params: dict[str, Any]) -> Iterable[ReplayRow]:
        """Plain tuples, all at once, from a cursor of their own: no
        ``sqlite3.Row`` made and turned into a tuple per step."""
        cursor = conn.cursor()
        cursor.row_factory = None
        try:
            return cursor.execute(self.sql["replay_steps"], params).fetchall()  # type: ignore[no-any-return]
        finally:
            cursor.close()

    @classmethod
    def accepts(cls, conn: Any) -> bool:
        return isinstance(conn, sqlite3.Connection)

    @classmethod
    @contextlib.contextmanager
    def _caller_cursor(cls, conn: Any) -> Iterator[Any]:
        cursor = conn.cursor()
        cursor.row_factory = sqlite3.Row
        try:
            yield cursor
        finally:
            cursor.close()

    @classmethod
    @contextlib.contextmanager
    def _named_rows(cls, conn: Any) -> Iterator[Any]:
        previous = conn.row_factory
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.row_factory = previous

    @classmethod
    def _names(cls, names: Sequence[str]) -> str:
        return json.dumps(list(names))

    @classmethod
    def _json(cls, value: Any) -> Any:
        return serde.loads(value)

    @classmethod
    def _time(cls, value: Any) -> dt.datetime | None:
        return dt.datetime.fromisoformat(value) if value else None

    @classmethod
    def _time_param(cls, value: dt.datetime) -> str:
        # Stored times compare as text: always UTC, so every one has the
        # same offset and text order is time order (and always the same
        # length: isoformat() leaves out a zero microsecond part).
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc)
        return value.isoformat(timespec="microseconds")

